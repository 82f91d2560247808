//! Audio files (WAV, FLAC, MP3, Ogg/Vorbis) to mono PCM with symphonia.

use std::io::{Cursor, ErrorKind};
use std::panic::{AssertUnwindSafe, catch_unwind};

use symphonia::core::codecs::audio::{AudioCodecParameters, AudioDecoder, AudioDecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::well_known::{FORMAT_ID_FLAC, FORMAT_ID_MP3, FORMAT_ID_WAVE};
use symphonia::core::formats::{FormatOptions, FormatReader};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::error::AudioError;
use crate::pcm::{Pcm, check_channels, check_rate, max_frames, mix_to_mono};

/// Decodes a whole audio file held in memory: the first audio track, mixed to mono (the mean of
/// the channels), as f32 in [-1, 1] at the file's own sample rate.
///
/// Formats: WAV (integer or float PCM), FLAC, MP3, Ogg/Vorbis, recognised from their contents.
/// Encoder delay and padding are trimmed (gapless decoding) where the file records them.
///
/// The input is treated as untrusted:
/// - the length is capped at [`crate::MAX_DURATION_SECS`], checked before each packet is kept;
/// - a packet that fails to decode refuses the whole file ([`AudioError::Corrupt`]): skipping it
///   would silently shorten the clip and shift everything after it;
/// - WAV, FLAC, and MP3 with a LAME (Xing/Info) header declare their exact length; stopping short
///   of it is [`AudioError::Truncated`] (symphonia only estimates the length of Ogg and of other
///   MP3s, so those are not checked);
/// - a chained Ogg stream ends at its first link;
/// - symphonia is pure safe Rust, but a panic on input its authors did not foresee (an index out
///   of range, an arithmetic overflow in debug builds) is still possible; it is caught and
///   reported as [`AudioError::Corrupt`]. This relies on `panic = "unwind"`, the default.
pub fn decode(bytes: &[u8]) -> Result<Pcm, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    // symphonia's source must be 'static, hence the copy; it is small next to the decoded samples.
    let owned = bytes.to_vec();
    guard_panics(|| decode_owned(owned))
}

/// Runs `f`, turning a panic inside it (symphonia on malformed data) into an error.
fn guard_panics<T>(f: impl FnOnce() -> Result<T, AudioError>) -> Result<T, AudioError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(AudioError::Corrupt(
            "the decoder failed on malformed data".into(),
        ))
    })
}

/// What the decode loop needs to know about the chosen track.
struct TrackInfo {
    id: u32,
    rate: u32,
    channels: usize,
    /// Exact frame count the container declares, when it is exact (see [`decode`]).
    exact_frames: Option<u64>,
}

fn decode_owned(bytes: Vec<u8>) -> Result<Pcm, AudioError> {
    let byte_len = bytes.len();
    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut format = symphonia::default::get_probe()
        .probe(
            &Hint::new(),
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(probe_error)?;
    let (info, params) = first_audio_track(format.as_ref())?;
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => AudioError::UnsupportedCodec(codec_name(&params)),
            other => AudioError::Corrupt(other.to_string()),
        })?;
    let mono = decode_packets(format.as_mut(), decoder.as_mut(), &info, byte_len)?;
    if mono.is_empty() {
        return Err(AudioError::Empty);
    }
    if let Some(declared) = info.exact_frames {
        if (mono.len() as u64) < declared {
            return Err(AudioError::Truncated {
                decoded: mono.len() as u64,
                declared,
            });
        }
    }
    Ok(Pcm::from_checked(mono, info.rate))
}

/// A readable name for the codecs a supported container may hold but this crate does not decode.
fn codec_name(params: &AudioCodecParameters) -> String {
    use symphonia::core::codecs::audio::well_known as ids;
    let id = params.codec;
    let name = match id {
        ids::CODEC_ID_OPUS => "Opus",
        ids::CODEC_ID_SPEEX => "Speex",
        ids::CODEC_ID_AAC => "AAC",
        ids::CODEC_ID_ALAC => "ALAC",
        ids::CODEC_ID_MP1 | ids::CODEC_ID_MP2 => "MPEG layer I/II",
        ids::CODEC_ID_PCM_ALAW | ids::CODEC_ID_PCM_MULAW => "G.711 A-law/mu-law",
        ids::CODEC_ID_ADPCM_G722
        | ids::CODEC_ID_ADPCM_G726
        | ids::CODEC_ID_ADPCM_G726LE
        | ids::CODEC_ID_ADPCM_MS
        | ids::CODEC_ID_ADPCM_IMA_WAV
        | ids::CODEC_ID_ADPCM_IMA_QT => "ADPCM",
        _ => return format!("codec id {id}"),
    };
    name.to_string()
}

fn probe_error(e: SymphoniaError) -> AudioError {
    match e {
        SymphoniaError::Unsupported(what) => AudioError::UnsupportedFormat(what.to_string()),
        SymphoniaError::IoError(io) if io.kind() == ErrorKind::UnexpectedEof => {
            AudioError::Corrupt("the file ends inside its header".into())
        }
        other => AudioError::Corrupt(other.to_string()),
    }
}

/// The first track with audio codec parameters, checked before any decoder is built.
fn first_audio_track(
    format: &dyn FormatReader,
) -> Result<(TrackInfo, AudioCodecParameters), AudioError> {
    let (track, params) = format
        .tracks()
        .iter()
        .find_map(|t| {
            t.codec_params
                .as_ref()
                .and_then(|c| c.audio())
                .map(|a| (t, a))
        })
        .ok_or(AudioError::NoAudioTrack)?;
    let rate = check_rate(params.sample_rate.map_or(0, u64::from))?;
    let channels = check_channels(params.channels.as_ref().map_or(0, |c| c.count()))?;
    let declared = track.num_frames;
    if declared.is_some_and(|n| n > max_frames(rate)) {
        // A header announcing more than the cap: refuse before decoding anything.
        return Err(AudioError::TooLong);
    }
    // Only lengths read from the stream, not estimated: WAV's data chunk, FLAC's STREAMINFO, and an
    // MP3 Xing/Info header (recognised by the LAME delay/padding it carries; without one symphonia
    // estimates an MP3's length from its bitrate).
    let container = format.format_info().format;
    let exact = container == FORMAT_ID_WAVE
        || container == FORMAT_ID_FLAC
        || (container == FORMAT_ID_MP3 && (track.delay.is_some() || track.padding.is_some()));
    let exact_frames = if exact { declared } else { None };
    Ok((
        TrackInfo {
            id: track.id,
            rate,
            channels,
            exact_frames,
        },
        params.clone(),
    ))
}

/// Reads and decodes every packet of the track, mixing each to mono as it arrives.
fn decode_packets(
    format: &mut dyn FormatReader,
    decoder: &mut dyn AudioDecoder,
    info: &TrackInfo,
    byte_len: usize,
) -> Result<Vec<f32>, AudioError> {
    let limit = max_frames(info.rate);
    let mut mono: Vec<f32> = Vec::new();
    let mut interleaved: Vec<f32> = Vec::new();
    // Every packet consumes input, so more packets than bytes means a reader that stopped making
    // progress: a guard against a hang on crafted input.
    let mut packets_left = byte_len + 1024;
    loop {
        let packet = match format.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) | Err(SymphoniaError::ResetRequired) => break,
            Err(SymphoniaError::IoError(e)) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(AudioError::Corrupt(e.to_string())),
        };
        packets_left = packets_left
            .checked_sub(1)
            .ok_or_else(|| AudioError::Corrupt("the demuxer makes no progress".into()))?;
        if packet.track_id != info.id {
            continue;
        }
        let buffer = decoder
            .decode(&packet)
            .map_err(|e| AudioError::Corrupt(e.to_string()))?;
        if buffer.spec().rate() != info.rate || buffer.spec().channels().count() != info.channels {
            return Err(AudioError::Corrupt(
                "the stream changes its sample rate or channels".into(),
            ));
        }
        if (mono.len() + buffer.frames()) as u64 > limit {
            return Err(AudioError::TooLong);
        }
        buffer.copy_to_vec_interleaved(&mut interleaved);
        if let Some(i) = interleaved.iter().position(|s| !s.is_finite()) {
            return Err(AudioError::NonFinite(mono.len() + i / info.channels));
        }
        let start = mono.len();
        mix_to_mono(&interleaved, info.channels, &mut mono);
        // Integer formats are in [-1, 1) already; float WAV and lossy decoders can overshoot.
        for s in &mut mono[start..] {
            *s = s.clamp(-1.0, 1.0);
        }
    }
    Ok(mono)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_the_decoder_is_an_error() {
        let result: Result<(), AudioError> =
            guard_panics(|| panic!("attempt to subtract with overflow"));
        assert!(matches!(result, Err(AudioError::Corrupt(_))));
        assert!(matches!(guard_panics(|| Ok(3)), Ok(3)));
    }
}
