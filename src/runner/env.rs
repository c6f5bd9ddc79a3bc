//! Every environment variable, output and state name the action reads or writes, in one place
//! (the inputs have their own table, `crate::config::inputs`).

// Runner-provided environment.
pub const GITHUB_ACTIONS: &str = "GITHUB_ACTIONS";
pub const GITHUB_OUTPUT: &str = "GITHUB_OUTPUT";
pub const GITHUB_STATE: &str = "GITHUB_STATE";
pub const GITHUB_ENV: &str = "GITHUB_ENV";
pub const GITHUB_STEP_SUMMARY: &str = "GITHUB_STEP_SUMMARY";
pub const GITHUB_WORKSPACE: &str = "GITHUB_WORKSPACE";
pub const GITHUB_EVENT_PATH: &str = "GITHUB_EVENT_PATH";
pub const GITHUB_EVENT_NAME: &str = "GITHUB_EVENT_NAME";
pub const GITHUB_REPOSITORY: &str = "GITHUB_REPOSITORY";
pub const GITHUB_REF_NAME: &str = "GITHUB_REF_NAME";
pub const GITHUB_RUN_ID: &str = "GITHUB_RUN_ID";
pub const GITHUB_RUN_ATTEMPT: &str = "GITHUB_RUN_ATTEMPT";
pub const GITHUB_JOB: &str = "GITHUB_JOB";
pub const GITHUB_ACTOR: &str = "GITHUB_ACTOR";
pub const GITHUB_SERVER_URL: &str = "GITHUB_SERVER_URL";
pub const GITHUB_API_URL: &str = "GITHUB_API_URL";
pub const GITHUB_GRAPHQL_URL: &str = "GITHUB_GRAPHQL_URL";
pub const RUNNER_OS: &str = "RUNNER_OS";
pub const RUNNER_TEMP: &str = "RUNNER_TEMP";
pub const HOME: &str = "HOME";
pub const GITHUB_PATH: &str = "GITHUB_PATH";
pub const PATH: &str = "PATH";
pub const XDG_DATA_HOME: &str = "XDG_DATA_HOME";
pub const XDG_CONFIG_HOME: &str = "XDG_CONFIG_HOME";
pub const XDG_CACHE_HOME: &str = "XDG_CACHE_HOME";
pub const XDG_STATE_HOME: &str = "XDG_STATE_HOME";

// AWS SDK environment (the object store's region fallback; credentials stay with aws-config).
pub const AWS_REGION: &str = "AWS_REGION";
pub const AWS_DEFAULT_REGION: &str = "AWS_DEFAULT_REGION";

// The runner proxy, in both cases (tools differ in which they read); the HTTP library
// reads them for fro-bot's own clients, and fro-bot hands them to OpenCode and its own git.
pub const PROXY: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];
pub const NO_PROXY: &[&str] = &["NO_PROXY", "no_proxy"];
/// A file (or directories) of trusted certificates in place of the system store (OpenSSL's names).
pub const SSL_CERT_FILE: &str = "SSL_CERT_FILE";
pub const SSL_CERT_DIR: &str = "SSL_CERT_DIR";
/// A file of certificates trusted besides the system store (Node's name; what runners set).
pub const NODE_EXTRA_CA_CERTS: &str = "NODE_EXTRA_CA_CERTS";
/// The certificate settings OpenCode is given.
pub const TRUST: &[&str] = &[SSL_CERT_FILE, SSL_CERT_DIR, NODE_EXTRA_CA_CERTS];
/// git's own trust settings (`http.sslCAInfo`, `http.sslCAPath`), for fro-bot's `git`.
pub const GIT_SSL_CAINFO: &str = "GIT_SSL_CAINFO";
pub const GIT_SSL_CAPATH: &str = "GIT_SSL_CAPATH";

// Actions runtime (cache service).
pub const ACTIONS_RUNTIME_TOKEN: &str = "ACTIONS_RUNTIME_TOKEN";
pub const ACTIONS_RESULTS_URL: &str = "ACTIONS_RESULTS_URL";
pub const ACTIONS_CACHE_URL: &str = "ACTIONS_CACHE_URL";
/// Set for JavaScript actions on runners whose cache is the v2 service; never for containers.
pub const ACTIONS_CACHE_SERVICE_V2: &str = "ACTIONS_CACHE_SERVICE_V2";
pub const ACTIONS_CACHE_MODE: &str = "ACTIONS_CACHE_MODE";

// AWS credentials (from the environment only; masked the moment the configuration is read).
pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub const AWS_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";

// Prefixes the runner uses to hand inputs and saved state to a step, and its runtime's variables.
pub const INPUT_PREFIX: &str = "INPUT_";
pub const STATE_PREFIX: &str = "STATE_";
pub const ACTIONS_PREFIX: &str = "ACTIONS_";

// Tokens the agent's environment must not inherit (it gets `GH_TOKEN` only where meant to).
pub const GITHUB_TOKEN: &str = "GITHUB_TOKEN";
pub const GH_TOKEN: &str = "GH_TOKEN";

// git's per-process configuration (`git config` keys from the environment, numbered from 0).
pub const GIT_CONFIG_COUNT: &str = "GIT_CONFIG_COUNT";
pub const GIT_CONFIG_KEY_0: &str = "GIT_CONFIG_KEY_0";
pub const GIT_CONFIG_VALUE_0: &str = "GIT_CONFIG_VALUE_0";
/// OpenCode's own git reads no global or system config (`confine::memory_group`).
pub const GIT_CONFIG_GLOBAL: &str = "GIT_CONFIG_GLOBAL";
pub const GIT_CONFIG_NOSYSTEM: &str = "GIT_CONFIG_NOSYSTEM";

// fro-bot's own switches.
/// A level name (`debug`, `trace`...) that raises log verbosity.
pub const FRO_BOT_LOG: &str = "FRO_BOT_LOG";
/// Crash tests: the named kill point (`runner::failpoint`).
pub const FRO_BOT_FAILPOINT: &str = "FRO_BOT_FAILPOINT";
/// Cancel tests: the named pause point, held until a signal (`runner::failpoint::pause`).
pub const FRO_BOT_PAUSEPOINT: &str = "FRO_BOT_PAUSEPOINT";
/// Tests only: makes the kernel's Landlock ABI look this old (never newer), to see the check
/// that refuses to run the agent unenforced (`confine::landlock::support`).
pub const FRO_BOT_LANDLOCK_ABI: &str = "FRO_BOT_LANDLOCK_ABI";
/// Set by fro-bot in OpenCode's environment: the agent's commands' network, applied by the shell
/// wrapper (`confine::network::narrow_commands`) and removed before the real shell runs.
pub const FRO_BOT_AGENT_NETWORK: &str = "FRO_BOT_AGENT_NETWORK";
/// Set by fro-bot in OpenCode's environment when the agent's commands run in the sibling
/// container: its exec relay's socket, where the shell wrapper hands each command
/// (`confine::sibling::shell`); never passed to the command.
pub const FRO_BOT_AGENT_SIBLING: &str = "FRO_BOT_AGENT_SIBLING";
/// The least time between two progress edits of the tracking comment, in ms (default 10 000;
/// tests shorten it).
pub const FRO_BOT_PROGRESS_EDIT_MS: &str = "FRO_BOT_PROGRESS_EDIT_MS";
/// The first wait before a GitHub call is tried again after a transient fault, in ms (default
/// 1 000, doubled for each later one; tests shorten it): `github::retry::Pacing::from_env`.
pub const FRO_BOT_GITHUB_BACKOFF_MS: &str = "FRO_BOT_GITHUB_BACKOFF_MS";

// OpenCode and the session-tools MCP server.
pub const OPENCODE_CONFIG_CONTENT: &str = "OPENCODE_CONFIG_CONTENT";
pub const OPENCODE_DISABLE_AUTOUPDATE: &str = "OPENCODE_DISABLE_AUTOUPDATE";
pub const OPENCODE_SERVER_PASSWORD: &str = "OPENCODE_SERVER_PASSWORD";
pub const OPENCODE_PATH: &str = "OPENCODE_PATH";
pub const OPENCODE_DISABLE_MODELS_FETCH: &str = "OPENCODE_DISABLE_MODELS_FETCH";
/// Provider credentials as JSON; OpenCode 1.18 reads them from here instead of `auth.json`.
pub const OPENCODE_AUTH_CONTENT: &str = "OPENCODE_AUTH_CONTENT";
pub const FRO_BOT_OPENCODE_URL: &str = "FRO_BOT_OPENCODE_URL";
pub const FRO_BOT_OPENCODE_PASSWORD: &str = "FRO_BOT_OPENCODE_PASSWORD";
pub const FRO_BOT_WORKSPACE: &str = "FRO_BOT_WORKSPACE";
/// Path of the session tools' trust view (JSON, `trust::TrustView`), written by fro-bot.
pub const FRO_BOT_SESSION_TRUST: &str = "FRO_BOT_SESSION_TRUST";
/// Where the agent's proposal tools append (`safe_outputs::proposals`).
pub const FRO_BOT_PROPOSALS: &str = "FRO_BOT_PROPOSALS";
/// The run's output policy the proposal tools check against (fro-bot's file, read-only to them).
pub const FRO_BOT_OUTPUT_POLICY: &str = "FRO_BOT_OUTPUT_POLICY";
/// fro-bot's view of the pull request the review tools read (`review::view`, read-only to them).
pub const FRO_BOT_REVIEW_VIEW: &str = "FRO_BOT_REVIEW_VIEW";

// Action inputs (`INPUT_<NAME>`) are declared, with their defaults and syntax, in the table at
// `crate::config::inputs`.

/// Action outputs.
pub mod output {
    pub const SESSION_ID: &str = "session-id";
    pub const CACHE_STATUS: &str = "cache-status";
    pub const CACHE_SAVE_RESULT: &str = "cache-save-result";
    pub const DURATION: &str = "duration";
    pub const LOGICAL_KEY: &str = "logical-key";
    pub const TOKENS: &str = "tokens";
    pub const COST: &str = "cost";
    pub const COMMENT_URL: &str = "comment-url";
    /// What became of the agent's file changes (`delivered`, `none`, `refused`, `off`, `patch`,
    /// `failed`).
    pub const CHANGES: &str = "changes";
    pub const BRANCH: &str = "branch";
    pub const COMMIT_SHA: &str = "commit-sha";
    pub const PR_URL: &str = "pr-url";
    pub const REVIEW_URL: &str = "review-url";
    /// How the run ended (`answered`, `delivered`, `empty`, `capped`, `timed-out`, `cancelled`,
    /// `failed`, `skipped`).
    pub const OUTCOME: &str = "outcome";

    /// Every output, in `action.yaml`'s order.
    pub const ALL: &[&str] = &[
        SESSION_ID,
        CACHE_STATUS,
        CACHE_SAVE_RESULT,
        DURATION,
        LOGICAL_KEY,
        TOKENS,
        COST,
        COMMENT_URL,
        CHANGES,
        BRANCH,
        COMMIT_SHA,
        PR_URL,
        REVIEW_URL,
        OUTCOME,
    ];
}

/// State keys main writes for post (read back as `STATE_<name>`, case preserved).
pub mod state {
    pub const CACHE_SAVED: &str = "cacheSaved";
    pub const LEASE_KEY: &str = "leaseKey";
    pub const LEASE_ETAG: &str = "leaseEtag";
    /// The tracking comment while it does not hold the run's final body (`{kind}:{id}`), so post
    /// can say the run was stopped when main was killed before it could.
    pub const TRACKING_COMMENT: &str = "trackingComment";
    /// The thread's turn (`phases::thread_turn`), which post releases when main could not.
    pub const THREAD_LEASE_KEY: &str = "threadLeaseKey";
    pub const THREAD_LEASE_ETAG: &str = "threadLeaseEtag";
    /// Main's session map (JSON, logical key → session id), for post's marker.
    pub const SESSION_MAP: &str = "sessionMap";
    /// Main's trust records (JSON, session id → who wrote it), for post's marker.
    pub const SESSION_TRUST: &str = "sessionTrust";
    /// The `.git` snapshot post restores when main was killed before it could (`{path}\t{sha256}`;
    /// empty once main restored it).
    pub const GIT_SNAPSHOT: &str = "gitSnapshot";
    /// `pending` while the agent's changes to memory are not yet limited to its own conversation
    /// (`memory::guard`): post then saves only what it can limit itself (`MEMORY_HANDOFF`).
    pub const MEMORY_GUARD: &str = "memoryGuard";
    /// Where the memory guard's copy is kept for post, and its SHA-256 (JSON
    /// `memory::guard::Handoff`); empty when it is out of post's reach or main put memory back.
    pub const MEMORY_HANDOFF: &str = "memoryHandoff";
    /// This run's own sessions (JSON list, `memory::guard::own_sessions`), written before the
    /// prompt is sent and when the turn returns: what post limits memory to.
    pub const MEMORY_OWN: &str = "memoryOwn";
    /// What main took from the agent's uid in the runner's home for the turn (JSON), which post
    /// gives back when main could not; empty once given back.
    pub const HOME_TAKEN: &str = "homeTaken";
    /// What the turn took from the runner's user besides its home (JSON: the file-command files
    /// and their directory, the checkout's credential files), which post gives back when main
    /// could not; empty once given back.
    pub const TURN_TAKEN: &str = "turnTaken";
    /// What the save's scrub reads (JSON `scrub::Scope`), set by main once memory was limited to
    /// the run's own conversation; absent, post's retry scrubs the whole database.
    pub const SCRUB_SCOPE: &str = "scrubScope";
    /// The id of the sibling container the agent's commands ran in (`confine::sibling`), which
    /// post removes when main could not; empty once main removed it.
    pub const AGENT_SIBLING: &str = "agentSibling";
}
