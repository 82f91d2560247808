//! The cache entry's bookkeeping: the lock that lets one process at a time fetch a model, and
//! the sidecar that lets a start trust the cached file without hashing 250 MB.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::{PullError, PullEvent, hex, io_err};

/// The exclusive lock on one model's cache entry, held until dropped (the OS also drops it
/// when the process dies, so a killed fetch blocks nobody).
pub(super) struct EntryLock {
    /// `None` where the file system takes no locks.
    _file: Option<File>,
    /// Whether another process held the lock first.
    pub waited: bool,
    /// Appended to temporary file names: empty under the lock, so that the next run finds
    /// (and resumes) them; unique to this process where no lock guards them.
    pub suffix: String,
}

impl EntryLock {
    pub fn acquire(
        dir: &Path,
        name: &str,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<Self, PullError> {
        let path = dir.join(format!(".{name}.lock"));
        // Never truncated nor removed: removing a lock file while another process waits on
        // it would let a third lock a new file of the same name.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
        // fs4's trait, called by path: on Rust 1.89+ `file.lock()` would be std's, newer than
        // the workspace's rust-version.
        let waited = match fs4::FileExt::try_lock(&file) {
            Ok(()) => false,
            Err(fs4::TryLockError::WouldBlock) => {
                events(PullEvent::Waiting { lock: path.clone() });
                fs4::FileExt::lock(&file).map_err(io_err(format!("locking {}", path.display())))?;
                true
            }
            Err(fs4::TryLockError::Error(e)) => {
                // Some network file systems take no locks: go on without, in files no other
                // process names (no resume across runs then, but no collisions either).
                tracing::warn!(
                    "cannot lock {}: {e}; fetching without a lock",
                    path.display()
                );
                return Ok(Self {
                    _file: None,
                    waited: false,
                    suffix: unique_suffix(),
                });
            }
        };
        Ok(Self {
            _file: Some(file),
            waited,
            suffix: String::new(),
        })
    }
}

fn unique_suffix() -> String {
    let nanos = UNIX_EPOCH.elapsed().map_or(0, |d| d.subsec_nanos());
    format!(".{}-{nanos}", std::process::id())
}

/// The sidecar of the model file at `path`: `<path>.sha256`.
fn sidecar_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The file's size and modification time in nanoseconds: what a sidecar vouches for.
fn stamp(path: &Path) -> Option<(u64, u128)> {
    let meta = fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some((meta.len(), mtime.as_nanos()))
}

/// Whether the sidecar of `path` holds `sha256` and the file's current size (`size`) and
/// mtime: the file was verified and nothing wrote to it since.
pub(super) fn sidecar_matches(path: &Path, sha256: &str, size: u64) -> bool {
    let Ok(text) = fs::read_to_string(sidecar_path(path)) else {
        return false;
    };
    let Some((len, mtime)) = stamp(path) else {
        return false;
    };
    let mut lines = text.lines();
    let digest_ok = lines
        .next()
        .and_then(|l| l.split_whitespace().next())
        .is_some_and(|d| d == sha256);
    digest_ok && len == size && lines.next() == Some(&stamp_line(len, mtime))
}

/// A comment to `sha256sum -c`, which ignores lines starting with `#`.
fn stamp_line(len: u64, mtime_ns: u128) -> String {
    format!("# size {len} mtime_ns {mtime_ns}")
}

/// Records that the file at `path` (named `file_name`) has digest `sha256`, with its current
/// size and mtime; written aside and renamed, so that a reader sees the old or the new one.
pub(super) fn write_sidecar(
    path: &Path,
    sha256: &str,
    file_name: &str,
    suffix: &str,
) -> Result<(), PullError> {
    let (len, mtime) = stamp(path).ok_or_else(|| PullError::Io {
        what: format!("reading the size and mtime of {}", path.display()),
        source: std::io::Error::other("no metadata"),
    })?;
    let sidecar = sidecar_path(path);
    let mut tmp = sidecar.as_os_str().to_owned();
    tmp.push(format!(".tmp{suffix}"));
    let tmp = PathBuf::from(tmp);
    let text = format!("{sha256}  {file_name}\n{}\n", stamp_line(len, mtime));
    fs::write(&tmp, text).map_err(io_err(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, &sidecar).map_err(io_err(format!("writing {}", sidecar.display())))
}

pub(super) fn remove_sidecar(path: &Path) -> Result<(), PullError> {
    let sidecar = sidecar_path(path);
    match fs::remove_file(&sidecar) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PullError::Io {
            what: format!("removing {}", sidecar.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The sha256 of the file at `path` in hex, reporting `progress(done, total)` as it reads.
pub(super) fn hash_file(
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<String, PullError> {
    let what = || path.display().to_string();
    let mut file = File::open(path).map_err(io_err(what()))?;
    let total = file.metadata().map_err(io_err(what()))?.len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io_err(what()))?;
        if n == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&buf[..n]);
        done += n as u64;
        progress(done, total);
    }
}
