//! Delivery: the safe outputs prepared before the turn (`prepare`), the change read, checked and
//! delivered after it (`change`), the threat check between the two (`threat_check`), and the pull
//! request review around the turn (`pr_review`).

pub mod change;
pub mod pr_review;
pub mod prepare;
pub mod threat_check;
