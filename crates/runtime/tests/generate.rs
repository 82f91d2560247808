//! Generation through the public API on tiny random Gemma 3 and Gemma 4 models: a model
//! computing NaN stops with an error on every sampling path (and the session stays usable),
//! sampling settings are checked before anything runs, long prompts report their passes.

use futures::StreamExt;
use wgemma::gguf::Gguf;
use wgemma::{
    Error, Event, GenerateRequest, LoadOptions, Model, Prompt, SamplingParams, StopReason,
};
use wgemma_text::synth::{SynthSpec, synthetic_bytes};

/// The tiny Gemma 3 (or with `gemma4` the tiny Gemma 4, whose per-layer embedding rows are
/// read from the mapped file as each token is fed), with the final norm's weights set to
/// `poison` when given; loaded from a file as the CLI loads it.
fn tiny_model(gemma4: bool, poison: Option<f32>) -> Option<Model> {
    let ctx = wgemma_test_support::gpu()?;
    let dtype = wgemma::gguf::GgmlType::F32;
    let spec = if gemma4 {
        SynthSpec::tiny_gemma4(dtype)
    } else {
        SynthSpec::tiny_gemma3(dtype)
    };
    let mut bytes = synthetic_bytes(&spec).expect("synthetic model");
    if let Some(value) = poison {
        let g = Gguf::parse(&bytes).expect("parses");
        let t = g
            .tensors()
            .iter()
            .find(|t| t.name == "output_norm.weight")
            .expect("a final norm");
        let start = (g.data_offset + t.offset) as usize;
        for w in bytes[start..start + t.n_bytes as usize].chunks_exact_mut(4) {
            w.copy_from_slice(&value.to_le_bytes());
        }
    }
    // Tests run on threads of one process: each file gets a name of its own.
    static FILES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("wgemma-generate-{}-{n}.gguf", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, bytes).expect("a scratch file");
    let opts = LoadOptions {
        context: Some(ctx.clone()),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(&path, opts)).expect("loads");
    std::fs::remove_file(&path).ok();
    Some(model)
}

/// Greedy (argmax), the whole-vocabulary draw (Gumbel argmax) below and above temperature 1
/// (where the noise scales -3.4e38 up) and the top-k draw.
fn strategies() -> [SamplingParams; 4] {
    let draw = |temperature, top_k| SamplingParams {
        temperature,
        top_k,
        seed: 7,
        ..SamplingParams::default()
    };
    [
        SamplingParams::default(),
        draw(0.8, 0),
        draw(1.5, 0),
        draw(0.8, 20),
    ]
}

/// Runs one request to its end: the generated text, or the error it ended with.
fn generate(session: &mut wgemma::Session, sampling: SamplingParams) -> Result<usize, Error> {
    let req = GenerateRequest {
        sampling,
        max_tokens: 6,
        ..GenerateRequest::new(Prompt::Tokens(vec![2, 17, 301, 44, 9]))
    };
    pollster::block_on(async {
        let mut stream = Box::pin(session.generate(req));
        let mut tokens = 0;
        while let Some(event) = stream.next().await {
            if let Event::Token { .. } = event? {
                tokens += 1;
            }
        }
        Ok(tokens)
    })
}

#[test]
fn a_model_computing_nan_stops_with_an_error_on_every_sampling_path() {
    for (gemma4, poison) in [(false, f32::NAN), (false, f32::INFINITY), (true, f32::NAN)] {
        let Some(model) = tiny_model(gemma4, Some(poison)) else {
            return;
        };
        let mut session = model.session(Default::default()).expect("session");
        for (i, sampling) in strategies().into_iter().enumerate() {
            // Twice: the failed request leaves the session able to take the next one.
            for attempt in 0..2 {
                match generate(&mut session, sampling.clone()) {
                    Err(e) => assert_eq!(
                        e.code(),
                        "bad_model",
                        "gemma4 {gemma4}, {poison}, strategy {i}, attempt {attempt}: {e}"
                    ),
                    Ok(n) => panic!("gemma4 {gemma4}, {poison}: strategy {i} generated {n} tokens"),
                }
            }
        }
    }
}

#[test]
fn a_healthy_model_is_not_taken_for_a_broken_one() {
    for gemma4 in [false, true] {
        let Some(model) = tiny_model(gemma4, None) else {
            return;
        };
        let mut session = model.session(Default::default()).expect("session");
        for sampling in strategies() {
            let n = generate(&mut session, sampling).expect("generates");
            assert!(n > 0);
        }
    }
}

#[test]
fn sampling_settings_are_checked_before_anything_runs() {
    let Some(model) = tiny_model(false, None) else {
        return;
    };
    let mut session = model.session(Default::default()).expect("session");
    let base = SamplingParams::default();
    let bad = [
        SamplingParams {
            temperature: f32::NAN,
            ..base.clone()
        },
        SamplingParams {
            temperature: -1.0,
            ..base.clone()
        },
        SamplingParams {
            top_p: 1.5,
            ..base.clone()
        },
        SamplingParams {
            repeat_penalty: -1.0,
            ..base.clone()
        },
        SamplingParams {
            top_k: 65,
            ..base.clone()
        },
    ];
    for sampling in bad {
        let e = generate(&mut session, sampling.clone()).expect_err("refused");
        assert_eq!(e.code(), "bad_request", "{sampling:?}: {e}");
        assert!(session.cached_tokens().is_empty(), "nothing ran");
    }
    assert!(generate(&mut session, SamplingParams::gemma(3)).expect("generates") > 0);
}

#[test]
fn a_long_prompt_reports_its_passes_and_can_be_stopped_between_them() {
    let Some(model) = tiny_model(false, None) else {
        return;
    };
    let opts = wgemma::SessionOptions {
        context: 128,
        max_batch: 8,
    };
    let mut session = model.session(opts).expect("session");
    let prompt: Vec<u32> = (0..30).map(|i| 3 + i * 7).collect();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    session.set_prompt_progress(Some(Box::new(move |done, total| {
        log.lock().unwrap().push((done, total));
    })));
    let req = GenerateRequest {
        max_tokens: 2,
        ..GenerateRequest::new(Prompt::Tokens(prompt.clone()))
    };
    let run = |session: &mut wgemma::Session, req: GenerateRequest| {
        pollster::block_on(async {
            let mut stream = Box::pin(session.generate(req));
            let mut last = None;
            while let Some(event) = stream.next().await {
                if let Event::Done { reason, .. } = event.expect("no error") {
                    last = Some(reason);
                }
            }
            last
        })
    };
    assert_eq!(
        run(&mut session, req.clone()),
        Some(wgemma::StopReason::MaxTokens)
    );
    assert_eq!(*seen.lock().unwrap(), [(8, 30), (16, 30), (24, 30)]);

    // A cancel during the prompt stops it after the pass that is running.
    pollster::block_on(session.reset()).expect("reset");
    let cancel = session.cancel_handle();
    let log = seen.clone();
    seen.lock().unwrap().clear();
    session.set_prompt_progress(Some(Box::new(move |done, total| {
        log.lock().unwrap().push((done, total));
        if done == 16 {
            cancel.cancel();
        }
    })));
    assert_eq!(run(&mut session, req), Some(wgemma::StopReason::Cancelled));
    assert_eq!(*seen.lock().unwrap(), [(8, 30), (16, 30)]);
    assert_eq!(
        session.cached_tokens(),
        &prompt[..16],
        "the cache keeps what was read"
    );
}

/// A generation's text and end, from its events.
fn reply(events: impl IntoIterator<Item = Result<Event, Error>>) -> (String, StopReason) {
    let mut text = String::new();
    for e in events {
        match e.expect("an event") {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Draft { .. } => panic!("a draft from a text model"),
            Event::Done { reason, .. } => return (text, reason),
        }
    }
    panic!("no end: {text:?}");
}

/// The batch tests' sessions: 64 positions, prompts read 16 tokens a pass.
const BATCH_OPTS: wgemma::SessionOptions = wgemma::SessionOptions {
    context: 64,
    max_batch: 16,
};

/// A prompt of `n` ids spread over `model`'s vocabulary, `max_tokens` generated greedily.
fn spread_request(model: &Model, n: u32, max_tokens: usize) -> GenerateRequest {
    let vocab = model.config().n_vocab as u32;
    GenerateRequest {
        max_tokens,
        ..GenerateRequest::new(Prompt::Tokens(
            (0..n).map(|i| (i * 31 + n * 7 + 2) % vocab).collect(),
        ))
    }
}

/// `r`'s reply from a fresh session of `model` with [`BATCH_OPTS`].
fn reply_alone(model: &Model, r: &GenerateRequest) -> (String, StopReason) {
    let mut s = model.session(BATCH_OPTS).expect("a session");
    reply(pollster::block_on(
        s.generate(r.clone()).collect::<Vec<_>>(),
    ))
}

/// Generations that start at different times and share decode steps in a [`wgemma::Batch`]
/// each give what the same request gives alone, ending at a stop string, the context's end or
/// their token limit while the next step is queued; a slot keeps its conversation's cache.
/// Long prompts are read a chunk a step (by default `max_batch` tokens, here also 4) while the
/// others go on decoding.
#[test]
fn batched_generations_match_each_alone() {
    use wgemma::Batch;
    for gemma4 in [false, true] {
        let Some(model) = tiny_model(gemma4, None) else {
            return;
        };
        let request = |n, max_tokens| spread_request(&model, n, max_tokens);
        let opts = BATCH_OPTS;
        let run_alone = |r: &GenerateRequest| reply_alone(&model, r);
        // A stop string from the middle of a reply (so that steps were queued past it), a
        // prompt that fills the context, a request for log-probabilities (steps one at a
        // time while it runs).
        let (text, _) = run_alone(&request(5, 12));
        let middle: String = text
            .chars()
            .skip(text.chars().count() / 2)
            .take(2)
            .collect();
        assert!(
            !middle.is_empty(),
            "gemma4 {gemma4}: a reply to stop in: {text:?}"
        );
        let requests = [
            request(9, 12),
            request(4, 7),
            request(17, 10),
            request(6, 9),
            GenerateRequest {
                stop: vec![middle],
                ..request(5, 12)
            },
            GenerateRequest {
                logprobs: Some(2),
                ..request(7, 6)
            },
            request(50, 30),
            request(8, 20),
        ];
        let alone: Vec<(String, StopReason)> = requests.iter().map(run_alone).collect();
        assert_eq!(alone[4].1, StopReason::StopString, "gemma4 {gemma4}");
        assert_eq!(alone[6].1, StopReason::ContextFull, "gemma4 {gemma4}");
        for chunk in [None, Some(4)] {
            let mut batch = Batch::new(&model, 3, opts).expect("a batch");
            if let Some(c) = chunk {
                batch.set_prefill_chunk(c);
            }
            let what = format!("gemma4 {gemma4}, chunks of {chunk:?}");
            let events = run_batch(&mut batch, &requests, &what);
            for (k, (want, got)) in alone.iter().zip(events).enumerate() {
                let last = got.last().map(|e| matches!(e, Ok(Event::Done { .. })));
                assert_eq!(last, Some(true), "{what}: request {k} ends with its end");
                assert_eq!(&reply(got), want, "{what}: request {k}");
            }
            // Slot 0 ran request 6 last: its cache holds that prompt and reply.
            assert!(batch.cached_tokens(0).len() > 6);
        }
    }
}

/// Runs `requests` in `batch` (request k in slot k % 3 once that slot is free, one every
/// three steps; request 0 runs alone at first; each slot paused every fifth step) and returns
/// each one's events. Checks that steps were queued ahead, and that
/// the generations under way went on while request 2's 17-token prompt was read in chunks.
fn run_batch(
    batch: &mut wgemma::Batch,
    requests: &[GenerateRequest],
    what: &str,
) -> Vec<Vec<Result<Event, Error>>> {
    let mut events: Vec<Vec<Result<Event, Error>>> = requests.iter().map(|_| Vec::new()).collect();
    let mut next = 0;
    let mut owner = [usize::MAX; 3];
    // Events of other requests between request 2's start and its first event.
    let mut while_reading = None;
    // Calls that left a step queued: the steps ran a step ahead of their readback.
    let mut ahead = 0;
    for round in 0..300 {
        if next < requests.len() && (round >= 3 * next) {
            let slot = next % 3;
            if batch.is_idle(slot) {
                owner[slot] = next;
                let started = pollster::block_on(batch.start(slot, requests[next].clone()));
                if next == 2 {
                    while_reading = Some(0);
                }
                for (i, e) in started.expect("starts") {
                    events[owner[i]].push(e);
                }
                next += 1;
            }
        }
        if next == requests.len() && batch.running() == 0 {
            break;
        }
        // Each slot left out of a step now and then, as the server leaves those whose client
        // has not taken the last event (a step queued before still gives them its token).
        for (i, e) in pollster::block_on(batch.step(|i| (round + i) % 5 == 0)) {
            if let Some(n) = &mut while_reading
                && owner[i] != 2
                && events[2].is_empty()
            {
                *n += 1;
            }
            events[owner[i]].push(e);
        }
        ahead += batch.in_flight();
    }
    assert!(ahead >= 5, "{what}: {ahead} steps queued ahead");
    if what.ends_with("Some(4)") {
        assert!(
            while_reading.is_some_and(|n| n >= 3),
            "{what}: {while_reading:?} events of others while the prompt was read"
        );
    }
    events
}

/// A generation whose stop string comes while its next step is queued, and that is paused in
/// the call that reads that step (its client has not taken the stop's event yet), drops that
/// step's token: its reply is what it is alone, and `Done` is its last event.
#[test]
fn a_batched_generation_paused_after_its_stop_gives_nothing_more() {
    use wgemma::Batch;
    let Some(model) = tiny_model(false, None) else {
        return;
    };
    let request = |n, max_tokens| spread_request(&model, n, max_tokens);
    let alone = |r: &GenerateRequest| reply_alone(&model, r);
    // This prompt's reply repeats a two-letter token ("amam..."): the stop string of its
    // second letter then the first is found by the second token, whose event gives no text
    // (the first letter went out with the first token, the second was held back).
    let (text, _) = alone(&request(9, 16));
    let letters: Vec<char> = text.chars().take(2).collect();
    let stop: String = [letters[1], letters[0]].iter().collect();
    let stopping = GenerateRequest {
        stop: vec![stop.clone()],
        ..request(9, 16)
    };
    let want = alone(&stopping);
    assert_eq!(
        want,
        (letters[0].to_string(), StopReason::StopString),
        "{text:?}, stop {stop:?}"
    );
    let mut batch = Batch::new(&model, 2, BATCH_OPTS).expect("a batch");
    let mut events: [Vec<Result<Event, Error>>; 2] = [Vec::new(), Vec::new()];
    for (slot, r) in [(0, request(6, 24)), (1, stopping)] {
        for (i, e) in pollster::block_on(batch.start(slot, r)).expect("starts") {
            events[i].push(e);
        }
    }
    // Slot 1 is left out once: in the call after the event of its stop.
    let mut left_out = false;
    for _ in 0..100 {
        if batch.running() == 0 {
            break;
        }
        let stopped = events[1]
            .iter()
            .skip(1)
            .any(|e| matches!(e, Ok(Event::Token { text, .. }) if text.is_empty()));
        let pause = stopped && !left_out;
        left_out |= pause;
        for (i, e) in pollster::block_on(batch.step(|i| i == 1 && pause)) {
            events[i].push(e);
        }
    }
    assert!(left_out, "the stop's event came: {:?}", events[1]);
    let [_, got] = events;
    let last = got.last().map(|e| matches!(e, Ok(Event::Done { .. })));
    assert_eq!(last, Some(true), "Done last: {got:?}");
    assert_eq!(reply(got), want);
}

/// A request cancelled while its prompt is read in chunks ends as cancelled at the next step,
/// and its slot then serves the next request as a fresh session would.
#[test]
fn a_batched_prompt_cancelled_while_read_ends_and_frees_its_slot() {
    use wgemma::{Batch, SessionOptions};
    let Some(model) = tiny_model(false, None) else {
        return;
    };
    let vocab = model.config().n_vocab as u32;
    let request = |n: u32| GenerateRequest {
        max_tokens: 6,
        ..GenerateRequest::new(Prompt::Tokens(
            (0..n).map(|i| (i * 17 + 5) % vocab).collect(),
        ))
    };
    let opts = SessionOptions {
        context: 64,
        max_batch: 16,
    };
    let mut batch = Batch::new(&model, 2, opts).expect("a batch");
    batch.set_prefill_chunk(4);
    let started = pollster::block_on(batch.start(0, request(20))).expect("starts");
    assert!(started.is_empty(), "no event before the prompt is read");
    assert_eq!(batch.reading_prompts(), 1);
    pollster::block_on(batch.step(|_| false));
    batch.cancel_handle(0).expect("slot 0").cancel();
    let events = pollster::block_on(batch.step(|_| false));
    assert!(
        matches!(
            events.as_slice(),
            [(
                0,
                Ok(Event::Done {
                    reason: StopReason::Cancelled,
                    ..
                })
            )]
        ),
        "{events:?}"
    );
    assert!(batch.is_idle(0) && batch.running() == 0);
    let mut alone = model.session(opts).expect("a session");
    let want = reply(pollster::block_on(
        alone.generate(request(11)).collect::<Vec<_>>(),
    ));
    let mut got = pollster::block_on(batch.start(0, request(11))).expect("starts");
    while batch.running() > 0 {
        got.extend(pollster::block_on(batch.step(|_| false)));
    }
    assert_eq!(reply(got.into_iter().map(|(_, e)| e)), want);
}

/// A request whose prompt starts like what another slot's cache holds takes that prefix
/// from it (a prefix cache across the slots): it reads only the rest, its timings count the
/// prefix as cached, and it replies as the same request alone does.
#[test]
fn a_batched_request_takes_a_prefix_another_slot_holds() {
    use wgemma::{Batch, SessionOptions};
    let Some(model) = tiny_model(true, None) else {
        return;
    };
    let vocab = model.config().n_vocab as u32;
    let system: Vec<u32> = (0..30).map(|i| (i * 13 + 3) % vocab).collect();
    let request = |tail: u32| {
        let mut tokens = system.clone();
        tokens.extend((0..6).map(|i| (i * 7 + tail) % vocab));
        GenerateRequest {
            max_tokens: 5,
            ..GenerateRequest::new(Prompt::Tokens(tokens))
        }
    };
    let opts = SessionOptions {
        context: 64,
        max_batch: 16,
    };
    let mut alone = model.session(opts).expect("a session");
    let want = reply(pollster::block_on(
        alone.generate(request(40)).collect::<Vec<_>>(),
    ));
    let mut batch = Batch::new(&model, 2, opts).expect("a batch");
    let finish = |batch: &mut Batch, slot: usize, req: GenerateRequest| {
        let mut got = pollster::block_on(batch.start(slot, req)).expect("starts");
        while batch.running() > 0 {
            got.extend(pollster::block_on(batch.step(|_| false)));
        }
        got.into_iter().map(|(_, e)| e).collect::<Vec<_>>()
    };
    finish(&mut batch, 0, request(20));
    let events = finish(&mut batch, 1, request(40));
    let cached = events.iter().find_map(|e| match e {
        Ok(Event::Done { timings, .. }) => Some(timings.cached_tokens),
        _ => None,
    });
    assert_eq!(
        cached,
        Some(system.len()),
        "the shared prefix came from slot 0"
    );
    assert_eq!(reply(events), want);
    // Slot 0 still holds its own conversation.
    assert_eq!(batch.cached_tokens(0)[..system.len()], system[..]);
}
