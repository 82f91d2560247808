//! Helpers shared by the integration tests: fixtures, .npy, hand-made WAV files, signal measures.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A float32 .npy file as a flat vector.
pub fn npy_f32(name: &str) -> Vec<f32> {
    let bytes = fixture(name);
    npyz::NpyFile::new(&bytes[..])
        .unwrap()
        .into_vec::<f32>()
        .unwrap()
}

/// A WAV file: `format` 1 (integer PCM) or 3 (IEEE float), `data` already encoded little-endian.
/// The sizes in the header are taken from `data` unless `declared_data_len` overrides them.
pub fn wav_bytes(
    format: u16,
    channels: u16,
    rate: u32,
    bits: u16,
    data: &[u8],
    declared_data_len: Option<u32>,
) -> Vec<u8> {
    let data_len = declared_data_len.unwrap_or(data.len() as u32);
    let block_align = channels.wrapping_mul(bits / 8);
    let byte_rate = rate.wrapping_mul(u32::from(block_align));
    let mut out = Vec::with_capacity(44 + data.len());
    out.extend_from_slice(b"RIFF");
    // An open-ended stream (ffmpeg writing to a pipe) marks both lengths as u32::MAX.
    let riff_len = if data_len == u32::MAX {
        u32::MAX
    } else {
        36u32.wrapping_add(data_len)
    };
    out.extend_from_slice(&riff_len.to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&byte_rate.to_le_bytes());
    out.extend_from_slice(&block_align.to_le_bytes());
    out.extend_from_slice(&bits.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// 16-bit PCM WAV of `samples` (interleaved).
pub fn wav_i16(samples: &[i16], channels: u16, rate: u32) -> Vec<u8> {
    let data: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    wav_bytes(1, channels, rate, 16, &data, None)
}

/// 32-bit float WAV of `samples` (interleaved).
pub fn wav_f32(samples: &[f32], channels: u16, rate: u32) -> Vec<u8> {
    let data: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    wav_bytes(3, channels, rate, 32, &data, None)
}

pub fn sine(freq: f64, amp: f64, rate: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (amp * (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin()) as f32
        })
        .collect()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Signal-to-noise ratio of `test` against `reference` in dB, over their common length, after
/// shifting `test` by the lag in `-max_lag..=max_lag` that maximises it (lossy codecs may keep
/// some encoder delay). Returns (snr_db, lag).
pub fn aligned_snr_db(reference: &[f32], test: &[f32], max_lag: usize) -> (f64, isize) {
    let mut best = (f64::NEG_INFINITY, 0isize);
    for lag in -(max_lag as isize)..=max_lag as isize {
        let (r, t) = if lag >= 0 {
            (reference, test.get(lag as usize..).unwrap_or(&[]))
        } else {
            (reference.get((-lag) as usize..).unwrap_or(&[]), test)
        };
        let n = r.len().min(t.len());
        if n < reference.len() / 2 {
            continue;
        }
        let (mut sig, mut err) = (0f64, 0f64);
        for (x, y) in r[..n].iter().zip(&t[..n]) {
            sig += f64::from(*x) * f64::from(*x);
            err += f64::from(x - y) * f64::from(x - y);
        }
        let snr = 10.0 * (sig / err.max(1e-30)).log10();
        if snr > best.0 {
            best = (snr, lag);
        }
    }
    best
}
