//! The audio tower's f32 CPU reference on the tiny random Gemma 4 E2B-like model against
//! transformers (`xtask/scripts/gemma4_audio_golden.py`, run on the lent GPU machine by
//! `bash benches/h100.sh audio_golden`): every recorded stage on the clip `a16k.wav`, with the
//! model read from llama.cpp's projector file; and the features computed here from the WAV
//! agree with those transformers fed the tower.

mod common;

use wgemma_audio::reference::{AudioConfig, AudioWeights};
use wgemma_gguf::{Gguf, MmapSource, TensorSource};

fn golden(name: &str) -> Vec<f32> {
    common::npy_f32(&format!("../golden/audio_e2b_a16k_{name}.npy"))
}

/// `max |got - want| / max |want|`.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn tower() -> (AudioConfig, AudioWeights) {
    let path = common::fixture_path("gemma4_tiny_audio_mmproj.gguf");
    let src = MmapSource::open(&path).unwrap();
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&src)).unwrap()).unwrap();
    let cfg = AudioConfig::from_gguf(&g).unwrap().expect("an audio tower");
    let w = AudioWeights::load(&g, &cfg, &src).unwrap();
    (cfg, w)
}

#[test]
fn the_cpu_reference_matches_transformers_at_every_stage() {
    let (cfg, w) = tower();
    assert_eq!((cfg.n_layer, cfg.hidden, cfg.n_head), (2, 64, 4));
    assert_eq!(
        (cfg.sscp_channels, cfg.output_dims, cfg.text_width),
        ([128, 8], 48, 64)
    );
    let features = golden("features");
    let mask: Vec<bool> = golden("mask").iter().map(|&m| m != 0.0).collect();
    let trace = w.forward(&cfg, &features, &mask);
    assert_eq!(trace.mask.iter().filter(|&&m| m).count(), 33);
    let stages = [
        ("sscp", &trace.sscp),
        ("layer0", &trace.layers[0]),
        ("encoder", &trace.layers[1]),
        ("output_proj", &trace.output),
        ("soft_tokens", &trace.soft_tokens),
    ];
    for (name, got) in stages {
        let err = rel_err(got, &golden(name));
        eprintln!("{name}: relative error {err:.2e}");
        assert!(err < 1e-4, "{name}: {err}");
    }
}

#[test]
fn features_from_the_wav_are_the_ones_transformers_fed_the_tower() {
    let chunks = wgemma_audio::mel_chunks_from_bytes(&common::fixture("a16k.wav")).unwrap();
    assert_eq!(chunks.len(), 1);
    let err = common::max_abs_diff(&chunks[0].features, &golden("features"));
    assert!(err < 1e-4, "{err}");
    assert_eq!(chunks[0].soft_tokens, 33);
}

#[test]
fn files_without_an_audio_tower_have_none() {
    let read = |path: std::path::PathBuf| {
        let src = MmapSource::open(&path).unwrap();
        let g = Gguf::parse(src.bytes(0, TensorSource::len(&src)).unwrap()).unwrap();
        AudioConfig::from_gguf(&g).unwrap()
    };
    // The text model, and a projector file holding only a vision tower.
    assert_eq!(read(common::fixture_path("gemma4_tiny_audio.gguf")), None);
    let vision = common::fixture_path(
        "../../../gemma4-vision/tests/fixtures/gemma4_tiny_vision_e2b_mmproj.gguf",
    );
    assert_eq!(read(vision), None);
}
