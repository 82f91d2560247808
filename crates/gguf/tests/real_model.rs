//! Dequantization of the real Gemma 3 270M GGUF against gguf-py's (golden statistics recorded
//! by `xtask/scripts/dequant_golden.py`; the weights themselves are never committed).

use std::path::PathBuf;

use wgemma_gguf::*;

/// The real model, fetched by `cargo run -p wgemma-cli -- pull` into the cache. Missing is a skip
/// on a developer machine and a failure in CI.
fn real_model() -> Option<PathBuf> {
    let path = std::env::var_os("WGEMMA_GEMMA3_270M")
        .map(PathBuf::from)
        .or_else(|| cache_dir().map(|d| d.join("models").join("gemma-3-270m-q4_k_m.gguf")))?;
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {} is missing: run `cargo run -p wgemma-cli -- pull` first",
        path.display()
    );
    eprintln!("skipping: {} not found", path.display());
    None
}

#[test]
fn dequant_matches_gguf_py() {
    let Some(path) = real_model() else { return };
    let src = MmapSource::open(&path).unwrap();
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&src)).unwrap()).unwrap();
    assert_eq!(g.tensors().len(), 236);
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/gemma3_270m_dequant.json")).unwrap();
    let mut dtypes = std::collections::BTreeSet::new();
    for t in golden["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = g.tensor(name).unwrap();
        assert_eq!(info.dtype.name(), t["dtype"].as_str().unwrap());
        dtypes.insert(info.dtype);
        let x = read_tensor_f32(&g, &src, info).unwrap();
        assert_eq!(x.len() as u64, t["elements"].as_u64().unwrap());
        for s in t["samples"].as_array().unwrap() {
            let (i, v) = (s[0].as_u64().unwrap() as usize, s[1].as_f64().unwrap());
            assert!(
                (x[i] as f64 - v).abs() <= 1e-6 * v.abs().max(1e-3),
                "{name}[{i}]: {} vs gguf-py {v}",
                x[i]
            );
        }
        let sum: f64 = x.iter().map(|&v| v as f64).sum();
        let sum_sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let absmax = x.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(sum, t["sum"].as_f64().unwrap()), "{name}: sum {sum}");
        assert!(
            close(sum_sq, t["sum_sq"].as_f64().unwrap()),
            "{name}: sum_sq {sum_sq}"
        );
        assert!(
            close(absmax, t["absmax"].as_f64().unwrap()),
            "{name}: absmax {absmax}"
        );
    }
    assert_eq!(
        dtypes.len(),
        5,
        "F32, Q5_0, Q8_0, Q4_K and Q6_K all checked"
    );
}

#[test]
fn random_blocks_match_gguf_py() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/random_blocks_gguf_py.json")).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 15);
    for case in cases {
        let dtype = GgmlType::from_name(case["dtype"].as_str().unwrap()).unwrap();
        let hex = case["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let ours = dequantize_to_vec(dtype, &bytes).unwrap();
        let theirs: Vec<f64> = case["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{dtype}");
        for (i, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a as f64 - b).abs() <= 1e-6 * b.abs().max(1e-3),
                "{dtype}[{i}]: {a} vs gguf-py {b}"
            );
        }
    }
}
