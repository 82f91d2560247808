//! Bad input is a typed error: never a panic, a hang or a huge allocation.

mod common;

use std::time::{Duration, Instant};

use common::{fixture, wav_bytes, wav_f32, wav_i16};
use wgemma_audio::{AudioError, MAX_DURATION_SECS, Pcm, Pcm16k, decode, mel_chunks_from_bytes};

const FILES: [&str; 7] = [
    "a16k.wav",
    "a16k.flac",
    "a16k.mp3",
    "a16k.ogg",
    "c44k.wav",
    "c44k.mp3",
    "c44k.ogg",
];

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Decodes `bytes` and checks what comes back: an error, or sane audio no longer than
/// `max_secs`. Returns whether it was an error and how long it took.
fn decode_checked(bytes: &[u8], max_secs: f64, what: &str) -> (bool, Duration) {
    let start = Instant::now();
    let result = decode(bytes);
    let took = start.elapsed();
    match result {
        Err(_) => (true, took),
        Ok(pcm) => {
            assert!(
                pcm.samples().iter().all(|s| (-1.0..=1.0).contains(s)),
                "{what}: sample out of range"
            );
            assert!(
                pcm.duration_secs() <= max_secs,
                "{what}: {} s",
                pcm.duration_secs()
            );
            // What decodes must also featurise without trouble (or be too short).
            match pcm.into_16k().and_then(|p| wgemma_audio::features(&p)) {
                Ok(_) | Err(AudioError::TooShort { .. }) => {}
                Err(e) => panic!("{what}: decoded but then failed: {e}"),
            }
            (false, took)
        }
    }
}

/// Truncations, byte flips, overwritten and zeroed runs, a duplicated run of every fixture.
#[test]
fn mutated_files_error_or_decode_sanely() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut total, mut errors, mut slowest) = (0, 0, Duration::ZERO);
    for name in FILES {
        let good = fixture(name);
        let max_secs = decode(&good).unwrap().duration_secs();
        // WAV, FLAC and LAME-tagged MP3 declare their length: every truncation must be refused.
        // An Ogg stream cut short may still decode what it holds.
        let exact_length = !name.ends_with(".ogg");
        let mut cases: Vec<(String, Vec<u8>, bool)> = Vec::new();
        for frac in [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99] {
            let cut = (good.len() as f64 * frac) as usize;
            cases.push((
                format!("truncated to {cut} bytes"),
                good[..cut].to_vec(),
                exact_length,
            ));
        }
        for k in 0..12 {
            let mut bad = good.clone();
            // Headers hold the interesting fields: aim half of the flips at the first 64 bytes.
            for _ in 0..1 + k / 3 {
                let at = if k % 2 == 0 {
                    rng.below(64.min(bad.len()))
                } else {
                    rng.below(bad.len())
                };
                bad[at] ^= 1 << rng.below(8);
            }
            cases.push((format!("bit flips #{k}"), bad, false));
        }
        for k in 0..6 {
            let mut bad = good.clone();
            let at = rng.below(bad.len());
            let len = (1 + rng.below(64)).min(bad.len() - at);
            let fill = if k % 2 == 0 { 0 } else { 0xff };
            bad[at..at + len].fill(fill);
            cases.push((format!("{len} bytes at {at} set to {fill:#x}"), bad, false));
        }
        let mid = good.len() / 2;
        cases.push((
            "middle duplicated".into(),
            [&good[..mid], &good[mid / 2..]].concat(),
            false,
        ));
        for (what, bytes, must_fail) in &cases {
            let what = format!("{name}: {what}");
            // A mutation can lengthen a stream (a duplicated run, a changed length field) but never
            // past the cap; allow twice the clip.
            let (err, took) = decode_checked(bytes, 2.0 * max_secs + 0.2, &what);
            assert!(err || !must_fail, "{what}: decoded");
            total += 1;
            errors += usize::from(err);
            slowest = slowest.max(took);
        }
    }
    println!(
        "{total} mutated files: {errors} refused, the rest decoded to sane audio; slowest {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "slowest decode {slowest:?}"
    );
}

/// Lengths declared in the header make truncation detectable.
#[test]
fn truncated_wav_and_flac_are_errors() {
    for name in ["a16k.wav", "a16k.flac", "a16k.mp3", "c44k.wav", "c44k.mp3"] {
        let good = fixture(name);
        for frac in [0.3, 0.6, 0.95] {
            let cut = (good.len() as f64 * frac) as usize;
            let err = decode(&good[..cut]).unwrap_err();
            assert!(
                matches!(err, AudioError::Truncated { .. } | AudioError::Corrupt(_)),
                "{name} at {frac}: {err}"
            );
        }
    }
    let err = decode(&fixture("a16k.wav")[..20_000]).unwrap_err();
    assert!(
        matches!(
            err,
            AudioError::Truncated {
                declared: 20_864,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn garbage_and_empty_input_are_errors() {
    assert!(matches!(decode(&[]), Err(AudioError::Empty)));
    let mut rng = Rng(42);
    for len in [1, 3, 4, 11, 44, 100, 4096, 200_000] {
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let start = Instant::now();
        assert!(decode(&bytes).is_err(), "{len} random bytes decoded");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
    // A RIFF header whose length cannot hold the WAVE form.
    let err = decode(b"RIFF\0\0\0\0WAVE").unwrap_err();
    assert!(matches!(err, AudioError::Corrupt(_)), "{err}");
    let err = decode(&[0u8; 10_000]).unwrap_err();
    assert!(matches!(err, AudioError::UnsupportedFormat(_)), "{err}");
    // A header with no samples.
    assert!(matches!(
        decode(&wav_i16(&[], 1, 16_000)),
        Err(AudioError::Empty)
    ));
}

#[test]
fn unsupported_codecs_are_named_errors() {
    for (name, codec) in [
        ("unsupported_opus.ogg", "Opus"),
        ("unsupported_adpcm.wav", "ADPCM"),
    ] {
        let err = decode(&fixture(name)).unwrap_err();
        println!("{name}: {err}");
        assert!(
            matches!(&err, AudioError::UnsupportedCodec(c) if c == codec),
            "{name}: {err}"
        );
    }
}

#[test]
fn bad_headers_are_errors() {
    let data: Vec<u8> = (0..3200u32)
        .flat_map(|i| ((i % 200) as i16 * 50).to_le_bytes())
        .collect();
    // Zero channels (symphonia's WAV reader refuses it itself).
    let err = decode(&wav_bytes(1, 0, 16_000, 16, &data, None)).unwrap_err();
    assert!(
        matches!(err, AudioError::Corrupt(_) | AudioError::BadChannelCount(0)),
        "0 channels: {err}"
    );
    // Absurd rates: 1 Hz, 100 Hz, 1 MHz, 4 GHz.
    for rate in [1, 100, 1_000_000, 4_000_000_000] {
        let err = decode(&wav_bytes(1, 1, rate, 16, &data, None)).unwrap_err();
        assert!(
            matches!(err, AudioError::BadSampleRate(r) if r == u64::from(rate)),
            "{rate} Hz: {err}"
        );
    }
    // Too many channels for the data to mean anything.
    let err = decode(&wav_bytes(1, 300, 16_000, 16, &data, None)).unwrap_err();
    assert!(
        matches!(
            err,
            AudioError::Corrupt(_) | AudioError::BadChannelCount(300)
        ),
        "300 channels: {err}"
    );
    // A data chunk claiming more than the file holds: truncated.
    let err = decode(&wav_bytes(
        1,
        1,
        16_000,
        16,
        &data,
        Some(data.len() as u32 * 4),
    ))
    .unwrap_err();
    assert!(matches!(err, AudioError::Truncated { .. }), "{err}");
    // A data chunk claiming far more than the duration cap: refused before decoding.
    let err = decode(&wav_bytes(1, 1, 8_000, 16, &data, Some(2_000_000_000))).unwrap_err();
    assert!(matches!(err, AudioError::TooLong), "{err}");
    // Odd bit depths.
    assert!(decode(&wav_bytes(1, 1, 16_000, 0, &data, None)).is_err());
    assert!(decode(&wav_bytes(1, 1, 16_000, 13, &data, None)).is_err());
}

#[test]
fn non_finite_samples_are_errors() {
    let mut samples = vec![0.25f32; 1000];
    samples[700] = f32::NAN;
    assert!(matches!(
        decode(&wav_f32(&samples, 1, 16_000)),
        Err(AudioError::NonFinite(700))
    ));
    samples[700] = f32::INFINITY;
    assert!(matches!(
        decode(&wav_f32(&samples, 2, 16_000)),
        Err(AudioError::NonFinite(350))
    ));
    assert!(matches!(
        Pcm::new(samples.clone(), 16_000),
        Err(AudioError::NonFinite(700))
    ));
    assert!(matches!(
        Pcm::from_interleaved(&samples, 16_000, 2),
        Err(AudioError::NonFinite(700))
    ));
    assert!(matches!(
        Pcm16k::new(samples),
        Err(AudioError::NonFinite(700))
    ));
    // Finite float samples beyond full scale decode, clipped to [-1, 1].
    let loud = decode(&wav_f32(&[2.0, -3.0, 0.5], 1, 16_000)).unwrap();
    assert_eq!(loud.samples(), &[1.0, -1.0, 0.5]);
}

#[test]
fn pcm_constructors_check_their_input() {
    assert!(matches!(Pcm::new(vec![], 16_000), Err(AudioError::Empty)));
    assert!(matches!(
        Pcm::new(vec![0.0; 10], 0),
        Err(AudioError::BadSampleRate(0))
    ));
    assert!(matches!(
        Pcm::new(vec![0.0; 10], 1_000_000),
        Err(AudioError::BadSampleRate(1_000_000))
    ));
    assert!(matches!(
        Pcm::from_interleaved(&[0.0; 10], 16_000, 0),
        Err(AudioError::BadChannelCount(0))
    ));
    assert!(matches!(
        Pcm::from_interleaved(&[0.0; 10], 16_000, 33),
        Err(AudioError::BadChannelCount(33))
    ));
    assert!(matches!(
        Pcm::from_interleaved(&[0.0; 10], 16_000, 3),
        Err(AudioError::PartialFrame {
            samples: 10,
            channels: 3
        })
    ));
    let cap = MAX_DURATION_SECS as usize * 8_000;
    assert!(Pcm::new(vec![0.0; cap], 8_000).is_ok());
    assert!(matches!(
        Pcm::new(vec![0.0; cap + 1], 8_000),
        Err(AudioError::TooLong)
    ));
    assert!(matches!(
        Pcm16k::new(vec![0.0; MAX_DURATION_SECS as usize * 16_000 + 1]),
        Err(AudioError::TooLong)
    ));
}

/// A file longer than the cap whose header does not say so (streamed WAV, length unknown) stops
/// with TooLong once the decoded length passes the cap.
#[test]
fn overlong_stream_stops_while_decoding() {
    let frames = (MAX_DURATION_SECS as usize + 5) * 4_000;
    // 8-bit unsigned PCM at 4 kHz keeps the test file small (2.4 MB).
    let data: Vec<u8> = (0..frames)
        .map(|i| (128 + (i % 64) as i32 - 32) as u8)
        .collect();
    let bytes = wav_bytes(1, 1, 4_000, 8, &data, Some(u32::MAX));
    let start = Instant::now();
    let err = decode(&bytes).unwrap_err();
    println!(
        "{} s of 4 kHz audio with an open-ended header: {err} after {:?}",
        frames / 4_000,
        start.elapsed()
    );
    assert!(matches!(err, AudioError::TooLong), "{err}");
    // Exactly at the cap is accepted.
    let ok = decode(&wav_bytes(
        1,
        1,
        4_000,
        8,
        &data[..MAX_DURATION_SECS as usize * 4_000],
        None,
    ))
    .unwrap();
    assert_eq!(ok.duration_secs(), f64::from(MAX_DURATION_SECS));
    assert!(mel_chunks_from_bytes(&fixture("a16k.wav")).is_ok());
}
