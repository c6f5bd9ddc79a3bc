//! Azure block-blob transfer through SAS URLs: Put Blob or Put Block + Put Block List for uploads,
//! plain or ranged parallel GETs for downloads. Everything streams from/to files.

use std::path::Path;

use base64::Engine as _;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::twirp::RetryPolicy;
use super::CacheError;

const MIB: u64 = 1024 * 1024;
/// The service's storage API version we speak.
const MS_VERSION: &str = "2025-01-05";

/// Sizes and parallelism of blob transfers. Tests lower the thresholds to force the block and
/// ranged paths on small data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferOptions {
    /// Largest archive sent with one Put Blob (Azure accepts 5000 MiB; the toolkit uses 128 MiB).
    pub single_put_max: u64,
    pub block_size: u64,
    pub upload_concurrency: usize,
    /// Blobs at least this large are downloaded with parallel ranged GETs.
    pub ranged_download_min: u64,
    pub range_size: u64,
    pub download_concurrency: usize,
}

impl Default for TransferOptions {
    fn default() -> Self {
        Self {
            single_put_max: 128 * MIB,
            block_size: 64 * MIB,
            upload_concurrency: 4,
            ranged_download_min: 128 * MIB,
            range_size: 32 * MIB,
            download_concurrency: 4,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct BlobClient {
    pub http: reqwest::Client,
    pub transfer: TransferOptions,
    pub retry: RetryPolicy,
}

/// Streams `len` bytes of `file` from `offset` as a request body.
pub(crate) async fn file_body(
    file: &Path,
    offset: u64,
    len: u64,
) -> Result<reqwest::Body, CacheError> {
    let mut f = tokio::fs::File::open(file)
        .await
        .map_err(|e| CacheError::io("cannot open archive", file, e))?;
    f.seek(std::io::SeekFrom::Start(offset))
        .await
        .map_err(|e| CacheError::io("cannot seek archive", file, e))?;
    let reader = tokio::io::AsyncReadExt::take(f, len);
    Ok(reqwest::Body::wrap_stream(
        tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024),
    ))
}

/// The id of block `i`: the same length for every block, as Azure requires.
pub(crate) fn block_id(i: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("fro-bot-block-{i:010}"))
}

fn with_query(url: &str, pairs: &[(&str, &str)]) -> Result<url::Url, CacheError> {
    let mut u = url::Url::parse(url).map_err(|e| CacheError::InvalidResponse {
        operation: "signed blob URL",
        detail: format!("not a URL: {e}"),
    })?;
    {
        let mut q = u.query_pairs_mut();
        for (k, v) in pairs {
            q.append_pair(k, v);
        }
    }
    Ok(u)
}

/// Reads a blob response into an error, keeping the message short and free of secrets.
async fn status_error(operation: &'static str, response: reqwest::Response) -> CacheError {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let message: String = text.chars().take(200).collect();
    // The SAS signature is a credential: never echo URLs or bodies unredacted.
    let message = crate::runner::log::redact(message.trim());
    if matches!(status, 500 | 502 | 503 | 504) {
        CacheError::Server {
            status,
            attempts: 1,
            message,
        }
    } else {
        CacheError::Http {
            operation,
            status,
            message,
        }
    }
}

/// Whether a failed blob step is worth another attempt.
fn retryable(e: &CacheError) -> bool {
    matches!(e, CacheError::Server { .. } | CacheError::Transport { .. })
}

impl BlobClient {
    /// Runs `step` with the retry policy for transient (5xx, transport) failures.
    async fn with_retries<F, Fut, T>(&self, mut step: F) -> Result<T, CacheError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, CacheError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match step().await {
                Err(e) if retryable(&e) && attempt < self.retry.attempts => {
                    tracing::debug!("blob transfer failed ({e}); retrying");
                    tokio::time::sleep(self.retry.delay(attempt - 1)).await;
                }
                Err(CacheError::Server {
                    status, message, ..
                }) => {
                    return Err(CacheError::Server {
                        status,
                        attempts: attempt,
                        message,
                    })
                }
                other => return other,
            }
        }
    }

    /// Uploads `file` (`size` bytes) to the SAS `url`.
    pub async fn upload(&self, url: &str, file: &Path, size: u64) -> Result<(), CacheError> {
        if size <= self.transfer.single_put_max {
            let target = with_query(url, &[])?;
            return self
                .with_retries(|| async {
                    let body = file_body(file, 0, size).await?;
                    let response = self
                        .http
                        .put(target.clone())
                        .header("x-ms-blob-type", "BlockBlob")
                        .header("x-ms-version", MS_VERSION)
                        .header(CONTENT_LENGTH, size)
                        .body(body)
                        .send()
                        .await
                        .map_err(|source| CacheError::Transport {
                            operation: "Put Blob",
                            source: source.without_url(),
                        })?;
                    if response.status().is_success() {
                        Ok(())
                    } else {
                        Err(status_error("Put Blob", response).await)
                    }
                })
                .await;
        }
        let block = self.transfer.block_size.max(1);
        let count = size.div_ceil(block);
        let ids: Vec<String> = (0..count).map(block_id).collect();
        futures_util::stream::iter(ids.iter().enumerate().map(|(i, id)| {
            let offset = i as u64 * block;
            let len = block.min(size - offset);
            self.put_block(url, id, file, offset, len)
        }))
        .buffer_unordered(self.transfer.upload_concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
        let mut xml = String::from(r#"<?xml version="1.0" encoding="utf-8"?><BlockList>"#);
        for id in &ids {
            xml.push_str("<Latest>");
            xml.push_str(id);
            xml.push_str("</Latest>");
        }
        xml.push_str("</BlockList>");
        let target = with_query(url, &[("comp", "blocklist")])?;
        self.with_retries(|| async {
            let response = self
                .http
                .put(target.clone())
                .header("x-ms-version", MS_VERSION)
                .header(CONTENT_TYPE, "application/xml")
                .body(xml.clone())
                .send()
                .await
                .map_err(|source| CacheError::Transport {
                    operation: "Put Block List",
                    source: source.without_url(),
                })?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(status_error("Put Block List", response).await)
            }
        })
        .await
    }

    async fn put_block(
        &self,
        url: &str,
        id: &str,
        file: &Path,
        offset: u64,
        len: u64,
    ) -> Result<(), CacheError> {
        let target = with_query(url, &[("comp", "block"), ("blockid", id)])?;
        self.with_retries(|| async {
            let body = file_body(file, offset, len).await?;
            let response = self
                .http
                .put(target.clone())
                .header("x-ms-version", MS_VERSION)
                .header(CONTENT_LENGTH, len)
                .body(body)
                .send()
                .await
                .map_err(|source| CacheError::Transport {
                    operation: "Put Block",
                    source: source.without_url(),
                })?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(status_error("Put Block", response).await)
            }
        })
        .await
    }

    /// Downloads the blob at `url` into `dest`; returns its size. Checks status and length.
    pub async fn download(&self, url: &str, dest: &Path) -> Result<u64, CacheError> {
        let size = self.with_retries(|| self.head(url)).await?;
        match size {
            Some(size) if size >= self.transfer.ranged_download_min && size > 0 => {
                self.download_ranged(url, dest, size).await?;
                Ok(size)
            }
            _ => {
                self.with_retries(|| self.download_plain(url, dest, true))
                    .await
            }
        }
    }

    /// Downloads from storage that is not Azure's (the v1 service's `archiveLocation` may be
    /// anywhere): one plain GET, retried, without Azure's headers.
    pub async fn download_generic(&self, url: &str, dest: &Path) -> Result<u64, CacheError> {
        self.with_retries(|| self.download_plain(url, dest, false))
            .await
    }

    /// The blob's size from HEAD, `None` when the host does not answer HEAD usefully.
    async fn head(&self, url: &str) -> Result<Option<u64>, CacheError> {
        let response = self
            .http
            .head(url)
            .header("x-ms-version", MS_VERSION)
            .send()
            .await
            .map_err(|source| CacheError::Transport {
                operation: "HEAD blob",
                source: source.without_url(),
            })?;
        let status = response.status();
        if status.is_server_error() {
            return Err(status_error("HEAD blob", response).await);
        }
        if !status.is_success() {
            return Ok(None);
        }
        Ok(header_u64(&response, CONTENT_LENGTH.as_str()))
    }

    async fn download_plain(&self, url: &str, dest: &Path, azure: bool) -> Result<u64, CacheError> {
        let mut request = self.http.get(url);
        if azure {
            request = request.header("x-ms-version", MS_VERSION);
        }
        let response = request
            .send()
            .await
            .map_err(|source| CacheError::Transport {
                operation: "GET blob",
                source: source.without_url(),
            })?;
        // The toolkit writes whatever comes back, error pages included: we insist on 200.
        if response.status() != reqwest::StatusCode::OK {
            return Err(status_error("GET blob", response).await);
        }
        let expected = header_u64(&response, CONTENT_LENGTH.as_str());
        let mut file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| CacheError::io("cannot create", dest, e))?;
        let written = copy_body(response, &mut file, dest, "GET blob").await?;
        check_length("GET blob", expected, written)?;
        Ok(written)
    }

    async fn download_ranged(&self, url: &str, dest: &Path, size: u64) -> Result<(), CacheError> {
        let file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| CacheError::io("cannot create", dest, e))?;
        file.set_len(size)
            .await
            .map_err(|e| CacheError::io("cannot size", dest, e))?;
        drop(file);
        let range = self.transfer.range_size.max(1);
        let ranges: Vec<(u64, u64)> = (0..size.div_ceil(range))
            .map(|i| (i * range, (i * range + range).min(size) - 1))
            .collect();
        futures_util::stream::iter(
            ranges
                .into_iter()
                .map(|(a, b)| self.with_retries(move || self.get_range(url, dest, a, b))),
        )
        .buffer_unordered(self.transfer.download_concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
        Ok(())
    }

    async fn get_range(&self, url: &str, dest: &Path, a: u64, b: u64) -> Result<(), CacheError> {
        let spec = format!("bytes={a}-{b}");
        let response = self
            .http
            .get(url)
            .header("x-ms-version", MS_VERSION)
            .header("x-ms-range", &spec)
            .header(reqwest::header::RANGE, &spec)
            .send()
            .await
            .map_err(|source| CacheError::Transport {
                operation: "ranged GET blob",
                source: source.without_url(),
            })?;
        if response.status() != reqwest::StatusCode::PARTIAL_CONTENT {
            return Err(status_error("ranged GET blob", response).await);
        }
        let expected = b - a + 1;
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .open(dest)
            .await
            .map_err(|e| CacheError::io("cannot open", dest, e))?;
        file.seek(std::io::SeekFrom::Start(a))
            .await
            .map_err(|e| CacheError::io("cannot seek", dest, e))?;
        let written = copy_body(response, &mut file, dest, "ranged GET blob").await?;
        check_length("ranged GET blob", Some(expected), written)
    }
}

fn header_u64(response: &reqwest::Response, name: &str) -> Option<u64> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

async fn copy_body(
    response: reqwest::Response,
    file: &mut tokio::fs::File,
    dest: &Path,
    operation: &'static str,
) -> Result<u64, CacheError> {
    // Network chunks are small; each tokio file write is a trip to the blocking pool.
    let mut file = tokio::io::BufWriter::with_capacity(super::WRITE_BUF, file);
    let mut stream = response.bytes_stream();
    let mut written = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| CacheError::Transport {
            operation,
            // The URL carries the SAS signature.
            source: source.without_url(),
        })?;
        file.write_all(&chunk)
            .await
            .map_err(|e| CacheError::io("cannot write", dest, e))?;
        written += chunk.len() as u64;
    }
    file.flush()
        .await
        .map_err(|e| CacheError::io("cannot write", dest, e))?;
    Ok(written)
}

fn check_length(
    operation: &'static str,
    expected: Option<u64>,
    got: u64,
) -> Result<(), CacheError> {
    match expected {
        Some(n) if n != got => Err(CacheError::InvalidResponse {
            operation,
            detail: format!("received {got} of {n} bytes"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ids_have_equal_length() {
        let a = block_id(0);
        let b = block_id(49_999);
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
    }
}
