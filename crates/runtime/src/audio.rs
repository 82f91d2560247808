//! Audio clips in prompts: what a request carries (decoded, resampled to 16 kHz and turned
//! into log-mel features once, when the clip is made, so a bad file is refused before any
//! request runs).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use wgemma_audio::{MelChunk, Pcm, SAMPLE_RATE, features};

use crate::error::Error;

/// One audio clip of a prompt: up to 30 s a chunk, each chunk up to 750 soft tokens (25 a
/// second); a longer clip is several chunks whose soft tokens follow each other between one
/// pair of audio markers, as llama.cpp's mtmd lays them out.
#[derive(Clone, Debug)]
pub struct AudioInput {
    chunks: Arc<[MelChunk]>,
    samples: usize,
    key: u64,
}

impl AudioInput {
    /// A WAV, FLAC, MP3 or Ogg/Vorbis file's bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let key = hash(0, bytes);
        Self::from_pcm(wgemma_audio::decode(bytes)?, key)
    }

    /// Samples the caller has already (a browser's `AudioBuffer`, a microphone): `channels`
    /// channels interleaved, at `sample_rate`; mixed to mono and resampled to 16 kHz.
    pub fn from_samples(
        interleaved: &[f32],
        sample_rate: u32,
        channels: usize,
    ) -> Result<Self, Error> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (1u8, sample_rate, channels).hash(&mut h);
        interleaved.iter().for_each(|s| s.to_bits().hash(&mut h));
        let pcm = Pcm::from_interleaved(interleaved, sample_rate, channels)?;
        Self::from_pcm(pcm, h.finish())
    }

    fn from_pcm(pcm: Pcm, key: u64) -> Result<Self, Error> {
        let pcm = pcm.into_16k()?;
        let samples = pcm.samples().len();
        Ok(Self {
            chunks: features(&pcm)?.into(),
            samples,
            key,
        })
    }

    /// The clip's soft tokens: the `<|audio|>` placeholders it becomes.
    pub fn soft_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.soft_tokens).sum()
    }

    /// The clip's length in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.samples as f64 / f64::from(SAMPLE_RATE)
    }

    /// The features of each 30 s chunk.
    pub fn chunks(&self) -> &[MelChunk] {
        &self.chunks
    }

    /// What tells two clips apart in the cache.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }
}

fn hash(tag: u8, bytes: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (tag, bytes).hash(&mut h);
    h.finish()
}
