//! Why audio was refused. Every problem with the input surfaces as one of these, never a panic.

use crate::pcm::{MAX_CHANNELS, MAX_DURATION_SECS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};

/// An audio input that cannot be turned into features.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    /// The input holds no samples (an empty file, or a stream that decodes to nothing).
    #[error("the audio is empty")]
    Empty,
    /// Not a WAV, FLAC, MP3 or Ogg stream (or too damaged to recognise).
    #[error("unrecognised audio format (supported: WAV, FLAC, MP3, Ogg/Vorbis): {0}")]
    UnsupportedFormat(String),
    /// The container has no audio track.
    #[error("the file has no audio track")]
    NoAudioTrack,
    /// The container is supported but the track's codec is not (e.g. ADPCM in WAV, Opus in Ogg).
    #[error("unsupported audio codec: {0}")]
    UnsupportedCodec(String),
    /// Zero channels, or more than any real layout has.
    #[error("{0} audio channels (expected 1 to {MAX_CHANNELS})")]
    BadChannelCount(usize),
    /// A sample rate missing, or outside what real audio uses.
    #[error("sample rate {0} Hz (expected {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz)")]
    BadSampleRate(u64),
    /// The stream is malformed: a packet failed to decode, or the decoder gave up.
    #[error("malformed audio stream: {0}")]
    Corrupt(String),
    /// The stream stops before the length its header declares.
    #[error("truncated audio: {decoded} of the {declared} frames the header declares")]
    Truncated {
        /// Frames decoded before the stream ended.
        decoded: u64,
        /// Frames the container promised.
        declared: u64,
    },
    /// Longer than [`MAX_DURATION_SECS`]; decoding stops as soon as the limit is passed.
    #[error("audio longer than {MAX_DURATION_SECS} s")]
    TooLong,
    /// A NaN or infinite sample (float input only).
    #[error("non-finite sample at index {0}")]
    NonFinite(usize),
    /// `from_interleaved` was given a sample count that is not a whole number of frames.
    #[error("{samples} interleaved samples are not a whole number of {channels}-channel frames")]
    PartialFrame {
        /// Samples given.
        samples: usize,
        /// Channels claimed.
        channels: usize,
    },
    /// Too short for a single valid feature frame (160 samples at 16 kHz, 10 ms, or fewer).
    #[error("audio too short: {samples} samples at 16 kHz give no complete 20 ms frame")]
    TooShort {
        /// Samples at 16 kHz.
        samples: usize,
    },
    /// The resampler refused the conversion (not expected for rates this crate accepts).
    #[error("resampling failed: {0}")]
    Resample(String),
}
