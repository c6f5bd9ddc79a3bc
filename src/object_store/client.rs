//! The S3 adapter over aws-sdk-s3: streamed puts and gets, conditional writes and deletes, listing.
//! Every error leaves here as a [`StoreError`] whose text is sanitized (no signatures, no
//! `Authorization`, no registered secret).

use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    Region, RequestChecksumCalculation, ResponseChecksumValidation, StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::validate::StoreSettings;
use crate::config::SseMode;
use crate::runner::log;

/// Listing stops after this many pages (100 000 keys) with a warning.
pub const MAX_LIST_PAGES: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    PutObject,
    GetObject,
    DeleteObject,
    ListObjects,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::PutObject => "PutObject",
            Operation::GetObject => "GetObject",
            Operation::DeleteObject => "DeleteObject",
            Operation::ListObjects => "ListObjectsV2",
        })
    }
}

/// One object-store failure. Messages are sanitized at construction.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The service answered with an error, or the request did not complete (then `status` and
    /// `code` are `None`).
    #[error("S3 {operation} {key}: {}{}{message}", code.as_deref().map(|c| format!("{c} ")).unwrap_or_default(), status.map(|s| format!("(HTTP {s}) ")).unwrap_or_default())]
    Request {
        operation: Operation,
        key: String,
        status: Option<u16>,
        code: Option<String>,
        message: String,
    },
    #[error("S3 {operation} {key}: local file {}: {source}", path.display())]
    Local {
        operation: Operation,
        key: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("S3 key: {source}")]
    InvalidKey {
        #[source]
        source: super::validate::ValidationError,
    },
    #[error("S3 {operation} {key}: {message}")]
    Integrity {
        operation: Operation,
        key: String,
        message: String,
    },
}

impl StoreError {
    pub fn status(&self) -> Option<u16> {
        match self {
            StoreError::Request { status, .. } => *status,
            StoreError::Local { .. }
            | StoreError::InvalidKey { .. }
            | StoreError::Integrity { .. } => None,
        }
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            StoreError::Request { code, .. } => code.as_deref(),
            StoreError::Local { .. }
            | StoreError::InvalidKey { .. }
            | StoreError::Integrity { .. } => None,
        }
    }

    pub(crate) fn local(
        operation: Operation,
        key: &str,
        path: &Path,
        source: std::io::Error,
    ) -> Self {
        StoreError::Local {
            operation,
            key: key.to_string(),
            path: path.to_path_buf(),
            source,
        }
    }

    fn from_sdk<E>(operation: Operation, key: &str, err: SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let status = err.raw_response().map(|r| r.status().as_u16());
        let code = err.code().map(str::to_string);
        let message = match (&err, err.message()) {
            (SdkError::ServiceError(_), Some(m)) => m.to_string(),
            _ => DisplayErrorContext(&err).to_string(),
        };
        StoreError::Request {
            operation,
            key: key.to_string(),
            status,
            code,
            message: sanitize(&message),
        }
    }
}

/// Removes signature material and registered secrets from a message: values after
/// `X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token`, `Signature=`, `Credential=`
/// (to the next delimiter) and after `Authorization` (to the end of the line).
pub fn sanitize(text: &str) -> String {
    let mut out = log::redact(text);
    let needles: [(&str, bool); 6] = [
        ("authorization", true),
        ("x-amz-signature", false),
        ("x-amz-credential", false),
        ("x-amz-security-token", false),
        ("signature=", false),
        ("credential=", false),
    ];
    for (needle, to_eol) in needles {
        let mut from = 0;
        loop {
            let lower = out.to_ascii_lowercase();
            let Some(pos) = lower[from..].find(needle).map(|p| p + from) else {
                break;
            };
            let bytes = out.as_bytes();
            let mut start = pos + needle.len();
            while start < bytes.len() && matches!(bytes[start], b'=' | b':' | b' ' | b'"' | b'\'') {
                start += 1;
            }
            let mut end = start;
            while end < bytes.len() {
                let b = bytes[end];
                let stop = if to_eol {
                    matches!(b, b'\n' | b'\r' | b'"' | b'\'' | b'}')
                } else {
                    matches!(
                        b,
                        b'&' | b','
                            | b' '
                            | b'\n'
                            | b'\r'
                            | b'"'
                            | b'\''
                            | b';'
                            | b'}'
                            | b'>'
                            | b'<'
                    )
                };
                if stop {
                    break;
                }
                end += 1;
            }
            if end > start && &out[start..end] != "***" {
                out.replace_range(start..end, "***");
                from = start + 3;
            } else {
                from = end.max(pos + needle.len());
            }
            if from >= out.len() {
                break;
            }
        }
    }
    out
}

/// A write/delete precondition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition<'a> {
    None,
    /// `If-None-Match: *`: create only.
    IfAbsent,
    /// `If-Match: <etag>`: replace only this version.
    IfMatch(&'a str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Written {
        etag: String,
    },
    /// 412, 409 ConditionalRequestConflict, or 404 on If-Match: someone else wrote first.
    PreconditionFailed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    PreconditionFailed,
}

/// What kind of object is written: decides tagging (lease and run records on real AWS only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    SessionDb,
    SessionMarker,
    LeaseRecord,
    RunRecord,
    Artifact,
    /// The spend ledger (`budget/spend.json`).
    SpendLedger,
}

impl ObjectKind {
    fn tag(self) -> Option<&'static str> {
        match self {
            ObjectKind::LeaseRecord => Some("fro-bot-kind=lease"),
            ObjectKind::RunRecord => Some("fro-bot-kind=run-record"),
            ObjectKind::SessionDb
            | ObjectKind::SessionMarker
            | ObjectKind::Artifact
            | ObjectKind::SpendLedger => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectBody {
    pub bytes: Bytes,
    pub etag: String,
    /// Epoch milliseconds (S3 has 1 s resolution).
    pub last_modified_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetOutcome {
    Found(ObjectBody),
    NotFound,
}

/// A fully downloaded object in a temporary file beside its destination. Dropping it deletes
/// the file; [`TempDownload::persist`] renames it into place.
#[derive(Debug)]
pub struct TempDownload {
    file: tempfile::NamedTempFile,
    pub etag: String,
    pub bytes: u64,
    /// Hex SHA-256 of the body, computed as it streamed in (a marker names its database by it).
    pub sha256: String,
}

impl TempDownload {
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn persist(self, target: &Path) -> std::io::Result<()> {
        self.file.persist(target).map(drop).map_err(|e| e.error)
    }
}

#[derive(Debug)]
pub enum DownloadOutcome {
    Downloaded(TempDownload),
    NotFound,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub objects: Vec<ListedObject>,
    /// The page cap was hit; more objects exist.
    pub capped: bool,
}

/// How a failed conditional request is read (docs/design.md#object-store): 412, 409
/// ConditionalRequestConflict, and — AWS — 404 for If-Match on a missing key all mean "someone else
/// won".
pub fn is_precondition_failure(
    status: Option<u16>,
    code: Option<&str>,
    cond: Condition<'_>,
) -> bool {
    match (status, cond) {
        (_, Condition::None) => false,
        (Some(412), _) => true,
        (Some(409), _) => code == Some("ConditionalRequestConflict"),
        (Some(404), Condition::IfMatch(_)) => true,
        _ => code == Some("PreconditionFailed"),
    }
}

/// Connected S3 client plus the settings every request needs.
#[derive(Debug, Clone)]
pub struct ObjectStore {
    client: aws_sdk_s3::Client,
    settings: StoreSettings,
}

impl ObjectStore {
    /// Credentials come from the default AWS chain (environment, profile, web identity, IMDS).
    pub async fn connect(settings: &StoreSettings) -> ObjectStore {
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(settings.region.clone()))
            .http_client(crate::net::aws_http_client())
            .load()
            .await;
        Self::with_sdk_config(settings, &sdk)
    }

    /// Builds the client from a loaded SDK config (tests and benchmarks pass static credentials).
    pub fn with_sdk_config(settings: &StoreSettings, sdk: &SdkConfig) -> ObjectStore {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .build();
        let mut builder = aws_sdk_s3::config::Builder::from(sdk)
            .region(Region::new(settings.region.clone()))
            .timeout_config(timeouts)
            .stalled_stream_protection(StalledStreamProtectionConfig::enabled().build());
        if let Some(endpoint) = &settings.endpoint {
            builder = builder
                .endpoint_url(endpoint.as_str().trim_end_matches('/'))
                // Virtual-host style needs DNS for `bucket.host`; S3-compatible servers take paths.
                .force_path_style(true)
                // Many S3-compatible servers reject the SDK's default trailing CRC checksums.
                .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
                .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        }
        ObjectStore {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            settings: settings.clone(),
        }
    }

    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    fn owner(&self) -> Option<String> {
        self.settings.expected_bucket_owner.clone()
    }

    fn put_request(
        &self,
        key: &str,
        body: ByteStream,
        cond: Condition<'_>,
        kind: ObjectKind,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .body(body)
            .set_expected_bucket_owner(self.owner());
        req = match self.settings.sse {
            SseMode::Aes256 => req.server_side_encryption(ServerSideEncryption::Aes256),
            SseMode::AwsKms => req
                .server_side_encryption(ServerSideEncryption::AwsKms)
                .set_ssekms_key_id(self.settings.sse_kms_key_id.clone()),
        };
        if self.settings.endpoint.is_none() {
            if let Some(tag) = kind.tag() {
                req = req.tagging(tag);
            }
        }
        match cond {
            Condition::None => req,
            Condition::IfAbsent => req.if_none_match("*"),
            Condition::IfMatch(etag) => req.if_match(etag),
        }
    }

    async fn send_put(
        &self,
        key: &str,
        body: ByteStream,
        cond: Condition<'_>,
        kind: ObjectKind,
    ) -> Result<PutOutcome, StoreError> {
        match self.put_request(key, body, cond, kind).send().await {
            Ok(out) => Ok(PutOutcome::Written {
                etag: out.e_tag().unwrap_or_default().to_string(),
            }),
            Err(err) => {
                let err = StoreError::from_sdk(Operation::PutObject, key, err);
                if is_precondition_failure(err.status(), err.code(), cond) {
                    Ok(PutOutcome::PreconditionFailed)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Puts an in-memory body (small records).
    pub async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        cond: Condition<'_>,
        kind: ObjectKind,
    ) -> Result<PutOutcome, StoreError> {
        self.send_put(key, ByteStream::from(body), cond, kind).await
    }

    /// Puts a file, streamed from disk (never loaded whole into memory).
    pub async fn put_file(
        &self,
        key: &str,
        path: &Path,
        cond: Condition<'_>,
        kind: ObjectKind,
    ) -> Result<PutOutcome, StoreError> {
        let body = ByteStream::from_path(path).await.map_err(|e| {
            StoreError::local(Operation::PutObject, key, path, std::io::Error::other(e))
        })?;
        self.send_put(key, body, cond, kind).await
    }

    /// Gets a small object whole, with its ETag and LastModified.
    pub async fn get_bytes(&self, key: &str) -> Result<GetOutcome, StoreError> {
        let out = match self.get_request(key).await? {
            Some(out) => out,
            None => return Ok(GetOutcome::NotFound),
        };
        let (etag, last_modified_ms) = etag_and_time(&out);
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| request_error(Operation::GetObject, key, &DisplayErrorContext(&e)))?
            .into_bytes();
        Ok(GetOutcome::Found(ObjectBody {
            bytes,
            etag,
            last_modified_ms,
        }))
    }

    /// Gets an object whole only if it holds at most `max` bytes: one the store says is larger,
    /// or whose body runs past `max`, is an `Integrity` error before more than `max` bytes are
    /// held (objects anyone with the store's credentials can write are untrusted input).
    pub async fn get_bytes_capped(&self, key: &str, max: usize) -> Result<GetOutcome, StoreError> {
        let op = Operation::GetObject;
        let too_large = |n: String| StoreError::Integrity {
            operation: op,
            key: key.to_string(),
            message: format!("{n} bytes, more than the {max} allowed"),
        };
        let out = match self.get_request(key).await? {
            Some(out) => out,
            None => return Ok(GetOutcome::NotFound),
        };
        if let Some(n) = out
            .content_length()
            .filter(|n| usize::try_from(*n).map_or(true, |n| n > max))
        {
            return Err(too_large(n.to_string()));
        }
        let (etag, last_modified_ms) = etag_and_time(&out);
        let mut body = out.body;
        let mut bytes = Vec::new();
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| request_error(op, key, &DisplayErrorContext(&e)))?
        {
            if bytes.len() + chunk.len() > max {
                return Err(too_large(format!("over {}", bytes.len() + chunk.len())));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(GetOutcome::Found(ObjectBody {
            bytes: Bytes::from(bytes),
            etag,
            last_modified_ms,
        }))
    }

    async fn get_request(
        &self,
        key: &str,
    ) -> Result<Option<aws_sdk_s3::operation::get_object::GetObjectOutput>, StoreError> {
        let res = self
            .client
            .get_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .set_expected_bucket_owner(self.owner())
            .send()
            .await;
        match res {
            Ok(out) => Ok(Some(out)),
            Err(err) => {
                let err = StoreError::from_sdk(Operation::GetObject, key, err);
                if err.status() == Some(404) || err.code() == Some("NoSuchKey") {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Streams an object into a temporary file in `dir`. A failure, a short body, or dropping
    /// this future leaves no file behind (the temp file is deleted on drop).
    pub async fn download_to_temp(
        &self,
        key: &str,
        dir: &Path,
    ) -> Result<DownloadOutcome, StoreError> {
        let op = Operation::GetObject;
        let out = match self.get_request(key).await? {
            Some(out) => out,
            None => return Ok(DownloadOutcome::NotFound),
        };
        let etag = out.e_tag().unwrap_or_default().to_string();
        let expected = out.content_length().and_then(|n| u64::try_from(n).ok());
        let tmp = tempfile::Builder::new()
            .prefix(".fro-bot-download-")
            .tempfile_in(dir)
            .map_err(|e| StoreError::local(op, key, dir, e))?;
        let std_file = tmp
            .reopen()
            .map_err(|e| StoreError::local(op, key, tmp.path(), e))?;
        let mut file =
            tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(std_file));
        let mut body = out.body;
        let mut written: u64 = 0;
        let mut hasher = Sha256::new();
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| request_error(op, key, &DisplayErrorContext(&e)))?
        {
            hasher.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| StoreError::local(op, key, tmp.path(), e))?;
            written += chunk.len() as u64;
        }
        file.flush()
            .await
            .map_err(|e| StoreError::local(op, key, tmp.path(), e))?;
        file.get_ref()
            .sync_all()
            .await
            .map_err(|e| StoreError::local(op, key, tmp.path(), e))?;
        if let Some(expected) = expected.filter(|n| *n != written) {
            return Err(StoreError::Integrity {
                operation: op,
                key: key.to_string(),
                message: format!("short body: {written} of {expected} bytes"),
            });
        }
        Ok(DownloadOutcome::Downloaded(TempDownload {
            file: tmp,
            etag,
            bytes: written,
            sha256: hex::encode(hasher.finalize()),
        }))
    }

    /// Deletes an object; conditional on its ETag with [`Condition::IfMatch`].
    pub async fn delete(
        &self,
        key: &str,
        cond: Condition<'_>,
    ) -> Result<DeleteOutcome, StoreError> {
        let mut req = self
            .client
            .delete_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .set_expected_bucket_owner(self.owner());
        if let Condition::IfMatch(etag) = cond {
            req = req.if_match(etag);
        }
        match req.send().await {
            Ok(_) => Ok(DeleteOutcome::Deleted),
            Err(err) => {
                let err = StoreError::from_sdk(Operation::DeleteObject, key, err);
                if is_precondition_failure(err.status(), err.code(), cond) {
                    Ok(DeleteOutcome::PreconditionFailed)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Lists keys under `prefix`, at most [`MAX_LIST_PAGES`] pages (warns when capped).
    pub async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.list_with_page_cap(prefix, MAX_LIST_PAGES).await
    }

    /// [`Self::list`] with an explicit page cap (tests).
    pub async fn list_with_page_cap(
        &self,
        prefix: &str,
        max_pages: usize,
    ) -> Result<Listing, StoreError> {
        let mut objects = Vec::new();
        let mut token: Option<String> = None;
        for _page in 0..max_pages {
            let out = self
                .client
                .list_objects_v2()
                .bucket(&self.settings.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .set_expected_bucket_owner(self.owner())
                .send()
                .await
                .map_err(|e| StoreError::from_sdk(Operation::ListObjects, prefix, e))?;
            objects.extend(out.contents().iter().filter_map(|o| {
                Some(ListedObject {
                    key: o.key()?.to_string(),
                    size: o.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                    etag: o.e_tag().map(str::to_string),
                })
            }));
            match (out.is_truncated(), out.next_continuation_token()) {
                (Some(true), Some(next)) => token = Some(next.to_string()),
                _ => {
                    return Ok(Listing {
                        objects,
                        capped: false,
                    })
                }
            }
        }
        tracing::warn!(
            "S3 listing of {prefix} stopped after {max_pages} pages; later objects are ignored"
        );
        Ok(Listing {
            objects,
            capped: true,
        })
    }
}

/// A get's ETag and LastModified (epoch ms; S3 has 1 s resolution).
fn etag_and_time(
    out: &aws_sdk_s3::operation::get_object::GetObjectOutput,
) -> (String, Option<u64>) {
    let etag = out.e_tag().unwrap_or_default().to_string();
    let last_modified_ms = out
        .last_modified()
        .and_then(|t| t.to_millis().ok())
        .and_then(|ms| u64::try_from(ms).ok());
    (etag, last_modified_ms)
}

fn request_error(operation: Operation, key: &str, err: &dyn std::fmt::Display) -> StoreError {
    StoreError::Request {
        operation,
        key: key.to_string(),
        status: None,
        code: None,
        message: sanitize(&err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precondition_table() {
        let m = Condition::IfMatch("\"e\"");
        let a = Condition::IfAbsent;
        let cases: &[(Option<u16>, Option<&str>, Condition<'_>, bool)] = &[
            (Some(412), Some("PreconditionFailed"), a, true),
            (Some(412), None, m, true),
            (Some(409), Some("ConditionalRequestConflict"), a, true),
            (Some(409), Some("ConditionalRequestConflict"), m, true),
            (Some(409), Some("BucketNotEmpty"), m, false),
            (Some(404), Some("NoSuchKey"), m, true),
            (Some(404), Some("NoSuchBucket"), m, true),
            (Some(404), Some("NoSuchKey"), a, false),
            (Some(500), Some("InternalError"), m, false),
            (Some(403), Some("AccessDenied"), a, false),
            (
                Some(412),
                Some("PreconditionFailed"),
                Condition::None,
                false,
            ),
            (None, None, m, false),
        ];
        for (status, code, cond, want) in cases {
            assert_eq!(
                is_precondition_failure(*status, *code, *cond),
                *want,
                "{status:?} {code:?} {cond:?}"
            );
        }
    }

    #[test]
    fn sanitize_removes_signatures() {
        let raw = "GET https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20260101&X-Amz-Signature=deadbeefcafe&X-Amz-Security-Token=tok123 failed; headers: {\"authorization\": \"AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/2026, SignedHeaders=host, Signature=abcdef0123\"}\nAuthorization: AWS4-HMAC-SHA256 Credential=AKIAX, Signature=99ff\nnext line";
        let s = sanitize(raw);
        for secret in [
            "deadbeefcafe",
            "AKIAEXAMPLE",
            "tok123",
            "abcdef0123",
            "AKIAX",
            "99ff",
        ] {
            assert!(!s.contains(secret), "{secret} left in {s}");
        }
        assert!(s.contains("X-Amz-Algorithm=AWS4-HMAC-SHA256"), "{s}");
        assert!(s.contains("next line"), "{s}");
        assert_eq!(sanitize("plain message"), "plain message");
    }

    #[test]
    fn tags_only_for_records() {
        assert_eq!(ObjectKind::LeaseRecord.tag(), Some("fro-bot-kind=lease"));
        assert_eq!(ObjectKind::RunRecord.tag(), Some("fro-bot-kind=run-record"));
        assert_eq!(ObjectKind::SessionDb.tag(), None);
        assert_eq!(ObjectKind::Artifact.tag(), None);
    }
}
