//! A streaming tar reader that checks each header's declared size against the caps before it
//! reads a byte of it. The `tar` crate reads a whole pax or GNU long-name header into memory
//! before its caller sees the entry (a 1 GiB long name in a 500 KB entry took 7 GB), so only the
//! decoding of single 512-byte header blocks ([`tar::Header`]) is taken from it.

use std::io::{self, Read, Write};
use std::time::Instant;

use tar::{EntryType, Header};

use super::limits::{Cap, Limits};

const BLOCK: u64 = 512;

/// One archive member as its headers (including pax / GNU extensions) describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberHeader {
    pub name: Vec<u8>,
    pub link: Option<Vec<u8>>,
    pub kind: EntryType,
    /// Data bytes that follow the header.
    pub size: u64,
    pub mode: Option<u32>,
    pub mtime: Option<u64>,
    /// A pax header announced GNU sparse data (`GNU.sparse.*`).
    pub sparse: bool,
}

#[derive(Debug)]
pub(crate) enum ReadError {
    /// A cap was exceeded.
    Cap(Cap),
    /// The tar structure is invalid (checksum, size field, pax record).
    Malformed(String),
    /// Reading the (decompressed) stream failed: truncation or zstd corruption.
    Stream(io::Error),
    /// Writing a member's data out failed (the local file system, not the archive).
    Write(io::Error),
}

/// Extension headers seen since the last member.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    sparse: bool,
}

pub(crate) struct TarReader<R> {
    inner: R,
    limits: Limits,
    deadline: Instant,
    /// Bytes read from the stream plus bytes the caller [`account`](Self::account)ed.
    total: u64,
    headers: u64,
    /// Data of the current member not yet read, and the padding after it.
    unread: u64,
    padding: u64,
}

fn padding_of(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

impl<R: Read> TarReader<R> {
    pub fn new(inner: R, limits: Limits) -> Self {
        Self {
            inner,
            limits,
            deadline: Instant::now() + limits.max_duration,
            total: 0,
            headers: 0,
            unread: 0,
            padding: 0,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Counts `bytes` written without being read (hard-link copies) against the total.
    pub fn account(&mut self, bytes: u64) -> Result<(), ReadError> {
        self.total = self.total.saturating_add(bytes);
        if self.total > self.limits.max_total_bytes {
            return Err(ReadError::Cap(Cap::TotalSize));
        }
        Ok(())
    }

    fn check_time(&self) -> Result<(), ReadError> {
        if Instant::now() > self.deadline {
            return Err(ReadError::Cap(Cap::Time));
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first byte.
    fn fill(&mut self, buf: &mut [u8]) -> Result<bool, ReadError> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(ReadError::Stream(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the tar stream ends inside a block",
                    )))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Stream(e)),
            }
        }
        self.total = self.total.saturating_add(buf.len() as u64);
        Ok(true)
    }

    /// Reads and drops `n` bytes.
    fn skip(&mut self, mut n: u64) -> Result<(), ReadError> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let chunk = n.min(buf.len() as u64) as usize;
            if !self.fill(&mut buf[..chunk])? {
                return Err(ReadError::Stream(io::ErrorKind::UnexpectedEof.into()));
            }
            n -= chunk as u64;
            self.check_time()?;
        }
        Ok(())
    }

    /// Checks that `n` more bytes from the stream stay within the total, before reading them.
    fn ensure_total(&self, n: u64) -> Result<(), ReadError> {
        if self.total.saturating_add(n) > self.limits.max_total_bytes {
            return Err(ReadError::Cap(Cap::TotalSize));
        }
        Ok(())
    }

    /// The data of an extension header, its size checked first.
    fn read_extension(&mut self, header: &Header) -> Result<Vec<u8>, ReadError> {
        let size = header
            .entry_size()
            .map_err(|e| ReadError::Malformed(format!("bad size field: {e}")))?;
        if size > self.limits.max_extension_header_bytes {
            return Err(ReadError::Cap(Cap::HeaderSize));
        }
        let padded = size + padding_of(size);
        self.ensure_total(padded)?;
        // `size` is at most the header cap, so this allocation is bounded.
        let mut data = vec![0u8; size as usize];
        if !self.fill(&mut data)? && size > 0 {
            return Err(ReadError::Stream(io::ErrorKind::UnexpectedEof.into()));
        }
        self.skip(padding_of(size))?;
        Ok(data)
    }

    /// Skips what is left of the current member, then reads headers up to the next member.
    /// `Ok(None)` at the end-of-archive block (or a clean end of stream on a block boundary).
    pub fn next_member(&mut self) -> Result<Option<MemberHeader>, ReadError> {
        let rest = self.unread + self.padding;
        self.unread = 0;
        self.padding = 0;
        self.skip(rest)?;
        let mut pending = Pending::default();
        loop {
            self.check_time()?;
            self.ensure_total(BLOCK)?;
            let mut block = [0u8; BLOCK as usize];
            if !self.fill(&mut block)? {
                return Ok(None);
            }
            if block.iter().all(|b| *b == 0) {
                return Ok(None);
            }
            self.headers += 1;
            if self.headers > self.limits.max_headers {
                return Err(ReadError::Cap(Cap::Members));
            }
            let header = Header::from_byte_slice(&block);
            verify_checksum(header)?;
            match header.entry_type() {
                EntryType::XHeader => {
                    let data = self.read_extension(header)?;
                    apply_pax(&data, &mut pending)?;
                }
                EntryType::XGlobalHeader => {
                    // Defaults for later members (charset, comment): nothing we honour.
                    self.read_extension(header)?;
                }
                EntryType::GNULongName => {
                    let data = self.read_extension(header)?;
                    pending.path = Some(trim_nuls(data));
                }
                EntryType::GNULongLink => {
                    let data = self.read_extension(header)?;
                    pending.link = Some(trim_nuls(data));
                }
                kind => return self.member(header, kind, pending).map(Some),
            }
        }
    }

    fn member(
        &mut self,
        header: &Header,
        kind: EntryType,
        pending: Pending,
    ) -> Result<MemberHeader, ReadError> {
        let size = match pending.size {
            Some(s) => s,
            None => header
                .entry_size()
                .map_err(|e| ReadError::Malformed(format!("bad size field: {e}")))?,
        };
        let name = pending
            .path
            .unwrap_or_else(|| header.path_bytes().into_owned());
        let link = pending
            .link
            .or_else(|| header.link_name_bytes().map(|l| l.into_owned()));
        let max = self.limits.max_name_bytes;
        if name.len() > max || link.as_ref().is_some_and(|l| l.len() > max) {
            return Err(ReadError::Cap(Cap::NameLength));
        }
        self.unread = size;
        self.padding = padding_of(size);
        Ok(MemberHeader {
            name,
            link,
            kind,
            size,
            mode: header.mode().ok(),
            mtime: header.mtime().ok(),
            sparse: pending.sparse || kind == EntryType::GNUSparse,
        })
    }

    /// Copies the current member's data to `out` (checking the total first, the clock as it goes).
    pub fn copy_data<W: Write>(&mut self, out: &mut W) -> Result<u64, ReadError> {
        let size = self.unread;
        self.ensure_total(size.saturating_add(self.padding))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = size;
        while left > 0 {
            let chunk = left.min(buf.len() as u64) as usize;
            if !self.fill(&mut buf[..chunk])? {
                return Err(ReadError::Stream(io::ErrorKind::UnexpectedEof.into()));
            }
            out.write_all(&buf[..chunk]).map_err(ReadError::Write)?;
            left -= chunk as u64;
            self.unread = left;
            self.check_time()?;
        }
        Ok(size)
    }

    /// After the end-of-archive block: reads the rest of the stream (where zstd reports truncation
    /// and checksum failures), allowing at most the trailing-data cap. Returns the inner reader.
    pub fn finish(mut self) -> Result<R, ReadError> {
        let mut buf = [0u8; 8192];
        let mut trailing = 0u64;
        loop {
            match self.inner.read(&mut buf) {
                Ok(0) => return Ok(self.inner),
                Ok(n) => trailing += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Stream(e)),
            }
            if trailing > self.limits.max_trailing_bytes {
                return Err(ReadError::Cap(Cap::TrailingData));
            }
            self.check_time()?;
        }
    }
}

/// The unsigned sum of the block with the checksum field read as spaces, as POSIX defines it.
fn verify_checksum(header: &Header) -> Result<(), ReadError> {
    let bytes = header.as_bytes();
    let sum: u32 = bytes[..148]
        .iter()
        .chain(&bytes[156..])
        .map(|b| u32::from(*b))
        .sum::<u32>()
        + 8 * u32::from(b' ');
    match header.cksum() {
        Ok(c) if c == sum => Ok(()),
        Ok(_) => Err(ReadError::Malformed("header checksum mismatch".into())),
        Err(e) => Err(ReadError::Malformed(format!("bad checksum field: {e}"))),
    }
}

/// GNU long names end in NUL padding; an interior NUL stays (and is refused by the caller).
fn trim_nuls(mut data: Vec<u8>) -> Vec<u8> {
    while data.last() == Some(&0) {
        data.pop();
    }
    data
}

/// Applies the records of a pax extended header (`LEN KEY=VALUE\n`, LEN counting the whole
/// record). Parsed by length, not by line: a value may hold a newline. The `tar` crate splits on
/// newlines, which misreads such values.
fn apply_pax(mut data: &[u8], pending: &mut Pending) -> Result<(), ReadError> {
    let bad = |what: &str| ReadError::Malformed(format!("bad pax record: {what}"));
    while !data.is_empty() {
        let space = data
            .iter()
            .take(20)
            .position(|b| *b == b' ')
            .ok_or_else(|| bad("no length"))?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("length is not a number"))?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad("length does not match"));
        }
        let record = &data[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|b| *b == b'=')
            .ok_or_else(|| bad("no '='"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pending.path = Some(value.to_vec()),
            b"linkpath" => pending.link = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("size is not a number"))?;
                pending.size = Some(size);
            }
            k if k.starts_with(b"GNU.sparse.") => pending.sparse = true,
            _ => {}
        }
        data = &data[len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pax(records: &[u8]) -> Result<Pending, ReadError> {
        let mut p = Pending::default();
        apply_pax(records, &mut p).map(|()| p)
    }

    #[test]
    fn pax_records_are_parsed_by_length() {
        let p = pax(b"12 path=a\nb\n9 size=7\n").unwrap();
        assert_eq!(p.path.as_deref(), Some(&b"a\nb"[..]));
        assert_eq!(p.size, Some(7));
        for bad in [
            &b"13 path=a\nb\n"[..],
            b"x path=a\n",
            b"5 p=a\n",
            b"99 path=a\n",
            b"9 size=x\n",
            b"7 path\n",
            b"3 \n",
            b"-5 path=\n",
        ] {
            assert!(
                matches!(pax(bad), Err(ReadError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(pax(b"22 GNU.sparse.major=1\n").unwrap().sparse);
    }
}
