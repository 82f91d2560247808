//! The GPU forward against the f32 CPU reference: tiny synthetic models of several dtypes
//! (prefill, chunked prefill past the sliding window, decode, teacher-forced scoring,
//! sampling), then the real Gemma 3 270M when it is present.

mod common;

use std::sync::Arc;

use common::{
    ctx, generate_pipelined, gpu_model, gpu_model_fetching_rows, gpu_model_table_on_gpu, load,
    rel_err, scoring_session,
};
use wgemma_gguf::{GgmlType, Gguf, MmapSource, TensorSource};
use wgemma_kernels::{ContextOptions, GpuContext};
use wgemma_text::sampling::sample_cpu;
use wgemma_text::synth::{DtypeMix, SynthMoe, SynthSpec, synthetic_bytes};
use wgemma_text::{CpuModel, ForwardError, GpuSession, SamplingParams, SessionOptions, TextConfig};

fn prompt(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab).collect()
}

#[test]
fn tiny_models_match_the_cpu_reference_through_prefill_and_decode() {
    let Some(ctx) = ctx() else { return };
    // Tolerances: f32 weights agree to float rounding; quantized weights are the same
    // dequantized values on both sides, so they agree equally well. Where a decode step rounds
    // the FFN's activations to 8-bit integers (K-quant down products), it agrees less
    // closely and keeps every argmax; those models also run with f32 activations, held to
    // the tight tolerance.
    let f32_activations = Arc::new(
        pollster::block_on(GpuContext::new(ContextOptions {
            allow_int8_activations: false,
            adapter_name: Some(ctx.info.name.clone()),
            ..ContextOptions::default().with_env()
        }))
        .unwrap(),
    );
    let mut specs: Vec<SynthSpec> = [
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5_0,
        GgmlType::Q6K,
    ]
    .into_iter()
    .map(|dtype| {
        let mut spec = SynthSpec::tiny_gemma3(dtype);
        spec.final_softcap = (dtype == GgmlType::Q4K).then_some(15.0);
        spec
    })
    .collect();
    // Gemma 4: per-layer embeddings (a quantized table whose rows are staged per step) with
    // shared KV; and experts beside the dense feed-forward, with V taken from K.
    specs.push(SynthSpec::tiny_gemma4(GgmlType::Q8_0));
    // 16 query heads (over 2 KV heads): a decode step merges their attention in a dispatch
    // of its own, not in front of the output product.
    let mut moe = SynthSpec::tiny_gemma4(GgmlType::Q5_0);
    (moe.n_head, moe.n_kv_head) = (16, 2);
    if let Some(g) = moe.gemma4.as_mut() {
        g.n_kv_head_global = 2;
        (g.n_ple, g.shared_kv_layers, g.k_eq_v) = (0, 0, true);
        g.moe = Some(SynthMoe {
            n_expert: 5,
            n_used: 2,
            n_ff: 64,
        });
    }
    specs.push(moe);
    let runs = specs.into_iter().flat_map(|spec| {
        let k_quant = matches!(spec.mix, DtypeMix::Uniform(GgmlType::Q4K | GgmlType::Q6K));
        let rounds = k_quant && ctx.features.int8_activations;
        let contexts = if rounds {
            vec![(ctx.clone(), true), (f32_activations.clone(), false)]
        } else {
            vec![(ctx.clone(), false)]
        };
        contexts.into_iter().map(move |c| (spec.clone(), c))
    });
    for (spec, (ctx, rounds)) in runs {
        let dtype = format!("{} {:?} rounding activations {rounds}", spec.arch, spec.mix);
        let decode_tol = if rounds { 1e-2 } else { 2e-4 };
        let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
        let tokens = prompt(11, spec.n_vocab as u32);
        let mut cpu_state = m.cpu.new_state();
        let want = m.cpu.forward(&mut cpu_state, &tokens).unwrap();
        for max_batch in [64, 4] {
            let mut s = GpuSession::new(
                m.gpu.clone(),
                SessionOptions {
                    context: 64,
                    max_batch,
                },
            )
            .unwrap();
            pollster::block_on(s.feed(&tokens)).unwrap();
            let got = pollster::block_on(s.logits()).unwrap();
            let e = rel_err(&got, want.last().unwrap());
            assert!(
                e < 2e-4,
                "{dtype} prefill (batch {max_batch}): relative error {e}"
            );
            // Decode: one token at a time, each step against the reference.
            let mut cpu_state2 = m.cpu.new_state();
            m.cpu.forward(&mut cpu_state2, &tokens).unwrap();
            for t in [5u32, 300, 17] {
                pollster::block_on(s.feed(&[t])).unwrap();
                let got = pollster::block_on(s.logits()).unwrap();
                let want = m.cpu.forward(&mut cpu_state2, &[t]).unwrap().pop().unwrap();
                let e = rel_err(&got, &want);
                assert!(
                    e < decode_tol,
                    "{dtype} decode after {}: relative error {e}",
                    s.position()
                );
                assert_eq!(
                    wgemma_kernels::cpu::argmax(&got).0,
                    wgemma_kernels::cpu::argmax(&want).0,
                    "{dtype} decode argmax after {}",
                    s.position()
                );
            }
        }
        // Teacher forcing returns the reference's argmax at every position.
        let mut s = scoring_session(&m.gpu);
        let scored = pollster::block_on(s.score(&tokens)).unwrap();
        for (i, (id, logit)) in scored.iter().enumerate() {
            let (want_id, want_logit) = wgemma_kernels::cpu::argmax(&want[i]);
            assert_eq!(*id, want_id, "{dtype} score position {i}");
            assert!((logit - want_logit).abs() < 1e-3 * want_logit.abs().max(1.0));
        }
    }
}

#[test]
fn sampling_on_the_gpu_matches_the_cpu_sampler() {
    let Some(ctx) = ctx() else { return };
    let spec = SynthSpec::tiny_gemma3(GgmlType::F32);
    let m = load(synthetic_bytes(&spec).unwrap(), ctx);
    let tokens = prompt(7, spec.n_vocab as u32);
    let settings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 1.5,
            seed: 9,
            ..Default::default()
        },
        SamplingParams {
            temperature: 2.0,
            top_k: 20,
            top_p: 0.9,
            seed: 3,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            min_p: 0.05,
            repeat_penalty: 1.5,
            frequency_penalty: 0.3,
            seed: 4,
            ..Default::default()
        },
    ];
    for p in settings {
        let mut s = GpuSession::new(
            m.gpu.clone(),
            SessionOptions {
                context: 64,
                max_batch: 64,
            },
        )
        .unwrap();
        pollster::block_on(s.feed(&tokens)).unwrap();
        for step in 0..4u32 {
            let logits = pollster::block_on(s.logits()).unwrap();
            let want = sample_cpu(&logits, &p, s.tokens(), step);
            let got = pollster::block_on(s.sample(&p, step)).unwrap();
            assert_eq!(got, want, "{p:?} step {step}");
            pollster::block_on(s.feed(&[got])).unwrap();
        }
    }
    // Same seed, same input: the same continuation; another seed: (almost surely) not.
    let run = |seed| {
        // A high temperature: the random model's logits are peaked.
        let p = SamplingParams {
            temperature: 200.0,
            seed,
            ..Default::default()
        };
        let mut s = GpuSession::new(
            m.gpu.clone(),
            SessionOptions {
                context: 64,
                max_batch: 64,
            },
        )
        .unwrap();
        let mut t = pollster::block_on(s.feed_and_sample(&tokens, &p, 0)).unwrap();
        let mut out = vec![t];
        for step in 1..12 {
            t = pollster::block_on(s.feed_and_sample(&[t], &p, step)).unwrap();
            out.push(t);
        }
        out
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

/// Log-probabilities of the sampled token and the top tokens: of the raw logits (penalties
/// and temperature change the draw, not them), step after step, against the CPU reference.
#[test]
fn logprobs_match_the_cpu_reference() {
    let Some(ctx) = ctx() else { return };
    let spec = SynthSpec::tiny_gemma4(GgmlType::Q8_0);
    let m = load(synthetic_bytes(&spec).unwrap(), ctx);
    let tokens = prompt(9, spec.n_vocab as u32);
    let p = SamplingParams {
        temperature: 1.3,
        repeat_penalty: 1.5,
        seed: 5,
        ..Default::default()
    };
    let opts = SessionOptions {
        context: 64,
        max_batch: 64,
    };
    let mut s = GpuSession::new(m.gpu.clone(), opts).unwrap();
    s.set_logprobs(Some(5)).unwrap();
    assert_eq!(s.pipeline_depth(), 1);
    let mut state = m.cpu.new_state();
    let mut want = m.cpu.forward(&mut state, &tokens).unwrap().pop().unwrap();
    pollster::block_on(s.begin(&tokens, &p, 0)).unwrap();
    for step in 1..5u32 {
        let token = pollster::block_on(s.next_token()).unwrap();
        let got = pollster::block_on(s.logprobs()).unwrap();
        let lse = want.iter().map(|&x| f64::from(x).exp()).sum::<f64>().ln() as f32;
        assert_eq!(got.token, token, "step {step}");
        assert!(
            (got.logprob - (want[token as usize] - lse)).abs() < 2e-3,
            "step {step}: {got:?}"
        );
        let mut order: Vec<u32> = (0..want.len() as u32).collect();
        order.sort_by(|&a, &b| want[b as usize].total_cmp(&want[a as usize]));
        assert_eq!(got.top.len(), 5);
        for (r, &(id, lp)) in got.top.iter().enumerate() {
            assert_eq!(id, order[r], "step {step}: rank {r}");
            assert!(
                (lp - (want[id as usize] - lse)).abs() < 2e-3,
                "step {step}: rank {r}"
            );
        }
        want = m.cpu.forward(&mut state, &[token]).unwrap().pop().unwrap();
        pollster::block_on(s.advance(&p, step)).unwrap();
    }
    // Off again: steps queue ahead as before.
    pollster::block_on(s.drain()).unwrap();
    s.set_logprobs(None).unwrap();
    assert!(s.pipeline_depth() > 1);
    assert!(pollster::block_on(s.logprobs()).is_err());
}

#[test]
fn bad_input_gives_errors_and_leaves_the_session_usable() {
    let Some(ctx) = ctx() else { return };
    let spec = SynthSpec::tiny_gemma3(GgmlType::Q8_0);
    let m = load(synthetic_bytes(&spec).unwrap(), ctx);
    let mut s = GpuSession::new(
        m.gpu.clone(),
        SessionOptions {
            context: 16,
            max_batch: 8,
        },
    )
    .unwrap();
    assert!(matches!(
        pollster::block_on(s.feed(&[])),
        Err(ForwardError::Empty)
    ));
    assert!(matches!(
        pollster::block_on(s.feed(&[1, 99_999])),
        Err(ForwardError::BadToken { id: 99_999, .. })
    ));
    assert!(matches!(
        pollster::block_on(s.logits()),
        Err(ForwardError::NoLogits)
    ));
    pollster::block_on(s.feed(&prompt(10, 512))).unwrap();
    assert!(matches!(
        pollster::block_on(s.feed(&prompt(7, 512))),
        Err(ForwardError::ContextOverflow {
            need: 17,
            capacity: 16
        })
    ));
    assert_eq!(s.position(), 10);
    // Still usable: rewind and continue, and the result equals a fresh run.
    s.rewind(4).unwrap();
    pollster::block_on(s.feed(&[7, 8])).unwrap();
    let a = pollster::block_on(s.logits()).unwrap();
    let mut fresh = GpuSession::new(
        m.gpu.clone(),
        SessionOptions {
            context: 16,
            max_batch: 8,
        },
    )
    .unwrap();
    let mut toks = prompt(4, 512);
    toks.extend([7, 8]);
    pollster::block_on(fresh.feed(&toks)).unwrap();
    // Different batch splits take different kernels (matvec or tiled), so allow rounding.
    let e = rel_err(&a, &pollster::block_on(fresh.logits()).unwrap());
    assert!(e < 1e-5, "rewound session differs from a fresh one by {e}");
}

#[test]
fn gemma3_270m_gpu_logits_match_the_cpu_reference() {
    let (Some(ctx), Some(path)) = (ctx(), wgemma_test_support::gemma3_270m()) else {
        return;
    };
    let src = Arc::new(MmapSource::open(&path).unwrap());
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&*src)).unwrap()).unwrap();
    let cfg = TextConfig::from_gguf(&g).unwrap();
    assert_eq!(
        (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_vocab),
        (18, 640, 4, 262_144)
    );
    assert_eq!(cfg.layers.iter().filter(|l| !l.sliding).count(), 3);
    let cpu = CpuModel::load(&g, &cfg, src.clone()).unwrap();
    let gpu = gpu_model(ctx.clone(), &g, &cfg, &src);
    // "<bos>The capital of France is" in Gemma 3 token ids, then two decode steps.
    let tokens = [2u32, 818, 5279, 529, 7001, 563];
    let mut st = cpu.new_state();
    let want = cpu.forward(&mut st, &tokens).unwrap();
    let mut s = GpuSession::new(gpu, SessionOptions::default()).unwrap();
    pollster::block_on(s.feed(&tokens)).unwrap();
    let got = pollster::block_on(s.logits()).unwrap();
    let e = rel_err(&got, want.last().unwrap());
    assert!(e < 1e-3, "prefill: relative error {e}");
    assert_eq!(
        wgemma_kernels::cpu::argmax(&got).0,
        wgemma_kernels::cpu::argmax(want.last().unwrap()).0
    );
    // Decode steps round the FFN's activations to 8-bit integers unless told not to: the
    // largest logit difference is then about 1.5% of the logits' RMS.
    let decode_tol = if ctx.features.int8_activations {
        3e-2
    } else {
        1e-3
    };
    for t in [9079u32, 236761] {
        pollster::block_on(s.feed(&[t])).unwrap();
        let got = pollster::block_on(s.logits()).unwrap();
        let want = cpu.forward(&mut st, &[t]).unwrap().pop().unwrap();
        let e = rel_err(&got, &want);
        assert!(e < decode_tol, "decode: relative error {e}");
        assert_eq!(
            wgemma_kernels::cpu::argmax(&got).0,
            wgemma_kernels::cpu::argmax(&want).0
        );
    }
}

/// Teacher-forced top-1 agreement with llama.cpp over its own greedy continuations (golden:
/// `xtask/scripts/llamacpp_greedy_golden.py`), and the top logit against Hugging Face
/// transformers' f32 forward of the same file (`xtask/scripts/hf_teacher_forced_golden.py`).
#[test]
fn gemma3_270m_agrees_with_llama_cpp_and_transformers() {
    let (Some(ctx), Some(path)) = (ctx(), wgemma_test_support::gemma3_270m()) else {
        return;
    };
    let llama: serde_json::Value =
        serde_json::from_str(include_str!("golden/llamacpp_gemma3_greedy.json")).unwrap();
    let hf: serde_json::Value =
        serde_json::from_str(include_str!("golden/hf_gemma3_teacher_forced.json")).unwrap();
    let src = Arc::new(MmapSource::open(&path).unwrap());
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&*src)).unwrap()).unwrap();
    let cfg = TextConfig::from_gguf(&g).unwrap();
    let gpu = gpu_model(ctx, &g, &cfg, &src);
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let (mut agree, mut total) = (0usize, 0usize);
    let (mut vs_llama, mut vs_hf, mut hf_agree, mut hf_total) =
        (Vec::new(), Vec::new(), 0usize, 0usize);
    let cases = llama["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for (case, hf_case) in cases.iter().zip(hf["cases"].as_array().unwrap()) {
        let prompt = ids(&case["prompt_tokens"]);
        let all: Vec<u32> = prompt
            .iter()
            .chain(&ids(&case["generated"]))
            .copied()
            .collect();
        assert_eq!(all, ids(&hf_case["tokens"]));
        let mut s = GpuSession::new(
            gpu.clone(),
            SessionOptions {
                context: 256,
                max_batch: 64,
            },
        )
        .unwrap();
        // Positions before the last prompt token need no logits; score from there on.
        let start = prompt.len() - 1;
        if start > 0 {
            pollster::block_on(s.feed(&all[..start])).unwrap();
        }
        let scored = pollster::block_on(s.score(&all[start..all.len() - 1])).unwrap();
        let (lt, ht) = (
            case["teacher_forced"].as_array().unwrap(),
            hf_case["teacher_forced"].as_array().unwrap(),
        );
        for (j, &(ours, our_logit)) in scored.iter().enumerate() {
            let i = start + j;
            total += 1;
            agree += usize::from(ours == all[i + 1]);
            for (truth, diffs) in [(&lt[i], &mut vs_llama), (&ht[i], &mut vs_hf)] {
                if ours == truth[0].as_u64().unwrap() as u32 {
                    diffs.push((our_logit - truth[1].as_f64().unwrap() as f32).abs());
                }
            }
            hf_total += 1;
            hf_agree += usize::from(ours == ht[i][0].as_u64().unwrap() as u32);
        }
    }
    let median = |v: &mut Vec<f32>| {
        v.sort_by(f32::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (ml, xl) = median(&mut vs_llama);
    let (mh, xh) = median(&mut vs_hf);
    let rate = agree as f64 / total as f64;
    eprintln!(
        "top-1 agreement with llama.cpp's greedy tokens: {agree}/{total} = {:.2}%; with transformers: {hf_agree}/{hf_total}",
        rate * 100.0
    );
    eprintln!(
        "top logit |ours - llama.cpp| median {ml} max {xl}; |ours - transformers| median {mh} max {xh}"
    );
    assert!(rate >= 0.97, "agreement with llama.cpp {rate}");
    // transformers runs exact f32 math on the same dequantized weights, as we do.
    assert!(
        hf_agree + 1 >= hf_total,
        "argmax differs from transformers at {} positions",
        hf_total - hf_agree
    );
    assert!(
        mh < 0.01 && xh < 0.05,
        "top logit vs transformers: median {mh}, max {xh}"
    );
    // llama.cpp's CPU path quantizes activations to 8 bits and takes GELU from an f16 table:
    // its logits sit ~1% away from exact f32 math (transformers shows the same distance).
    assert!(ml < 0.3, "median top-logit difference to llama.cpp {ml}");
}

/// Steps queued back to back (the token never leaves the GPU between them) give the same
/// tokens as one step at a time through the CPU, and the cache ends up the same.
#[test]
fn pipelined_steps_match_step_by_step_generation() {
    let Some(ctx) = ctx() else { return };
    // Gemma 4 with per-layer embeddings needs each fed token on the CPU: one step runs while
    // the next is recorded.
    for (spec, depth) in [
        (
            SynthSpec::tiny_gemma3(GgmlType::Q8_0),
            wgemma_text::forward::MAX_IN_FLIGHT,
        ),
        (SynthSpec::tiny_gemma4(GgmlType::Q8_0), 2),
    ] {
        pipelined_generation_matches(&spec, depth, ctx.clone());
    }
}

fn pipelined_generation_matches(
    spec: &SynthSpec,
    depth: usize,
    ctx: Arc<wgemma_kernels::GpuContext>,
) {
    let bytes = synthetic_bytes(spec).unwrap();
    let m = load(bytes.clone(), ctx.clone());
    let fetching = gpu_model_fetching_rows(ctx.clone(), bytes.clone());
    let table_on_gpu = gpu_model_table_on_gpu(ctx, bytes);
    let tokens = prompt(9, spec.n_vocab as u32);
    for p in [
        SamplingParams::default(),
        SamplingParams {
            temperature: 150.0,
            seed: 5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 150.0,
            top_k: 30,
            top_p: 0.9,
            repeat_penalty: 1.3,
            seed: 6,
            ..Default::default()
        },
    ] {
        let opts = SessionOptions {
            context: 64,
            max_batch: 16,
        };
        let mut one = GpuSession::new(m.gpu.clone(), opts).unwrap();
        let mut t = pollster::block_on(one.feed_and_sample(&tokens, &p, 0)).unwrap();
        let mut want = vec![t];
        for step in 1..10 {
            t = pollster::block_on(one.feed_and_sample(&[t], &p, step)).unwrap();
            want.push(t);
        }
        let pipelined = |many: &mut GpuSession| {
            assert_eq!(many.pipeline_depth(), depth);
            generate_pipelined(many, &tokens, &p, 10)
        };
        // Per-layer rows fetched asynchronously (the browser's way) give the same tokens;
        // feeding a token whose rows were not fetched is an error.
        let mut fetched = GpuSession::new(fetching.clone(), opts).unwrap();
        if spec.gemma4.is_some() {
            assert!(matches!(
                pollster::block_on(fetched.begin(&tokens, &p, 0)),
                Err(ForwardError::RowsNotFetched(_))
            ));
        }
        pollster::block_on(fetched.fetch_rows(&tokens)).unwrap();
        assert_eq!(pipelined(&mut fetched), want, "fetched rows, {p:?}");
        // The per-layer table on the GPU: the same tokens, with steps queued as deep as for
        // a model without the table (no token needs the CPU).
        let mut resident = GpuSession::new(table_on_gpu.clone(), opts).unwrap();
        assert_eq!(
            resident.pipeline_depth(),
            wgemma_text::forward::MAX_IN_FLIGHT
        );
        let got = generate_pipelined(&mut resident, &tokens, &p, 10);
        assert_eq!(got, want, "table on the GPU, {p:?}");
        let mut many = GpuSession::new(m.gpu.clone(), opts).unwrap();
        let got = pipelined(&mut many);
        assert_eq!(got, want, "{p:?}");
        // Both caches hold the prompt and the first nine generated tokens.
        assert_eq!(many.tokens(), one.tokens());
        assert_eq!(many.position(), tokens.len() + 9);
        assert!(matches!(pollster::block_on(many.advance(&p, 10)), Ok(())));
        assert!(
            many.rewind(3).is_err(),
            "rewinding with steps in flight is refused"
        );
        pollster::block_on(many.drain()).unwrap();
        many.rewind(3).unwrap();
        assert_eq!(many.tokens(), &tokens[..3]);
    }
}

/// After `compile_pipelines`, requests compile nothing more: prompts of one full chunk, of
/// several chunks and a remainder of 5 tokens or more, and shorter ones down to 5, greedy
/// and sampled, then decode steps.
#[test]
fn compiled_pipelines_cover_a_first_request() {
    let Some(shared) = ctx() else { return };
    for spec in [
        SynthSpec::tiny_gemma3(GgmlType::Q8_0),
        SynthSpec::tiny_gemma4(GgmlType::Q8_0),
    ] {
        // A context of its own: other tests compile into the shared one meanwhile.
        let ctx = Arc::new(
            pollster::block_on(GpuContext::new(ContextOptions {
                adapter_name: Some(shared.info.name.clone()),
                ..ContextOptions::default().with_env()
            }))
            .unwrap(),
        );
        let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
        let opts = SessionOptions {
            context: 64,
            max_batch: 16,
        };
        let s = GpuSession::new(m.gpu.clone(), opts).unwrap();
        s.compile_pipelines().unwrap();
        let compiled = ctx.pipeline_count();
        let vocab = spec.n_vocab as u32;
        for (len, p) in [
            (16, SamplingParams::default()),
            (37, SamplingParams::default()),
            (5, SamplingParams::default()),
            (21, SamplingParams::default()),
            (
                9,
                SamplingParams {
                    temperature: 0.8,
                    top_k: 40,
                    top_p: 0.9,
                    seed: 3,
                    ..Default::default()
                },
            ),
        ] {
            let mut s = GpuSession::new(m.gpu.clone(), opts).unwrap();
            generate_pipelined(&mut s, &prompt(len, vocab), &p, 4);
            assert_eq!(
                ctx.pipeline_count(),
                compiled,
                "{}: a {len}-token prompt compiled pipelines ({p:?})",
                spec.arch
            );
        }
    }
}
