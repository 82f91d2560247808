//! Log-mel features against transformers' `Gemma4AudioFeatureExtractor` (goldens from
//! `xtask/scripts/gemma4_audio_features_golden.py`), and the 30 s chunking.

mod common;

use common::{max_abs_diff, npy_f32};
use wgemma_audio::{AudioError, CHUNK_SAMPLES, N_MELS, Pcm16k, features, soft_tokens};

/// Features of a 16 kHz source clip against transformers'; returns the largest difference.
fn compare_with_transformers(name: &str) -> f32 {
    let samples = npy_f32(&format!("{name}.f32.npy"));
    let want = npy_f32(&format!("{name}.features.npy"));
    let want_mask: Vec<bool> = npy_f32(&format!("{name}.mask.npy"))
        .iter()
        .map(|&m| m != 0.0)
        .collect();
    let chunks = features(&Pcm16k::new(samples.clone()).unwrap()).unwrap();
    assert_eq!(chunks.len(), 1, "{name}: one chunk under 30 s");
    let chunk = &chunks[0];
    assert_eq!(chunk.frames(), want_mask.len(), "{name}: frame count");
    assert_eq!(chunk.features.len(), want.len(), "{name}: feature count");
    assert_eq!(chunk.mask, want_mask, "{name}: mask");
    assert_eq!(chunk.samples, samples.len());
    assert_eq!(chunk.start_sample, 0);
    let err = max_abs_diff(&chunk.features, &want);
    let (worst, _) =
        chunk
            .features
            .iter()
            .zip(&want)
            .enumerate()
            .fold((0, 0f32), |acc, (i, (a, b))| {
                if (a - b).abs() > acc.1 {
                    (i, (a - b).abs())
                } else {
                    acc
                }
            });
    println!(
        "{name}: {} frames ({} valid), max |rust - transformers| = {err:.3e} at frame {} bin {}",
        chunk.frames(),
        chunk.valid_frames(),
        worst / N_MELS,
        worst % N_MELS
    );
    err
}

#[test]
fn features_match_transformers_length_multiple_of_128() {
    let err = compare_with_transformers("a16k");
    assert!(err < 1e-4, "a16k: max error {err}");
}

#[test]
fn features_match_transformers_length_padded_with_invalid_frame() {
    let err = compare_with_transformers("b16k");
    assert!(err < 1e-4, "b16k: max error {err}");
    // The golden's last frame lies on the pad: masked and zero in both.
    let chunk = &features(&Pcm16k::new(npy_f32("b16k.f32.npy")).unwrap()).unwrap()[0];
    assert_eq!((chunk.frames(), chunk.valid_frames()), (126, 125));
    assert!(chunk.frame(125).iter().all(|&v| v == 0.0));
    // The digital silence (samples 8000..10000) sits on the log floor, log(1e-3), in every bin.
    let floor = (1e-3f64).ln() as f32;
    assert!(
        chunk.frame(55).iter().all(|&v| (v - floor).abs() < 1e-6),
        "{:?}",
        &chunk.frame(55)[..4]
    );
    // Soft tokens: 125 valid frames -> 63 -> 32.
    assert_eq!(chunk.soft_tokens, 32);
    assert_eq!(soft_tokens(&chunk.mask), 32);
}

/// A 70 s clip: two full 30 s chunks and a 10 s one, featurised independently.
#[test]
fn long_clip_splits_into_30s_chunks() {
    let n = 70 * 16_000;
    // A sweep that never repeats, so a chunk computed from the wrong offset would differ.
    let samples: Vec<f32> = (0..n)
        .map(|i| (0.3 * (i as f64 * 1e-3 + (i as f64 * 3e-7).powi(2)).sin()) as f32)
        .collect();
    let chunks = features(&Pcm16k::new(samples.clone()).unwrap()).unwrap();
    let got: Vec<(usize, usize, usize, usize, usize)> = chunks
        .iter()
        .map(|c| {
            (
                c.start_sample,
                c.samples,
                c.frames(),
                c.valid_frames(),
                c.soft_tokens,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 480_000, 2999, 2999, 750),
            (480_000, 480_000, 2999, 2999, 750),
            (960_000, 160_000, 999, 999, 250)
        ]
    );
    for c in &chunks {
        assert_eq!(c.features.len(), c.frames() * N_MELS);
    }
    // The last chunk is exactly the features of its own samples.
    let last = &features(&Pcm16k::new(samples[2 * CHUNK_SAMPLES..].to_vec()).unwrap()).unwrap()[0];
    assert_eq!(last.features, chunks[2].features);
}

/// A tail of 10 ms or less has no complete frame: no chunk for it, and alone it is too short.
#[test]
fn tiny_tails_and_tiny_clips() {
    let chunks = features(&Pcm16k::new(vec![0.1; CHUNK_SAMPLES + 160]).unwrap()).unwrap();
    assert_eq!(chunks.len(), 1);
    let chunks = features(&Pcm16k::new(vec![0.1; CHUNK_SAMPLES + 161]).unwrap()).unwrap();
    assert_eq!(chunks.len(), 2);
    assert_eq!(
        (
            chunks[1].frames(),
            chunks[1].valid_frames(),
            chunks[1].soft_tokens
        ),
        (1, 1, 1)
    );
    assert!(matches!(
        features(&Pcm16k::new(vec![0.1; 160]).unwrap()),
        Err(AudioError::TooShort { samples: 160 })
    ));
    // One second: 99 frames -> 50 -> 25 soft tokens, the 40 ms per token of the processor.
    let one_second = features(&Pcm16k::new(vec![0.1; 16_000]).unwrap()).unwrap();
    assert_eq!(
        (one_second[0].valid_frames(), one_second[0].soft_tokens),
        (99, 25)
    );
}
