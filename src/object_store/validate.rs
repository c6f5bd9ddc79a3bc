//! Validation of every `s3-*` input and of every key component and local path the store touches.
//! One module so the rules (docs/design.md#object-store) can be read, and table-tested, in one
//! place.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};

use url::{Host, Url};

use crate::config::inputs as input;
use crate::config::{S3Input, SseMode};

/// An invalid `s3-*` input, a bad key component or an escaping local path. `input` names the
/// action input (or `key`/`path` for internal values); `reason` says what is wrong and never
/// contains credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("input '{input}' is invalid: {reason}")]
    Invalid { input: &'static str, reason: String },
}

fn invalid(input: &'static str, reason: impl Into<String>) -> ValidationError {
    ValidationError::Invalid {
        input,
        reason: reason.into(),
    }
}

/// Internal (non-input) names used in [`ValidationError`].
pub const KEY_COMPONENT: &str = "key component";
pub const LOCAL_PATH: &str = "local path";

/// Validated object-store settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    pub bucket: String,
    pub region: String,
    /// A custom (non-AWS) endpoint; `None` = real AWS S3.
    pub endpoint: Option<Url>,
    pub prefix: String,
    pub expected_bucket_owner: Option<String>,
    /// Effective server-side encryption.
    pub sse: SseMode,
    /// Only present when `sse` is `aws:kms`.
    pub sse_kms_key_id: Option<String>,
}

impl StoreSettings {
    /// Validates the raw inputs. The region falls back to `AWS_REGION` / `AWS_DEFAULT_REGION`
    /// (the order aws-config's environment provider uses).
    pub fn from_input(
        input: &S3Input,
        env: &crate::runner::Env,
    ) -> Result<StoreSettings, ValidationError> {
        let region = env
            .get(crate::runner::env::AWS_REGION)
            .or(env.get(crate::runner::env::AWS_DEFAULT_REGION));
        Self::from_input_with_env_region(input, region)
    }

    /// [`Self::from_input`] with the environment's region passed in (tests).
    pub fn from_input_with_env_region(
        s3: &S3Input,
        env_region: Option<&str>,
    ) -> Result<StoreSettings, ValidationError> {
        let bucket = validate_bucket(&s3.bucket)?;
        let prefix = validate_prefix(&s3.prefix)?;
        let endpoint = s3
            .endpoint
            .as_deref()
            .map(|e| validate_endpoint(e, s3.allow_insecure_endpoint))
            .transpose()?;
        let expected_bucket_owner = s3
            .expected_bucket_owner
            .as_deref()
            .map(validate_bucket_owner)
            .transpose()?;
        let sse = match (s3.sse_encryption, &endpoint) {
            (Some(mode), _) => mode,
            // Most S3-compatible servers do not run a KMS; AES256 is what they accept.
            (None, Some(_)) => SseMode::Aes256,
            (None, None) => SseMode::AwsKms,
        };
        let sse_kms_key_id = validate_kms_key_id(s3.sse_kms_key_id.as_deref(), sse)?;
        let region = match (
            non_empty(s3.region.as_deref()),
            non_empty(env_region),
            &endpoint,
        ) {
            (Some(r), _, _) | (None, Some(r), _) => validate_region(r)?,
            (None, None, Some(_)) => "us-east-1".to_string(),
            (None, None, None) => {
                return Err(invalid(
                    input::AWS_REGION.name,
                    format!(
                        "no region: set '{}' or {} for AWS S3",
                        input::AWS_REGION.name,
                        crate::runner::env::AWS_REGION
                    ),
                ))
            }
        };
        Ok(StoreSettings {
            bucket,
            region,
            endpoint,
            prefix,
            expected_bucket_owner,
            sse,
            sse_kms_key_id,
        })
    }
}

fn non_empty(v: Option<&str>) -> Option<&str> {
    v.map(str::trim).filter(|v| !v.is_empty())
}

fn validate_bucket(bucket: &str) -> Result<String, ValidationError> {
    let b = bucket.trim();
    if b.is_empty() {
        return Err(invalid(input::S3_BUCKET.name, "must not be empty"));
    }
    let ok = b.len() <= 255
        && b.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !ok {
        return Err(invalid(
            input::S3_BUCKET.name,
            format!("{b:?} is not a bucket name (letters, digits, '.', '-', '_')"),
        ));
    }
    Ok(b.to_string())
}

fn validate_region(region: &str) -> Result<String, ValidationError> {
    let ok = region.len() <= 64
        && region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(region.to_string())
    } else {
        Err(invalid(
            input::AWS_REGION.name,
            format!("{region:?} is not a region name"),
        ))
    }
}

/// `^[0-9A-Za-z][\w.-]{0,63}$`, one segment, no `..`.
pub fn validate_prefix(prefix: &str) -> Result<String, ValidationError> {
    let p = prefix.trim();
    let expected = "expected one path segment: a letter or digit, then up to 63 of letters, digits, '_', '.', '-'";
    let mut chars = p.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if p.is_empty() {
        return Err(invalid(input::S3_PREFIX.name, "must not be empty"));
    }
    if !first_ok || !rest_ok || p.len() > 64 {
        return Err(invalid(input::S3_PREFIX.name, format!("{p:?}: {expected}")));
    }
    if p.contains("..") {
        return Err(invalid(
            input::S3_PREFIX.name,
            format!("{p:?} contains '..'"),
        ));
    }
    Ok(p.to_string())
}

/// Makes one key component safe: rejects NUL and `..`, strips control characters, turns `/` and
/// `\` into `-`, and rejects what is left empty.
pub fn sanitize_key_component(raw: &str) -> Result<String, ValidationError> {
    if raw.contains('\0') {
        return Err(invalid(KEY_COMPONENT, "contains a NUL byte"));
    }
    if raw.contains("..") {
        return Err(invalid(KEY_COMPONENT, format!("{raw:?} contains '..'")));
    }
    let out: String = raw
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| if c == '/' || c == '\\' { '-' } else { c })
        .collect();
    if out.trim().is_empty() {
        return Err(invalid(KEY_COMPONENT, "is empty"));
    }
    Ok(out)
}

/// Joins a relative path under `base`, refusing anything that could land outside it (absolute
/// paths, `..`, prefixes). Does not touch the filesystem.
pub fn confine_path(base: &Path, relative: &str) -> Result<PathBuf, ValidationError> {
    if relative.is_empty() || relative.contains('\0') {
        return Err(invalid(LOCAL_PATH, "empty or contains NUL"));
    }
    let rel = Path::new(relative);
    let mut out = base.to_path_buf();
    let mut depth = 0usize;
    for comp in rel.components() {
        match comp {
            Component::Normal(part) => {
                out.push(part);
                depth += 1;
            }
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(
                    LOCAL_PATH,
                    format!("{relative:?} escapes the target directory"),
                ))
            }
        }
    }
    if depth == 0 {
        return Err(invalid(LOCAL_PATH, format!("{relative:?} names no file")));
    }
    Ok(out)
}

/// Exactly 12 digits (an AWS account id).
pub fn validate_bucket_owner(owner: &str) -> Result<String, ValidationError> {
    let o = owner.trim();
    if o.len() == 12 && o.bytes().all(|b| b.is_ascii_digit()) {
        Ok(o.to_string())
    } else {
        Err(invalid(
            input::S3_EXPECTED_BUCKET_OWNER.name,
            format!("{o:?} is not a 12-digit AWS account id"),
        ))
    }
}

/// A KMS key id is only meaningful (and only sent) with `aws:kms`.
pub fn validate_kms_key_id(
    key_id: Option<&str>,
    effective_sse: SseMode,
) -> Result<Option<String>, ValidationError> {
    match (non_empty(key_id), effective_sse) {
        (None, _) => Ok(None),
        (Some(k), SseMode::AwsKms) => Ok(Some(k.to_string())),
        (Some(_), SseMode::Aes256) => Err(invalid(
            input::S3_SSE_KMS_KEY_ID.name,
            "a KMS key id requires s3-sse-encryption 'aws:kms' (the effective value is 'AES256')",
        )),
    }
}

/// Why an endpoint host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostClass {
    /// Fine to contact.
    Public,
    /// Local or non-routable; allowed only with `s3-allow-insecure-endpoint`.
    Restricted(&'static str),
    /// Cloud metadata services: never contacted.
    Blocked(&'static str),
}

/// Parses and classifies an endpoint URL (docs/design.md#object-store).
pub fn validate_endpoint(raw: &str, allow_insecure: bool) -> Result<Url, ValidationError> {
    let e = |reason: String| invalid(input::S3_ENDPOINT.name, reason);
    let url = Url::parse(raw.trim()).map_err(|err| e(format!("does not parse as a URL: {err}")))?;
    // Checked before anything echoes the URL: it may carry a password.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(e(
            "must not embed credentials (user:password@); use the AWS credential chain".into(),
        ));
    }
    match url.scheme() {
        "https" => {}
        "http" if allow_insecure => {}
        "http" => {
            return Err(e(format!(
                "{url} uses http; use https or set s3-allow-insecure-endpoint"
            )))
        }
        other => return Err(e(format!("scheme {other:?} is not http(s)"))),
    }
    let class = match url.host() {
        None => return Err(e("has no host".into())),
        Some(Host::Ipv4(v4)) => classify_ipv4(v4),
        Some(Host::Ipv6(v6)) => classify_ipv6(v6),
        Some(Host::Domain(d)) => classify_domain(d),
    };
    match class {
        HostClass::Public => Ok(url),
        HostClass::Restricted(_) if allow_insecure => Ok(url),
        HostClass::Restricted(why) => Err(e(format!(
            "host {} is {why}; set s3-allow-insecure-endpoint to allow it",
            url.host_str().unwrap_or_default()
        ))),
        HostClass::Blocked(why) => Err(e(format!(
            "host {} is {why} and is never allowed",
            url.host_str().unwrap_or_default()
        ))),
    }
}

/// Classifies a host name as written (brackets and one trailing dot are stripped first).
pub fn classify_host(host: &str) -> HostClass {
    let h = host.trim();
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    classify_domain(h)
}

fn classify_domain(domain: &str) -> HostClass {
    let d = domain
        .strip_suffix('.')
        .unwrap_or(domain)
        .to_ascii_lowercase();
    if let Ok(ip) = d.parse::<IpAddr>() {
        return classify_ip(ip);
    }
    if d == "metadata.google.internal" {
        return HostClass::Blocked("a cloud metadata service");
    }
    if d == "localhost" || d.ends_with(".localhost") {
        return HostClass::Restricted("a loopback name");
    }
    HostClass::Public
}

pub fn classify_ip(ip: IpAddr) -> HostClass {
    match ip {
        IpAddr::V4(v4) => classify_ipv4(v4),
        IpAddr::V6(v6) => classify_ipv6(v6),
    }
}

const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

fn in_v4(ip: Ipv4Addr, net: [u8; 4], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_ipv4(ip: Ipv4Addr) -> HostClass {
    if METADATA_V4.contains(&ip) {
        return HostClass::Blocked("a cloud metadata address");
    }
    let restricted: [([u8; 4], u32, &'static str); 10] = [
        ([0, 0, 0, 0], 8, "an unspecified address"),
        ([127, 0, 0, 0], 8, "a loopback address"),
        ([10, 0, 0, 0], 8, "a private address"),
        ([172, 16, 0, 0], 12, "a private address"),
        ([192, 168, 0, 0], 16, "a private address"),
        ([169, 254, 0, 0], 16, "a link-local address"),
        ([100, 64, 0, 0], 10, "a carrier-grade NAT address"),
        ([192, 0, 2, 0], 24, "a documentation address"),
        ([198, 51, 100, 0], 24, "a documentation address"),
        ([203, 0, 113, 0], 24, "a documentation address"),
    ];
    restricted
        .iter()
        .find(|(net, bits, _)| in_v4(ip, *net, *bits))
        .map_or(HostClass::Public, |(_, _, why)| HostClass::Restricted(why))
}

/// The IPv4 address an IPv6 address carries, for the forms that route to it: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), SIIT-translated (`::ffff:0:a.b.c.d`), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002:AABB:CCDD::/48`).
fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = Ipv4Addr::new(
        (s[6] >> 8) as u8,
        (s[6] & 0xff) as u8,
        (s[7] >> 8) as u8,
        (s[7] & 0xff) as u8,
    );
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(tail),
        [0, 0, 0, 0, 0, 0, _, _] => Some(tail),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        [0x64, 0xff9b, 1, ..] => Some(tail),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            (hi & 0xff) as u8,
            (lo >> 8) as u8,
            (lo & 0xff) as u8,
        )),
        _ => None,
    }
}

fn classify_ipv6(ip: Ipv6Addr) -> HostClass {
    if ip == METADATA_V6 {
        return HostClass::Blocked("a cloud metadata address");
    }
    if ip.is_unspecified() {
        return HostClass::Restricted("an unspecified address");
    }
    if ip.is_loopback() {
        return HostClass::Restricted("a loopback address");
    }
    if let Some(v4) = embedded_ipv4(ip) {
        return classify_ipv4(v4);
    }
    let s = ip.segments();
    if s[0] & 0xfe00 == 0xfc00 {
        return HostClass::Restricted("a unique-local address");
    }
    if s[0] & 0xffc0 == 0xfe80 {
        return HostClass::Restricted("a link-local address");
    }
    if s[0] == 0x2001 && s[1] == 0x0db8 {
        return HostClass::Restricted("a documentation address");
    }
    HostClass::Public
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Want {
        Ok,
        /// Refused without the insecure flag, accepted with it.
        NeedsFlag,
        /// Refused with and without the flag.
        Never,
    }

    #[test]
    fn endpoint_classifier_table() {
        use Want::*;
        let cases: &[(&str, Want)] = &[
            // Public hosts.
            ("https://s3.amazonaws.com", Ok),
            ("https://s3.eu-west-1.amazonaws.com/", Ok),
            ("https://abc.r2.cloudflarestorage.com", Ok),
            ("https://s3.us-west-002.backblazeb2.com", Ok),
            ("https://8.8.8.8", Ok),
            ("https://[2606:4700::1111]", Ok),
            ("https://minio.example.com:9000", Ok),
            ("https://example.com.", Ok),
            ("https://[::ffff:8.8.8.8]", Ok),
            ("https://[64:ff9b::808:808]", Ok),
            ("https://100.63.255.255", Ok),
            ("https://100.128.0.1", Ok),
            ("https://172.32.0.1", Ok),
            ("https://notlocalhost.com", Ok),
            // Plain http needs the flag even for a public host.
            ("http://s3.amazonaws.com", NeedsFlag),
            // Loopback, private and friends: the flag lifts them.
            ("https://localhost:9000", NeedsFlag),
            ("https://LOCALHOST.", NeedsFlag),
            ("https://minio.localhost", NeedsFlag),
            ("http://127.0.0.1:8333", NeedsFlag),
            ("https://127.1.2.3", NeedsFlag),
            ("https://127.0.0.1.", NeedsFlag),
            ("https://2130706433", NeedsFlag),
            ("https://10.0.0.5", NeedsFlag),
            ("https://172.16.3.4", NeedsFlag),
            ("https://172.31.255.255", NeedsFlag),
            ("https://192.168.1.1", NeedsFlag),
            ("https://169.254.1.1", NeedsFlag),
            ("https://0.0.0.0", NeedsFlag),
            ("https://0.1.2.3", NeedsFlag),
            ("https://100.64.0.1", NeedsFlag),
            ("https://100.127.255.254", NeedsFlag),
            ("https://192.0.2.10", NeedsFlag),
            ("https://198.51.100.7", NeedsFlag),
            ("https://203.0.113.9", NeedsFlag),
            ("https://[::1]", NeedsFlag),
            ("https://[::]", NeedsFlag),
            ("https://[fc00::1]", NeedsFlag),
            ("https://[fd12:3456::1]", NeedsFlag),
            ("https://[fe80::1]", NeedsFlag),
            ("https://[2001:db8::1]", NeedsFlag),
            ("https://[::ffff:127.0.0.1]", NeedsFlag),
            ("https://[::ffff:10.1.2.3]", NeedsFlag),
            ("https://[::ffff:0:192.168.0.1]", NeedsFlag),
            ("https://[::127.0.0.1]", NeedsFlag),
            ("https://[64:ff9b::a00:1]", NeedsFlag),
            ("https://[64:ff9b:1::c0a8:1]", NeedsFlag),
            ("https://[2002:c0a8:101::1]", NeedsFlag),
            // Metadata services: never, flag or not.
            ("http://169.254.169.254", Never),
            ("https://169.254.169.254/latest/meta-data", Never),
            ("https://169.254.170.2", Never),
            ("https://100.100.100.200", Never),
            ("https://[fd00:ec2::254]", Never),
            ("https://[::ffff:169.254.169.254]", Never),
            ("https://[::ffff:a9fe:a9fe]", Never),
            ("https://[64:ff9b::a9fe:a9fe]", Never),
            ("https://[::ffff:100.100.100.200]", Never),
            ("https://[::ffff:169.254.170.2]", Never),
            ("https://metadata.google.internal", Never),
            ("https://METADATA.google.internal.", Never),
            ("https://2852039166", Never),
            // Malformed or unsafe URLs.
            ("https://user:pass@s3.amazonaws.com", Never),
            ("https://user@s3.amazonaws.com", Never),
            ("http://user:pass@127.0.0.1:9000", Never),
            ("ftp://s3.amazonaws.com", Never),
            ("file:///etc/passwd", Never),
            ("not a url", Never),
            ("s3.amazonaws.com", Never),
            ("", Never),
        ];
        assert!(cases.len() >= 40);
        for (raw, want) in cases {
            let strict = validate_endpoint(raw, false);
            let lax = validate_endpoint(raw, true);
            let got = match (strict.is_ok(), lax.is_ok()) {
                (true, true) => Want::Ok,
                (false, true) => Want::NeedsFlag,
                (false, false) => Want::Never,
                (true, false) => panic!("{raw}: the flag made it stricter"),
            };
            assert_eq!(got, *want, "{raw}: strict={strict:?} lax={lax:?}");
            if let Err(ValidationError::Invalid { input, reason }) = strict {
                assert_eq!(input, "s3-endpoint");
                assert!(
                    !reason.contains(":pass@"),
                    "{raw}: leaks userinfo: {reason}"
                );
            }
        }
    }

    #[test]
    fn classify_host_strips_brackets_and_one_dot() {
        assert_eq!(
            classify_host("[fd00:ec2::254]"),
            HostClass::Blocked("a cloud metadata address")
        );
        assert_eq!(
            classify_host("localhost."),
            HostClass::Restricted("a loopback name")
        );
        assert_eq!(classify_host("localhost.."), HostClass::Public);
        assert_eq!(
            classify_host("169.254.169.254."),
            HostClass::Blocked("a cloud metadata address")
        );
    }

    #[test]
    fn prefix_table() {
        let ok = [
            "fro-bot-state",
            "a",
            "A1",
            "0_x.y-z",
            " padded ",
            &"a".repeat(64),
        ];
        for p in ok {
            assert_eq!(validate_prefix(p), Result::Ok(p.trim().to_string()), "{p}");
        }
        let bad = [
            "",
            "   ",
            "-lead",
            "_lead",
            ".lead",
            "a/b",
            "a\\b",
            "a..b",
            "a b",
            "ä",
            "a\0",
            &"a".repeat(65),
        ];
        for p in bad {
            assert!(
                matches!(
                    validate_prefix(p),
                    Err(ValidationError::Invalid {
                        input: "s3-prefix",
                        ..
                    })
                ),
                "{p:?}"
            );
        }
    }

    #[test]
    fn key_component_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("octo", Some("octo")),
            ("my.repo-1", Some("my.repo-1")),
            ("a/b", Some("a-b")),
            ("a\\b", Some("a-b")),
            ("tab\there", Some("tabhere")),
            ("new\nline\r", Some("newline")),
            ("\u{7f}x", Some("x")),
            ("123-1-job-m0abc", Some("123-1-job-m0abc")),
            ("..", None),
            ("a..b", None),
            ("../etc", None),
            ("nul\0", None),
            ("", None),
            ("\n\t", None),
            (" ", None),
        ];
        for (raw, want) in cases {
            assert_eq!(
                sanitize_key_component(raw).ok().as_deref(),
                *want,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn confine_path_table() {
        let base = Path::new("/data/opencode");
        let ok = [
            ("opencode.db", "/data/opencode/opencode.db"),
            ("log/a.log", "/data/opencode/log/a.log"),
            ("./x", "/data/opencode/x"),
        ];
        for (rel, want) in ok {
            assert_eq!(confine_path(base, rel).unwrap(), PathBuf::from(want));
        }
        for rel in ["", ".", "../x", "a/../../x", "/etc/passwd", "a/..", "x\0"] {
            assert!(confine_path(base, rel).is_err(), "{rel:?}");
        }
    }

    #[test]
    fn bucket_owner_table() {
        assert!(validate_bucket_owner("123456789012").is_ok());
        for bad in [
            "",
            "12345678901",
            "1234567890123",
            "12345678901a",
            "-12345678901",
            "１２３４５６７８９０１２",
        ] {
            assert!(validate_bucket_owner(bad).is_err(), "{bad:?}");
        }
    }

    fn base_input() -> S3Input {
        S3Input {
            bucket: "my-bucket".into(),
            prefix: "fro-bot-state".into(),
            ..S3Input::default()
        }
    }

    #[test]
    fn sse_region_and_kms_table() {
        // (endpoint, configured sse, kms key, input region, env region) → (sse, region) or error input
        type Case = (
            Option<&'static str>,
            Option<SseMode>,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            Result<(SseMode, &'static str), &'static str>,
        );
        let custom = Some("https://s3.example.com");
        let cases: &[Case] = &[
            (
                None,
                None,
                None,
                Some("eu-west-1"),
                None,
                Ok((SseMode::AwsKms, "eu-west-1")),
            ),
            (
                None,
                None,
                None,
                None,
                Some("us-west-2"),
                Ok((SseMode::AwsKms, "us-west-2")),
            ),
            (
                None,
                None,
                None,
                Some("eu-west-1"),
                Some("us-west-2"),
                Ok((SseMode::AwsKms, "eu-west-1")),
            ),
            (None, None, None, None, None, Err("aws-region")),
            (
                custom,
                None,
                None,
                None,
                None,
                Ok((SseMode::Aes256, "us-east-1")),
            ),
            (
                custom,
                None,
                None,
                None,
                Some("auto"),
                Ok((SseMode::Aes256, "auto")),
            ),
            (
                custom,
                Some(SseMode::AwsKms),
                Some("key-1"),
                None,
                None,
                Ok((SseMode::AwsKms, "us-east-1")),
            ),
            (
                None,
                Some(SseMode::Aes256),
                None,
                Some("eu-west-1"),
                None,
                Ok((SseMode::Aes256, "eu-west-1")),
            ),
            (
                None,
                None,
                Some("arn:aws:kms:k"),
                Some("eu-west-1"),
                None,
                Ok((SseMode::AwsKms, "eu-west-1")),
            ),
            (
                custom,
                None,
                Some("key-1"),
                None,
                None,
                Err("s3-sse-kms-key-id"),
            ),
            (
                None,
                Some(SseMode::Aes256),
                Some("key-1"),
                Some("eu-west-1"),
                None,
                Err("s3-sse-kms-key-id"),
            ),
            (None, None, None, Some("eu west"), None, Err("aws-region")),
        ];
        for (i, (endpoint, sse, kms, region, env_region, want)) in cases.iter().enumerate() {
            let input = S3Input {
                endpoint: endpoint.map(str::to_string),
                sse_encryption: *sse,
                sse_kms_key_id: kms.map(str::to_string),
                region: region.map(str::to_string),
                ..base_input()
            };
            let got = StoreSettings::from_input_with_env_region(&input, *env_region);
            match (got, want) {
                (Result::Ok(s), Result::Ok((want_sse, want_region))) => {
                    assert_eq!(
                        (s.sse, s.region.as_str()),
                        (*want_sse, *want_region),
                        "case {i}"
                    );
                    assert_eq!(s.sse_kms_key_id.as_deref(), *kms, "case {i}");
                    assert_eq!(s.endpoint.is_some(), endpoint.is_some(), "case {i}");
                }
                (Err(ValidationError::Invalid { input, .. }), Err(want_input)) => {
                    assert_eq!(input, *want_input, "case {i}")
                }
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn from_input_names_the_bad_input() {
        let cases: &[(S3Input, &str)] = &[
            (
                S3Input {
                    bucket: " ".into(),
                    ..base_input()
                },
                "s3-bucket",
            ),
            (
                S3Input {
                    bucket: "a/b".into(),
                    ..base_input()
                },
                "s3-bucket",
            ),
            (
                S3Input {
                    prefix: "../x".into(),
                    ..base_input()
                },
                "s3-prefix",
            ),
            (
                S3Input {
                    expected_bucket_owner: Some("abc".into()),
                    ..base_input()
                },
                "s3-expected-bucket-owner",
            ),
            (
                S3Input {
                    endpoint: Some("http://127.0.0.1:9000".into()),
                    ..base_input()
                },
                "s3-endpoint",
            ),
        ];
        for (input, want) in cases {
            match StoreSettings::from_input_with_env_region(input, Some("us-east-1")) {
                Err(ValidationError::Invalid { input: got, .. }) => assert_eq!(got, *want),
                Result::Ok(s) => panic!("{input:?} accepted: {s:?}"),
            }
        }
        let ok = StoreSettings::from_input_with_env_region(
            &S3Input {
                endpoint: Some("http://127.0.0.1:9000".into()),
                allow_insecure_endpoint: true,
                expected_bucket_owner: Some("123456789012".into()),
                ..base_input()
            },
            None,
        )
        .unwrap();
        assert_eq!(ok.expected_bucket_owner.as_deref(), Some("123456789012"));
        assert_eq!(ok.endpoint.unwrap().as_str(), "http://127.0.0.1:9000/");
    }
}
