//! Long clips split into 30 s chunks, each turned into log-mel features plus the number of soft
//! tokens the conformer will produce for it.

use crate::error::AudioError;
use crate::mel::{self, N_MELS};
use crate::pcm::Pcm16k;

/// Samples per chunk: transformers truncates a clip at 480000 samples (`max_length`, 30 s); longer
/// clips are cut into 30 s chunks the way llama.cpp's mtmd does it
/// (`mtmd_audio_preprocessor_gemma4a::preprocess`: consecutive, non-overlapping pieces of
/// `30 * sample_rate`, the last one shorter), and each chunk is featurised on its own.
pub const CHUNK_SAMPLES: usize = 480_000;
/// `Gemma4Processor.audio_seq_length`: the most soft tokens one chunk can give. 30 s gives exactly
/// 750, so the cap never bites on chunks this crate makes; it is kept for parity.
pub const MAX_SOFT_TOKENS_PER_CHUNK: usize = 750;

/// The features of one chunk of at most 30 s: what the audio tower takes for one forward.
#[derive(Clone, Debug, PartialEq)]
pub struct MelChunk {
    /// `[frames, 128]` log-mel values, row-major (frame after frame); invalid frames are 0.
    pub features: Vec<f32>,
    /// One entry per frame: true where the frame's window lies entirely on real audio. The valid
    /// frames come first.
    pub mask: Vec<bool>,
    /// Soft tokens the tower produces for this chunk (the `<|audio|>` placeholders it needs).
    pub soft_tokens: usize,
    /// Where the chunk starts in the 16 kHz clip, in samples.
    pub start_sample: usize,
    /// Samples of the clip in this chunk (before the pad to a multiple of 128).
    pub samples: usize,
}

impl MelChunk {
    /// Frames (rows of `features`), valid or not.
    pub fn frames(&self) -> usize {
        self.mask.len()
    }

    /// Frames with `mask` set.
    pub fn valid_frames(&self) -> usize {
        self.mask.iter().filter(|&&m| m).count()
    }

    /// The 128 mel values of frame `i`. Panics if `i >= self.frames()`, like slice indexing.
    pub fn frame(&self, i: usize) -> &[f32] {
        &self.features[i * N_MELS..(i + 1) * N_MELS]
    }
}

/// Soft tokens for a frame mask: the two stride-2 convolutions of the tower's subsampler
/// (kernel 3, padding 1) keep every other frame twice, and the tokens are the surviving valid
/// positions (`Gemma4Processor.replace_audio_token`: `mask[::2][:(t + 2 - 3) // 2 + 1]` twice,
/// then `mask.sum()`), capped at 750 (`audio_seq_length`). With the valid frames a prefix of
/// length `v` this is `((v - 1) // 2 + 1)` applied twice (0 for `v = 0`), the same count as
/// `_compute_audio_num_tokens` and as llama.cpp's frame arithmetic.
pub fn soft_tokens(mask: &[bool]) -> usize {
    let mut mask = mask.to_vec();
    for _ in 0..2 {
        let t_out = (mask.len() + 2).saturating_sub(3) / 2 + 1;
        mask = mask.iter().step_by(2).take(t_out).copied().collect();
    }
    mask.iter()
        .filter(|&&m| m)
        .count()
        .min(MAX_SOFT_TOKENS_PER_CHUNK)
}

/// Log-mel features of a 16 kHz clip, one [`MelChunk`] per 30 s (see [`CHUNK_SAMPLES`]).
///
/// Each chunk is computed exactly as transformers computes a clip of that length. A last chunk of
/// 160 samples (10 ms) or less has no valid frame and no soft token; it is dropped. llama.cpp
/// wraps all chunks of one clip in a single `<|audio>` ... `<audio|>` pair (mtmd.cpp `add_media`),
/// so the chunks' soft tokens follow each other in the prompt.
///
/// Errors with [`AudioError::TooShort`] when nothing is left (160 samples or fewer in all).
pub fn features(pcm: &Pcm16k) -> Result<Vec<MelChunk>, AudioError> {
    let samples = pcm.samples();
    let chunks: Vec<MelChunk> = samples
        .chunks(CHUNK_SAMPLES)
        .enumerate()
        .filter(|(_, piece)| mel::valid_frame_count(piece.len()) > 0)
        .map(|(i, piece)| {
            let (features, mask) = mel::log_mel(piece);
            let soft_tokens = soft_tokens(&mask);
            MelChunk {
                features,
                mask,
                soft_tokens,
                start_sample: i * CHUNK_SAMPLES,
                samples: piece.len(),
            }
        })
        .collect();
    if chunks.is_empty() {
        return Err(AudioError::TooShort {
            samples: samples.len(),
        });
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(valid: usize, frames: usize) -> Vec<bool> {
        (0..frames).map(|i| i < valid).collect()
    }

    #[test]
    fn soft_tokens_are_two_ceiling_halvings() {
        for (valid, frames, want) in [
            (0, 0, 0),
            (1, 1, 1),
            (2, 3, 1),
            (3, 3, 1),
            (5, 6, 2),
            (125, 126, 32),
        ] {
            assert_eq!(
                soft_tokens(&prefix(valid, frames)),
                want,
                "{valid}/{frames}"
            );
        }
        // 30 s: 2999 frames -> 1500 -> 750.
        assert_eq!(soft_tokens(&prefix(2999, 2999)), 750);
        // The cap: a (hypothetical) longer mask still gives 750.
        assert_eq!(soft_tokens(&prefix(4000, 4000)), 750);
    }
}
