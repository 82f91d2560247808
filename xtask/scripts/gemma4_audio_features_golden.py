#!/usr/bin/env python3
"""transformers' Gemma 4 audio features of a few synthetic clips, as goldens for wgemma-audio.

Regenerate (from the repository root; numpy-only, no torch: the feature extractor does not
import it):

    python3 -m pip install --target /work/dl/py numpy huggingface_hub packaging pyyaml regex \
        filelock tqdm safetensors soundfile
    mkdir -p /work/dl/tfpkg && (cd /work/dl/tfpkg && unzip -q -o \
        /work/main/.dev/transformers-5.23.0-py3-none-any.whl)
    PYTHONPATH=/work/dl/py:/work/dl/tfpkg python3 xtask/scripts/gemma4_audio_features_golden.py

(The wheel has to be unpacked: transformers 5.23 lists its `models/` folder at import time,
which fails inside a zip on sys.path.) Seen with numpy 2.4.6, soundfile 0.14.0 (libsndfile
1.2.2, which encodes MP3 through LAME and Vorbis through libvorbis).

The clips are drawn from formulas with fixed seeds:
    a16k  16 kHz mono, 20864 samples (163 x 128): linear chirp 120 Hz -> 7 kHz, a 440 Hz tone,
          white noise. Encoded as WAV (16-bit), FLAC (16-bit), MP3 and Ogg/Vorbis.
    b16k  16 kHz mono, 20130 samples (not a multiple of 128; the pad to 20224 adds one
          invalid frame): decaying harmonics with a slow tremolo, exact digital silence in
          samples 8000..10000 (the log floor), white noise.
    c44k  44.1 kHz stereo, 57330 frames (441 x 130): left a chirp 150 Hz -> 6 kHz, right two
          tones, independent noise low-passed below 6 kHz. Encoded as WAV (16-bit), MP3, Ogg.
Two more files hold codecs wgemma-audio does not decode (to test its error): the first 0.25 s
of a16k as Ogg/Opus and as IMA ADPCM in WAV.
The Ogg files differ byte-wise between runs (libsndfile picks a random stream serial number);
everything else is byte-identical. WAV and FLAC hold the 16-bit values round(x * 32768) written
as integers, so a decoder that divides by 32768 gets them back exactly.

Writes into crates/gemma4-audio/tests/fixtures/:
    {a16k,b16k}.f32.npy              the float32 source samples
    {a16k,b16k}.features.npy         transformers' `input_features` [frames, 128], float32
    {a16k,b16k}.mask.npy             `input_features_mask` as float32 0/1 [frames]
    a16k.{wav,flac,mp3,ogg}, c44k.{wav,mp3,ogg}, unsupported_{opus.ogg,adpcm.wav}
    c44k_16k.features.npy / .mask.npy  features of c44k.wav's 16-bit samples mixed to mono
          (mean of the channels) and resampled to 16 kHz by an exact band-limited reference:
          the whole clip's spectrum cut at 8 kHz (rfft -> keep bins -> irfft, float64). The
          content is below 6 kHz and faded in and out, so this periodic resampler is exact up
          to 16-bit noise, and any good resampler should land close to it.
The extractor is called with a list of one clip, as Gemma4Processor does (transformers 5.23
fails on a bare 1-D array: `_extract_spectrogram` squeezes the wrong axis).
"""
from pathlib import Path

import numpy as np
import soundfile as sf
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

COMMAND = "PYTHONPATH=/work/dl/py:/work/dl/tfpkg python3 xtask/scripts/gemma4_audio_features_golden.py"
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/gemma4-audio/tests/fixtures"


def fade(x, n):
    """Raised-cosine fade in and out over n samples (first axis), so clips start and end at 0."""
    ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(n) / n)
    shape = (n,) + (1,) * (x.ndim - 1)
    x[:n] *= ramp.reshape(shape)
    x[-n:] *= ramp[::-1].reshape(shape)
    return x


def chirp(n, sr, f0, f1):
    t = np.arange(n) / sr
    dur = n / sr
    return np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * dur)))


def clip_a():
    n, sr = 20864, 16000
    rng = np.random.default_rng(1)
    t = np.arange(n) / sr
    x = 0.45 * chirp(n, sr, 120, 7000) + 0.1 * np.sin(2 * np.pi * 440 * t) + 0.01 * rng.standard_normal(n)
    return fade(x, 160).astype(np.float32)


def clip_b():
    n, sr = 20130, 16000
    rng = np.random.default_rng(2)
    t = np.arange(n) / sr
    tone = sum(np.sin(2 * np.pi * 220 * k * t) / k for k in range(1, 7))
    x = 0.3 * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) * tone + 0.005 * rng.standard_normal(n)
    x = fade(x, 160)
    x[8000:10000] = 0.0
    return x.astype(np.float32)


def lowpassed_noise(n, sr, cutoff, rng):
    spec = np.fft.rfft(rng.standard_normal(n))
    spec[np.fft.rfftfreq(n, 1 / sr) >= cutoff] = 0
    y = np.fft.irfft(spec, n)
    return y / y.std()


def clip_c():
    n, sr = 57330, 44100
    rng = np.random.default_rng(3)
    t = np.arange(n) / sr
    left = 0.4 * chirp(n, sr, 150, 6000) + 0.02 * lowpassed_noise(n, sr, 6000, rng)
    right = 0.25 * np.sin(2 * np.pi * 300 * t) + 0.2 * np.sin(2 * np.pi * 2500 * t)
    right = right + 0.02 * lowpassed_noise(n, sr, 6000, rng)
    return fade(np.stack([left, right], axis=1), 882).astype(np.float32)


def to_i16(x):
    return np.clip(np.round(x.astype(np.float64) * 32768), -32768, 32767).astype(np.int16)


def fft_resample(x, n_out):
    """Band-limited resampling of a whole clip: keep the spectrum below the new Nyquist."""
    spec = np.fft.rfft(x.astype(np.float64))
    keep = n_out // 2 + 1
    out = np.zeros(keep, dtype=np.complex128)
    out[: min(keep, spec.size)] = spec[:keep]
    if n_out % 2 == 0:
        out[-1] = out[-1].real  # the new Nyquist bin of a real signal is real
    return np.fft.irfft(out, n_out) * (n_out / x.size)


def features(fe, wave):
    out = fe([wave])
    feat = np.asarray(out["input_features"][0], dtype=np.float32)
    mask = np.asarray(out["input_features_mask"][0]).astype(np.float32)
    return feat, mask


def save_features(fe, name, wave):
    feat, mask = features(fe, wave)
    np.save(OUT / f"{name}.features.npy", feat)
    np.save(OUT / f"{name}.mask.npy", mask)
    print(f"{name}: {wave.size} samples -> {feat.shape[0]} frames, {int(mask.sum())} valid")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    fe = Gemma4AudioFeatureExtractor()

    a, b, c = clip_a(), clip_b(), clip_c()
    for name, wave in (("a16k", a), ("b16k", b)):
        np.save(OUT / f"{name}.f32.npy", wave)
        save_features(fe, name, wave)

    sf.write(OUT / "a16k.wav", to_i16(a), 16000, subtype="PCM_16")
    sf.write(OUT / "a16k.flac", to_i16(a), 16000, subtype="PCM_16")
    sf.write(OUT / "a16k.mp3", a, 16000, format="MP3", subtype="MPEG_LAYER_III")
    sf.write(OUT / "a16k.ogg", a, 16000, format="OGG", subtype="VORBIS")

    sf.write(OUT / "unsupported_opus.ogg", a[:4000], 16000, format="OGG", subtype="OPUS")
    sf.write(OUT / "unsupported_adpcm.wav", to_i16(a[:4000]), 16000, subtype="IMA_ADPCM")

    c16 = to_i16(c)
    sf.write(OUT / "c44k.wav", c16, 44100, subtype="PCM_16")
    sf.write(OUT / "c44k.mp3", c, 44100, format="MP3", subtype="MPEG_LAYER_III")
    sf.write(OUT / "c44k.ogg", c, 44100, format="OGG", subtype="VORBIS")
    mono = (c16.astype(np.float64) / 32768).mean(axis=1)
    ref16k = fft_resample(mono, c.shape[0] * 160 // 441).astype(np.float32)
    save_features(fe, "c44k_16k", ref16k)

    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{OUT}: {total} bytes; regenerate with: {COMMAND}")


if __name__ == "__main__":
    main()
