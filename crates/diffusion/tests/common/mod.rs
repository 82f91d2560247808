//! What the diffusion crate's tests share: the tiny random model of
//! `xtask/scripts/diffusion_gemma_fixtures.py`, its goldens, and the error measure.

#![allow(dead_code)]

pub const GGUF: &[u8] = include_bytes!("../fixtures/dg_tiny.gguf");
pub const GOLDEN: &str = include_str!("../golden/dg_tiny.json");
pub const REPLAY: &str = include_str!("../golden/dg_tiny_replay.json");

/// A raw little-endian f32 golden file of `tests/golden/`.
pub fn golden_f32(name: &str) -> Vec<f32> {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A JSON array of whole numbers as token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A JSON array of numbers as f32.
pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

pub fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}
