//! Gemma 4 audio input, CPU side: audio files or PCM to the log-mel features the audio tower
//! (the USM-style conformer, run on the GPU through `wgemma-kernels` in a later step) consumes.
//!
//! ```text
//! bytes --decode--> Pcm (mono, any rate) --into_16k--> Pcm16k --features--> Vec<MelChunk>
//! ```
//!
//! - [`decode`]: WAV, FLAC, MP3 or Ogg/Vorbis bytes to mono f32 (symphonia, pure Rust).
//! - [`Pcm::from_interleaved`] / [`Pcm::new`]: samples the caller already has.
//! - [`Pcm::into_16k`]: band-limited resampling to 16 kHz (rubato), skipped at 16 kHz.
//! - [`features`]: transformers' `Gemma4AudioFeatureExtractor` (log-mel, 128 bins, 10 ms hop)
//!   per 30 s chunk, with the frame mask and the soft-token count of each chunk.
//! - [`mel_chunks_from_bytes`]: all three in one call.
//!
//! - [`reference`]: the tower's f32 CPU reference forward (`AudioConfig::from_gguf`,
//!   `AudioWeights::load` read a llama.cpp projector file), the oracle for the GPU tower.
//!
//! Bad input is an [`AudioError`], never a panic: malformed or truncated files, unsupported
//! codecs, impossible channel counts or sample rates, NaN/infinite samples, and clips longer
//! than [`MAX_DURATION_SECS`] (checked while decoding).

mod decode;
mod error;
mod features;
mod load;
mod mel;
mod pcm;
pub mod reference;
pub mod synth;
mod tensors;
mod tower;

pub use decode::decode;
pub use error::AudioError;
pub use features::{CHUNK_SAMPLES, MAX_SOFT_TOKENS_PER_CHUNK, MelChunk, features, soft_tokens};
pub use load::AudioLoadError;
pub use mel::{HOP, N_MELS};
pub use pcm::{
    MAX_CHANNELS, MAX_DURATION_SECS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, Pcm, Pcm16k, SAMPLE_RATE,
};
pub use reference::AudioConfig;
pub use tensors::{AudioLayout, ClampedLinear, ConformerLayer, FeedForward, Tower, TowerTensors};
pub use tower::{AudioTower, Encoded, TowerError};

/// Decodes an audio file, resamples it to 16 kHz and computes its features: [`decode`], then
/// [`Pcm::into_16k`], then [`features`].
pub fn mel_chunks_from_bytes(bytes: &[u8]) -> Result<Vec<MelChunk>, AudioError> {
    features(&decode(bytes)?.into_16k()?)
}
