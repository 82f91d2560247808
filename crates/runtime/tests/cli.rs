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
