//! The entropy-bound sampler and the block loop against transformers' own `generate`, with the
//! randomness replaced by the same given streams on both sides
//! (`xtask/scripts/diffusion_gemma_fixtures.py` recorded `golden/dg_tiny_replay.json`): every
//! step's argmax canvas, accepted positions, next canvas, mean entropy and stop, and the
//! generated tokens.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;

use serde_json::Value;
use wgemma_diffusion::{
    DiffusionConfig, DiffusionEvent, DiffusionRequest, DiffusionSession, EntropyBound, Finish,
    GpuDiffusion, ReplayRng, StepOutcome, generate,
};
use wgemma_gguf::{BytesSource, Gguf};
use wgemma_text::LoadOptions;

mod common;

use common::{GGUF, REPLAY, floats as f32s, ids as u32s};

fn model() -> Option<Arc<GpuDiffusion>> {
    let ctx = wgemma_test_support::gpu()?.clone();
    let g = Gguf::parse(GGUF).unwrap();
    let cfg = DiffusionConfig::from_gguf(&g).unwrap();
    let src = BytesSource::new(GGUF.to_vec());
    let load = GpuDiffusion::load(ctx, &g, &cfg, &src, LoadOptions::default(), |_| {});
    Some(Arc::new(pollster::block_on(load).unwrap()))
}

fn rows<T>(v: &Value, f: impl Fn(&Value) -> T) -> VecDeque<T> {
    v.as_array().unwrap().iter().map(f).collect()
}

/// A recorded run's streams and request (no stop tokens: transformers ran without any).
fn replay_of(run: &Value) -> (ReplayRng, DiffusionRequest) {
    let rng = ReplayRng {
        canvases: rows(&run["canvases"], u32s),
        uniforms: rows(&run["uniforms"], f32s),
        renoise: rows(&run["renoise"], u32s),
    };
    let num = |k: &str| run[k].as_f64().unwrap() as f32;
    let req = DiffusionRequest {
        max_new_tokens: run["generated"].as_array().unwrap().len(),
        sampler: EntropyBound {
            max_steps: run["steps"].as_u64().unwrap() as u32,
            t_min: num("t_min"),
            t_max: num("t_max"),
            entropy_bound: num("entropy_bound"),
            stability_threshold: run["stability_threshold"].as_u64().unwrap() as u32,
            confidence_threshold: num("confidence_threshold"),
        },
        stop_tokens: Vec::new(),
    };
    (rng, req)
}

#[test]
fn replayed_runs_match_transformers_step_by_step() {
    let Some(model) = model() else { return };
    let golden: Value = serde_json::from_str(REPLAY).unwrap();
    for (name, run) in golden["runs"].as_object().unwrap() {
        let (mut rng, req) = replay_of(run);
        let mut steps: Vec<(usize, StepOutcome)> = Vec::new();
        let mut on_event = |e: &DiffusionEvent| {
            if let DiffusionEvent::Step { block, outcome, .. } = e {
                steps.push((*block, outcome.clone()));
            }
            ControlFlow::Continue(())
        };
        let mut s = DiffusionSession::new(model.clone(), 128).unwrap();
        let prompt = u32s(&run["prompt"]);
        let out =
            pollster::block_on(generate(&mut s, &prompt, &req, &mut rng, &mut on_event)).unwrap();
        let records = run["records"].as_array().unwrap();
        assert_eq!(steps.len(), records.len(), "{name}: steps");
        for (i, ((block, got), want)) in steps.iter().zip(records).enumerate() {
            let at = format!("{name}, step {i}");
            assert_eq!(
                *block as u64,
                want["block"].as_u64().unwrap(),
                "{at}: block"
            );
            assert_eq!(got.argmax, u32s(&want["argmax"]), "{at}: argmax");
            let accepted: Vec<u32> = got.accepted.iter().map(|&a| u32::from(a)).collect();
            assert_eq!(accepted, u32s(&want["accepted"]), "{at}: accepted");
            assert_eq!(got.next, u32s(&want["next_canvas"]), "{at}: next canvas");
            let mean = want["mean_entropy"].as_f64().unwrap() as f32;
            assert!(
                (got.mean_entropy - mean).abs() < 1e-3,
                "{at}: mean entropy {} vs {mean}",
                got.mean_entropy
            );
            assert_eq!(got.done, want["done"].as_bool().unwrap(), "{at}: done");
        }
        assert_eq!(out.tokens, u32s(&run["generated"]), "{name}: generated");
        assert_eq!(out.finish, Finish::Length);
        assert!(
            rng.uniforms.is_empty() && rng.renoise.is_empty(),
            "{name}: streams left"
        );
    }
}

/// A stop token in the first block ends the generation there: the block is cut before it (as
/// transformers pads everything from it on) and no second block runs.
#[test]
fn a_stop_token_ends_the_block_loop() {
    let Some(model) = model() else { return };
    let golden: Value = serde_json::from_str(REPLAY).unwrap();
    let run = &golden["runs"]["two_blocks"];
    let (mut rng, mut req) = replay_of(run);
    let generated = u32s(&run["generated"]);
    let first_block_steps = run["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["block"] == 0)
        .count() as u32;
    let stop = generated[5];
    let at = generated.iter().position(|&t| t == stop).unwrap();
    req.stop_tokens = vec![stop];
    let mut blocks = Vec::new();
    let mut on_event = |e: &DiffusionEvent| {
        if let DiffusionEvent::Block { tokens, .. } = e {
            blocks.push(tokens.clone());
        }
        ControlFlow::Continue(())
    };
    let mut s = DiffusionSession::new(model, 128).unwrap();
    let prompt = u32s(&run["prompt"]);
    let out = pollster::block_on(generate(&mut s, &prompt, &req, &mut rng, &mut on_event)).unwrap();
    assert_eq!(out.tokens, generated[..at]);
    assert_eq!(
        (out.finish, out.blocks, out.steps),
        (Finish::Stop, 1, first_block_steps)
    );
    assert_eq!(blocks, [generated[..at].to_vec()]);
    assert_eq!(
        s.position(),
        prompt.len(),
        "the finished block is not read into the cache"
    );
}

/// A request whose blocks do not fit the session is refused before anything runs.
#[test]
fn a_request_past_the_context_is_refused() {
    let Some(model) = model() else { return };
    let golden: Value = serde_json::from_str(REPLAY).unwrap();
    let (mut rng, mut req) = replay_of(&golden["runs"]["one_block"]);
    let mut s = DiffusionSession::new(model, 40).unwrap();
    req.max_new_tokens = 40;
    let r = pollster::block_on(generate(&mut s, &[2, 3, 4], &req, &mut rng, &mut |_| {
        ControlFlow::Continue(())
    }));
    assert!(
        matches!(
            r,
            Err(wgemma_diffusion::DiffusionError::ContextOverflow {
                need: 51,
                capacity: 40
            })
        ),
        "{r:?}"
    );
    assert_eq!(s.position(), 0);
}
