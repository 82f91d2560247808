//! Decoding the fixture files, and resampling to 16 kHz.

mod common;

use common::{aligned_snr_db, fixture, max_abs_diff, npy_f32, sine, wav_i16};
use wgemma_audio::{Pcm, decode, features, mel_chunks_from_bytes};

/// The 16-bit values the WAV and FLAC fixtures hold: round(x * 32768) / 32768, with numpy's
/// round-half-to-even.
fn quantised(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            (f64::from(v) * 32768.0)
                .round_ties_even()
                .clamp(-32768.0, 32767.0) as f32
                / 32768.0
        })
        .collect()
}

#[test]
fn wav_and_flac_decode_to_the_source_samples() {
    let source = npy_f32("a16k.f32.npy");
    let q = quantised(&source);
    for name in ["a16k.wav", "a16k.flac"] {
        let pcm = decode(&fixture(name)).unwrap();
        assert_eq!(pcm.sample_rate(), 16_000, "{name}");
        assert_eq!(pcm.samples().len(), source.len(), "{name}");
        // Exactly the stored 16-bit values, so within half a 16-bit step of the float source.
        let mismatches = pcm.samples().iter().zip(&q).filter(|(a, b)| a != b).count();
        assert_eq!(
            mismatches, 0,
            "{name}: samples differing from the stored 16-bit values"
        );
        let err = max_abs_diff(pcm.samples(), &source);
        println!(
            "{name}: max |decoded - source| = {err:.3e} (half a 16-bit step is {:.3e})",
            0.5 / 32768.0
        );
        assert!(err <= 0.5 / 32768.0 + 1e-9, "{name}: {err}");
    }
}

/// Lossy codecs: the decoded clip has the source's length (gapless trimming) give or take a
/// frame of codec delay, and is close to it (SNR after the best alignment).
#[test]
fn mp3_and_vorbis_decode_close_to_the_source() {
    let source = npy_f32("a16k.f32.npy");
    for (name, min_snr) in [("a16k.mp3", 20.0), ("a16k.ogg", 20.0)] {
        let pcm = decode(&fixture(name)).unwrap();
        assert_eq!(pcm.sample_rate(), 16_000, "{name}");
        let (snr, lag) = aligned_snr_db(&source, pcm.samples(), 1200);
        println!(
            "{name}: {} samples (source {}), SNR {snr:.1} dB at lag {lag}",
            pcm.samples().len(),
            source.len()
        );
        assert!(snr > min_snr, "{name}: SNR {snr:.1} dB");
        assert!(
            pcm.samples().len().abs_diff(source.len()) <= 1152,
            "{name}: length {}",
            pcm.samples().len()
        );
        assert!(pcm.samples().iter().all(|s| (-1.0..=1.0).contains(s)));
    }
}

/// Stereo 44.1 kHz: the lossy files decode close to the WAV's mono mix.
#[test]
fn stereo_lossy_files_decode_close_to_the_wav() {
    let wav = decode(&fixture("c44k.wav")).unwrap();
    assert_eq!((wav.sample_rate(), wav.samples().len()), (44_100, 57_330));
    for name in ["c44k.mp3", "c44k.ogg"] {
        let pcm = decode(&fixture(name)).unwrap();
        assert_eq!(pcm.sample_rate(), 44_100, "{name}");
        let (snr, lag) = aligned_snr_db(wav.samples(), pcm.samples(), 2400);
        println!("{name}: SNR {snr:.1} dB against the WAV's mono mix, lag {lag}");
        assert!(snr > 20.0, "{name}: SNR {snr:.1} dB");
    }
}

/// 44.1 kHz stereo to 16 kHz mono, against transformers' features of the same 16-bit samples
/// mixed to mono and resampled by an exact (whole-clip FFT) band-limited resampler.
#[test]
fn resampled_stereo_features_match_reference() {
    let pcm = decode(&fixture("c44k.wav")).unwrap();
    let pcm16 = pcm.into_16k().unwrap();
    assert_eq!(pcm16.samples().len(), 20_800, "ceil(57330 * 160 / 441)");
    let chunks = features(&pcm16).unwrap();
    let want = npy_f32("c44k_16k.features.npy");
    let want_mask: Vec<bool> = npy_f32("c44k_16k.mask.npy")
        .iter()
        .map(|&m| m != 0.0)
        .collect();
    assert_eq!(chunks[0].mask, want_mask);
    let got = &chunks[0].features;
    // The clip's content stops at 6 kHz; above it both signals are 16-bit noise on the log floor,
    // where the resamplers' different anti-aliasing filters show. Compare the bins below 6 kHz
    // tightly and all bins loosely.
    let low_bins = 100; // HTK mel centre of bin 100 is about 5.4 kHz
    let (mut low, mut all, mut sum) = (0f32, 0f32, 0f64);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = (g - w).abs();
        all = all.max(d);
        sum += f64::from(d);
        if i % 128 < low_bins {
            low = low.max(d);
        }
    }
    let mean = sum / got.len() as f64;
    println!(
        "44.1k stereo -> 16k: max |diff| bins <100: {low:.3e}, all bins: {all:.3e}, mean {mean:.3e}"
    );
    // Seen: 2.1e-4, 5.1e-2, 1.2e-4.
    assert!(low < 2e-3, "bins below 5.4 kHz: {low}");
    assert!(all < 0.2, "all bins: {all}");
    assert!(mean < 1e-3, "mean: {mean}");
    // The one-call path gives the same.
    assert_eq!(mel_chunks_from_bytes(&fixture("c44k.wav")).unwrap(), chunks);
}

/// Amplitude (RMS * sqrt 2) and frequency (from a DFT peak with parabolic interpolation) of a
/// stationary sine, over `x` minus its first and last 10%.
fn sine_params(x: &[f32], rate: f64) -> (f64, f64) {
    let cut = x.len() / 10;
    let x = &x[cut..x.len() - cut];
    let amp = (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
        * 2f64.sqrt();
    let n = x.len();
    let power = |f: f64| {
        let (mut re, mut im) = (0f64, 0f64);
        for (i, &v) in x.iter().enumerate() {
            let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos();
            let ph = 2.0 * std::f64::consts::PI * f * i as f64 / rate;
            re += f64::from(v) * w * ph.cos();
            im -= f64::from(v) * w * ph.sin();
        }
        re * re + im * im
    };
    // Coarse search on a 1 Hz grid around the expected band, then refine by golden-section.
    let (mut lo, mut hi) = (0f64, rate / 2.0);
    let step = rate / n as f64;
    let mut best = (0f64, 0f64);
    let mut f = step;
    while f < rate / 2.0 {
        let p = power(f);
        if p > best.1 {
            best = (f, p);
        }
        f += step;
    }
    lo = lo.max(best.0 - step);
    hi = hi.min(best.0 + step);
    for _ in 0..40 {
        let (a, b) = (lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618);
        if power(a) > power(b) { hi = b } else { lo = a }
    }
    (amp, (lo + hi) / 2.0)
}

/// A sine keeps its frequency and amplitude through down- and up-sampling.
#[test]
fn resampling_keeps_a_sine() {
    for (rate, freq) in [
        (44_100u32, 1000.0),
        (48_000, 3150.0),
        (8_000, 440.0),
        (22_050, 7000.0),
    ] {
        let n = rate as usize / 2;
        let pcm = Pcm::new(sine(freq, 0.5, rate, n), rate).unwrap();
        let out = pcm.into_16k().unwrap();
        assert_eq!(
            out.samples().len(),
            (n as u64 * 16_000).div_ceil(u64::from(rate)) as usize,
            "{rate}"
        );
        let (amp, f) = sine_params(out.samples(), 16_000.0);
        println!("{rate} Hz, {freq} Hz sine -> 16 kHz: amplitude {amp:.5}, frequency {f:.3} Hz");
        assert!((amp - 0.5).abs() < 0.005, "{rate}: amplitude {amp}");
        assert!((f - freq).abs() < 0.5, "{rate}: frequency {f}");
    }
    // Content above 8 kHz must not alias into the band: a 10 kHz sine at 44.1 kHz vanishes
    // (away from the clip's abrupt start and end, whose clicks are broadband).
    let out = Pcm::new(sine(10_000.0, 0.5, 44_100, 22_050), 44_100)
        .unwrap()
        .into_16k()
        .unwrap();
    let middle = &out.samples()[800..out.samples().len() - 800];
    let rms =
        (middle.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / middle.len() as f64).sqrt();
    println!("10 kHz sine at 44.1 kHz -> 16 kHz: rms {rms:.2e}");
    assert!(rms < 1e-4, "aliasing: rms {rms}");
}

/// 16 kHz input is passed through untouched; channels are averaged.
#[test]
fn sixteen_khz_passes_through_and_channels_average() {
    let pcm = Pcm::from_interleaved(&[0.5, -0.5, 0.25, 0.75, -1.0, -1.0], 16_000, 2).unwrap();
    assert_eq!(pcm.samples(), &[0.0, 0.5, -1.0]);
    assert_eq!(pcm.clone().into_16k().unwrap().samples(), pcm.samples());
    // Stereo WAV with opposite channels mixes to silence.
    let samples: Vec<i16> = (0..2000).flat_map(|i| [i as i16, -(i as i16)]).collect();
    let decoded = decode(&wav_i16(&samples, 2, 16_000)).unwrap();
    assert_eq!(decoded.samples().len(), 2000);
    assert!(decoded.samples().iter().all(|&s| s == 0.0));
}

/// An ID3v2 tag in front (with binary junk that looks like MPEG frame syncs, as embedded cover
/// art does) and an ID3v1 tag behind: the MP3 still decodes to the same samples.
#[test]
fn mp3_with_id3_tags_decodes() {
    let mp3 = fixture("a16k.mp3");
    let mut junk = b"x\0".to_vec();
    junk.extend((0..3000u32).map(|i| {
        if i % 7 == 0 {
            0xff
        } else if i % 7 == 1 {
            0xfb
        } else {
            (i * 31) as u8
        }
    }));
    let mut frame = b"PRIV".to_vec();
    frame.extend((junk.len() as u32).to_be_bytes());
    frame.extend([0, 0]);
    frame.extend(&junk);
    let size = frame.len() as u32;
    let syncsafe = [
        (size >> 21) as u8 & 0x7f,
        (size >> 14) as u8 & 0x7f,
        (size >> 7) as u8 & 0x7f,
        size as u8 & 0x7f,
    ];
    let mut tagged = b"ID3\x03\x00\x00".to_vec();
    tagged.extend(syncsafe);
    tagged.extend(&frame);
    tagged.extend(&mp3);
    let mut id3v1 = b"TAG".to_vec();
    id3v1.resize(128, b' ');
    tagged.extend(&id3v1);
    let plain = decode(&mp3).unwrap();
    let with_tags = decode(&tagged).unwrap();
    assert_eq!(with_tags.samples(), plain.samples());
}
