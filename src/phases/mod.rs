//! The pipeline, in order; each phase only orchestrates the rooms below it. The main step (`run`,
//! also `fro-bot local`): `admit` fixes what the run works with (`run_context::Admitted`; what the
//! phases append to is `run_context::RunLedger`), `thread_turn` waits for the thread's turn, memory
//! is restored (`memory::restore`), the `budget` across runs judges the run, the `turn` sub-room runs the agent (its network, what it leaves
//! behind, the agent, the cleanup) with the `delivery` sub-room around it (the outputs prepared
//! before; the change, the threat check and the pull request review after), `finalize` answers and
//! writes the summary, and memory is saved (`memory::save`). Beside them: the `tracking_comment`
//! and the dedup `sentinels`. The other entries: `post` (the post step; `post_memory` finishes the memory
//! guard of a main step killed mid-turn) and `inspect`.

pub mod admit;
pub(crate) mod budget;
pub mod delivery;
pub mod finalize;
pub mod inspect;
pub mod post;
pub(crate) mod post_memory;
pub mod run;
pub mod run_context;
pub mod sentinels;
pub mod thread_turn;
pub mod tracking_comment;
pub mod turn;
