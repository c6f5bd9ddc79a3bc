//! Every key and identity derived from the environment (docs/design.md#keys-and-identities). All of
//! it is a pure function of env values, so the main step and the post step derive the same keys.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::runner::env;
use crate::runner::Env;

/// The Actions cache rejects longer keys (counted in UTF-16 code units, as JavaScript does).
pub const MAX_CACHE_KEY_UNITS: usize = 512;
/// Room kept after the primary key for `-{runId}-{runAttempt}`: a u64 and a u32 in decimal.
const RUN_SUFFIX_UNITS: usize = 1 + 20 + 1 + 10;
/// The identity is shortened to this many units inside cache keys.
const IDENTITY_UNITS: usize = 128;
/// The primary key is bounded so that any save key built on it fits, whatever the run and job:
/// restore prefixes must not depend on the run id's length or the job.
const PRIMARY_UNITS: usize = MAX_CACHE_KEY_UNITS - RUN_SUFFIX_UNITS - 1 - IDENTITY_UNITS;
const KEY_PREFIX: &str = "opencode-storage-";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("{var} is not set; cache keys need it")]
    Missing { var: &'static str },
}

/// First 8 hex digits of sha256.
pub fn short_hash(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    hex::encode(&digest[..4])
}

/// The job-level component run id and attempt lack: sanitized `GITHUB_JOB`, plus `-m` and a
/// hash of the canonical matrix context for a matrix leg. `None` outside a runner.
pub fn invocation_identity(env: &Env, matrix_context: Option<&str>) -> Option<String> {
    let job = env.get(env::GITHUB_JOB)?;
    let job: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    match matrix_hash(matrix_context) {
        Some(hash) => Some(format!("{job}-m{hash}")),
        None => Some(job),
    }
}

/// `None` for a missing, blank, `null`, `{}`, `[]` or scalar matrix; the hash of the canonical
/// JSON for a non-empty object/array; the hash of the trimmed text when it is not JSON.
fn matrix_hash(matrix_context: Option<&str>) -> Option<String> {
    let raw = matrix_context.map(str::trim).filter(|s| !s.is_empty())?;
    match serde_json::from_str::<Value>(raw) {
        Ok(value @ Value::Object(_)) | Ok(value @ Value::Array(_)) => {
            let empty = match &value {
                Value::Object(m) => m.is_empty(),
                Value::Array(a) => a.is_empty(),
                _ => true,
            };
            if empty {
                None
            } else {
                Some(short_hash(canonical_json(&value).as_bytes()))
            }
        }
        Ok(_) => None,
        Err(_) => Some(short_hash(raw.as_bytes())),
    }
}

/// Keys sorted recursively, no whitespace, arrays in order, integral numbers as integers.
/// Written by hand because serde_json's map order depends on a crate feature anything in the
/// dependency tree may switch on.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => out.push_str(&value.to_string()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (None, Some(u), _) => out.push_str(&u.to_string()),
            // Integral floats print as integers (as JSON.stringify does below 1e21).
            // `+ 0.0` turns -0 into 0, as JSON.stringify prints it.
            (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e21 => {
                out.push_str(&format!("{:.0}", f + 0.0))
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
    }
}

fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// Shortens `s` to at most `max_units` UTF-16 units, replacing the tail with `-` and a hash of the
/// whole value so distinct long values stay distinct.
pub fn shorten(s: &str, max_units: usize) -> String {
    if utf16_len(s) <= max_units {
        return s.to_string();
    }
    let hash = short_hash(s.as_bytes());
    let budget = max_units.saturating_sub(hash.len() + 1);
    let mut units = 0;
    let head: String = s
        .chars()
        .take_while(|c| {
            units += c.len_utf16();
            units <= budget
        })
        .collect();
    format!("{head}-{hash}")
}

/// The cache service forbids `,` in keys.
fn clean(component: &str) -> String {
    component.replace(',', "-")
}

/// `GITHUB_REPOSITORY` with `/` → `-`, as every key spells the repository.
pub fn repo_slug(repository: &str) -> String {
    clean(&repository.replace('/', "-"))
}

/// The Actions cache keys and the run-scoped names built from the same env values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKeys {
    /// `opencode-storage-{repo}-{branch}-{os}`; never written itself.
    pub primary: String,
    repo_prefix: String,
    run_id: String,
    run_attempt: String,
    identity: Option<String>,
}

impl CacheKeys {
    pub fn from_env(env: &Env, identity: Option<&str>) -> Result<CacheKeys, KeyError> {
        let need = |var: &'static str| env.get(var).ok_or(KeyError::Missing { var });
        let repo = repo_slug(need(env::GITHUB_REPOSITORY)?);
        let branch = clean(need(env::GITHUB_REF_NAME)?);
        let os = clean(need(env::RUNNER_OS)?);
        let run_id = clean(need(env::GITHUB_RUN_ID)?);
        let run_attempt = clean(need(env::GITHUB_RUN_ATTEMPT)?);

        // Fit the primary key by shortening the branch first (the usual culprit), then the repo.
        let fixed = utf16_len(KEY_PREFIX) + 2 + utf16_len(&os);
        let repo = shorten(&repo, PRIMARY_UNITS.saturating_sub(fixed + 16));
        let branch = shorten(
            &branch,
            PRIMARY_UNITS.saturating_sub(fixed + utf16_len(&repo)),
        );
        let primary = format!("{KEY_PREFIX}{repo}-{branch}-{os}");
        Ok(CacheKeys {
            primary,
            repo_prefix: format!("{KEY_PREFIX}{repo}-"),
            run_id: shorten(&run_id, 20),
            run_attempt: shorten(&run_attempt, 10),
            identity: identity.map(|i| shorten(&clean(i), IDENTITY_UNITS)),
        })
    }

    /// Restore prefixes, most specific first: this branch, then any branch of the repository.
    pub fn restore_prefixes(&self) -> [String; 2] {
        [format!("{}-", self.primary), self.repo_prefix.clone()]
    }

    /// `{primary}-{runId}-{runAttempt}[-{identity}]`: unique per attempt and job.
    pub fn save_key(&self) -> String {
        format!("{}-{}", self.primary, self.run_key())
    }

    /// `{runId}-{runAttempt}[-{identity}]`, e.g. for object-store metadata keys.
    pub fn run_key(&self) -> String {
        match &self.identity {
            Some(id) => format!("{}-{}-{id}", self.run_id, self.run_attempt),
            None => format!("{}-{}", self.run_id, self.run_attempt),
        }
    }

    /// `action:{runId}:{runAttempt}[:{identity}]`, the lease holder.
    pub fn holder_id(&self) -> String {
        match &self.identity {
            Some(id) => format!("action:{}:{}:{id}", self.run_id, self.run_attempt),
            None => format!("action:{}:{}", self.run_id, self.run_attempt),
        }
    }
}

/// Which OpenCode session a run continues.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogicalKey(String);

impl LogicalKey {
    pub fn issue(n: u64) -> Self {
        Self(format!("issue-{n}"))
    }

    pub fn pull_request(n: u64) -> Self {
        Self(format!("pr-{n}"))
    }

    pub fn discussion(n: u64) -> Self {
        Self(format!("discussion-{n}"))
    }

    /// Run-scoped: each scheduled run starts a fresh thread; re-runs of it resume it.
    pub fn schedule(cron: &str, run_id: &str, identity: Option<&str>) -> Self {
        let hash = short_hash(cron.as_bytes());
        Self(with_identity(format!("schedule-{hash}-{run_id}"), identity))
    }

    pub fn dispatch(run_id: &str, identity: Option<&str>) -> Self {
        Self(with_identity(format!("dispatch-{run_id}"), identity))
    }

    /// For `fro-bot local` (docs/design.md#local-runs).
    pub fn local(thread: &str) -> Self {
        Self(format!("local-{thread}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The OpenCode session title that marks this key.
    pub fn session_title(&self) -> String {
        format!("fro-bot: {}", self.0)
    }
}

impl std::fmt::Display for LogicalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn with_identity(key: String, identity: Option<&str>) -> String {
    match identity {
        Some(id) => format!("{key}-{id}"),
        None => key,
    }
}

/// The entity a dedup sentinel is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupEntity {
    Issue(u64),
    PullRequest(u64),
}

impl DedupEntity {
    /// `issue-{n}` / `pr-{n}`, also recorded inside the sentinel.
    pub fn label(self) -> String {
        match self {
            DedupEntity::Issue(n) => format!("issue-{n}"),
            DedupEntity::PullRequest(n) => format!("pr-{n}"),
        }
    }

    /// `fro-bot-dedup-v1-{repo}-{pr|issue}-{n}-`: the restore prefix.
    pub fn sentinel_prefix(self, repository: &str) -> String {
        format!(
            "fro-bot-dedup-v1-{}-{}-",
            repo_slug(repository),
            self.label()
        )
    }

    /// `fro-bot-dedup-v1-{repo}-{pr|issue}-{n}-{runId}`: the save key.
    pub fn sentinel_key(self, repository: &str, run_id: &str) -> String {
        format!("{}{}", self.sentinel_prefix(repository), clean(run_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs.iter().copied())
    }

    /// sha256 hex prefix, computed independently of `short_hash` by the sha2 crate directly.
    fn h8(s: &str) -> String {
        let d = Sha256::digest(s.as_bytes());
        format!("{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3])
    }

    #[test]
    fn vectors_computed_with_sha256sum() {
        // `printf '%s' '<canonical>' | sha256sum | cut -c1-8`, computed outside this code.
        let e = env(&[("GITHUB_JOB", "agent")]);
        assert_eq!(
            invocation_identity(&e, Some(r#"{ "os": "ubuntu-latest", "node": 20.0 }"#)).as_deref(),
            Some("agent-m91ee8fe9")
        );
        assert_eq!(
            invocation_identity(
                &e,
                Some(r#"{"z":{"b":[3,1,{"y":1,"x":2}],"a":null},"a":false}"#)
            )
            .as_deref(),
            Some("agent-m868cc9de")
        );
        assert_eq!(
            invocation_identity(&e, Some(" os=linux, node=20 ")).as_deref(),
            Some("agent-m8160a9b7")
        );
        assert_eq!(
            invocation_identity(&e, Some("[2, 1]")).as_deref(),
            Some("agent-maf1a1fc1")
        );
        assert_eq!(
            LogicalKey::schedule("30 5 * * 1-5", "77", Some("agent")).as_str(),
            "schedule-2b51d4e3-77-agent"
        );
    }

    #[test]
    fn short_hash_is_the_sha256_prefix() {
        // sha256("abc") = ba7816bf 8f01cfea ... (FIPS 180-2 test vector).
        assert_eq!(short_hash(b"abc"), "ba7816bf");
        // sha256("") = e3b0c442 98fc1c14 ...
        assert_eq!(short_hash(b""), "e3b0c442");
    }

    #[test]
    fn identity_is_the_sanitized_job() {
        let e = env(&[("GITHUB_JOB", "  build & test/linux  ")]);
        assert_eq!(
            invocation_identity(&e, None).as_deref(),
            Some("build---test-linux")
        );
        let e = env(&[("GITHUB_JOB", "a_b.c-D9")]);
        assert_eq!(invocation_identity(&e, None).as_deref(), Some("a_b.c-D9"));
        // Non-ASCII letters are outside the allowed set.
        let e = env(&[("GITHUB_JOB", "jöb")]);
        assert_eq!(invocation_identity(&e, None).as_deref(), Some("j-b"));
    }

    #[test]
    fn identity_is_none_without_a_job() {
        assert_eq!(
            invocation_identity(&env(&[]), Some(r#"{"os":"linux"}"#)),
            None
        );
        assert_eq!(
            invocation_identity(&env(&[("GITHUB_JOB", "   ")]), None),
            None
        );
    }

    #[test]
    fn empty_matrices_add_nothing() {
        let e = env(&[("GITHUB_JOB", "agent")]);
        for m in [
            "", "   ", "null", "{}", "[]", " { } ", "\"str\"", "5", "true",
        ] {
            assert_eq!(
                invocation_identity(&e, Some(m)).as_deref(),
                Some("agent"),
                "matrix {m:?}"
            );
        }
    }

    #[test]
    fn matrix_hash_uses_canonical_json() {
        let e = env(&[("GITHUB_JOB", "agent")]);
        let expected = format!("agent-m{}", h8(r#"{"node":20,"os":"ubuntu-latest"}"#));
        // Key order and whitespace (toJSON pretty-prints) do not matter.
        let pretty = "{\n  \"os\": \"ubuntu-latest\",\n  \"node\": 20\n}";
        assert_eq!(
            invocation_identity(&e, Some(pretty)),
            Some(expected.clone())
        );
        assert_eq!(
            invocation_identity(&e, Some(r#"{"node":20,"os":"ubuntu-latest"}"#)),
            Some(expected.clone())
        );
        // Integral floats hash as integers.
        assert_eq!(
            invocation_identity(&e, Some(r#"{"os":"ubuntu-latest","node":20.0}"#)),
            Some(expected)
        );
        // -0.0 and a large integral float print as integers.
        assert_eq!(
            invocation_identity(&e, Some(r#"[-0.0, 1e20]"#)),
            Some(format!("agent-m{}", h8("[0,100000000000000000000]")))
        );
        // A fractional float keeps its fraction.
        assert_eq!(
            invocation_identity(&e, Some(r#"{"v":1.5}"#)),
            Some(format!("agent-m{}", h8(r#"{"v":1.5}"#)))
        );
    }

    #[test]
    fn nested_keys_are_sorted_and_arrays_keep_order() {
        let e = env(&[("GITHUB_JOB", "j")]);
        let m = r#"{"z":{"b":[3,1,{"y":1,"x":2}],"a":null},"a":false}"#;
        let canonical = r#"{"a":false,"z":{"a":null,"b":[3,1,{"x":2,"y":1}]}}"#;
        assert_eq!(
            invocation_identity(&e, Some(m)),
            Some(format!("j-m{}", h8(canonical)))
        );
        let arr = r#"[ 2, 1 ]"#;
        assert_eq!(
            invocation_identity(&e, Some(arr)),
            Some(format!("j-m{}", h8("[2,1]")))
        );
    }

    #[test]
    fn non_json_matrix_hashes_the_trimmed_text() {
        let e = env(&[("GITHUB_JOB", "j")]);
        assert_eq!(
            invocation_identity(&e, Some("  os=linux, node=20 ")),
            Some(format!("j-m{}", h8("os=linux, node=20")))
        );
    }

    fn base_env() -> Env {
        env(&[
            ("GITHUB_REPOSITORY", "octo-org/hello-world"),
            ("GITHUB_REF_NAME", "main"),
            ("RUNNER_OS", "Linux"),
            ("GITHUB_RUN_ID", "1234567890"),
            ("GITHUB_RUN_ATTEMPT", "2"),
        ])
    }

    #[test]
    fn cache_keys_follow_the_layout() {
        let keys = CacheKeys::from_env(&base_env(), Some("agent-m0badc0de")).unwrap();
        assert_eq!(
            keys.primary,
            "opencode-storage-octo-org-hello-world-main-Linux"
        );
        assert_eq!(
            keys.restore_prefixes(),
            [
                "opencode-storage-octo-org-hello-world-main-Linux-".to_string(),
                "opencode-storage-octo-org-hello-world-".to_string()
            ]
        );
        assert_eq!(
            keys.save_key(),
            "opencode-storage-octo-org-hello-world-main-Linux-1234567890-2-agent-m0badc0de"
        );
        assert_eq!(keys.run_key(), "1234567890-2-agent-m0badc0de");
        assert_eq!(keys.holder_id(), "action:1234567890:2:agent-m0badc0de");

        let keys = CacheKeys::from_env(&base_env(), None).unwrap();
        assert_eq!(
            keys.save_key(),
            "opencode-storage-octo-org-hello-world-main-Linux-1234567890-2"
        );
        assert_eq!(keys.run_key(), "1234567890-2");
        assert_eq!(keys.holder_id(), "action:1234567890:2");
    }

    #[test]
    fn commas_are_replaced_and_missing_vars_named() {
        let mut e = base_env();
        e.set("GITHUB_REF_NAME", "feat,x");
        let keys = CacheKeys::from_env(&e, None).unwrap();
        assert_eq!(
            keys.primary,
            "opencode-storage-octo-org-hello-world-feat-x-Linux"
        );
        e.remove("RUNNER_OS");
        assert_eq!(
            CacheKeys::from_env(&e, None),
            Err(KeyError::Missing { var: "RUNNER_OS" })
        );
    }

    #[test]
    fn long_branches_are_shortened_with_a_hash_and_keys_fit() {
        let mut e = base_env();
        // Astral-plane chars count two UTF-16 units each.
        let branch = format!("feature/{}", "🦀".repeat(400));
        e.set("GITHUB_REF_NAME", &branch);
        e.set("GITHUB_RUN_ID", "18446744073709551615");
        e.set("GITHUB_RUN_ATTEMPT", "4294967295");
        let identity = "j".repeat(300);
        let keys = CacheKeys::from_env(&e, Some(&identity)).unwrap();
        let save = keys.save_key();
        assert!(utf16_len(&save) <= 512, "{} units", utf16_len(&save));
        assert!(keys
            .primary
            .starts_with("opencode-storage-octo-org-hello-world-feature/"));
        assert!(keys.primary.ends_with(&format!("-{}-Linux", h8(&branch))));
        // Deterministic, and independent of run id and identity (restore prefixes must match
        // across runs and jobs).
        let mut other = e.clone();
        other.set("GITHUB_RUN_ID", "7");
        let again = CacheKeys::from_env(&other, None).unwrap();
        assert_eq!(again.primary, keys.primary);
        assert!(save.starts_with(&again.restore_prefixes()[0]));
        // Two long branches that share a head stay distinct.
        let mut e2 = e.clone();
        e2.set("GITHUB_REF_NAME", format!("{branch}x"));
        assert_ne!(
            CacheKeys::from_env(&e2, None).unwrap().primary,
            keys.primary
        );
    }

    #[test]
    fn logical_keys_and_titles() {
        assert_eq!(LogicalKey::issue(42).as_str(), "issue-42");
        assert_eq!(LogicalKey::pull_request(7).as_str(), "pr-7");
        assert_eq!(
            LogicalKey::discussion(3).session_title(),
            "fro-bot: discussion-3"
        );
        let cron = "30 5 * * 1-5";
        assert_eq!(
            LogicalKey::schedule(cron, "99", Some("nightly")).as_str(),
            format!("schedule-{}-99-nightly", h8(cron))
        );
        assert_eq!(
            LogicalKey::schedule(cron, "99", None).as_str(),
            format!("schedule-{}-99", h8(cron))
        );
        assert_eq!(
            LogicalKey::dispatch("99", Some("j")).as_str(),
            "dispatch-99-j"
        );
        assert_eq!(LogicalKey::dispatch("99", None).as_str(), "dispatch-99");
    }

    #[test]
    fn dedup_sentinel_keys() {
        let e = DedupEntity::PullRequest(12);
        assert_eq!(e.sentinel_prefix("o/r"), "fro-bot-dedup-v1-o-r-pr-12-");
        assert_eq!(
            e.sentinel_key("o/r", "555"),
            "fro-bot-dedup-v1-o-r-pr-12-555"
        );
        assert_eq!(
            DedupEntity::Issue(3).sentinel_prefix("o/r"),
            "fro-bot-dedup-v1-o-r-issue-3-"
        );
    }
}
