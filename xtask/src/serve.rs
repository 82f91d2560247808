//! `cargo xtask serve`: the demo page and models over HTTP on 127.0.0.1, with the Range
//! requests the browser loader reads weights by. `web/` is served at `/`, each `--model` file at
//! `/models/<file name>`, and their names at `/models/index.json`. Under `/broken/` the same
//! files are served with every body longer than a byte cut off halfway and the connection
//! closed, as a dropped download looks to the browser.

use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::{TaskError, workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// GGUF files to offer at /models/<file name>.
    #[arg(long)]
    model: Vec<PathBuf>,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Serve the page as it is, without rebuilding the wasm package first.
    #[arg(long)]
    no_build: bool,
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let root = workspace_root();
    if !a.no_build {
        crate::wasm::build(&root)?;
    }
    let server = Server::start(root.join("web"), a.model, a.port)?;
    eprintln!("serving http://{}/ (Ctrl-C stops)", server.addr);
    server.join();
    Ok(())
}

struct Site {
    web: PathBuf,
    models: Vec<PathBuf>,
}

/// A running server; its threads live until the process ends.
pub struct Server {
    pub addr: SocketAddr,
    accept: std::thread::JoinHandle<()>,
}

impl Server {
    /// Listens on 127.0.0.1:`port` (0: any free port).
    pub fn start(web: PathBuf, models: Vec<PathBuf>, port: u16) -> Result<Self, TaskError> {
        for m in &models {
            if !m.is_file() {
                return Err(format!("{}: no such file", m.display()).into());
            }
        }
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let addr = listener.local_addr()?;
        let site = Arc::new(Site { web, models });
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let site = site.clone();
                std::thread::spawn(move || {
                    // A client that goes away mid-response is not an error worth reporting.
                    let _ = serve_connection(&site, stream);
                });
            }
        });
        Ok(Self { addr, accept })
    }

    pub fn join(self) {
        let _ = self.accept.join();
    }
}

/// Requests are read until the client closes the connection (HTTP/1.1 keep-alive).
fn serve_connection(site: &Site, stream: TcpStream) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        // Lines are read at most 8 KiB at a time, so no client makes the server allocate more.
        let mut request_line = String::new();
        if (&mut reader).take(8 << 10).read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut range = None;
        let mut header_bytes = 0;
        loop {
            let mut line = String::new();
            let n = (&mut reader).take(8 << 10).read_line(&mut line)?;
            header_bytes += n;
            if n == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            if header_bytes > 64 << 10 {
                return respond_status(&mut out, 431, "Request Header Fields Too Large");
            }
            if let Some((k, v)) = line.split_once(':')
                && k.trim().eq_ignore_ascii_case("range")
            {
                range = Some(v.trim().to_string());
            }
        }
        let mut parts = request_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        if method != "GET" && method != "HEAD" {
            respond_status(&mut out, 405, "Method Not Allowed")?;
            continue;
        }
        let path = target.split(['?', '#']).next().unwrap_or("/");
        respond(site, &mut out, path, range.as_deref(), method == "HEAD")?;
    }
}

fn respond_status(out: &mut TcpStream, code: u16, reason: &str) -> io::Result<()> {
    write!(
        out,
        "HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{reason}",
        reason.len()
    )
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        "json" => "application/json",
        "css" => "text/css",
        "ts" => "text/plain; charset=utf-8",
        "png" => "image/png",
        _ => "application/octet-stream",
    }
}

/// What a URL path names.
#[derive(Debug, PartialEq)]
enum Target {
    /// A file under `web/` or a served model; never outside them (a path that does not
    /// exist stands for a 404).
    File(PathBuf),
    /// A generated JSON body.
    Json(Vec<u8>),
}

fn resolve(site: &Site, path: &str) -> Target {
    if path == "/models/index.json" {
        let names: Vec<String> = site
            .models
            .iter()
            .filter_map(|m| m.file_name()?.to_str().map(str::to_string))
            .collect();
        return Target::Json(serde_json::to_vec(&names).unwrap_or_default());
    }
    if let Some(name) = path.strip_prefix("/models/") {
        return Target::File(
            site.models
                .iter()
                .find(|m| m.file_name().and_then(|n| n.to_str()) == Some(name))
                .cloned()
                .unwrap_or_default(),
        );
    }
    let rel = Path::new(path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Target::File(PathBuf::new());
    }
    let file = site.web.join(rel);
    Target::File(if file.is_dir() {
        file.join("index.html")
    } else {
        file
    })
}

fn respond(
    site: &Site,
    out: &mut TcpStream,
    path: &str,
    range: Option<&str>,
    head: bool,
) -> io::Result<()> {
    let (path, broken) = match path.strip_prefix("/broken") {
        Some(rest) if rest.starts_with('/') => (rest, true),
        _ => (path, false),
    };
    let file = match resolve(site, path) {
        Target::File(f) => f,
        Target::Json(json) => {
            write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nCache-Control: no-cache\r\n\r\n",
                json.len()
            )?;
            return if head { Ok(()) } else { out.write_all(&json) };
        }
    };
    let Ok((mut fh, meta)) = std::fs::File::open(&file).and_then(|f| f.metadata().map(|m| (f, m)))
    else {
        return respond_status(out, 404, "Not Found");
    };
    if !meta.is_file() {
        return respond_status(out, 404, "Not Found");
    }
    let size = meta.len();
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let common = format!(
        "Content-Type: {}\r\nAccept-Ranges: bytes\r\nETag: \"{size:x}-{mtime:x}\"\r\nCache-Control: no-cache",
        content_type(&file)
    );
    let (status, start, len) = match range.map(|r| parse_range(r, size)) {
        None => ("200 OK".to_string(), 0, size),
        Some(Some((start, end))) => (
            format!(
                "206 Partial Content\r\nContent-Range: bytes {start}-{}/{size}",
                end - 1
            ),
            start,
            end - start,
        ),
        Some(None) => {
            return write!(
                out,
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{size}\r\nContent-Length: 0\r\n\r\n"
            );
        }
    };
    write!(
        out,
        "HTTP/1.1 {status}\r\n{common}\r\nContent-Length: {len}\r\n\r\n"
    )?;
    if head {
        return Ok(());
    }
    fh.seek(SeekFrom::Start(start))?;
    if broken && len > 1 {
        io::copy(&mut fh.take(len / 2), out)?;
        return Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "cut off on purpose",
        ));
    }
    io::copy(&mut fh.take(len), out)?;
    Ok(())
}

/// The byte span `[start, end)` of a single-range `Range` header (`bytes=a-b`, `bytes=a-`,
/// `bytes=-n`), or `None` when it cannot be satisfied.
fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
    let spec = header.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        (size.saturating_sub(n), size)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            size
        } else {
            b.parse::<u64>().ok()?.saturating_add(1).min(size)
        };
        (start, end)
    };
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-0", 10), Some((0, 1)));
        assert_eq!(parse_range("bytes=2-", 10), Some((2, 10)));
        assert_eq!(parse_range("bytes=-3", 10), Some((7, 10)));
        assert_eq!(parse_range("bytes=5-100", 10), Some((5, 10)));
        assert_eq!(parse_range("bytes=10-", 10), None);
        assert_eq!(parse_range("bytes=4-2", 10), None);
        assert_eq!(parse_range("bytes=0-1,4-5", 10), None);
        assert_eq!(parse_range("items=0-1", 10), None);
    }

    #[test]
    fn paths_stay_inside_the_site() {
        let site = Site {
            web: PathBuf::from("/srv/web"),
            models: vec![PathBuf::from("/m/tiny.gguf")],
        };
        let file = |p: &str| Target::File(PathBuf::from(p));
        assert_eq!(resolve(&site, "/app.js"), file("/srv/web/app.js"));
        assert_eq!(resolve(&site, "/models/tiny.gguf"), file("/m/tiny.gguf"));
        assert_eq!(resolve(&site, "/models/other.gguf"), file(""));
        assert_eq!(resolve(&site, "/../etc/passwd"), file(""));
        assert_eq!(
            resolve(&site, "/models/index.json"),
            Target::Json(br#"["tiny.gguf"]"#.to_vec())
        );
    }
}
