//! Every action input parsed and validated once into typed settings, as [`inputs::INPUTS`]
//! declares them (defaults, secrecy, syntax). Invalid configuration is one clear error naming the
//! input, the bad value (unless secret) and what is accepted.

pub mod inputs;
pub mod review;
pub mod safe_outputs;

use std::time::Duration;

use serde_json::{Map, Value};

pub use inputs::DEFAULT_OPENCODE_VERSION;
use inputs::{InputSpec, INPUTS};

use crate::runner::{log, Env};

/// Call sites read `input::TIMEOUT` like the other names in `runner::env`.
use inputs as input;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("input '{input}' is required: {hint}")]
    Missing {
        input: &'static str,
        hint: &'static str,
    },
    #[error("input '{input}' has an invalid value {shown}: {expected}")]
    Invalid {
        input: &'static str,
        /// The value as it may be shown (`(hidden)` for secrets).
        shown: String,
        expected: String,
    },
}

fn invalid(spec: &InputSpec, value: &str, expected: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        input: spec.name,
        shown: if spec.secret {
            "(hidden)".into()
        } else {
            format!("{value:?}")
        },
        expected: expected.into(),
    }
}

/// `agent-env`: comma/newline-separated names; a name that is never passed is an error, not a
/// silent drop (`crate::confine::env`).
fn parse_agent_env(raw: Option<&str>) -> Result<Vec<String>, ConfigError> {
    let (names, refused) = crate::confine::env::parse_opt_in(raw.unwrap_or(""));
    match refused.first() {
        None => Ok(names),
        Some(name) => Err(invalid(
            &input::AGENT_ENV,
            name,
            "a variable name the agent may see (INPUT_*, STATE_*, ACTIONS_*, AWS_*, GITHUB_TOKEN, \
             GH_TOKEN and the file-command paths are never passed)",
        )),
    }
}

/// The input's value, else the table's default; `None` when it has neither.
fn optional<'e>(env: &'e Env, spec: &InputSpec) -> Option<&'e str> {
    env.input(spec.name).or(spec.default.value())
}

/// The input's value, else the table's default (every input read this way has one).
fn with_default<'e>(env: &'e Env, spec: &InputSpec) -> Result<&'e str, ConfigError> {
    optional(env, spec).ok_or(ConfigError::Missing {
        input: spec.name,
        hint: "it has no default, so a value must be given",
    })
}

/// A value that must never be printed. `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps and masks a secret at once, so nothing can print it afterwards.
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        log::add_mask(&value);
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseMode {
    Github,
    None,
}

/// How many response comments a thread gets (docs/design.md#the-github-surface): one per run, or
/// one per thread, edited by each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommentMode {
    #[default]
    Run,
    Sticky,
}

/// Whose comments enter the prompt as context (docs/security.md). Everything is fenced and
/// labelled either way; `Trusted` also leaves out comments of authors without write access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextAuthors {
    #[default]
    Trusted,
    All,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub provider: String,
    pub model: String,
}

/// `s3-*` inputs as given (trimmed). The object store validates them into its own settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct S3Input {
    pub bucket: String,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub prefix: String,
    pub expected_bucket_owner: Option<String>,
    pub allow_insecure_endpoint: bool,
    pub sse_encryption: Option<SseMode>,
    pub sse_kms_key_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseMode {
    AwsKms,
    Aes256,
}

impl SseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SseMode::AwsKms => "aws:kms",
            SseMode::Aes256 => "AES256",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub github_token: Option<Secret>,
    /// Provider id → OpenCode auth entry. Every string value in it is masked.
    pub auth: Map<String, Value>,
    pub prompt: Option<String>,
    pub agent: Option<String>,
    pub model: Option<ModelRef>,
    /// `None` = no deadline (`timeout: 0`).
    pub timeout: Option<Duration>,
    /// Fail the step on an `empty` outcome (`fail-on-empty`).
    pub fail_on_empty: bool,
    /// `max-cost` and `max-tokens`.
    pub spend_cap: crate::confine::spend::SpendCap,
    /// `max-daily-cost` and `max-runs-per-user-per-hour`.
    pub budget: Budget,
    pub session_retention: u32,
    pub skip_cache: bool,
    /// `None` = dedup off (`dedup-window: 0`).
    pub dedup_window: Option<Duration>,
    pub response_mode: ResponseMode,
    pub comment_mode: CommentMode,
    pub opencode_version: String,
    pub opencode_config: Option<Map<String, Value>>,
    pub matrix_context: Option<String>,
    pub mention: String,
    pub context_authors: ContextAuthors,
    /// The label whose addition starts a run; `None` = off.
    pub trigger_label: Option<String>,
    /// Present when `s3-backup: true`.
    pub s3: Option<S3Input>,
    /// How long a run waits for its turn on its thread (`phases::thread_turn`); `None` = never.
    pub thread_wait: Option<Duration>,
    /// Names of variables of the job passed on to the agent (`agent-env`).
    pub agent_env: Vec<String>,
    /// What becomes of what the agent proposes (`changes`, `protected-paths`, ...).
    pub safe_outputs: safe_outputs::SafeOutputSettings,
    /// What the agent may reach (`agent-network`, `allowed-domains`, `agent-ports`).
    pub network: crate::egress::NetworkSettings,
    /// Pull request review (`review`, `review-events`, `max-review-comments`).
    pub review: review::ReviewSettings,
}

/// The budget across runs (docs/design.md#the-budget-across-runs), counted from the spend ledger
/// (`memory::spend_ledger`); `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    /// USD per UTC day, for the repository (`max-daily-cost`).
    pub max_daily_cost: Option<f64>,
    /// Runs one actor may start in any 60 minutes (`max-runs-per-user-per-hour`).
    pub max_runs_per_user_per_hour: Option<u32>,
}

impl Budget {
    pub fn is_set(&self) -> bool {
        self.max_daily_cost.is_some() || self.max_runs_per_user_per_hour.is_some()
    }
}

/// Whether `auth-json` must be given (the action) or may default to `{}` (a local run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthRequirement {
    Required,
    Optional,
}

/// Registers every secret the inputs and environment hold, validating nothing else: for the post
/// step, which saves (and so scrubs) memory but reads no other input.
pub fn register_secrets(env: &Env) {
    let secret_inputs = INPUTS
        .iter()
        .filter(|spec| spec.secret)
        .filter_map(|spec| env.input(spec.name));
    let secret_vars = [
        crate::runner::env::AWS_SECRET_ACCESS_KEY,
        crate::runner::env::AWS_SESSION_TOKEN,
        crate::runner::env::ACTIONS_RUNTIME_TOKEN,
    ]
    .into_iter()
    .filter_map(|var| env.get(var));
    secret_inputs.chain(secret_vars).for_each(log::add_mask);
    let _ = parse_auth_json(optional(env, &input::AUTH_JSON), AuthRequirement::Optional);
    let _ = parse_opencode_config(optional(env, &input::OPENCODE_CONFIG));
}

impl Settings {
    pub fn from_env(env: &Env, auth: AuthRequirement) -> Result<Self, ConfigError> {
        // Secrets first: masked before any other parsing could echo them in an error.
        let secret_inputs = INPUTS
            .iter()
            .filter(|spec| spec.secret)
            .filter_map(|spec| env.input(spec.name));
        let secret_vars = [
            crate::runner::env::AWS_SECRET_ACCESS_KEY,
            crate::runner::env::AWS_SESSION_TOKEN,
            crate::runner::env::ACTIONS_RUNTIME_TOKEN,
        ]
        .into_iter()
        .filter_map(|var| env.get(var));
        secret_inputs.chain(secret_vars).for_each(log::add_mask);

        let github_token = optional(env, &input::GITHUB_TOKEN).map(Secret::new);
        let auth = parse_auth_json(optional(env, &input::AUTH_JSON), auth)?;

        // Every input's format is checked, even those a disabled feature would not use.
        let s3_backup = parse_bool(env, &input::S3_BACKUP)?;
        let s3 = parse_s3(env)?;
        let s3 = if s3_backup {
            Some(s3.ok_or(ConfigError::Missing {
                input: input::S3_BUCKET.name,
                hint: "'s3-backup: true' needs the bucket that holds the session database",
            })?)
        } else {
            None
        };
        let text = |spec: &InputSpec| optional(env, spec).map(str::to_string);
        Ok(Settings {
            github_token,
            auth,
            prompt: text(&input::PROMPT),
            agent: text(&input::AGENT),
            model: optional(env, &input::MODEL).map(parse_model).transpose()?,
            timeout: non_zero_ms(parse_u64(env, &input::TIMEOUT)?),
            fail_on_empty: parse_bool(env, &input::FAIL_ON_EMPTY)?,
            spend_cap: parse_spend_cap(env)?,
            budget: parse_budget(env)?,
            session_retention: parse_u32(env, &input::SESSION_RETENTION)?,
            skip_cache: parse_bool(env, &input::SKIP_CACHE)?,
            dedup_window: non_zero_ms(parse_u64(env, &input::DEDUP_WINDOW)?),
            thread_wait: non_zero_ms(parse_u64(env, &input::THREAD_WAIT)?),
            response_mode: parse_response_mode(env)?,
            comment_mode: parse_comment_mode(env)?,
            opencode_version: parse_version(env)?,
            opencode_config: parse_opencode_config(optional(env, &input::OPENCODE_CONFIG))?,
            matrix_context: text(&input::MATRIX_CONTEXT),
            mention: parse_mention(with_default(env, &input::MENTION)?)?,
            context_authors: parse_context_authors(env)?,
            trigger_label: text(&input::TRIGGER_LABEL),
            s3,
            agent_env: parse_agent_env(optional(env, &input::AGENT_ENV))?,
            safe_outputs: safe_outputs::parse(env)?,
            network: parse_network(env)?,
            review: review::parse(env)?,
        })
    }
}

/// `max-cost` (USD) and `max-tokens` (a count); each absent: no cap.
fn parse_spend_cap(env: &Env) -> Result<crate::confine::spend::SpendCap, ConfigError> {
    let max_tokens = match optional(env, &input::MAX_TOKENS) {
        None => None,
        Some(_) => Some(u64::from(parse_u32(env, &input::MAX_TOKENS)?)),
    };
    Ok(crate::confine::spend::SpendCap {
        max_cost: parse_usd(env, &input::MAX_COST)?,
        max_tokens,
    })
}

/// `max-daily-cost` (USD) and `max-runs-per-user-per-hour` (a count); each absent: no limit.
fn parse_budget(env: &Env) -> Result<Budget, ConfigError> {
    let max_runs_per_user_per_hour = match optional(env, &input::MAX_RUNS_PER_USER_PER_HOUR) {
        None => None,
        Some(_) => Some(parse_u32(env, &input::MAX_RUNS_PER_USER_PER_HOUR)?),
    };
    Ok(Budget {
        max_daily_cost: parse_usd(env, &input::MAX_DAILY_COST)?,
        max_runs_per_user_per_hour,
    })
}

/// A [`Parser::Usd`](inputs::Parser::Usd) input: digits with at most one `.`; absent: `None`.
fn parse_usd(env: &Env, spec: &InputSpec) -> Result<Option<f64>, ConfigError> {
    let Some(v) = optional(env, spec) else {
        return Ok(None);
    };
    let digits = v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && v.bytes().filter(|b| *b == b'.').count() <= 1
        && v.bytes().any(|b| b.is_ascii_digit());
    let parsed = v.parse::<f64>().ok().filter(|c| digits && c.is_finite());
    parsed
        .map(Some)
        .ok_or_else(|| invalid(spec, v, "expected an amount in USD such as '0.50'"))
}

fn non_zero_ms(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// A [`Parser::Bool`](inputs::Parser::Bool) input.
pub fn parse_bool(env: &Env, spec: &InputSpec) -> Result<bool, ConfigError> {
    parse_choice(env, spec, [("true", true), ("false", false)])
}

/// One of two words, any case; the error names both.
fn parse_choice<T: Copy, const N: usize>(
    env: &Env,
    spec: &InputSpec,
    choices: [(&str, T); N],
) -> Result<T, ConfigError> {
    let value = with_default(env, spec)?;
    match choices
        .iter()
        .find(|(word, _)| value.eq_ignore_ascii_case(word))
    {
        Some((_, choice)) => Ok(*choice),
        None => {
            // "expected 'a' or 'b'", "expected 'a', 'b' or 'c'".
            let words: Vec<String> = choices.iter().map(|(w, _)| format!("'{w}'")).collect();
            let expected = match words.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => String::new(),
            };
            Err(invalid(spec, value, format!("expected {expected}")))
        }
    }
}

/// A [`Parser::Millis`](inputs::Parser::Millis) or [`Parser::Count`](inputs::Parser::Count) input.
fn parse_u64(env: &Env, spec: &InputSpec) -> Result<u64, ConfigError> {
    match with_default(env, spec)? {
        // `u64::from_str` accepts a leading '+'; inputs take plain decimal digits
        // (docs/design.md#inputs-and-configuration).
        v if v.bytes().all(|b| b.is_ascii_digit()) => v
            .parse()
            .map_err(|_| invalid(spec, v, "the number is too large")),
        v => Err(invalid(
            spec,
            v,
            "expected a non-negative whole number (decimal digits only)",
        )),
    }
}

fn parse_u32(env: &Env, spec: &InputSpec) -> Result<u32, ConfigError> {
    let value = parse_u64(env, spec)?;
    u32::try_from(value).map_err(|_| invalid(spec, &value.to_string(), "the number is too large"))
}

fn parse_context_authors(env: &Env) -> Result<ContextAuthors, ConfigError> {
    let choices = [
        ("trusted", ContextAuthors::Trusted),
        ("all", ContextAuthors::All),
    ];
    parse_choice(env, &input::CONTEXT_AUTHORS, choices)
}

fn parse_response_mode(env: &Env) -> Result<ResponseMode, ConfigError> {
    let choices = [
        ("github", ResponseMode::Github),
        ("none", ResponseMode::None),
    ];
    parse_choice(env, &input::RESPONSE_MODE, choices)
}

fn parse_comment_mode(env: &Env) -> Result<CommentMode, ConfigError> {
    let choices = [("run", CommentMode::Run), ("sticky", CommentMode::Sticky)];
    parse_choice(env, &input::COMMENT_MODE, choices)
}

fn parse_network(env: &Env) -> Result<crate::egress::NetworkSettings, ConfigError> {
    use crate::egress::{parse_ports, AgentNetwork, Allowlist};
    let mode = parse_choice(env, &input::AGENT_NETWORK, AgentNetwork::CHOICES)?;
    let raw = optional(env, &input::ALLOWED_DOMAINS).unwrap_or("");
    let allowed =
        Allowlist::parse(raw).map_err(|e| invalid(&input::ALLOWED_DOMAINS, raw, e.to_string()))?;
    let raw = optional(env, &input::AGENT_PORTS).unwrap_or("");
    let agent_ports =
        parse_ports(raw).map_err(|e| invalid(&input::AGENT_PORTS, raw, e.to_string()))?;
    let isolation = parse_choice(
        env,
        &input::AGENT_ISOLATION,
        crate::confine::sibling::AgentIsolation::CHOICES,
    )?;
    Ok(crate::egress::NetworkSettings {
        mode,
        allowed,
        agent_ports,
        isolation,
    })
}

fn parse_model(value: &str) -> Result<ModelRef, ConfigError> {
    match value.split_once('/') {
        Some((provider, model)) if !provider.trim().is_empty() && !model.trim().is_empty() => {
            Ok(ModelRef {
                provider: provider.trim().to_string(),
                model: model.trim().to_string(),
            })
        }
        _ => Err(invalid(
            &input::MODEL,
            value,
            "expected 'provider/model', e.g. 'anthropic/claude-sonnet-4'",
        )),
    }
}

fn parse_version(env: &Env) -> Result<String, ConfigError> {
    let v = with_default(env, &input::OPENCODE_VERSION)?;
    let ok = v.eq_ignore_ascii_case("latest")
        || v.split('.').count() == 3
            && v.split(['.', '-']).all(|p| !p.is_empty())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if ok {
        Ok(v.to_string())
    } else {
        Err(invalid(
            &input::OPENCODE_VERSION,
            v,
            "expected a version such as '1.18.33' or 'latest'",
        ))
    }
}

fn parse_auth_json(
    raw: Option<&str>,
    req: AuthRequirement,
) -> Result<Map<String, Value>, ConfigError> {
    let Some(raw) = raw else {
        return match req {
            AuthRequirement::Required => Err(ConfigError::Missing {
                input: input::AUTH_JSON.name,
                hint: "pass a JSON object of provider credentials, e.g. '${{ secrets.OPENCODE_AUTH_JSON }}' ('{}' when providers are configured elsewhere)",
            }),
            AuthRequirement::Optional => Ok(Map::new()),
        };
    };
    // The whole value is masked already (a secret input): a parse error must not echo any of it.
    let value: Value = serde_json::from_str(raw).map_err(|e| {
        invalid(
            &input::AUTH_JSON,
            raw,
            format!("not valid JSON (line {}, column {})", e.line(), e.column()),
        )
    })?;
    let Value::Object(map) = value else {
        return Err(invalid(
            &input::AUTH_JSON,
            raw,
            "expected a JSON object: provider id → auth entry",
        ));
    };
    for (provider, entry) in &map {
        if !entry.is_object() {
            return Err(invalid(
                &input::AUTH_JSON,
                raw,
                format!("the entry for provider {provider:?} must be an object, e.g. {{\"type\":\"api\",\"key\":\"...\"}}"),
            ));
        }
        mask_strings(entry, None);
    }
    Ok(map)
}

/// Masks every string leaf of an auth entry except its `type` tag ("api", "oauth").
fn mask_strings(value: &Value, key: Option<&str>) {
    match value {
        Value::String(s) if key != Some("type") => log::add_mask(s),
        Value::Object(map) => map.iter().for_each(|(k, v)| mask_strings(v, Some(k))),
        Value::Array(items) => items.iter().for_each(|v| mask_strings(v, key)),
        _ => {}
    }
}

/// Masks values of fields that hold credentials in an OpenCode config (`apiKey`, `token`,
/// `password`, `secret`, header values under `headers`...), wherever they are nested.
fn mask_credential_fields(value: &Value, sensitive: bool) {
    match value {
        Value::String(s) if sensitive => log::add_mask(s),
        Value::Object(map) => {
            for (k, v) in map {
                let k = k.to_ascii_lowercase();
                let hit = sensitive
                    || k == "headers"
                    || [
                        "key",
                        "token",
                        "secret",
                        "password",
                        "authorization",
                        "credential",
                    ]
                    .iter()
                    .any(|needle| k.contains(needle));
                mask_credential_fields(v, hit);
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|v| mask_credential_fields(v, sensitive)),
        _ => {}
    }
}

fn parse_opencode_config(raw: Option<&str>) -> Result<Option<Map<String, Value>>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) => {
            mask_credential_fields(&Value::Object(map.clone()), false);
            Ok(Some(map))
        }
        Ok(_) => Err(ConfigError::Invalid {
            input: input::OPENCODE_CONFIG.name,
            shown: "(JSON value)".into(),
            expected: "expected a JSON object (it is merged over the baseline OpenCode config)"
                .into(),
        }),
        Err(e) => Err(ConfigError::Invalid {
            input: input::OPENCODE_CONFIG.name,
            shown: "(not JSON)".into(),
            expected: format!("not valid JSON: {e}"),
        }),
    }
}

fn parse_mention(raw: &str) -> Result<String, ConfigError> {
    let name = raw.trim_start_matches('@');
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '/')
    {
        Ok(format!("@{name}"))
    } else {
        Err(invalid(
            &input::MENTION,
            raw,
            "expected a handle such as '@fro-bot'",
        ))
    }
}

/// The `s3-*` inputs, validated for format; `None` when no bucket is given.
fn parse_s3(env: &Env) -> Result<Option<S3Input>, ConfigError> {
    let allow_insecure_endpoint = parse_bool(env, &input::S3_ALLOW_INSECURE_ENDPOINT)?;
    let sse_encryption = match optional(env, &input::S3_SSE_ENCRYPTION) {
        None => None,
        Some("aws:kms") => Some(SseMode::AwsKms),
        Some("AES256") => Some(SseMode::Aes256),
        Some(v) => {
            return Err(invalid(
                &input::S3_SSE_ENCRYPTION,
                v,
                "expected 'aws:kms' or 'AES256'",
            ))
        }
    };
    let prefix = with_default(env, &input::S3_PREFIX)?;
    let Some(bucket) = optional(env, &input::S3_BUCKET) else {
        return Ok(None);
    };
    let text = |spec: &InputSpec| optional(env, spec).map(str::to_string);
    Ok(Some(S3Input {
        bucket: bucket.to_string(),
        region: text(&input::AWS_REGION),
        endpoint: text(&input::S3_ENDPOINT),
        prefix: prefix.to_string(),
        expected_bucket_owner: text(&input::S3_EXPECTED_BUCKET_OWNER),
        allow_insecure_endpoint,
        sse_encryption,
        sse_kms_key_id: text(&input::S3_SSE_KMS_KEY_ID),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        let mut env = Env::from_pairs([("INPUT_AUTH-JSON", "{}")]);
        for (k, v) in pairs {
            env.set(crate::runner::input_var(k), *v);
        }
        env
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_env(&env(pairs), AuthRequirement::Required)
    }

    fn err_input(pairs: &[(&str, &str)]) -> &'static str {
        match parse(pairs).expect_err("accepted a bad value") {
            ConfigError::Missing { input, .. } | ConfigError::Invalid { input, .. } => input,
        }
    }

    #[test]
    fn defaults() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.timeout, Some(Duration::from_millis(1_800_000)));
        assert_eq!(s.session_retention, 50);
        assert!(!s.skip_cache);
        assert_eq!(s.dedup_window, Some(Duration::from_millis(600_000)));
        assert_eq!(s.response_mode, ResponseMode::Github);
        assert_eq!(s.opencode_version, DEFAULT_OPENCODE_VERSION);
        assert_eq!(s.mention, "@fro-bot");
        assert!(s.s3.is_none());
        assert!(s.auth.is_empty());
    }

    #[test]
    fn every_bad_value_names_its_input() {
        let cases: &[(&str, &str)] = &[
            ("skip-cache", "yes"),
            ("skip-cache", "1"),
            ("s3-backup", "TRUE!"),
            ("s3-allow-insecure-endpoint", "on"),
            ("timeout", "-1"),
            ("max-cost", "$1"),
            ("max-cost", "1.2.3"),
            ("max-cost", "-0.5"),
            ("max-tokens", "1e6"),
            ("timeout", "+5"),
            ("timeout", "1.5"),
            ("timeout", "30s"),
            ("timeout", "99999999999999999999999"),
            ("session-retention", "ten"),
            ("session-retention", "4294967296"),
            ("dedup-window", "-0"),
            ("response-mode", "slack"),
            ("model", "no-slash"),
            ("model", "/model"),
            ("model", "provider/"),
            ("opencode-version", "v1"),
            ("opencode-version", "1.18"),
            ("opencode-config", "[1,2]"),
            ("opencode-config", "{not json"),
            ("mention", "@"),
            ("mention", "two words"),
            ("auth-json", "[]"),
            ("auth-json", "{\"p\":\"key-not-object\"}"),
            ("auth-json", "{oops"),
        ];
        for (input, value) in cases {
            assert_eq!(err_input(&[(input, value)]), *input, "{input}={value}");
        }
    }

    #[test]
    fn s3_inputs() {
        assert_eq!(
            err_input(&[("s3-sse-encryption", "bogus")]),
            "s3-sse-encryption"
        );
        assert!(parse(&[("s3-bucket", "b")]).unwrap().s3.is_none());
        assert_eq!(err_input(&[("s3-backup", "true")]), "s3-bucket");
        assert_eq!(
            err_input(&[
                ("s3-backup", "true"),
                ("s3-bucket", "b"),
                ("s3-sse-encryption", "aes256")
            ]),
            "s3-sse-encryption"
        );
        let s = parse(&[
            ("s3-backup", "True"),
            ("s3-bucket", " b "),
            ("s3-sse-encryption", "aws:kms"),
            ("s3-allow-insecure-endpoint", "FALSE"),
        ])
        .unwrap()
        .s3
        .unwrap();
        assert_eq!(s.bucket, "b");
        assert_eq!(s.prefix, "fro-bot-state");
        assert_eq!(s.sse_encryption, Some(SseMode::AwsKms));
    }

    #[test]
    fn zero_turns_deadlines_off_and_values_parse() {
        let s = parse(&[
            ("timeout", "0"),
            ("dedup-window", "0"),
            ("model", "anthropic/claude-x"),
            ("response-mode", "NONE"),
            ("mention", "my-bot"),
            ("opencode-config", "{\"theme\":\"x\"}"),
        ])
        .unwrap();
        assert_eq!(s.timeout, None);
        assert_eq!(s.dedup_window, None);
        assert_eq!(s.model.unwrap().model, "claude-x");
        assert_eq!(s.response_mode, ResponseMode::None);
        assert_eq!(s.mention, "@my-bot");
        assert!(s.opencode_config.unwrap().contains_key("theme"));
    }

    #[test]
    fn auth_json_is_required_for_the_action_and_never_echoed() {
        let bare = Env::default();
        assert!(matches!(
            Settings::from_env(&bare, AuthRequirement::Required),
            Err(ConfigError::Missing {
                input: "auth-json",
                ..
            })
        ));
        assert!(Settings::from_env(&bare, AuthRequirement::Optional).is_ok());
        let err = parse(&[("auth-json", "{\"openai\": \"sk-very-secret-value\"}")]).unwrap_err();
        assert!(!err.to_string().contains("sk-very-secret"), "{err}");
        let s = parse(&[(
            "auth-json",
            "{\"openai\":{\"type\":\"api\",\"key\":\"sk-another-secret\"}}",
        )])
        .unwrap();
        assert_eq!(
            crate::runner::log::redact("x sk-another-secret y"),
            "x *** y"
        );
        // The type tag is not a secret: it must not blank the word everywhere.
        assert_eq!(crate::runner::log::redact("api"), "api");
        assert!(s.auth.contains_key("openai"));
    }

    #[test]
    fn credentials_inside_opencode_config_are_masked() {
        let cfg = r#"{"provider":{"x":{"options":{"apiKey":"sk-inside-config-1","baseURL":"https://llm.example"},
            "headers":{"X-Custom":"hdr-secret-value"}}},"theme":"dark-mode-theme"}"#;
        parse(&[("opencode-config", cfg)]).unwrap();
        let text = crate::runner::log::redact(
            "sk-inside-config-1 hdr-secret-value https://llm.example dark-mode-theme",
        );
        assert_eq!(text, "*** *** https://llm.example dark-mode-theme");
    }

    /// A value each parser refuses (`None`: it takes any text) and one it accepts.
    fn samples(parser: inputs::Parser) -> (Option<&'static str>, &'static str) {
        use inputs::Parser;
        match parser {
            Parser::Text => (None, "x"),
            Parser::Bool => (Some("yes"), "TRUE"),
            Parser::Millis => (Some("+5"), "0"),
            Parser::Count => (Some("4294967296"), "7"),
            Parser::Usd => (Some("$1"), "0.50"),
            Parser::Model => (Some("no-slash"), "a/b"),
            Parser::Version => (Some("1.18"), "1.2.3-rc1"),
            Parser::ResponseMode => (Some("slack"), "None"),
            Parser::AuthJson => (Some("{\"p\":\"not-an-object\"}"), "{}"),
            Parser::JsonObject => (Some("[1]"), "{}"),
            Parser::Handle => (Some("two words"), "bot"),
            Parser::SseMode => (Some("aes256"), "AES256"),
            Parser::ContextAuthors => (Some("everyone"), "ALL"),
            Parser::CommentMode => (Some("thread"), "Sticky"),
            Parser::Changes => (Some("push"), "OFF"),
            Parser::List => (None, "a, b"),
            Parser::AgentNetwork => (Some("closed"), "None"),
            Parser::ThreatCheck => (Some("loud"), "Warn"),
            Parser::Hosts => (
                Some("http://x.example"),
                "a.example, *.b.example, node, ::1",
            ),
            Parser::Ports => (Some("80,http"), "3000, 5432"),
            Parser::AgentIsolation => (Some("vm"), "Container"),
            Parser::Review => (Some("always"), "Auto"),
            Parser::ReviewEvents => (Some("COMMENT, MERGE"), "comment, approve"),
        }
    }

    #[test]
    fn a_choice_input_names_every_word_it_takes() {
        for (name, value, expected) in [
            ("comment-mode", "thread", "expected 'run' or 'sticky'"),
            (
                "agent-network",
                "closed",
                "expected 'allowlist', 'none' or 'open'",
            ),
            (
                "agent-isolation",
                "vm",
                "expected 'auto', 'container' or 'process'",
            ),
        ] {
            let Err(e) = parse(&[(name, value)]) else {
                panic!("{name}: {value} was taken")
            };
            let e = e.to_string();
            assert!(e.contains(expected), "{name}: {e}");
        }
    }

    #[test]
    fn every_input_is_read_with_the_parser_the_table_declares() {
        for spec in INPUTS {
            let (bad, good) = samples(spec.parser);
            // A bucket, so that `s3-backup: true` alone is valid.
            let with = |value: &str| parse(&[("s3-bucket", "b"), (spec.name, value)]);
            assert!(with(good).is_ok(), "{} refused {good:?}", spec.name);
            if let Some(bad) = bad {
                match with(bad) {
                    Err(ConfigError::Invalid { input, shown, .. }) => {
                        assert_eq!(input, spec.name, "{bad:?}");
                        assert_eq!(shown == "(hidden)", spec.secret, "{}: {shown}", spec.name);
                    }
                    other => panic!("{} took {bad:?}: {other:?}", spec.name),
                }
            }
        }
    }

    #[test]
    fn an_absent_input_means_the_tables_default() {
        let absent = format!("{:?}", parse(&[("s3-bucket", "b")]).unwrap());
        for spec in INPUTS {
            if let Some(default) = spec.default.value() {
                let given = parse(&[("s3-bucket", "b"), (spec.name, default)]).unwrap();
                assert_eq!(format!("{given:?}"), absent, "{}", spec.name);
            }
        }
    }

    #[test]
    fn every_secret_input_is_masked_whole() {
        let value = |spec: &InputSpec| match spec.parser {
            inputs::Parser::AuthJson => {
                "{\"zz\":{\"type\":\"api\",\"key\":\"k-secret-in-auth-json\"}}".to_string()
            }
            _ => format!("secret-value-of-{}", spec.name),
        };
        let secrets: Vec<_> = INPUTS.iter().filter(|s| s.secret).collect();
        assert!(!secrets.is_empty());
        let pairs: Vec<(&str, String)> = secrets.iter().map(|s| (s.name, value(s))).collect();
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        parse(&pairs).unwrap();
        for (name, v) in pairs {
            assert_eq!(crate::runner::log::redact(v), "***", "{name}");
        }
    }

    #[test]
    fn github_token_is_masked_and_hidden_from_debug() {
        let s = parse(&[("github-token", "ghs_tokenvalue123")]).unwrap();
        assert!(!format!("{s:?}").contains("ghs_tokenvalue123"));
        assert_eq!(crate::runner::log::redact("ghs_tokenvalue123"), "***");
    }
}
