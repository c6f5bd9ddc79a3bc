//! Safe outputs: the agent proposes, fro-bot disposes
//! (docs/security.md#the-agent-proposes-fro-bot-disposes).
//!
//! The agent holds no GitHub credential in any run mode. What it wants done leaves the run only
//! through fro-bot, which alone holds the token: its file changes (`capture`, checked by `checks`,
//! read with git under fro-bot's own config, `git`) become a signed commit on the thread's branch
//! and a draft pull request (`deliver`, on a branch `branch` chose before the turn), and what it
//! asks through its tools (`proposals`, served by `crate::tools`) is checked against the run's
//! policy and carried out (`actions`).

pub mod actions;
pub mod branch;
pub mod capture;
pub mod checks;
pub mod deliver;
pub mod git;
pub mod proposals;
