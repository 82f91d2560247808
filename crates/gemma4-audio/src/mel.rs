//! Log-mel features of one 16 kHz piece (at most 30 s), computed as transformers 5.23's
//! `Gemma4AudioFeatureExtractor` does (`feature_extraction_gemma4.py`, with `mel_filter_bank` and
//! `window_function` from `audio_utils.py`), step by step:
//!
//! 1. pad the samples with zeros to a multiple of 128 (`pad_to_multiple_of=128`; the pad is masked);
//! 2. prepend 160 zeros (`frame_length // 2`, "semicausal" padding);
//! 3. cut frames of 321 samples every 160 (`_unfold(size=frame_length + 1)`), keep the first 320;
//! 4. multiply by the periodic Hann window of 320 (`np.hanning(321)[:-1]`, cast to float32);
//! 5. `|rfft(frame, n=512)|`, 257 bins;
//! 6. multiply by the HTK mel filterbank (128 filters, 0-8000 Hz, no area norm), `log(mel + 1e-3)`;
//! 7. frame `i` is valid iff sample `i*160 + 320` of the left-padded signal is real audio; invalid
//!    frames are set to 0.
//!
//! Precision: numpy 2 keeps the samples, the window and their product in float32 and runs the FFT
//! in float32; the filterbank is float64, so the matrix product, the log and everything after it
//! are float64 until the final cast to float32. Here the windowed frame is rounded to f32 exactly as
//! numpy does, and the FFT runs in f64 (numpy 1 did that too): the float32 FFT's rounding is the
//! only difference, at most 5e-7 on the goldens (measured in numpy against an f64 FFT).

use std::sync::{Arc, OnceLock};

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

/// Mel bins per frame: the width of every feature row.
pub const N_MELS: usize = 128;
/// Samples between frames at 16 kHz (10 ms).
pub const HOP: usize = 160;
/// Samples of one analysis window at 16 kHz (20 ms).
const FRAME_LEN: usize = 320;
/// `frame_length // 2` zeros in front: frame `i` is centred on sample `i * HOP` of the input.
const PAD_LEFT: usize = FRAME_LEN / 2;
/// transformers unfolds one sample more than the window and drops it (the preemphasis slot).
const UNFOLD: usize = FRAME_LEN + 1;
/// `2 ** ceil(log2(320))`.
const FFT_LEN: usize = 512;
const N_BINS: usize = FFT_LEN / 2 + 1;
/// The extractor's `pad_to_multiple_of` default.
const PAD_MULTIPLE: usize = 128;
/// Added before the log (transformers: `log(mel + mel_floor)`; llama.cpp and Ollama use
/// `log(max(mel, 1e-3))` instead, see reference/multimodal.md §0.3).
const MEL_FLOOR: f64 = 1e-3;
const SAMPLE_RATE: f64 = 16_000.0;
const MEL_MAX_HZ: f64 = 8_000.0;

/// One triangular filter stored as its non-zero run of FFT bins.
struct MelFilter {
    first_bin: usize,
    weights: Vec<f64>,
}

/// The constant parts of the front end, built once per process.
struct FrontEnd {
    window: [f32; FRAME_LEN],
    filters: Vec<MelFilter>,
    fft: Arc<dyn RealToComplex<f64>>,
}

fn front_end() -> &'static FrontEnd {
    static FRONT_END: OnceLock<FrontEnd> = OnceLock::new();
    FRONT_END.get_or_init(|| FrontEnd {
        window: hann_window(),
        filters: mel_filters(),
        fft: RealFftPlanner::<f64>::new().plan_fft_forward(FFT_LEN),
    })
}

/// `window_function(320)`: `np.hanning(321)[:-1]` in float64, written the way numpy computes it
/// (`0.5 + 0.5 cos(pi n / (M - 1))`, n = 1-M, 3-M, ...) so the float32 cast lands on the same
/// values, then cast to float32 as the extractor does.
fn hann_window() -> [f32; FRAME_LEN] {
    let m = (FRAME_LEN + 1) as f64;
    let mut window = [0f32; FRAME_LEN];
    for (k, w) in window.iter_mut().enumerate() {
        let n = 1.0 - m + 2.0 * k as f64;
        *w = (0.5 + 0.5 * (std::f64::consts::PI * n / (m - 1.0)).cos()) as f32;
    }
    window
}

fn hz_to_mel_htk(hz: f64) -> f64 {
    2595.0 * (1.0 + hz / 700.0).log10()
}

fn mel_to_hz_htk(mel: f64) -> f64 {
    700.0 * (10f64.powf(mel / 2595.0) - 1.0)
}

/// `np.linspace(start, stop, num)` as numpy evaluates it: `i * step + start`, last = `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(last) = v.last_mut() {
        *last = stop;
    }
    v
}

/// `mel_filter_bank(257, 128, 0, 8000, 16000, norm=None, mel_scale="htk")`: triangles between
/// 130 points equally spaced in HTK mel, evaluated at the FFT bin frequencies in Hz
/// (`_create_triangular_filter_bank`). The lowest filter is narrower than one bin and comes out all
/// zero (transformers warns and keeps it): its feature is always `log(1e-3)`.
fn mel_filters() -> Vec<MelFilter> {
    let mel_freqs = linspace(hz_to_mel_htk(0.0), hz_to_mel_htk(MEL_MAX_HZ), N_MELS + 2);
    let filter_freqs: Vec<f64> = mel_freqs.iter().map(|&m| mel_to_hz_htk(m)).collect();
    let fft_freqs = linspace(0.0, SAMPLE_RATE / 2.0, N_BINS);
    let diff: Vec<f64> = filter_freqs.windows(2).map(|w| w[1] - w[0]).collect();
    (0..N_MELS)
        .map(|j| {
            let weight = |k: usize| {
                let down = -(filter_freqs[j] - fft_freqs[k]) / diff[j];
                let up = (filter_freqs[j + 2] - fft_freqs[k]) / diff[j + 1];
                down.min(up).max(0.0)
            };
            let nonzero: Vec<usize> = (0..N_BINS).filter(|&k| weight(k) > 0.0).collect();
            match (nonzero.first(), nonzero.last()) {
                (Some(&a), Some(&b)) => MelFilter {
                    first_bin: a,
                    weights: (a..=b).map(weight).collect(),
                },
                _ => MelFilter {
                    first_bin: 0,
                    weights: Vec::new(),
                },
            }
        })
        .collect()
}

/// Frames transformers produces for `samples` input samples: the padded length plus the left pad,
/// unfolded by 321 every 160 (`(len - 321) // 160 + 1`, none when shorter than 321).
pub fn frame_count(samples: usize) -> usize {
    let padded = samples.div_ceil(PAD_MULTIPLE) * PAD_MULTIPLE + PAD_LEFT;
    if padded < UNFOLD {
        0
    } else {
        (padded - UNFOLD) / HOP + 1
    }
}

/// Frames whose whole window lies on real samples (`attention_mask[i*160 + 320]` is 1, i.e.
/// `i*160 + 320 < 160 + samples`). They form a prefix of the frames.
pub fn valid_frame_count(samples: usize) -> usize {
    let real_end = PAD_LEFT + samples;
    (0..frame_count(samples))
        .take_while(|i| i * HOP + FRAME_LEN < real_end)
        .count()
}

/// Log-mel features `[frames, 128]` (row-major) and the frame mask of one piece of 16 kHz audio,
/// as `Gemma4AudioFeatureExtractor` returns them for a clip of at most 480000 samples.
pub fn log_mel(samples: &[f32]) -> (Vec<f32>, Vec<bool>) {
    let fe = front_end();
    let frames = frame_count(samples.len());
    let valid = valid_frame_count(samples.len());
    let mut features = vec![0f32; frames * N_MELS];
    let mut input = fe.fft.make_input_vec();
    let mut spectrum = fe.fft.make_output_vec();
    let mut scratch = fe.fft.make_scratch_vec();
    let mut magnitude = [0f64; N_BINS];
    // Only valid frames are computed: transformers multiplies the others by a zero mask.
    for (i, row) in features.chunks_exact_mut(N_MELS).take(valid).enumerate() {
        windowed_frame(samples, i, &fe.window, &mut input);
        if fe
            .fft
            .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .is_err()
        {
            // Cannot happen: the buffers come from this plan. Leave the row at 0 rather than panic.
            continue;
        }
        for (m, c) in magnitude.iter_mut().zip(&spectrum) {
            *m = abs(c);
        }
        for (out, filter) in row.iter_mut().zip(&fe.filters) {
            let bins = &magnitude[filter.first_bin..filter.first_bin + filter.weights.len()];
            let mel: f64 = bins.iter().zip(&filter.weights).map(|(m, w)| m * w).sum();
            *out = (mel + MEL_FLOOR).ln() as f32;
        }
    }
    let mask = (0..frames).map(|i| i < valid).collect();
    (features, mask)
}

fn abs(c: &Complex<f64>) -> f64 {
    c.re.hypot(c.im)
}

/// Fills `out` (512 long) with frame `i`: 320 samples of the left-padded signal starting at
/// `i * 160`, times the window in float32 (numpy's dtype for `frames * window`), then zeros.
fn windowed_frame(samples: &[f32], i: usize, window: &[f32; FRAME_LEN], out: &mut [f64]) {
    out.fill(0.0);
    for (k, (o, w)) in out.iter_mut().zip(window).enumerate() {
        // Position in the padded signal is i*HOP + k; the real samples start at PAD_LEFT.
        let pos = i * HOP + k;
        let x = pos
            .checked_sub(PAD_LEFT)
            .and_then(|p| samples.get(p))
            .copied()
            .unwrap_or(0.0);
        *o = f64::from(x * w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_counts_follow_the_unfold() {
        // 128 padded + 160 = 288 < 321: no frame. 256 + 160 = 416: one.
        assert_eq!(frame_count(1), 0);
        assert_eq!(frame_count(129), 1);
        assert_eq!(frame_count(20864), 130);
        assert_eq!(frame_count(20130), 126);
        assert_eq!(valid_frame_count(20130), 125);
        assert_eq!(valid_frame_count(160), 0);
        assert_eq!(valid_frame_count(161), 1);
        assert_eq!(frame_count(480_000), 2999);
        assert_eq!(valid_frame_count(480_000), 2999);
    }

    #[test]
    fn filterbank_shape_matches_transformers() {
        let f = mel_filters();
        assert_eq!(f.len(), N_MELS);
        // transformers: only filter 0 is all zero; the widest spans 11 bins.
        assert!(f[0].weights.is_empty());
        assert!(f[1..].iter().all(|m| !m.weights.is_empty()));
        assert_eq!(f.iter().map(|m| m.weights.len()).max(), Some(11));
    }
}
