//! The cache version: what makes an entry restorable only with the same path list and compression.
//! Byte-compatible with `@actions/cache` (`getCacheVersion`).

use sha2::{Digest, Sha256};

/// What the toolkit reports when a `zstd` binary is on PATH; our archives are zstd without `--long`.
pub const COMPRESSION: &str = "zstd-without-long";

/// `sha256_hex(paths.join("|") + "|zstd-without-long|1.0")`, paths exactly as given.
pub fn version(paths: &[String]) -> String {
    version_with(paths, COMPRESSION, false)
}

/// The general form, for the vectors of other compressions and of Windows runners.
pub(crate) fn version_with(paths: &[String], compression: &str, windows_only: bool) -> String {
    let mut parts: Vec<&str> = paths.iter().map(String::as_str).collect();
    parts.push(compression);
    if windows_only {
        parts.push("windows-only");
    }
    parts.push("1.0");
    hex::encode(Sha256::digest(parts.join("|").as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[test]
    fn matches_the_toolkit_vectors() {
        let data = p("/home/runner/.local/share/opencode");
        assert_eq!(
            version(&data),
            "e25a09a496e9cd81a98cb9ddee7eaaadaa48642afd97489c76ccf0a471e6db13"
        );
        assert_eq!(
            version_with(&data, "zstd", false),
            "c98fd52758e88d0f4d2cbcd2e602bd40af9365ef35aa73bb384342b5bffe535d"
        );
        assert_eq!(
            version_with(&data, "gzip", false),
            "da13a634b94fdbcb37794a61be54568f5f60f76952894c5d138e89cf4ee4083b"
        );
        assert_eq!(
            version_with(&data, "zstd-without-long", true),
            "b461467e3e63953743f118b41572945f463684692ace998c60411dd7e97d07db"
        );
        assert_eq!(
            version(&p("~/.local/share/opencode")),
            "1d42c94ce54352ee784b2536f2b105d27834bd3a11f30b2bb1419138e49960c5"
        );
    }

    #[test]
    fn order_matters() {
        let a = vec!["/a".to_string(), "/b".to_string()];
        let b = vec!["/b".to_string(), "/a".to_string()];
        assert_ne!(version(&a), version(&b));
    }
}
