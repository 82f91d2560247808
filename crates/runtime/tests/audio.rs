//! Audio prompts through the public API on the tiny random Gemma 4 E2B-like model with an
//! audio tower (`xtask/scripts/gemma4_audio_golden.py`): teacher-forced predictions against
//! transformers for the golden prompt holding `a16k.wav`, from the model + mmproj pair and from
//! an Ollama-style blob holding both (the two layouts name tensors differently); generation
//! with audio over several turns (earlier clips stay in the cache); and bad input.

use std::path::PathBuf;

use futures::StreamExt;
use wgemma::{
    AudioInput, Error, Event, GenerateRequest, LoadOptions, MediaInput, Message, Model, Prompt,
    SessionOptions,
};

fn audio_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gemma4-audio/tests"
    ))
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(audio_dir().join(path)).unwrap()
}

fn options() -> Option<LoadOptions> {
    let ctx = wgemma_test_support::gpu()?;
    Some(LoadOptions {
        context: Some(ctx.clone()),
        ..LoadOptions::default()
    })
}

/// The model with its projector file (which holds a vision tower too), or the Ollama-style
/// blob holding the text model and the audio tower, loaded from files as the CLI does.
fn load(blob: bool) -> Option<Model> {
    load_with(blob, options()?)
}

fn load_with(blob: bool, mut opts: LoadOptions) -> Option<Model> {
    let fixtures = audio_dir().join("fixtures");
    let text = fixtures.join("gemma4_tiny_audio.gguf");
    let mmproj = fixtures.join("gemma4_tiny_audio_mmproj.gguf");
    let path = if blob {
        let bytes = wgemma_test_support::ollama_audio_blob(
            &std::fs::read(&text).unwrap(),
            &std::fs::read(&mmproj).unwrap(),
        );
        let path =
            std::env::temp_dir().join(format!("wgemma-audio-blob-{}.gguf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    } else {
        opts.mmproj = Some(mmproj);
        text
    };
    let model = pollster::block_on(Model::load_file(&path, opts)).unwrap();
    if blob {
        std::fs::remove_file(&path).ok();
    }
    Some(model)
}

fn clip(name: &str) -> AudioInput {
    AudioInput::from_bytes(&read(&format!("fixtures/{name}"))).unwrap()
}

fn numbers(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn teacher_forced_audio_prompts_match_transformers_in_both_layouts() {
    let golden: serde_json::Value = serde_json::from_slice(&read("golden/audio_e2b.json")).unwrap();
    let tokens: Vec<u32> = numbers(&golden["prompt"])
        .iter()
        .map(|&t| t as u32)
        .collect();
    let at = numbers(&golden["audio_positions"])[0] as usize;
    let want = numbers(&golden["teacher_forced"]["argmax"]);
    let margin = numbers(&golden["teacher_forced"]["margin"]);
    let mut soft = Vec::new();
    for blob in [false, true] {
        let Some(model) = load(blob) else { return };
        assert!(model.audio().is_some(), "blob {blob}: an audio tower");
        let mut session = model
            .session(SessionOptions {
                context: 128,
                max_batch: 16,
            })
            .unwrap();
        let inputs = [(at, MediaInput::Audio(clip("a16k.wav")))];
        let scored = pollster::block_on(session.score_with(&tokens, &inputs)).unwrap();
        let (mut checked, mut agree) = (0, 0);
        for (i, (id, _)) in scored.iter().enumerate() {
            if margin[i] >= 0.25 {
                checked += 1;
                agree += usize::from(f64::from(*id) == want[i]);
            }
        }
        eprintln!("blob {blob}: {agree} of {checked} confident positions agree");
        assert!(checked > 60);
        assert_eq!(agree, checked, "blob {blob}: teacher-forced argmax");
        let plain = pollster::block_on(session.score(&tokens)).unwrap();
        let same = plain
            .iter()
            .zip(&want)
            .filter(|((id, _), w)| f64::from(*id) == **w)
            .count();
        assert!(same < checked, "the clip changes the predictions");
        soft.push(pollster::block_on(model.encode_audio_to_vec(&clip("a16k.wav"))).unwrap());
    }
    assert_eq!(soft[0].1, 33);
    assert_eq!(soft[0], soft[1], "both layouts give the same soft tokens");
}

/// Collects a reply's events: the `Done` timings.
fn reply(session: &mut wgemma::Session, req: GenerateRequest) -> Result<wgemma::Timings, Error> {
    let mut stream = Box::pin(session.generate(req));
    let mut timings = None;
    while let Some(e) = pollster::block_on(stream.next()) {
        if let Event::Done { timings: t, .. } = e? {
            timings = Some(t);
        }
    }
    Ok(timings.unwrap())
}

fn request(messages: &[Message], audio: &[AudioInput]) -> GenerateRequest {
    let mut req = GenerateRequest::new(Prompt::Chat(messages.to_vec()));
    req.max_tokens = 4;
    req.audio = audio.to_vec();
    req
}

#[test]
fn chat_with_audio_keeps_earlier_clips_in_the_cache() {
    let Some(model) = load(false) else { return };
    let mut session = model.session(SessionOptions::default()).unwrap();
    let mut messages = vec![Message::user("What do you hear?").with_audio(1)];
    let mut audio = vec![clip("a16k.wav")];
    let first = reply(&mut session, request(&messages, &audio)).unwrap();
    assert_eq!(first.encoded_audio, 1);
    assert!(first.prompt_tokens > 35, "33 soft tokens and markers");
    messages.push(Message::assistant("A tone."));
    // The same clip decoded from FLAC: other bytes, so another clip to the cache.
    messages.push(Message::user("And this?").with_audio(1));
    audio.push(clip("a16k.flac"));
    let second = reply(&mut session, request(&messages, &audio)).unwrap();
    assert_eq!(
        second.encoded_audio, 1,
        "the first clip comes from the cache"
    );
    assert!(second.cached_tokens > 35);
    // An image and a clip in one message of a model whose projector holds both towers.
    let png =
        std::fs::read(audio_dir().join("../../gemma4-vision/tests/fixtures/exact_480x336.png"))
            .unwrap();
    let mut req = request(
        &[Message::user("Both?").with_images(1).with_audio(1)],
        &[clip("c44k.wav")],
    );
    req.images = vec![wgemma::ImageInput::from_bytes(png).with_budget(70)];
    let both = reply(&mut session, req).unwrap();
    assert_eq!((both.encoded_images, both.encoded_audio), (1, 1));
}

#[test]
fn bad_audio_requests_are_errors_and_the_session_goes_on() {
    // Bad files are refused when the clip is made, before any request.
    for bad in [
        &b"RIFF\x24\x00\x00\x00WAVEfmt "[..],
        b"",
        b"not audio at all",
    ] {
        let e = AudioInput::from_bytes(bad).unwrap_err();
        assert_eq!(e.code(), "bad_audio", "{e}");
    }
    assert!(AudioInput::from_samples(&[0.0, f32::NAN], 16_000, 1).is_err());
    assert!(AudioInput::from_samples(&[0.1; 1000], 0, 1).is_err());
    let Some(model) = load(false) else { return };
    let mut session = model.session(SessionOptions::default()).unwrap();
    let one = [Message::user("Hi").with_audio(1)];
    let count = reply(
        &mut session,
        request(&one, &[clip("a16k.wav"), clip("a16k.wav")]),
    );
    assert!(matches!(count, Err(Error::Request(_))), "{count:?}");
    // A context too small for the clip's 33 tokens.
    let mut small = model
        .session(SessionOptions {
            context: 24,
            max_batch: 16,
        })
        .unwrap();
    let overflow = reply(&mut small, request(&one, &[clip("a16k.wav")]));
    assert!(matches!(overflow, Err(Error::Forward(_))), "{overflow:?}");
    reply(&mut session, request(&one, &[clip("a16k.wav")])).unwrap();

    // A text-only model refuses audio.
    let text = audio_dir().join("fixtures/gemma4_tiny_audio.gguf");
    let text_only = pollster::block_on(Model::load_file(&text, options().unwrap())).unwrap();
    let mut s = text_only.session(SessionOptions::default()).unwrap();
    let r = reply(&mut s, request(&one, &[clip("a16k.wav")]));
    assert!(matches!(r, Err(Error::NoAudio)), "{r:?}");
    reply(&mut s, request(&[Message::user("Hi")], &[])).unwrap();
}

/// Load progress (what a bar shows) covers the towers: an Ollama blob's inside the model file,
/// and a projector file's, each ending at its total without going back.
#[test]
fn load_progress_counts_the_towers() {
    for blob in [false, true] {
        let Some(mut opts) = options() else { return };
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        opts.on_progress = Some(Box::new(move |p: wgemma::LoadProgress| {
            sink.lock().unwrap().push((p.done, p.total));
        }));
        let model = load_with(blob, opts).unwrap();
        let seen = seen.lock().unwrap().clone();
        let &(done, total) = seen.last().unwrap();
        assert_eq!(done, total, "blob {blob}: progress ends at its total");
        assert!(
            seen.windows(2).all(|w| w[1].0 >= w[0].0 && w[1].1 == total),
            "blob {blob}: progress never goes back: {seen:?}"
        );
        let text = model.gpu_bytes();
        assert!(
            total > text,
            "blob {blob}: {total} bytes counted, the text model's {text}"
        );
    }
}

/// A request's profile with an image and a clip: each tower's forward, then the prefill with
/// their soft tokens in place and one decode step, each timed per kernel; the session is
/// usable afterwards.
#[test]
fn a_profile_of_a_request_times_the_towers_too() {
    let Some(model) = load(false) else { return };
    let mut session = model.session(SessionOptions::default()).unwrap();
    let png =
        std::fs::read(audio_dir().join("../../gemma4-vision/tests/fixtures/exact_480x336.png"))
            .unwrap();
    let mut req = request(
        &[Message::user("Both?").with_images(1).with_audio(1)],
        &[clip("a16k.wav")],
    );
    req.images = vec![wgemma::ImageInput::from_bytes(png).with_budget(70)];
    let Some(steps) = pollster::block_on(session.profile_request(&req)).unwrap() else {
        return; // No timestamp queries on this adapter.
    };
    let whats: Vec<_> = steps.iter().map(|s| s.what).collect();
    assert_eq!(whats, ["vision", "audio", "prefill", "decode"]);
    assert!(steps.iter().all(|s| !s.kernels.is_empty()));
    let soft = steps[0].tokens + steps[1].tokens;
    assert!(
        steps[1].tokens == 33,
        "the clip's soft tokens: {}",
        steps[1].tokens
    );
    assert!(
        steps[2].tokens > soft + 4,
        "the prefill holds the soft tokens and the text"
    );
    let timings = reply(&mut session, req).unwrap();
    assert_eq!(timings.prompt_tokens, steps[2].tokens);
}
