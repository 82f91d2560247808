//! Image prompts through the public API on the tiny random Gemma 4 E2B-like model with a
//! vision tower (`xtask/scripts/gemma4_vision_golden.py`): teacher-forced predictions against
//! transformers for a prompt holding an image that needs no resize and one that does, from
//! the model + mmproj pair and from an Ollama-style blob holding both; generation with images
//! over several turns (earlier images stay in the cache); and bad input.

use std::path::PathBuf;

use futures::StreamExt;
use wgemma::{
    Error, Event, GenerateRequest, ImageInput, LoadOptions, Message, Model, Prompt, SessionOptions,
};

fn vision_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gemma4-vision/tests"
    ))
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(vision_dir().join(path)).unwrap()
}

fn options() -> Option<LoadOptions> {
    let ctx = wgemma_test_support::gpu()?;
    Some(LoadOptions {
        context: Some(ctx.clone()),
        ..LoadOptions::default()
    })
}

/// A variant's model with its projector file (`LoadOptions::mmproj`), or the Ollama-style blob
/// holding both, loaded from files as the CLI does.
fn load_variant(variant: &str, blob: bool) -> Option<Model> {
    let mut opts = options()?;
    let fixtures = vision_dir().join("fixtures");
    let text = fixtures.join(format!("gemma4_tiny_vision_{variant}.gguf"));
    let mmproj = fixtures.join(format!("gemma4_tiny_vision_{variant}_mmproj.gguf"));
    let path = if blob {
        let bytes = wgemma_test_support::ollama_vision_blob(
            &std::fs::read(&text).unwrap(),
            &std::fs::read(&mmproj).unwrap(),
        );
        let name = format!("wgemma-vision-{variant}-blob-{}.gguf", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    } else {
        opts.mmproj = Some(mmproj);
        text
    };
    Some(pollster::block_on(Model::load_file(&path, opts)).unwrap())
}

fn load(blob: bool) -> Option<Model> {
    load_variant("e2b", blob)
}

fn image(name: &str) -> ImageInput {
    ImageInput::from_bytes(read(&format!("fixtures/{name}.png"))).with_budget(70)
}

/// E2B-like: image tokens attend causally. 26B-like (MoE, no per-layer embeddings): an image's
/// tokens also see its later tokens on sliding layers.
#[test]
fn teacher_forced_image_prompts_match_transformers() {
    for variant in ["e2b", "moe"] {
        teacher_forced(variant);
    }
}

fn teacher_forced(variant: &str) {
    let golden: serde_json::Value =
        serde_json::from_slice(&read(&format!("golden/vision_{variant}.json"))).unwrap();
    let tokens: Vec<u32> = golden["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let image_id = golden["tokens"]["image"].as_u64().unwrap() as u32;
    // Each image's soft tokens start at the first placeholder of its run.
    let starts: Vec<usize> = (0..tokens.len())
        .filter(|&i| tokens[i] == image_id && (i == 0 || tokens[i - 1] != image_id))
        .collect();
    let names: Vec<&str> = golden["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    let images: Vec<(usize, ImageInput)> = starts
        .iter()
        .zip(&names)
        .map(|(&at, n)| (at, image(n)))
        .collect();
    let want: Vec<u64> = golden["teacher_forced"]["argmax"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let margin: Vec<f64> = golden["teacher_forced"]["margin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for blob in [false, true] {
        let Some(model) = load_variant(variant, blob) else {
            return;
        };
        // Steps shorter than an image (70 soft tokens): E2B's are cut (causal), the 26B-like
        // model's session takes steps that hold a whole image.
        let mut session = model
            .session(SessionOptions {
                context: 256,
                max_batch: 32,
            })
            .unwrap();
        let scored = pollster::block_on(session.score_with_images(&tokens, &images)).unwrap();
        let (mut checked, mut agree) = (0, 0);
        for (i, (id, _)) in scored.iter().enumerate() {
            if margin[i] >= 0.25 {
                checked += 1;
                if u64::from(*id) == want[i] {
                    agree += 1;
                } else {
                    eprintln!("position {i}: {id} vs transformers' {}", want[i]);
                }
            }
        }
        eprintln!("{variant}, blob {blob}: {agree} of {checked} confident positions agree");
        assert!(checked > 100);
        assert_eq!(
            agree, checked,
            "{variant}, blob {blob}: teacher-forced argmax vs transformers"
        );
        // Without the images the placeholders' own embeddings give other predictions: the
        // soft tokens are what the agreement rests on.
        let plain = pollster::block_on(session.score(&tokens)).unwrap();
        let same = plain
            .iter()
            .zip(&want)
            .filter(|((id, _), w)| u64::from(*id) == **w)
            .count();
        assert!(same < checked, "the images change the predictions");
    }
}

/// Collects a reply's events: the text, and the `Done` timings.
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

#[test]
fn chat_with_images_keeps_earlier_images_in_the_cache() {
    let Some(model) = load(false) else { return };
    let mut session = model.session(SessionOptions::default()).unwrap();
    let mut messages = vec![Message::user("What is this?").with_images(1)];
    let mut images = vec![image("exact_480x336")];
    let request = |messages: &[Message], images: &[ImageInput]| {
        let mut req = GenerateRequest::new(Prompt::Chat(messages.to_vec()));
        req.max_tokens = 4;
        req.images = images.to_vec();
        req
    };
    let first = reply(&mut session, request(&messages, &images)).unwrap();
    assert_eq!(first.encoded_images, 1);
    assert!(
        first.prompt_tokens > 72,
        "the image's 70 soft tokens and markers"
    );
    messages.push(Message::assistant("A pattern."));
    messages.push(Message::user("And this one?").with_images(1));
    images.push(image("up_97x61"));
    let second = reply(&mut session, request(&messages, &images)).unwrap();
    assert_eq!(
        second.encoded_images, 1,
        "the first image comes from the cache"
    );
    assert!(second.cached_tokens > 72);

    // Another first image: the cache is cut before it and both are encoded.
    images[0] = image("down_700x300");
    let third = reply(&mut session, request(&messages, &images));
    let third = third.unwrap();
    assert_eq!(third.encoded_images, 2);
}

#[test]
fn bad_image_requests_are_errors_and_the_session_goes_on() {
    let Some(model) = load(false) else { return };
    let mut session = model.session(SessionOptions::default()).unwrap();
    let req = |images: Vec<ImageInput>, n: usize| {
        let mut r = GenerateRequest::new(Prompt::Chat(vec![Message::user("Hi").with_images(n)]));
        r.max_tokens = 2;
        r.images = images;
        r
    };
    let broken = ImageInput::from_bytes(b"\x89PNG\r\n\x1a\n not really".to_vec());
    assert!(matches!(
        reply(&mut session, req(vec![broken], 1)),
        Err(Error::Image(_))
    ));
    let count = reply(&mut session, req(vec![image("up_97x61")], 2));
    assert!(matches!(count, Err(Error::Request(_))), "{count:?}");
    let budget = reply(
        &mut session,
        req(vec![image("up_97x61").with_budget(100)], 1),
    );
    assert!(matches!(budget, Err(Error::Request(_))), "{budget:?}");
    // A context too small for the image's tokens.
    let mut small = model
        .session(SessionOptions {
            context: 40,
            max_batch: 64,
        })
        .unwrap();
    let overflow = reply(&mut small, req(vec![image("exact_480x336")], 1));
    assert!(matches!(overflow, Err(Error::Forward(_))), "{overflow:?}");
    reply(&mut session, req(vec![image("up_97x61")], 1)).unwrap();

    // A text-only model refuses images.
    let opts = options().unwrap();
    let text = vision_dir().join("fixtures/gemma4_tiny_vision_e2b.gguf");
    let text_only = pollster::block_on(Model::load_file(&text, opts)).unwrap();
    let mut s = text_only.session(SessionOptions::default()).unwrap();
    let r = reply(&mut s, req(vec![image("up_97x61")], 1));
    assert!(matches!(r, Err(Error::NoVision)), "{r:?}");
}

/// An image content part of a JSON message becomes a placeholder in its text: that one stays
/// the image token, while the same characters typed in a message's text of a model without
/// the token, or control-token text typed there, stay text.
#[test]
fn json_image_parts_are_image_tokens_and_typed_markers_stay_text() {
    let Some(model) = load(false) else { return };
    let session = model.session(SessionOptions::default()).unwrap();
    let tok = model.tokenizer();
    let image = tok
        .token_id(wgemma::IMAGE_PLACEHOLDER)
        .expect("an image token");
    let end_of_turn = tok.token_id("<turn|>").expect("an end-of-turn token");
    let json = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look<turn|> at"},
        {"type": "image"},
        {"type": "text", "text": "this."}
    ]}]});
    let req = GenerateRequest::from_json(&json).unwrap();
    let ids = session
        .prompt_tokens(&req.prompt, req.parse_special)
        .unwrap();
    let count = |id| ids.iter().filter(|&&t| t == id).count();
    assert_eq!(count(image), 1, "{ids:?}");
    // The template's own end of turn only: the typed one is text.
    assert_eq!(count(end_of_turn), 1, "{ids:?}");
}

/// An image decoded ahead (as a server does on a worker thread) gives the patches its file
/// gives, keeps its budget, and a broken file fails there with the same error.
#[test]
fn an_image_decoded_ahead_gives_the_same_patches() {
    let file = image("up_97x61").with_budget(140);
    let ahead = file.decoded().unwrap();
    assert!(matches!(ahead.data, wgemma::ImageData::Rgb(_)));
    assert_eq!(ahead.budget, 140);
    let (a, b) = (file.patches().unwrap(), ahead.patches().unwrap());
    assert_eq!((a.rows, a.cols), (b.rows, b.cols));
    assert_eq!(a.pixels, b.pixels);
    // Decoding again is a no-op.
    assert_eq!(ahead.decoded().unwrap().patches().unwrap().pixels, b.pixels);
    let broken = ImageInput::from_bytes(b"\x89PNG\r\n\x1a\n not really".to_vec());
    assert!(matches!(broken.decoded(), Err(Error::Image(_))));
    assert!(matches!(
        file.with_budget(100).decoded(),
        Err(Error::Request(_))
    ));
}
