//! Audio clips from JavaScript, as `web/worker.js` hands them over: `{bytes: Uint8Array}` (a
//! WAV, FLAC, MP3 or Ogg/Vorbis file, decoded here as natively) or `{samples: Float32Array,
//! sampleRate, channels}` (PCM, channels interleaved, as `web/wgemma.js` makes it of an
//! `AudioBuffer`: what the browser decoded or recorded).

use js_sys::{Array, Float32Array, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};

use super::{bad, field};
use crate::{AudioInput, Error};

/// A positive whole number in `u32`'s range.
fn positive(v: &JsValue, key: &str) -> Result<u32, Error> {
    field(v, key)
        .and_then(|x| x.as_f64())
        .filter(|x| *x >= 1.0 && x.fract() == 0.0 && *x <= f64::from(u32::MAX))
        .map(|x| x as u32)
        .ok_or_else(|| bad(format!("audio samples need a positive whole `{key}`")))
}

/// One audio object.
pub fn audio_input(v: &JsValue) -> Result<AudioInput, Error> {
    if let Some(b) = field(v, "bytes") {
        let bytes = b
            .dyn_into::<Uint8Array>()
            .map_err(|_| bad("an audio clip's `bytes` must be a Uint8Array"))?;
        return AudioInput::from_bytes(&bytes.to_vec());
    }
    if let Some(s) = field(v, "samples") {
        let samples = s
            .dyn_into::<Float32Array>()
            .map_err(|_| bad("an audio clip's `samples` must be a Float32Array"))?;
        let rate = positive(v, "sampleRate")?;
        let channels = positive(v, "channels")?;
        // Refused before the samples are copied into wasm memory.
        let most =
            u64::from(wgemma_audio::MAX_DURATION_SECS) * u64::from(rate) * u64::from(channels);
        if u64::from(samples.length()) > most {
            return Err(wgemma_audio::AudioError::TooLong.into());
        }
        return AudioInput::from_samples(&samples.to_vec(), rate, channels as usize);
    }
    Err(bad(
        "an audio clip needs `bytes` (a file) or `samples` with a `sampleRate` and `channels`",
    ))
}

/// An array of audio objects (or nothing: no audio).
pub fn audio_inputs(list: &JsValue) -> Result<Vec<AudioInput>, Error> {
    if list.is_undefined() || list.is_null() {
        return Ok(Vec::new());
    }
    let list = list
        .dyn_ref::<Array>()
        .ok_or_else(|| bad("the audio clips must be an array"))?;
    list.iter().map(|v| audio_input(&v)).collect()
}
