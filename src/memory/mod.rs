//! Memory: OpenCode's session database across runs (docs/persistence.md). Restored (`restore`,
//! falling back past entries that cannot be restored: `fallback`; checked and cleaned:
//! `sanitize`, `checkpoint`; kept visible across shallow checkouts: `project_identity`), guarded
//! through the turn (`guard`), and saved (`save`: the safety gate of `save_result`, `scrub`, the
//! checkpoint, entries saved meanwhile merged in by `cache_merge`, the store's read-merge-write in
//! `publish`); `merge` joins two databases session by session. Beside them: where memory lives
//! (`state_paths`, the marker), which session continues which thread (`session_map`), what each run spent (`spend_ledger`,
//! which the budget across runs is counted from), and what the summary says of it all (`report`).

pub mod cache_merge;
pub mod checkpoint;
pub mod fallback;
pub mod guard;
pub mod ledger;
pub mod merge;
pub mod project_identity;
pub mod publish;
pub mod repair;
pub mod report;
pub mod restore;
pub mod sanitize;
pub mod save;
pub mod save_result;
pub mod scrub;
pub mod session_map;
pub mod spend_ledger;
pub mod spend_store;
pub mod state_paths;
