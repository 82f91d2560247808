//! The audio tower's f32 CPU reference on the tiny random Gemma 4 E2B-like model against
//! transformers (`xtask/scripts/gemma4_audio_golden.py`, run on the lent GPU machine by
//! `bash benches/h100.sh audio_golden`): every recorded stage on the clip `a16k.wav`, with the
//! model read from llama.cpp's projector file; and the features computed here from the WAV
//! agree with those transformers fed the tower. The GPU tower against both: the goldens'
//! stages, and the CPU reference on clips whose lengths leave invalid frames (the padding
//! mask) and on a full 30 s chunk.

mod common;

use wgemma_audio::reference::{AudioConfig, AudioTrace, AudioWeights};
use wgemma_audio::{AudioTower, MelChunk, Pcm16k};
use wgemma_gguf::{BytesSource, Gguf, MmapSource, TensorSource};

/// Clips with transformers' stages: a multiple of 128 samples, and one whose pad leaves an
/// invalid frame (the padding mask in the subsampling).
const CLIPS: [&str; 2] = ["a16k", "b16k"];

fn golden(clip: &str, name: &str) -> Vec<f32> {
    common::npy_f32(&format!("../golden/audio_e2b_{clip}_{name}.npy"))
}

/// The features and mask transformers fed the tower for `clip`.
fn golden_chunk(clip: &str) -> MelChunk {
    let mask: Vec<bool> = golden(clip, "mask").iter().map(|&m| m != 0.0).collect();
    MelChunk {
        features: golden(clip, "features"),
        soft_tokens: wgemma_audio::soft_tokens(&mask),
        start_sample: 0,
        samples: mask.len() * 160,
        mask,
    }
}

/// transformers' stages of `clip`, with the validity mask `mask` (the CPU reference's).
fn golden_trace(clip: &str, mask: Vec<bool>) -> AudioTrace {
    AudioTrace {
        sscp: golden(clip, "sscp"),
        layers: vec![golden(clip, "layer0"), golden(clip, "encoder")],
        output: golden(clip, "output_proj"),
        soft_tokens: golden(clip, "soft_tokens"),
        mask,
    }
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
    for (clip, tokens) in CLIPS.into_iter().zip([33, 32]) {
        let chunk = golden_chunk(clip);
        let trace = w.forward(&cfg, &chunk.features, &chunk.mask);
        assert_eq!(trace.mask.iter().filter(|&&m| m).count(), tokens);
        let want = golden_trace(clip, trace.mask.clone());
        compare(
            &format!("{clip} CPU vs transformers"),
            &trace,
            &want,
            &cfg,
            1e-4,
        );
    }
    assert!(
        golden_chunk("b16k").mask.contains(&false),
        "b16k has an invalid frame"
    );
}

#[test]
fn features_from_the_wav_are_the_ones_transformers_fed_the_tower() {
    let chunks = wgemma_audio::mel_chunks_from_bytes(&common::fixture("a16k.wav")).unwrap();
    assert_eq!(chunks.len(), 1);
    let err = common::max_abs_diff(&chunks[0].features, &golden("a16k", "features"));
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

fn gpu_tower() -> Option<(AudioTower, AudioWeights)> {
    let ctx = wgemma_test_support::gpu()?.clone();
    let bytes = common::fixture("gemma4_tiny_audio_mmproj.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = AudioConfig::from_gguf(&g).unwrap().unwrap();
    let src = BytesSource::new(bytes.clone());
    let tower = pollster::block_on(AudioTower::load(ctx, &g, &cfg, &src, |_, _| {})).unwrap();
    let cpu = AudioWeights::load(&g, &cfg, &src).unwrap();
    Some((tower, cpu))
}

/// The GPU trace's stages against `want`'s, each over the valid positions only (the padding
/// positions after them are dropped from the soft tokens and may differ).
fn compare(what: &str, got: &AudioTrace, want: &AudioTrace, cfg: &AudioConfig, tol: f32) {
    let tokens = want.mask.iter().filter(|&&m| m).count();
    assert_eq!(
        got.soft_tokens.len(),
        tokens * cfg.text_width,
        "{what}: soft tokens"
    );
    let valid = |v: &[f32], width: usize| v[..tokens * width].to_vec();
    let mut stages = vec![(
        "sscp",
        valid(&got.sscp, cfg.hidden),
        valid(&want.sscp, cfg.hidden),
    )];
    for (i, (g, w)) in got.layers.iter().zip(&want.layers).enumerate() {
        let name = if i == 0 { "layer0" } else { "later layer" };
        stages.push((name, valid(g, cfg.hidden), valid(w, cfg.hidden)));
    }
    stages.push((
        "output_proj",
        valid(&got.output, cfg.output_dims),
        valid(&want.output, cfg.output_dims),
    ));
    stages.push((
        "soft_tokens",
        got.soft_tokens.clone(),
        want.soft_tokens.clone(),
    ));
    for (name, g, w) in stages {
        let err = rel_err(&g, &w);
        eprintln!("{what} {name}: relative error {err:.2e}");
        assert!(err < tol, "{what} {name}: {err}");
    }
}

/// The GPU's products may round through f16 (tensor cores): within 2e-3 of f32 at every
/// stage, as the issue asks of transformers' values.
const GPU_TOLERANCE: f32 = 2e-3;

#[test]
fn the_gpu_tower_matches_transformers_at_every_stage() {
    let Some((tower, cpu)) = gpu_tower() else {
        return;
    };
    let cfg = &tower.cfg;
    for clip in CLIPS {
        let chunk = golden_chunk(clip);
        let got = pollster::block_on(tower.trace(&chunk)).unwrap();
        let mask = cpu.forward(cfg, &chunk.features, &chunk.mask).mask;
        let want = golden_trace(clip, mask);
        compare(
            &format!("{clip} vs transformers"),
            &got,
            &want,
            cfg,
            GPU_TOLERANCE,
        );
        let encoded = pollster::block_on(tower.encode_to_vec(&chunk)).unwrap();
        assert_eq!(encoded, got.soft_tokens, "encode and trace agree");
    }
}

/// A clip of `samples` at 16 kHz: two tones and a little noise.
fn clip(samples: usize, seed: u32) -> Vec<MelChunk> {
    let mut rng = wgemma_test_support::Rng(u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let tone = common::sine(440.0, 0.3, 16_000, samples);
    let hum = common::sine(97.0, 0.2, 16_000, samples);
    let pcm: Vec<f32> = tone
        .iter()
        .zip(&hum)
        .map(|(a, b)| a + b + 0.01 * rng.uniform())
        .collect();
    wgemma_audio::features(&Pcm16k::new(pcm).unwrap()).unwrap()
}

#[test]
fn the_gpu_tower_matches_the_cpu_reference_with_padding_and_on_a_full_chunk() {
    let Some((tower, cpu)) = gpu_tower() else {
        return;
    };
    let cfg = &tower.cfg;
    // 21 889 samples are no multiple of 128: the pad makes the last frame invalid; 30 s is the longest
    // chunk; 0.05 s gives a single soft token.
    for (samples, seed) in [(21_889, 3), (480_000, 5), (800, 7)] {
        let chunks = clip(samples, seed);
        assert_eq!(chunks.len(), 1);
        let chunk = &chunks[0];
        assert!(samples % 128 == 0 || chunk.mask.iter().any(|m| !m));
        let got = pollster::block_on(tower.trace(chunk)).unwrap();
        let want = cpu.forward(cfg, &chunk.features, &chunk.mask);
        assert_eq!(
            got.soft_tokens.len() / cfg.text_width,
            chunk.soft_tokens,
            "the tower's tokens are the placeholders the prompt gets"
        );
        compare(
            &format!("{samples} samples"),
            &got,
            &want,
            cfg,
            GPU_TOLERANCE,
        );
    }
}

#[test]
fn features_that_do_not_hold_together_are_refused() {
    let Some((tower, _)) = gpu_tower() else {
        return;
    };
    let chunk = clip(16_000, 1).remove(0);
    let mut short = chunk.clone();
    short.features.pop();
    let mut holes = chunk.clone();
    holes.mask[3] = false;
    let empty = MelChunk {
        features: Vec::new(),
        mask: Vec::new(),
        ..chunk.clone()
    };
    for bad in [short, holes, empty] {
        let err = pollster::block_on(tower.encode(&bad)).unwrap_err();
        assert!(matches!(err, wgemma_audio::TowerError::Chunk(_)), "{err}");
    }
    // The tower still encodes after refusing.
    assert!(pollster::block_on(tower.encode_to_vec(&chunk)).is_ok());
}
