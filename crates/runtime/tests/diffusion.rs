//! DiffusionGemma through the public API on the diffusion crate's tiny random model: the
//! stream's events in order (a draft per step, each finished block's tokens, the end with
//! block and step counts), the same reply for the same seed, a cancel ending it, each kind
//! of model refused by the other's loader, and images in the prompt (the tiny model with the
//! vision fixtures' tower).

use futures::StreamExt;
use wgemma::{
    DiffusionGenerate, DiffusionModel, EntropyBound, Error, Event, IMAGE_PLACEHOLDER, ImageInput,
    LoadOptions, Model, Prompt, StopReason,
};

use wgemma_test_support::dg_vision;

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../diffusion/tests/fixtures/dg_tiny.gguf"
);

fn opts() -> Option<LoadOptions> {
    Some(LoadOptions {
        context: Some(wgemma_test_support::gpu()?.clone()),
        ..LoadOptions::default()
    })
}

fn model() -> Option<DiffusionModel> {
    Some(pollster::block_on(DiffusionModel::load_file(PATH, opts()?)).expect("loads"))
}

fn request(seed: u64) -> DiffusionGenerate {
    DiffusionGenerate {
        max_tokens: 24,
        sampler: Some(EntropyBound {
            max_steps: 5,
            ..EntropyBound::default()
        }),
        ..DiffusionGenerate::new(Prompt::Tokens(vec![2, 40, 41, 42]), seed)
    }
}

fn events(chat: &mut wgemma::DiffusionChat, req: DiffusionGenerate) -> Vec<Event> {
    let stream = chat.generate(req);
    pollster::block_on(stream.map(|e| e.expect("no error")).collect())
}

#[test]
fn a_reply_streams_drafts_then_blocks() {
    let Some(model) = model() else { return };
    let mut chat = model.session(128, None).unwrap();
    let got = events(&mut chat, request(11));
    // Two blocks of 16 (24 tokens asked): each 5 steps (no stop under the default
    // confidence on a random model), 5 drafts then its tokens.
    let kinds: String = got
        .iter()
        .map(|e| match e {
            Event::Draft { .. } => 'd',
            Event::Token { .. } => 't',
            Event::Done { .. } => '.',
        })
        .collect();
    assert_eq!(
        kinds,
        format!("ddddd{}ddddd{}.", "t".repeat(16), "t".repeat(8))
    );
    let Some(Event::Done { reason, timings }) = got.last() else {
        panic!("no end")
    };
    assert_eq!(*reason, StopReason::MaxTokens);
    assert_eq!((timings.blocks, timings.denoising_steps), (2, 10));
    assert_eq!((timings.prompt_tokens, timings.generated_tokens), (4, 24));
    assert!(timings.decode_ms > 0.0 && timings.ms_per_step() > 0.0);
    // The block's text is its last draft.
    let last_draft = got[4].clone();
    let first_block: String = got[5..21]
        .iter()
        .map(|e| match e {
            Event::Token { text, .. } => text.clone(),
            _ => String::new(),
        })
        .collect();
    assert!(matches!(last_draft, Event::Draft { block: 0, step: 4, text } if text == first_block));
    // Same seed, same reply (the session starts afresh); another seed, another.
    let again = events(&mut chat, request(11));
    assert_eq!(ids_and_drafts(&again), ids_and_drafts(&got));
    assert_ne!(
        ids_and_drafts(&events(&mut chat, request(12))),
        ids_and_drafts(&got)
    );
}

/// The tokens and drafts of a reply (not its timings).
fn ids_and_drafts(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, .. } => Some(id.to_string()),
            Event::Draft { text, .. } => Some(text.clone()),
            Event::Done { .. } => None,
        })
        .collect()
}

#[test]
fn a_cancel_ends_the_reply_and_the_session_goes_on() {
    let Some(model) = model() else { return };
    let mut chat = model.session(128, None).unwrap();
    let cancel = chat.cancel_handle();
    let mut stream = Box::pin(chat.generate(request(3)));
    let first = pollster::block_on(stream.next()).unwrap().unwrap();
    assert!(matches!(first, Event::Draft { step: 0, .. }));
    cancel.cancel();
    let rest: Vec<Event> = pollster::block_on(stream.map(|e| e.unwrap()).collect());
    assert!(
        matches!(
            rest.as_slice(),
            [Event::Done {
                reason: StopReason::Cancelled,
                ..
            }]
        ),
        "{rest:?}"
    );
    drop(rest);
    let next = events(&mut chat, request(3));
    assert!(matches!(
        next.last(),
        Some(Event::Done {
            reason: StopReason::MaxTokens,
            ..
        })
    ));
}

#[test]
fn bad_requests_are_errors() {
    let Some(model) = model() else { return };
    assert!(model.session(100_000, None).is_err());
    assert!(model.session(64, Some(0)).is_err());
    let mut chat = model.session(40, None).unwrap();
    let too_long = DiffusionGenerate {
        max_tokens: 64,
        ..request(1)
    };
    let got: Vec<Result<Event, Error>> = pollster::block_on(chat.generate(too_long).collect());
    assert!(
        matches!(got.as_slice(), [Err(e)] if e.code() == "context_overflow"),
        "{got:?}"
    );
    let empty = DiffusionGenerate::new(Prompt::Tokens(Vec::new()), 1);
    let got: Vec<Result<Event, Error>> = pollster::block_on(chat.generate(empty).collect());
    assert!(
        matches!(got.as_slice(), [Err(Error::EmptyPrompt)]),
        "{got:?}"
    );
}

/// Each loader names the other when given the other's model.
#[test]
fn each_kind_of_model_is_refused_by_the_other_loader() {
    let Some(opts) = opts() else { return };
    let r = pollster::block_on(Model::load_file(PATH, opts));
    assert!(matches!(r, Err(Error::DiffusionModel)), "{:?}", r.err());
    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gemma4-text/tests/fixtures/gemma4_tiny_moe.gguf"
    );
    let r = pollster::block_on(DiffusionModel::load_file(text, self::opts().unwrap()));
    assert!(matches!(r, Err(Error::DiffusionConfig(_))), "{:?}", r.err());
}

fn image(budget: u32) -> ImageInput {
    ImageInput::from_bytes(std::fs::read(dg_vision::IMAGE).unwrap()).with_budget(budget)
}

/// A request whose text opens with an image (70 soft tokens at budget 70) and its reply.
fn image_reply(chat: &mut wgemma::DiffusionChat, images: Vec<ImageInput>) -> Vec<Event> {
    let placeholders = IMAGE_PLACEHOLDER.repeat(images.len());
    let req = DiffusionGenerate {
        images,
        ..DiffusionGenerate::new(Prompt::Text(placeholders + "Describe it"), 5)
    };
    events(
        chat,
        DiffusionGenerate {
            max_tokens: 16,
            sampler: request(5).sampler,
            ..req
        },
    )
}

/// An image in the prompt: the projector's tower encodes it, its marker block (70 soft tokens
/// and the two markers) joins the prompt, the timings count it, the reply is the same for the
/// same request and differs from the reply to the text alone. Bad image requests are typed
/// errors and the session goes on.
#[test]
fn an_image_in_the_prompt_is_encoded_and_read() {
    let Some(opts) = opts() else { return };
    let opts = LoadOptions {
        mmproj: Some(dg_vision::MMPROJ.into()),
        ..opts
    };
    let dg = pollster::block_on(DiffusionModel::load_file(dg_vision::MODEL, opts)).unwrap();
    assert!(dg.vision().is_some());
    let mut chat = dg.session(256, None).unwrap();
    let text_only = image_reply(&mut chat, Vec::new());
    let got = image_reply(&mut chat, vec![image(70)]);
    let Some(Event::Done { timings, .. }) = got.last() else {
        panic!("no end: {got:?}")
    };
    let Some(Event::Done { timings: t0, .. }) = text_only.last() else {
        panic!("no end")
    };
    assert_eq!(timings.encoded_images, 1);
    assert!(timings.encode_ms > 0.0);
    assert_eq!(timings.prompt_tokens, t0.prompt_tokens + 72);
    assert_eq!(
        ids_and_drafts(&image_reply(&mut chat, vec![image(70)])),
        ids_and_drafts(&got)
    );
    assert_ne!(ids_and_drafts(&got), ids_and_drafts(&text_only));

    // More image tokens than the context holds; a placeholder without its image; an image
    // that is not one.
    let mut small = dg.session(200, None).unwrap();
    let bad: [(Vec<ImageInput>, &str); 3] = [
        (vec![image(280)], "context_overflow"),
        (vec![image(70), image(70)], "bad_request"),
        (
            vec![ImageInput::from_bytes(b"not an image".to_vec())],
            "bad_image",
        ),
    ];
    for (images, code) in bad {
        let n = images.len().min(1);
        let req = DiffusionGenerate {
            images,
            ..DiffusionGenerate::new(Prompt::Text(IMAGE_PLACEHOLDER.repeat(n) + "Hi"), 1)
        };
        let got: Vec<Result<Event, Error>> = pollster::block_on(small.generate(req).collect());
        assert!(
            matches!(got.as_slice(), [Err(e)] if e.code() == code),
            "{code}: {got:?}"
        );
    }
    assert_eq!(
        ids_and_drafts(&image_reply(&mut small, vec![image(70)])),
        ids_and_drafts(&got),
        "the session goes on"
    );

    // A model without a vision tower.
    let Some(plain) = model() else { return };
    let mut chat = plain.session(128, None).unwrap();
    let req = DiffusionGenerate {
        images: vec![image(70)],
        ..request(1)
    };
    let got: Vec<Result<Event, Error>> = pollster::block_on(chat.generate(req).collect());
    assert!(matches!(got.as_slice(), [Err(Error::NoVision)]), "{got:?}");
}
