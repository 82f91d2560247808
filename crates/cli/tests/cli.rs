//! The `wgemma` binary as a user runs it: `info` on a file, on an Ollama model name resolved
//! through a store directory, on the real Gemma 3 270M when it is present, and on bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wgemma_gguf::GgmlType;
use wgemma_text::synth::{SynthSpec, synthetic_bytes};

fn wgemma(args: &[&str], ollama_models: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgemma"));
    cmd.args(args);
    if let Some(store) = ollama_models {
        cmd.env("OLLAMA_MODELS", store);
    }
    cmd.output().expect("the wgemma binary runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("info --json prints one JSON object")
}

fn scratch_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wgemma-cli-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn info_reads_a_file_and_an_ollama_name() {
    let dir = scratch_dir("info");
    let bytes = synthetic_bytes(&SynthSpec::tiny_gemma4(GgmlType::Q8_0)).unwrap();
    let file = dir.join("tiny.gguf");
    std::fs::write(&file, &bytes).unwrap();
    let by_path = json(&wgemma(&["info", file.to_str().unwrap(), "--json"], None));
    assert_eq!(by_path["architecture"], "gemma4");
    // A text-only model holds no vision tower.
    assert!(by_path["vision"].is_null());
    let tensors = by_path["tensors"].as_array().unwrap();
    assert_eq!(
        by_path["tensor_count"].as_u64().unwrap() as usize,
        tensors.len()
    );
    assert!(
        tensors
            .iter()
            .any(|t| t["name"] == "per_layer_token_embd.weight")
    );
    assert!(by_path["parameter_count"].as_u64().unwrap() > 0);
    assert_eq!(by_path["metadata"]["gemma4.block_count"], 7);

    // The same file as an Ollama blob named by a manifest.
    let store = dir.join("store");
    let digest = "d".repeat(64);
    std::fs::create_dir_all(store.join("blobs")).unwrap();
    std::fs::write(store.join("blobs").join(format!("sha256-{digest}")), &bytes).unwrap();
    let manifest = store.join("manifests/registry.ollama.ai/library/gemma4/tiny");
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    let layers = serde_json::json!({ "schemaVersion": 2, "layers": [
        { "mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{digest}") }
    ]});
    std::fs::write(&manifest, layers.to_string()).unwrap();
    let by_name = json(&wgemma(&["info", "gemma4:tiny", "--json"], Some(&store)));
    assert_eq!(by_name["tensor_count"], by_path["tensor_count"]);

    // A missing name and a truncated file: an error on stderr and a failing exit code.
    let missing = wgemma(&["info", "gemma4:nope"], Some(&store));
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("gemma4"));
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let truncated = wgemma(&["info", cut.to_str().unwrap()], None);
    assert!(!truncated.status.success());
    assert!(String::from_utf8_lossy(&truncated.stderr).starts_with("error:"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn info_on_the_real_gemma3_270m() {
    let Some(path) = wgemma_test_support::gemma3_270m() else {
        return;
    };
    let info = json(&wgemma(&["info", path.to_str().unwrap(), "--json"], None));
    assert_eq!(info["architecture"], "gemma3");
    assert_eq!(info["tensor_count"], 236);
    assert_eq!(info["parameter_count"], 268_098_176u64);
}

/// `--lora` on `score`: a GGUF adapter and the same adapter as a PEFT directory give the same
/// predictions, which differ from the base model's; at scale 0 the base model's exactly;
/// a missing file or a file that is no adapter is an error that names it.
#[test]
fn score_applies_lora_adapters_from_gguf_and_peft() {
    use wgemma_text::TextConfig;
    use wgemma_text::lora::{LoraAdapter, LoraPair, Proj};
    let dir = scratch_dir("lora");
    let bytes = synthetic_bytes(&SynthSpec::tiny_gemma4(GgmlType::Q8_0)).unwrap();
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, &bytes).unwrap();
    let cfg = TextConfig::from_gguf(&wgemma_gguf::Gguf::parse(&bytes).unwrap()).unwrap();
    let mut rng = wgemma_test_support::Rng(11);
    let mut adapter = LoraAdapter::default();
    for il in 0..cfg.n_layer {
        for p in [Proj::Q, Proj::O, Proj::Down] {
            let (rows, cols) = p.shape(&cfg, il);
            let pair = LoraPair {
                a: rng.vec(4 * cols, 1.0),
                b: rng.vec(rows * 4, 1.0),
                rank: 4,
                cols,
                rows,
                scale: 2.0,
            };
            adapter.pairs.insert((il, p), pair);
        }
    }
    let gguf = dir.join("adapter.gguf");
    std::fs::write(&gguf, adapter.to_gguf("gemma4").unwrap()).unwrap();
    let peft = dir.join("peft");
    std::fs::create_dir_all(&peft).unwrap();
    let (config, tensors) = adapter.to_peft("tiny").unwrap();
    std::fs::write(peft.join("adapter_config.json"), config).unwrap();
    std::fs::write(peft.join("adapter_model.safetensors"), tensors).unwrap();
    let score = |lora: &[&str]| {
        let mut args = vec![
            "score",
            "--model",
            model.to_str().unwrap(),
            "--tokens",
            "2,17,300,41,9,77",
        ];
        for l in lora {
            args.extend(["--lora", l]);
        }
        wgemma(&args, None)
    };
    let base = json(&score(&[]));
    let (g, p) = (gguf.to_str().unwrap(), peft.to_str().unwrap());
    let with_gguf = json(&score(&[g]));
    assert_ne!(with_gguf, base, "the adapter changed nothing");
    assert_eq!(json(&score(&[p])), with_gguf);
    assert_eq!(json(&score(&[&format!("{g}:0")])), base);
    for (bad, says) in [
        (dir.join("none.gguf"), "none.gguf"),
        (model.clone(), "general.type"),
    ] {
        let out = score(&[bad.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs the binary with `env` changes (`None` removes a variable), killing it after
/// `limit`: a command that blocks (on a FIFO, say) fails the test instead of hanging it.
fn wgemma_within(
    args: &[&str],
    env: &[(&str, Option<&str>)],
    limit: std::time::Duration,
) -> (Output, std::time::Duration) {
    use std::process::Stdio;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgemma"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let start = std::time::Instant::now();
    let mut child = cmd.spawn().expect("the wgemma binary runs");
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("wgemma {args:?} still runs after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let elapsed = start.elapsed();
    (child.wait_with_output().unwrap(), elapsed)
}

/// `bytes` with the u64 at `at` replaced.
fn patch_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Corrupt lengths in a header: `info` and `run` fail at once with a short message, never
/// one that quotes megabytes read from the file (a corrupt key length can claim 116 MB).
#[test]
fn corrupt_lengths_give_short_errors_fast() {
    let dir = scratch_dir("corrupt");
    let bytes = synthetic_bytes(&SynthSpec::tiny_gemma4(GgmlType::Q8_0)).unwrap();
    // The first key's length (after magic, version and the two counts) claims 116 MB, in a
    // file that holds that many bytes after it (sparse: the tail is a hole).
    let mut key = bytes.clone();
    patch_u64(&mut key, 24, 116 << 20);
    let key_file = dir.join("key.gguf");
    std::fs::write(&key_file, &key).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&key_file)
        .unwrap()
        .set_len(200 << 20)
        .unwrap();
    // A string value claiming 100 MB in a small file.
    let meta = vec![
        (
            "general.architecture".to_string(),
            wgemma_gguf::Value::String("gemma4".into()),
        ),
        (
            "general.name".to_string(),
            wgemma_gguf::Value::String("tiny".into()),
        ),
    ];
    let mut value = wgemma_gguf::write_gguf(&meta, &[], 32).unwrap();
    let at = value
        .windows(12)
        .position(|w| w == b"general.name")
        .unwrap();
    patch_u64(&mut value, at + 12 + 4, 100 << 20);
    let value_file = dir.join("value.gguf");
    std::fs::write(&value_file, &value).unwrap();

    let limit = std::time::Duration::from_secs(30);
    for file in [&key_file, &value_file] {
        let path = file.to_str().unwrap();
        for args in [vec!["info", path], vec!["run", "--model", path, "hi"]] {
            let (out, took) = wgemma_within(&args, &[], limit);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} succeeded");
            assert!(err.starts_with("error:"), "{err}");
            assert!(err.len() < 1024, "{args:?}: {} bytes of error", err.len());
            assert!(took.as_secs_f64() < 2.0, "{args:?} took {took:?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A directory or a FIFO given as a model is named for what it is, and a FIFO is never
/// opened (which would wait for a writer).
#[cfg(unix)]
#[test]
fn a_directory_or_fifo_as_model_says_what_it_is() {
    let dir = scratch_dir("kinds");
    let fifo = dir.join("model.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let (d, f) = (dir.to_str().unwrap(), fifo.to_str().unwrap());
    let limit = std::time::Duration::from_secs(30);
    for (args, says) in [
        (vec!["info", d], "is a directory"),
        (vec!["run", "--model", d, "hi"], "is a directory"),
        (vec!["info", f], "is not a regular file"),
        (
            vec!["tokenize", "--model", f, "hi"],
            "is not a regular file",
        ),
        (vec!["run", "--model", f, "hi"], "is not a regular file"),
    ] {
        let (out, _) = wgemma_within(&args, &[], limit);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("no such file"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// On a machine without a desktop session (no XDG_RUNTIME_DIR), a command that uses the GPU
/// prints nothing about Wayland: Mesa's device-selection layer would make libwayland say
/// "XDG_RUNTIME_DIR is invalid or not set" twice.
#[test]
fn gpu_commands_without_a_desktop_session_print_no_wayland_noise() {
    let dir = scratch_dir("wayland");
    let bytes = synthetic_bytes(&SynthSpec::tiny_gemma4(GgmlType::Q8_0)).unwrap();
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, &bytes).unwrap();
    let args = [
        "score",
        "--model",
        model.to_str().unwrap(),
        "--tokens",
        "2,17,300",
    ];
    let env = [
        ("XDG_RUNTIME_DIR", None),
        ("WAYLAND_DISPLAY", None),
        ("WAYLAND_SOCKET", None),
    ];
    let (out, _) = wgemma_within(&args, &env, std::time::Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A warning logged into a pipe is plain text: no ANSI colour codes.
#[test]
fn logs_into_a_pipe_have_no_colour_codes() {
    let dir = scratch_dir("colour");
    let bytes = synthetic_bytes(&SynthSpec::tiny_gemma4(GgmlType::Q8_0)).unwrap();
    let header = wgemma_gguf::Gguf::parse(&bytes).unwrap();
    // An end-of-turn id outside the vocabulary: the tokenizer warns and ignores it.
    let mut meta: Vec<_> = header
        .metadata
        .entries()
        .iter()
        .filter(|(k, _)| k != "tokenizer.ggml.eot_token_id")
        .cloned()
        .collect();
    meta.push((
        "tokenizer.ggml.eot_token_id".to_string(),
        wgemma_gguf::Value::U32(u32::MAX),
    ));
    let model = dir.join("warns.gguf");
    std::fs::write(&model, wgemma_gguf::write_gguf(&meta, &[], 32).unwrap()).unwrap();
    let args = ["tokenize", "--model", model.to_str().unwrap(), "hi"];
    let (out, _) = wgemma_within(
        &args,
        &[("NO_COLOR", None)],
        std::time::Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("WARN"), "no warning logged: {err}");
    assert!(!err.contains('\x1b'), "{err:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The audio fixtures of `crates/gemma4-audio/tests` (tiny model, projector, clips).
fn audio_fixture(name: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gemma4-audio/tests");
    dir.join(name).display().to_string()
}

#[test]
fn audio_on_the_command_line_encodes_scores_and_runs() {
    let (model, mmproj) = (
        audio_fixture("fixtures/gemma4_tiny_audio.gguf"),
        audio_fixture("fixtures/gemma4_tiny_audio_mmproj.gguf"),
    );
    let clip = audio_fixture("fixtures/a16k.wav");
    let dir = scratch_dir("audio");
    let npy = dir.join("soft.npy").display().to_string();
    let base = ["--model", &model, "--mmproj", &mmproj];
    let encode = wgemma(
        &[&["encode"], &base[..], &["--audio", &clip, "--out", &npy]].concat(),
        None,
    );
    assert!(
        encode.status.success(),
        "{}",
        String::from_utf8_lossy(&encode.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&encode.stdout).trim(), "33");
    let bytes = std::fs::read(&npy).unwrap();
    let array = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(array.shape(), &[33, 64]);

    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(audio_fixture("golden/audio_e2b.json")).unwrap())
            .unwrap();
    let tokens: Vec<String> = golden["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let at = format!("{clip}@{}", golden["audio_positions"][0]);
    let score = wgemma(
        &[
            &["score"],
            &base[..],
            &["--tokens", &tokens.join(","), "--audio", &at],
        ]
        .concat(),
        None,
    );
    let positions = json(&score)["positions"].as_array().unwrap().len();
    assert_eq!(positions, tokens.len());
    // A clip at the wrong place: its placeholders are not there.
    let misplaced = format!("{clip}@3");
    let wrong = wgemma(
        &[
            &["score"],
            &base[..],
            &["--tokens", &tokens.join(","), "--audio", &misplaced],
        ]
        .concat(),
        None,
    );
    assert!(!wrong.status.success());

    let run = wgemma(
        &[
            &["run"],
            &base[..],
            &[
                "--audio",
                &clip,
                "--greedy",
                "--max-tokens",
                "3",
                "What is it?",
            ],
        ]
        .concat(),
        None,
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("1 audio clip encoded"), "{stderr}");

    // A file that is no audio: an error naming it, no panic.
    let bad = dir.join("bad.wav");
    std::fs::write(&bad, b"RIFF\x10\x00\x00\x00WAVEjunk").unwrap();
    let bad = bad.display().to_string();
    let out = wgemma(
        &[&["run"], &base[..], &["--audio", &bad, "Hi"]].concat(),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("bad.wav") && !stderr.contains("panicked"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `wgemma serve` from the command line: it listens where asked, answers OpenAI's chat
/// endpoint (with the key it was given) and stops on SIGTERM.
#[cfg(unix)]
#[test]
fn serve_answers_chat_requests_until_stopped() {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let model = audio_fixture("fixtures/gemma4_tiny_audio.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgemma"))
        .args(["serve", "--model", &model, "--port", &port.to_string()])
        .env("WGEMMA_API_KEY", "k1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let started = std::time::Instant::now();
    let reply = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut conn) => {
                conn.write_all(request.as_bytes()).unwrap();
                let mut reply = String::new();
                conn.read_to_string(&mut reply).unwrap();
                break reply;
            }
            Err(_) if started.elapsed() < std::time::Duration::from_secs(60) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("the server never listened: {e}"),
        }
    };
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"chat.completion\""), "{reply}");
    // SAFETY: signalling the child this test started.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
