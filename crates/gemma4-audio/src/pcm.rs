//! Mono PCM, at the source rate ([`Pcm`]) or at the model's 16 kHz ([`Pcm16k`]), and the
//! checks every clip passes before it is kept.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler, WindowFunction};

use crate::error::AudioError;

/// The rate the Gemma 4 audio tower is trained on.
pub const SAMPLE_RATE: u32 = 16_000;
/// Longest clip accepted, in seconds (10 minutes = 20 chunks of 30 s, 15000 soft tokens). The
/// decoder checks it packet by packet, so a long or lying file stops early instead of filling
/// memory: the mono samples kept stay under 4 bytes x 600 s x the sample rate (115 MB at 48 kHz,
/// 460 MB at 192 kHz).
pub const MAX_DURATION_SECS: u32 = 600;
/// Lowest accepted sample rate, half of telephone audio's 8 kHz: below it the band ends under
/// 2 kHz and little of speech is left; such a rate in a header is more likely corruption.
pub const MIN_SAMPLE_RATE: u32 = 4_000;
/// Highest accepted sample rate: the highest rate of ordinary studio formats. It also bounds the
/// memory of a maximal clip and the resampler's block size (which is the input rate when it
/// shares no factor with 16000).
pub const MAX_SAMPLE_RATE: u32 = 192_000;
/// Most channels accepted (22.2 surround has 24); more is a corrupt header, not audio.
pub const MAX_CHANNELS: usize = 32;

/// Mono audio at its own sample rate, samples finite (decoded files: within [-1, 1]).
#[derive(Clone, Debug, PartialEq)]
pub struct Pcm {
    samples: Vec<f32>,
    sample_rate: u32,
}

/// Mono audio at 16 kHz, ready for [`crate::features`].
#[derive(Clone, Debug, PartialEq)]
pub struct Pcm16k {
    samples: Vec<f32>,
}

/// Checks a sample rate against [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`].
pub(crate) fn check_rate(rate: u64) -> Result<u32, AudioError> {
    match u32::try_from(rate) {
        Ok(r) if (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&r) => Ok(r),
        _ => Err(AudioError::BadSampleRate(rate)),
    }
}

/// Checks a channel count against 1..=[`MAX_CHANNELS`].
pub(crate) fn check_channels(channels: usize) -> Result<usize, AudioError> {
    if (1..=MAX_CHANNELS).contains(&channels) {
        Ok(channels)
    } else {
        Err(AudioError::BadChannelCount(channels))
    }
}

/// Frames allowed at `rate` by [`MAX_DURATION_SECS`].
pub(crate) fn max_frames(rate: u32) -> u64 {
    u64::from(MAX_DURATION_SECS) * u64::from(rate)
}

/// The checks every stored clip passes: some samples, not too many, all finite.
fn check_samples(samples: &[f32], rate: u32) -> Result<(), AudioError> {
    if samples.is_empty() {
        return Err(AudioError::Empty);
    }
    if samples.len() as u64 > max_frames(rate) {
        return Err(AudioError::TooLong);
    }
    match samples.iter().position(|s| !s.is_finite()) {
        Some(i) => Err(AudioError::NonFinite(i)),
        None => Ok(()),
    }
}

/// Averages interleaved frames to mono (the usual downmix: librosa's `to_mono`, miniaudio in
/// llama.cpp), appending to `out`. `interleaved.len()` must be a multiple of `channels`.
pub(crate) fn mix_to_mono(interleaved: &[f32], channels: usize, out: &mut Vec<f32>) {
    if channels == 1 {
        out.extend_from_slice(interleaved);
        return;
    }
    let scale = channels as f32;
    out.extend(
        interleaved
            .chunks_exact(channels)
            .map(|frame| frame.iter().sum::<f32>() / scale),
    );
}

impl Pcm {
    /// Mono samples at `sample_rate` Hz. Errors on a rate outside the accepted range, no samples,
    /// more than [`MAX_DURATION_SECS`], or a NaN/infinite sample. Values are kept as given
    /// (transformers does not clip either).
    pub fn new(samples: Vec<f32>, sample_rate: u32) -> Result<Self, AudioError> {
        let sample_rate = check_rate(u64::from(sample_rate))?;
        check_samples(&samples, sample_rate)?;
        Ok(Self {
            samples,
            sample_rate,
        })
    }

    /// Interleaved samples of `channels` channels (frame after frame), mixed to mono by averaging
    /// the channels, then checked as [`Pcm::new`] does.
    pub fn from_interleaved(
        interleaved: &[f32],
        sample_rate: u32,
        channels: usize,
    ) -> Result<Self, AudioError> {
        let channels = check_channels(channels)?;
        if !interleaved.len().is_multiple_of(channels) {
            return Err(AudioError::PartialFrame {
                samples: interleaved.len(),
                channels,
            });
        }
        // Refuse before mixing: no work or allocation for input that will be rejected anyway.
        let rate = check_rate(u64::from(sample_rate))?;
        if (interleaved.len() / channels) as u64 > max_frames(rate) {
            return Err(AudioError::TooLong);
        }
        if let Some(i) = interleaved.iter().position(|s| !s.is_finite()) {
            return Err(AudioError::NonFinite(i));
        }
        let mut mono = Vec::with_capacity(interleaved.len() / channels);
        mix_to_mono(interleaved, channels, &mut mono);
        Self::new(mono, rate)
    }

    /// Wraps samples already checked by the decoder.
    pub(crate) fn from_checked(samples: Vec<f32>, sample_rate: u32) -> Self {
        Self {
            samples,
            sample_rate,
        }
    }

    /// The mono samples.
    pub fn samples(&self) -> &[f32] {
        &self.samples
    }

    /// Samples per second.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Length in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate)
    }

    /// The clip at 16 kHz; a clip already at 16 kHz is passed through untouched.
    ///
    /// Resampling uses rubato's synchronous FFT resampler (`rubato::Fft`): the ratio is fixed for
    /// the whole clip, which is what it is built for, and it is band-limited (a windowed-sinc
    /// anti-aliasing filter applied in the frequency domain, Blackman-Harris squared window) and
    /// faster than the asynchronous sinc resampler of the same quality. One FFT block per call
    /// (`sub_chunks` 1) of about 4096 input frames puts the filter's cutoff at about 0.99 of the
    /// lower Nyquist frequency (7.93 kHz from 44.1 kHz), so the mel bins, which end at 8 kHz, see
    /// the whole band, and a 10 kHz tone at 44.1 kHz comes out at -140 dB. `process_all`
    /// trims the filter delay: the output has exactly `ceil(n * 16000 / rate)` samples, aligned
    /// with the input. It runs in f32, like the samples; its rounding is far below 16-bit noise.
    pub fn into_16k(self) -> Result<Pcm16k, AudioError> {
        if self.sample_rate == SAMPLE_RATE {
            return Ok(Pcm16k {
                samples: self.samples,
            });
        }
        let rate = self.sample_rate as usize;
        let mut resampler = Fft::<f32>::new_custom(
            rate,
            SAMPLE_RATE as usize,
            4096,
            1,
            1,
            WindowFunction::BlackmanHarris2,
            FixedSync::Both,
        )
        .map_err(|e| AudioError::Resample(e.to_string()))?;
        let n = self.samples.len();
        let input = InterleavedSlice::new(&self.samples, 1, n)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        let output = resampler
            .process_all(&input, n, None)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        Pcm16k::new(output.take_data())
    }
}

impl Pcm16k {
    /// Mono samples already at 16 kHz, checked as [`Pcm::new`] does.
    pub fn new(samples: Vec<f32>) -> Result<Self, AudioError> {
        check_samples(&samples, SAMPLE_RATE)?;
        Ok(Self { samples })
    }

    /// The 16 kHz samples.
    pub fn samples(&self) -> &[f32] {
        &self.samples
    }

    /// Length in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.samples.len() as f64 / f64::from(SAMPLE_RATE)
    }
}
