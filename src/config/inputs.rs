//! The action's inputs, in one table: `action.yaml`, the README's inputs table, `Settings::from_env`
//! and the `fro-bot local` flags (with their `--help` texts) all follow [`INPUTS`]. A test fails
//! when `action.yaml` or the README disagrees with it (tests/it/inputs.rs).

use InputDefault::{Derived, Expression, Value};

/// The OpenCode version the action pins (also installed by the test command and the Dockerfile).
pub const DEFAULT_OPENCODE_VERSION: &str = "1.18.33";

/// One action input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputSpec {
    /// As the user spells it in `with:`; read from `INPUT_<NAME>`; the `local` flag's long name.
    pub name: &'static str,
    /// `action.yaml`'s description, also the flag's `--help` text.
    pub description: &'static str,
    pub default: InputDefault,
    /// `required: true` in `action.yaml` (the runner checks nothing; config enforces it).
    pub required: bool,
    /// The whole value is masked as soon as the configuration is read, and never shown in an error.
    pub secret: bool,
    pub parser: Parser,
    /// Whether `fro-bot local` takes it as a flag (inputs meaningless on a laptop are left out).
    pub local_flag: bool,
}

/// What an absent input means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputDefault {
    /// Unset.
    None,
    /// This value, as if given (`action.yaml`'s `default:`).
    Value(&'static str),
    /// A workflow expression the runner evaluates (`action.yaml`'s `default:`). Outside a runner
    /// (`fro-bot local`) nothing evaluates it: the input is unset.
    Expression(&'static str),
    /// No `default:` in `action.yaml`; chosen at run time as described (the README's column).
    Derived(&'static str),
}

impl InputDefault {
    /// The value config uses when the input is absent.
    pub fn value(self) -> Option<&'static str> {
        match self {
            InputDefault::Value(v) => Some(v),
            InputDefault::None | InputDefault::Expression(_) | InputDefault::Derived(_) => None,
        }
    }

    /// `action.yaml`'s `default:`.
    pub fn in_action_yaml(self) -> Option<&'static str> {
        match self {
            InputDefault::Value(v) | InputDefault::Expression(v) => Some(v),
            InputDefault::None | InputDefault::Derived(_) => None,
        }
    }
}

/// How config reads an input's value (after trimming; empty counts as absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parser {
    /// Any text, passed on as given (the object store validates the `s3-*` ones).
    Text,
    /// `true` or `false`, any case.
    Bool,
    /// Milliseconds as plain decimal digits; `0` turns the feature off.
    Millis,
    /// A count as plain decimal digits, at most `u32::MAX`.
    Count,
    /// An amount of US dollars: decimal digits with at most one `.`, e.g. `0.50`.
    Usd,
    /// `provider/model`.
    Model,
    /// `x.y.z` (optionally `-suffix`) or `latest`.
    Version,
    /// `github` or `none`, any case.
    ResponseMode,
    /// A JSON object of objects: provider id → OpenCode auth entry.
    AuthJson,
    /// A JSON object.
    JsonObject,
    /// A handle such as `@fro-bot` (the `@` is optional).
    Handle,
    /// `aws:kms` or `AES256`, exactly.
    SseMode,
    /// `trusted` or `all`, any case.
    ContextAuthors,
    /// `run` or `sticky`, any case.
    CommentMode,
    /// `pull-request` or `off`, any case.
    Changes,
    /// Names or path patterns, comma- or newline-separated.
    List,
    /// `allowlist`, `none` or `open`, any case.
    AgentNetwork,
    /// `block`, `warn`, `strict` or `off`, any case.
    ThreatCheck,
    /// Host names, `*.suffix` patterns, addresses and named sets, each with an optional `:port`.
    Hosts,
    /// TCP port numbers.
    Ports,
    /// `auto`, `container` or `process`, any case.
    AgentIsolation,
    /// `on-request` or `auto`, any case.
    Review,
    /// Review events (`COMMENT`, `REQUEST_CHANGES`, `APPROVE`), comma- or newline-separated.
    ReviewEvents,
}

impl Parser {
    /// The placeholder in `--help`.
    pub fn value_name(self) -> &'static str {
        match self {
            Parser::Text => "TEXT",
            Parser::Bool => "true|false",
            Parser::Millis => "MS",
            Parser::Count => "N",
            Parser::Usd => "USD",
            Parser::Model => "PROVIDER/MODEL",
            Parser::Version => "VERSION",
            Parser::ResponseMode => "github|none",
            Parser::AuthJson | Parser::JsonObject => "JSON",
            Parser::Handle => "@HANDLE",
            Parser::SseMode => "aws:kms|AES256",
            Parser::ContextAuthors => "trusted|all",
            Parser::CommentMode => "run|sticky",
            Parser::Changes => "pull-request|off",
            Parser::List => "LIST",
            Parser::AgentNetwork => "allowlist|none|open",
            Parser::ThreatCheck => "block|warn|strict|off",
            Parser::Hosts => "HOSTS",
            Parser::Ports => "PORTS",
            Parser::AgentIsolation => "auto|container|process",
            Parser::Review => "on-request|auto",
            Parser::ReviewEvents => "EVENTS",
        }
    }
}

const fn spec(name: &'static str, description: &'static str) -> InputSpec {
    InputSpec {
        name,
        description,
        default: InputDefault::None,
        required: false,
        secret: false,
        parser: Parser::Text,
        local_flag: true,
    }
}

impl InputSpec {
    const fn default(self, default: InputDefault) -> Self {
        Self { default, ..self }
    }
    const fn parser(self, parser: Parser) -> Self {
        Self { parser, ..self }
    }
    const fn required(self) -> Self {
        Self {
            required: true,
            ..self
        }
    }
    const fn secret(self) -> Self {
        Self {
            secret: true,
            ..self
        }
    }
    const fn not_local(self) -> Self {
        Self {
            local_flag: false,
            ..self
        }
    }

    /// The `INPUT_*` variable the runner sets for it.
    pub fn var(&self) -> String {
        crate::runner::input_var(self.name)
    }
}

// Not a `local` flag: a token on the command line lands in the shell history (set
// `INPUT_GITHUB-TOKEN` instead).
pub const GITHUB_TOKEN: InputSpec = spec(
    "github-token",
    "Token for reactions, context, the response comment, and carrying out what the agent proposes (commits, pull requests, labels, issues). Never given to the agent.",
)
.default(Expression("${{ github.token }}"))
.secret()
.not_local();
pub const AUTH_JSON: InputSpec = spec(
    "auth-json",
    "JSON object of provider credentials, provider id -> OpenCode auth entry, e.g. {\"anthropic\":{\"type\":\"api\",\"key\":\"...\"}}. Pass it from a secret. '{}' is valid when providers are configured through opencode-config or the environment. Never written to a cached path.",
)
.required()
.secret()
.parser(Parser::AuthJson);
pub const PROMPT: InputSpec = spec(
    "prompt",
    "Task for the agent. Required for schedule and workflow_dispatch runs; for comment and issue events it is added to the event's directive.",
);
pub const AGENT: InputSpec = spec("agent", "OpenCode agent to use (e.g. build, plan).");
pub const MODEL: InputSpec = spec(
    "model",
    "Model as provider/model, e.g. anthropic/claude-sonnet-4.",
)
.parser(Parser::Model);
pub const TIMEOUT: InputSpec = spec(
    "timeout",
    "Deadline for the agent's turn in milliseconds; 0 means no deadline.",
)
.default(Value("1800000"))
.parser(Parser::Millis);
pub const MAX_COST: InputSpec = spec(
    "max-cost",
    "Spend cap of one run in USD, e.g. 0.50: fro-bot's key proxy counts what each model response reports, priced from OpenCode's model list, and refuses the agent's requests once it is reached; the turn then ends with its partial answer. Empty: no cap.",
)
.parser(Parser::Usd);
pub const MAX_TOKENS: InputSpec = spec(
    "max-tokens",
    "Token cap of one run (input and output tokens together), counted and enforced the same way. Empty: no cap.",
)
.parser(Parser::Count);
pub const MAX_DAILY_COST: InputSpec = spec(
    "max-daily-cost",
    "Budget of the repository in USD per UTC day, e.g. 5.00, counted from the spend ledger fro-bot keeps with its memory: a run that would pass it is answered that the budget is spent and when it resets, and the agent does not start. Exact across concurrent runs with the object store, best effort with the Actions cache alone. Empty: no budget.",
)
.parser(Parser::Usd);
pub const MAX_RUNS_PER_USER_PER_HOUR: InputSpec = spec(
    "max-runs-per-user-per-hour",
    "Runs one user (whoever asked) may start in any 60 minutes, counted from the same ledger; a run past it is answered with when the user may ask again, and the agent does not start. Empty: no limit.",
)
.parser(Parser::Count);
pub const FAIL_ON_EMPTY: InputSpec = spec(
    "fail-on-empty",
    "Fail the step when the agent's turn completes with no written answer and nothing delivered (the outcome output is 'empty' either way).",
)
.default(Value("false"))
.parser(Parser::Bool);
pub const SESSION_RETENTION: InputSpec = spec(
    "session-retention",
    "Root sessions kept beyond those updated in the last 30 days (the newest N are always kept).",
)
.default(Value("50"))
.parser(Parser::Count);
pub const SKIP_CACHE: InputSpec = spec(
    "skip-cache",
    "When true, memory is neither restored nor saved.",
)
.default(Value("false"))
.parser(Parser::Bool);
// Not a `local` flag (nor the next three): a local run is a manual dispatch of this checkout, which
// is never deduplicated, mentions no one, and posts nothing unless pointed at an API on purpose.
pub const DEDUP_WINDOW: InputSpec = spec(
    "dedup-window",
    "Skip an issue/pull_request event if a run for the same entity succeeded within this many milliseconds; 0 turns it off.",
)
.default(Value("600000"))
.parser(Parser::Millis)
.not_local();
pub const RESPONSE_MODE: InputSpec = spec(
    "response-mode",
    "'github' posts one comment, kept up to date while the agent works and ending with its answer; 'none' posts nothing.",
)
.default(Value("github"))
.parser(Parser::ResponseMode)
.not_local();
pub const COMMENT_MODE: InputSpec = spec(
    "comment-mode",
    "'run': each run posts its own comment, edited from 'working' to the answer; 'sticky': one comment per issue, pull request or discussion, edited by every run.",
)
.default(Value("run"))
.parser(Parser::CommentMode)
.not_local();
pub const OPENCODE_VERSION: InputSpec = spec(
    "opencode-version",
    "OpenCode version to install when none is on PATH (local runs). The container image ships this version on PATH, which is used as is.",
)
.default(Value(DEFAULT_OPENCODE_VERSION))
.parser(Parser::Version)
.not_local();
pub const OPENCODE_CONFIG: InputSpec = spec(
    "opencode-config",
    "JSON object merged over the baseline OpenCode configuration (user values win).",
)
.parser(Parser::JsonObject);
pub const AGENT_ENV: InputSpec = spec(
    "agent-env",
    "Names of job environment variables passed on to the agent (comma- or newline-separated). The agent otherwise sees only a fixed allowlist (PATH, locale, the non-secret GITHUB_* context, the runner proxy and certificate settings). INPUT_*, STATE_*, ACTIONS_*, AWS_*, GITHUB_TOKEN and the file-command paths are never passed.",
)
.not_local();
pub const AGENT_NETWORK: InputSpec = spec(
    "agent-network",
    "What the agent may reach: allowlist (the model, fro-bot's tools and the hosts on allowed-domains, through fro-bot's egress proxy), none (the model and fro-bot's tools only; the agent's commands get no network) or open (nothing enforced, at the workflow's own risk). allowlist and none need Linux Landlock ABI 4 (Linux 6.7 or later; GitHub's ubuntu-24.04 runners have it).",
)
.default(Value("allowlist"))
.parser(Parser::AgentNetwork);
pub const ALLOWED_DOMAINS: InputSpec = spec(
    "allowed-domains",
    "Hosts the agent may reach under agent-network: allowlist (comma-, space- or newline-separated): exact names, *.suffix patterns, addresses and the named sets node, python, rust, go, java, ruby, debian and ubuntu (their registry and download hosts). Ports 443 and 80; host:port allows that port instead. Loopback, private and metadata addresses are reached only through an exact name or address listed here. Links and images in what fro-bot posts may point at these hosts too; others are shown as code.",
)
.parser(Parser::Hosts);
pub const AGENT_PORTS: InputSpec = spec(
    "agent-ports",
    "TCP ports the agent may bind and connect to directly, e.g. for a test server it starts (comma-separated). In the agent's own container (agent-isolation) a listed port is reachable only inside it; under the process rules, which know ports, not hosts, on any host.",
)
.parser(Parser::Ports);
pub const AGENT_ISOLATION: InputSpec = spec(
    "agent-isolation",
    "Where the agent's commands run under agent-network: allowlist or none. container: in a sibling container with no network at all, started through the Docker socket the runner mounts; the egress proxy is its only way out (agent-ports are then reachable only inside it). process: in fro-bot's container under the kernel's port rules, which name ports, not hosts. auto: container where the Docker socket works, else process (the summary's Network row says which ran).",
)
.default(Value("auto"))
.parser(Parser::AgentIsolation);
pub const MATRIX_CONTEXT: InputSpec = spec(
    "matrix-context",
    "The job's matrix, so matrix legs keep distinct cache keys and sessions. Leave the default.",
)
.default(Expression("${{ toJSON(matrix) }}"))
.not_local();
pub const MENTION: InputSpec = spec(
    "mention",
    "The handle a comment must mention to trigger the agent.",
)
.default(Value("@fro-bot"))
.parser(Parser::Handle)
.not_local();
pub const CONTEXT_AUTHORS: InputSpec = spec(
    "context-authors",
    "Whose comments enter the prompt as context: trusted (OWNER, MEMBER, COLLABORATOR and fro-bot itself) or all. Either way every quoted item is fenced and labelled as data, with hidden text stripped.",
)
.default(Value("trusted"))
.parser(Parser::ContextAuthors);
pub const TRIGGER_LABEL: InputSpec = spec(
    "trigger-label",
    "A label that starts a run when added to an issue or pull request (off when empty).",
)
.not_local();
pub const S3_BACKUP: InputSpec = spec(
    "s3-backup",
    "Also keep memory in an S3-compatible object store, guarded by a coordination lease.",
)
.default(Value("false"))
.parser(Parser::Bool);
pub const THREAD_WAIT: InputSpec = spec(
    "thread-wait",
    "With s3-backup, how long a run waits, in milliseconds, for an earlier run on the same issue, pull request or discussion to finish before it starts (so it sees that exchange); a run that cannot get its turn says so on the thread. 0 means runs never wait.",
)
.default(Value("300000"))
.parser(Parser::Millis)
.not_local();
pub const S3_BUCKET: InputSpec = spec(
    "s3-bucket",
    "Bucket for the object store (required when s3-backup is true).",
);
pub const AWS_REGION: InputSpec = spec(
    "aws-region",
    "AWS region of the bucket (defaults to AWS_REGION; us-east-1 for custom endpoints).",
);
pub const S3_ENDPOINT: InputSpec = spec(
    "s3-endpoint",
    "Custom S3-compatible endpoint (R2, B2, MinIO, SeaweedFS). https only unless s3-allow-insecure-endpoint.",
);
pub const S3_PREFIX: InputSpec = spec(
    "s3-prefix",
    "Key prefix inside the bucket (one path segment).",
)
.default(Value("fro-bot-state"));
pub const S3_EXPECTED_BUCKET_OWNER: InputSpec = spec(
    "s3-expected-bucket-owner",
    "12-digit AWS account id that must own the bucket (sent as ExpectedBucketOwner on every request).",
);
pub const S3_ALLOW_INSECURE_ENDPOINT: InputSpec = spec(
    "s3-allow-insecure-endpoint",
    "Allow http and private/loopback endpoints (never cloud metadata addresses).",
)
.default(Value("false"))
.parser(Parser::Bool);
pub const S3_SSE_ENCRYPTION: InputSpec = spec(
    "s3-sse-encryption",
    "Server-side encryption: aws:kms or AES256 (default aws:kms on AWS, AES256 on custom endpoints).",
)
.default(Derived("`aws:kms` on AWS, `AES256` elsewhere"))
.parser(Parser::SseMode);
pub const S3_SSE_KMS_KEY_ID: InputSpec =
    spec("s3-sse-kms-key-id", "KMS key id for aws:kms encryption.");

pub const CHANGES: InputSpec = spec(
    "changes",
    "What becomes of the files the agent changes: 'pull-request' commits them (signed, by fro-bot, never by the agent) to a branch per issue, pull request or discussion and opens a draft pull request; 'off' delivers nothing (the answer only).",
)
.default(Value("pull-request"))
.parser(Parser::Changes)
.not_local();
pub const PROTECTED_PATHS: InputSpec = spec(
    "protected-paths",
    "Paths a delivered change may not touch (comma- or newline-separated; 'dir/' is a directory, a name without '/' matches at any depth); replaces the default list. 'none' protects nothing.",
)
.default(Value(
    ".github/, .opencode/, opencode.json, opencode.jsonc, AGENTS.md, CODEOWNERS, .gitmodules",
))
.parser(Parser::List)
.not_local();
pub const MAX_CHANGE_FILES: InputSpec = spec(
    "max-change-files",
    "A change touching more files than this is not delivered (the answer says by how much).",
)
.default(Value("100"))
.parser(Parser::Count)
.not_local();
pub const MAX_CHANGE_BYTES: InputSpec = spec(
    "max-change-bytes",
    "A change with more bytes of changed content than this is not delivered.",
)
.default(Value("4194304"))
.parser(Parser::Count)
.not_local();
pub const ALLOWED_BINARY_PATHS: InputSpec = spec(
    "allowed-binary-paths",
    "Binary (non-text) files a delivered change may add or change (patterns as for protected-paths); any other binary file refuses the change.",
)
.parser(Parser::List)
.not_local();
pub const THREAT_CHECK: InputSpec = spec(
    "threat-check",
    "The model check of the agent's change: 'block' holds a change it flags, 'warn' delivers it with a warning, 'strict' is 'block' and also refuses what the deterministic gate marks for review, 'off' skips the model check.",
)
.default(Value("block"))
.parser(Parser::ThreatCheck)
.not_local();
pub const BRANCH_PREFIX: InputSpec = spec(
    "branch-prefix",
    "Prefix of the branches fro-bot creates: {prefix}issue-N, {prefix}pr-N, {prefix}discussion-N, {prefix}run-ID.",
)
.default(Value("fro-bot/"))
.not_local();
pub const PUSH_TO_PR_BRANCH: InputSpec = spec(
    "push-to-pr-branch",
    "On a same-repository pull request asked by someone with write access, commit to the pull request's own branch (else to fro-bot's branch for it). Fork pull requests are never pushed to.",
)
.default(Value("true"))
.parser(Parser::Bool)
.not_local();
pub const PR_DRAFT: InputSpec = spec("pr-draft", "Open fro-bot's pull requests as drafts.")
    .default(Value("true"))
    .parser(Parser::Bool)
    .not_local();
pub const ALLOWED_LABELS: InputSpec = spec(
    "allowed-labels",
    "Labels the agent may add or remove through its add_labels/remove_labels tools (comma- or newline-separated).",
)
.default(Derived("the repository's existing labels"))
.parser(Parser::List)
.not_local();
pub const MAX_COMMENTS: InputSpec = spec(
    "max-comments",
    "Comments the agent may have fro-bot post through its comment tool in one run (its answer is not counted).",
)
.default(Value("3"))
.parser(Parser::Count)
.not_local();
pub const MAX_ISSUES: InputSpec = spec(
    "max-issues",
    "Issues the agent may have fro-bot open through its create_issue tool in one run.",
)
.default(Value("1"))
.parser(Parser::Count)
.not_local();

pub const REVIEW: InputSpec = spec(
    "review",
    "When fro-bot reviews a pull request: 'on-request' when someone asks it to (e.g. '@fro-bot review'); 'auto' also on every pull_request opened, synchronize (a push) and ready_for_review event the workflow receives.",
)
.default(Value("on-request"))
.parser(Parser::Review)
.not_local();
pub const REVIEW_EVENTS: InputSpec = spec(
    "review-events",
    "What a review may do besides comment: COMMENT, REQUEST_CHANGES, APPROVE (comma-separated). fro-bot never approves a pull request its own token opened.",
)
.default(Value("COMMENT"))
.parser(Parser::ReviewEvents)
.not_local();
pub const MAX_REVIEW_COMMENTS: InputSpec = spec(
    "max-review-comments",
    "Inline comments one review may carry; further findings go into the review's body.",
)
.default(Value("20"))
.parser(Parser::Count)
.not_local();

/// Every input, in `action.yaml`'s order.
pub const INPUTS: &[InputSpec] = &[
    GITHUB_TOKEN,
    AUTH_JSON,
    PROMPT,
    AGENT,
    MODEL,
    TIMEOUT,
    MAX_COST,
    MAX_TOKENS,
    MAX_DAILY_COST,
    MAX_RUNS_PER_USER_PER_HOUR,
    FAIL_ON_EMPTY,
    SESSION_RETENTION,
    SKIP_CACHE,
    DEDUP_WINDOW,
    RESPONSE_MODE,
    COMMENT_MODE,
    OPENCODE_VERSION,
    OPENCODE_CONFIG,
    AGENT_ENV,
    AGENT_NETWORK,
    ALLOWED_DOMAINS,
    AGENT_PORTS,
    AGENT_ISOLATION,
    MATRIX_CONTEXT,
    MENTION,
    CONTEXT_AUTHORS,
    TRIGGER_LABEL,
    S3_BACKUP,
    THREAD_WAIT,
    S3_BUCKET,
    AWS_REGION,
    S3_ENDPOINT,
    S3_PREFIX,
    S3_EXPECTED_BUCKET_OWNER,
    S3_ALLOW_INSECURE_ENDPOINT,
    S3_SSE_ENCRYPTION,
    S3_SSE_KMS_KEY_ID,
    CHANGES,
    PROTECTED_PATHS,
    MAX_CHANGE_FILES,
    MAX_CHANGE_BYTES,
    ALLOWED_BINARY_PATHS,
    THREAT_CHECK,
    BRANCH_PREFIX,
    PUSH_TO_PR_BRANCH,
    PR_DRAFT,
    ALLOWED_LABELS,
    MAX_COMMENTS,
    MAX_ISSUES,
    REVIEW,
    REVIEW_EVENTS,
    MAX_REVIEW_COMMENTS,
];

/// The input of that name.
pub fn find(name: &str) -> Option<&'static InputSpec> {
    INPUTS.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_runner_safe() {
        for (i, a) in INPUTS.iter().enumerate() {
            assert!(
                a.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{}",
                a.name
            );
            assert!(
                INPUTS[i + 1..].iter().all(|b| b.name != a.name),
                "{} is listed twice",
                a.name
            );
        }
    }
}
