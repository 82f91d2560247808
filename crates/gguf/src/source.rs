//! Where tensor bytes come from: a memory-mapped file or owned bytes (synchronous, zero-copy),
//! or any asynchronous byte-range reader (the browser's HTTP Range fetches, a local file).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::{GgufError, SourceError};
use crate::file::Gguf;

/// Synchronous random access to a file's bytes without copying.
pub trait TensorSource: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes `[offset, offset + len)`.
    fn bytes(&self, offset: u64, len: u64) -> Result<&[u8], SourceError>;
}

fn slice_of(all: &[u8], offset: u64, len: u64) -> Result<&[u8], SourceError> {
    let size = all.len() as u64;
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(&all[offset as usize..end as usize]),
        _ => Err(SourceError::OutOfRange { offset, len, size }),
    }
}

impl<T: TensorSource + ?Sized> TensorSource for Arc<T> {
    fn len(&self) -> u64 {
        (**self).len()
    }

    fn bytes(&self, offset: u64, len: u64) -> Result<&[u8], SourceError> {
        (**self).bytes(offset, len)
    }
}

/// A file held in memory.
#[derive(Clone)]
pub struct BytesSource(Arc<[u8]>);

impl BytesSource {
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Self {
        Self(bytes.into())
    }
}

impl TensorSource for BytesSource {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn bytes(&self, offset: u64, len: u64) -> Result<&[u8], SourceError> {
        slice_of(&self.0, offset, len)
    }
}

/// Opens `path` for reading when it is a regular file: a directory or a FIFO, socket or
/// device is an error naming what it is, and opening never blocks (a FIFO would wait for a
/// writer). Returns the file and its length.
#[cfg(not(target_arch = "wasm32"))]
fn open_regular(path: &std::path::Path) -> Result<(std::fs::File, u64), SourceError> {
    let kind = |meta: &std::fs::Metadata| {
        if meta.is_dir() {
            Err(SourceError::IsDirectory)
        } else if !meta.is_file() {
            Err(SourceError::NotRegularFile)
        } else {
            Ok(())
        }
    };
    // Asked first for the message (Windows cannot open a directory at all); the open handle
    // is asked again below, which is what counts if the path changes in between.
    kind(&std::fs::metadata(path)?)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    // Non-blocking, so that a FIFO put in place after the check cannot hang the open; reads
    // of a regular file ignore the flag.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NONBLOCK);
    let file = opts.open(path)?;
    let meta = file.metadata()?;
    kind(&meta)?;
    Ok((file, meta.len()))
}

/// A memory-mapped file (native only).
///
/// Reads through the map are plain memory reads: if the file is truncated while it is mapped,
/// touching a page past the new end kills the process with SIGBUS (on Linux and macOS) instead
/// of returning an error. Read headers with [`read_file_header`], which copies through
/// ordinary reads, and do not truncate or rewrite a model file in place while it is loaded
/// (write a new file and rename it over the old one instead: the map keeps the old one).
#[cfg(not(target_arch = "wasm32"))]
pub struct MmapSource {
    map: memmap2::Mmap,
}

#[cfg(not(target_arch = "wasm32"))]
impl MmapSource {
    /// Maps `path` read-only; it must be a regular file.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self, SourceError> {
        let (file, _) = open_regular(path.as_ref())?;
        // SAFETY: the map is read-only and only ever read as bytes. A file truncated underneath
        // it faults on access (SIGBUS, see the type's documentation): a risk every mmap-based
        // loader takes (llama.cpp maps the same way), documented rather than defended against.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(Self { map })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl TensorSource for MmapSource {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn bytes(&self, offset: u64, len: u64) -> Result<&[u8], SourceError> {
        slice_of(&self.map, offset, len)
    }
}

/// Asynchronous byte-range reads: what an HTTP Range reader or a local-file reader implements.
///
/// Natively the futures are `Send`, so that a multi-threaded async runtime can move the tasks
/// that await them; in the browser they need not be (browser futures are not).
pub trait RangeSource {
    /// Total length in bytes.
    fn len(&self) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads `[offset, offset + len)`; the result holds exactly `len` bytes.
    fn read_range(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, SourceError>> + MaybeSend;
}

impl<T: TensorSource> RangeSource for T {
    fn len(&self) -> u64 {
        TensorSource::len(self)
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, SourceError>> + MaybeSend {
        std::future::ready(self.bytes(offset, len).map(<[u8]>::to_vec))
    }
}

/// `Send + Sync` natively; no bound on wasm32, where nothing crosses threads and browser
/// objects are neither.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSendSync: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync + ?Sized> MaybeSendSync for T {}
/// `Send + Sync` natively; no bound on wasm32, where nothing crosses threads and browser
/// objects are neither.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSendSync {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSendSync for T {}

/// `Send` natively; no bound on wasm32.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + ?Sized> MaybeSend for T {}
/// `Send` natively; no bound on wasm32.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSend for T {}

/// The future of [`RowFetcher::fetch`]: every range's bytes, in order (`Send` natively).
#[cfg(not(target_arch = "wasm32"))]
pub type FetchedRows<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Vec<u8>>, SourceError>> + Send + 'a>>;
/// The future of [`RowFetcher::fetch`]: every range's bytes, in order (`Send` natively).
#[cfg(target_arch = "wasm32")]
pub type FetchedRows<'a> = Pin<Box<dyn Future<Output = Result<Vec<Vec<u8>>, SourceError>> + 'a>>;

/// Scattered reads while a model runs (Gemma 4's per-layer embedding rows: kilobytes per token
/// at random offsets), from a source that cannot answer synchronously, such as HTTP Range
/// requests in the browser. Object-safe; every [`RangeSource`] is one.
pub trait RowFetcher: MaybeSendSync {
    /// The bytes of each `(offset, len)` range; the reads may run concurrently.
    fn fetch<'a>(&'a self, ranges: &'a [(u64, u64)]) -> FetchedRows<'a>;
}

impl<T: RangeSource + MaybeSendSync> RowFetcher for T {
    fn fetch<'a>(&'a self, ranges: &'a [(u64, u64)]) -> FetchedRows<'a> {
        Box::pin(futures::future::try_join_all(
            ranges
                .iter()
                .map(|&(offset, len)| self.read_range(offset, len)),
        ))
    }
}

/// A local file read by positioned reads (native only), for callers that want the async
/// interface without mapping the file.
#[cfg(not(target_arch = "wasm32"))]
pub struct FileRangeSource {
    file: std::fs::File,
    len: u64,
}

#[cfg(not(target_arch = "wasm32"))]
impl FileRangeSource {
    /// Opens `path`; it must be a regular file.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self, SourceError> {
        let (file, len) = open_regular(path.as_ref())?;
        Ok(Self { file, len })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
        }
        #[cfg(windows)]
        {
            let mut done = 0;
            while done < buf.len() {
                let n = std::os::windows::fs::FileExt::seek_read(
                    &self.file,
                    &mut buf[done..],
                    offset + done as u64,
                )?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                done += n;
            }
            Ok(())
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl RangeSource for FileRangeSource {
    fn len(&self) -> u64 {
        self.len
    }

    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(SourceError::OutOfRange {
                    offset,
                    len,
                    size: self.len,
                });
            }
        }
        let mut buf = vec![0u8; len as usize];
        self.read_at(offset, &mut buf).map_err(|e| match e.kind() {
            // The length was checked against the size at open: the file shrank since.
            std::io::ErrorKind::UnexpectedEof => SourceError::Shrank {
                offset,
                len,
                size: self.len,
            },
            _ => SourceError::Io(e),
        })?;
        Ok(buf)
    }
}

/// Reads and parses the header of the GGUF file at `path` with ordinary positioned reads
/// (never through a memory map), so a file cut short or truncated while it is read gives an
/// error, not a SIGBUS. Only the header's bytes are read.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_file_header(path: impl AsRef<std::path::Path>) -> Result<Gguf, GgufError> {
    let file = FileRangeSource::open(path)?;
    // FileRangeSource's reads are synchronous: every future is ready when first polled.
    futures::executor::block_on(read_header(&file)).map(|(g, _)| g)
}

/// The first read of a header; doubled on each further read, so a header of `h` bytes costs
/// at most `1 + log2(h / FIRST_READ)` requests.
pub const FIRST_HEADER_READ: u64 = 1 << 20;

/// Reads and parses a GGUF header through `source`, fetching only header bytes. Returns the
/// header and how many range requests it took.
pub async fn read_header<S: RangeSource + ?Sized>(source: &S) -> Result<(Gguf, usize), GgufError> {
    let file_len = source.len();
    let mut buf = source
        .read_range(0, FIRST_HEADER_READ.min(file_len))
        .await?;
    let mut requests = 1;
    loop {
        match Gguf::parse_prefix(&buf, file_len) {
            Err(GgufError::NeedMoreBytes { have, at_least }) => {
                let want = at_least.max(have.saturating_mul(2)).min(file_len);
                let more = source.read_range(have, want - have).await?;
                buf.extend_from_slice(&more);
                requests += 1;
            }
            other => return other.map(|g| (g, requests)),
        }
    }
}

/// The directory where wgemma caches downloaded models: `$WGEMMA_CACHE`, else
/// `$XDG_CACHE_HOME/wgemma`, else `~/.cache/wgemma`.
#[cfg(not(target_arch = "wasm32"))]
pub fn cache_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let env = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("WGEMMA_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("wgemma")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("wgemma")))
}
