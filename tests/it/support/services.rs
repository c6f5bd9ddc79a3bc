//! Locations of the services `scripts/test` installs and starts (SeaweedFS, OpenCode).

/// An environment variable set by `scripts/test`; a test that needs it fails with a pointer to the
/// test command instead of being silently skipped.
pub fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the suite with scripts/test, which starts the test services")
    })
}

pub struct S3Service {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
}

pub fn s3() -> S3Service {
    S3Service {
        endpoint: required_env("FRO_BOT_TEST_S3_ENDPOINT"),
        bucket: required_env("FRO_BOT_TEST_S3_BUCKET"),
        access_key: required_env("FRO_BOT_TEST_S3_ACCESS_KEY"),
        secret_key: required_env("FRO_BOT_TEST_S3_SECRET_KEY"),
    }
}

/// The pinned OpenCode binary.
pub fn opencode_bin() -> std::path::PathBuf {
    required_env("FRO_BOT_TEST_OPENCODE").into()
}

/// A Python with `cmarkgfm` (GitHub's Markdown parser) installed.
pub fn gfm_python() -> std::path::PathBuf {
    required_env("FRO_BOT_TEST_GFM_PYTHON").into()
}

/// The checker of requests against GitHub's published API descriptions
/// (tests/it/support/github_schema.rs).
pub fn github_schema_url() -> String {
    required_env("FRO_BOT_TEST_GITHUB_SCHEMA")
}
