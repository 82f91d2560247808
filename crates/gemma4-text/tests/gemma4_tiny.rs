//! Tiny random Gemma 4 models (per-layer embeddings with shared KV, MoE, dense with V from K)
//! against two independent references recorded in `golden/gemma4_tiny_*.json` by
//! `xtask/scripts/gemma4_tiny_fixtures.py`: Hugging Face transformers (f32) and llama.cpp (CPU,
//! f32) on the same GGUF. Both our CPU reference and the GPU forward must pick the same token
//! as both at every position and stay close to transformers' logits.

mod common;

use std::sync::Arc;

use common::{
    ctx, generate_pipelined, gpu_model_table_on_gpu, load, rel_err, scoring_session,
    session_in_chunks,
};
use wgemma_text::CpuModel;

struct Case {
    tokens: Vec<u32>,
    hf_argmax: Vec<u32>,
    hf_max: Vec<f32>,
    llama_argmax: Vec<u32>,
    llama_max: Vec<f32>,
    /// Transformers' whole logits rows at a few positions.
    hf_rows: Vec<(usize, Vec<f32>)>,
}

fn golden(json: &str) -> Vec<Case> {
    let g: serde_json::Value = serde_json::from_str(json).unwrap();
    let ints = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            tokens: ints(&c["tokens"]),
            hf_argmax: ints(&c["hf"]["argmax"]),
            hf_max: floats(&c["hf"]["max_logit"]),
            llama_argmax: ints(&c["llama_cpp"]["argmax"]),
            llama_max: floats(&c["llama_cpp"]["max_logit"]),
            hf_rows: c["hf"]["full_rows"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.parse().unwrap(), floats(v)))
                .collect(),
        })
        .collect()
}

const MODELS: [(&str, &[u8], &str); 3] = [
    (
        "e2b",
        include_bytes!("fixtures/gemma4_tiny_e2b.gguf"),
        include_str!("golden/gemma4_tiny_e2b.json"),
    ),
    (
        "moe",
        include_bytes!("fixtures/gemma4_tiny_moe.gguf"),
        include_str!("golden/gemma4_tiny_moe.json"),
    ),
    (
        "dense",
        include_bytes!("fixtures/gemma4_tiny_dense.gguf"),
        include_str!("golden/gemma4_tiny_dense.json"),
    ),
];

fn argmax(row: &[f32]) -> (u32, f32) {
    wgemma_kernels::cpu::argmax(row)
}

/// Checks one position's prediction against both references. transformers and our f32
/// forwards agree to rounding; llama.cpp rounds GELU's input to f16, so its logits sit a few
/// hundredths away (the golden records 0.07 at most).
fn check_position(what: &str, case: &Case, t: usize, (id, max): (u32, f32)) {
    assert_eq!(
        id, case.hf_argmax[t],
        "{what}: position {t} vs transformers"
    );
    assert_eq!(
        id, case.llama_argmax[t],
        "{what}: position {t} vs llama.cpp"
    );
    let (dh, dl) = (
        (max - case.hf_max[t]).abs(),
        (max - case.llama_max[t]).abs(),
    );
    assert!(
        dh < 2e-3,
        "{what}: position {t}: max logit {max} vs transformers' {}",
        case.hf_max[t]
    );
    assert!(
        dl < 0.1,
        "{what}: position {t}: max logit {max} vs llama.cpp's {}",
        case.llama_max[t]
    );
}

#[test]
fn cpu_reference_agrees_with_transformers_and_llama_cpp() {
    for (name, bytes, json) in MODELS {
        let g = wgemma_gguf::Gguf::parse(bytes).unwrap();
        let cfg = wgemma_text::TextConfig::from_gguf(&g).unwrap();
        let src = Arc::new(wgemma_gguf::BytesSource::new(bytes.to_vec()));
        let cpu = CpuModel::load(&g, &cfg, src).unwrap();
        for (ci, case) in golden(json).iter().enumerate() {
            let rows = cpu.forward(&mut cpu.new_state(), &case.tokens).unwrap();
            for (t, row) in rows.iter().enumerate() {
                check_position(&format!("{name} case {ci} cpu"), case, t, argmax(row));
            }
            for (t, want) in &case.hf_rows {
                let e = rel_err(&rows[*t], want);
                assert!(
                    e < 1e-4,
                    "{name} case {ci}: row {t} differs from transformers by {e}"
                );
            }
        }
    }
}

/// The GPU forward of every tiny model, the E2B fixture's per-layer width of 8 included,
/// against the transformers and llama.cpp goldens.
#[test]
fn gpu_forward_agrees_with_transformers_and_llama_cpp() {
    let Some(ctx) = ctx() else { return };
    for (name, bytes, json) in MODELS {
        let m = load(bytes.to_vec(), ctx.clone());
        for (ci, case) in golden(json).iter().enumerate() {
            // Teacher forcing through the batched kernels, in chunks smaller than the prompt
            // and in one (the MoE model's experts then run tiled, grouped by expert).
            for chunk in [8, 32] {
                let mut s = session_in_chunks(&m.gpu, chunk);
                let scored = pollster::block_on(s.score(&case.tokens)).unwrap();
                for (t, &p) in scored.iter().enumerate() {
                    check_position(&format!("{name} case {ci} gpu score/{chunk}"), case, t, p);
                }
            }
            // A prefill, then the decode kernels one token at a time, each row against the
            // transformers row where the golden holds one.
            let first = case.hf_rows.iter().map(|(t, _)| *t).min().unwrap();
            let mut s = scoring_session(&m.gpu);
            pollster::block_on(s.feed(&case.tokens[..=first])).unwrap();
            for t in first..case.tokens.len() {
                if t > first {
                    pollster::block_on(s.feed(&case.tokens[t..=t])).unwrap();
                }
                let got = pollster::block_on(s.logits()).unwrap();
                check_position(
                    &format!("{name} case {ci} gpu decode"),
                    case,
                    t,
                    argmax(&got),
                );
                if let Some((_, want)) = case.hf_rows.iter().find(|(p, _)| *p == t) {
                    let e = rel_err(&got, want);
                    assert!(
                        e < 1e-4,
                        "{name} case {ci}: row {t} differs from transformers by {e}"
                    );
                }
            }
        }
    }
}

/// Rewrites a llama.cpp-layout Gemma 4 GGUF the way Ollama's blobs store it: experts' gate and
/// up as two tensors, the per-expert scale named after the router, the tokenizer declared as
/// "llama" with the gemma4 pre-tokenizer, and vision tensors and keys in the same file.
fn to_ollama_layout(bytes: &[u8]) -> Vec<u8> {
    use wgemma_gguf::{GgmlType, Gguf, GgufWriter, TensorSpec, Value};
    let g = Gguf::parse(bytes).unwrap();
    let mut meta: Vec<(String, Value)> = g
        .metadata
        .entries()
        .iter()
        .filter(|(k, _)| k != "tokenizer.ggml.pre")
        .map(|(k, v)| match k.as_str() {
            "tokenizer.ggml.model" => (k.clone(), Value::String("llama".into())),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    meta.push(("tokenizer.ggml.pre".into(), Value::String("gemma4".into())));
    meta.push(("gemma4.vision.block_count".into(), Value::U32(2)));
    let mut specs = Vec::new();
    let mut data: Vec<Vec<u8>> = Vec::new();
    for t in g.tensors() {
        let r = g.tensor_range(t);
        let raw = &bytes[r.start as usize..r.end as usize];
        if let Some(prefix) = t.name.strip_suffix("ffn_gate_up_exps.weight") {
            let (d, rows2, e) = (t.dims[0], t.dims[1], t.dims[2]);
            let half = (rows2 / 2 * t.row_bytes()) as usize;
            let (mut gate, mut up) = (Vec::new(), Vec::new());
            for expert in raw.chunks_exact(2 * half) {
                gate.extend_from_slice(&expert[..half]);
                up.extend_from_slice(&expert[half..]);
            }
            for (name, part) in [("ffn_gate_exps", gate), ("ffn_up_exps", up)] {
                specs.push(TensorSpec::new(
                    format!("{prefix}{name}.weight"),
                    t.dtype,
                    &[d, rows2 / 2, e],
                ));
                data.push(part);
            }
        } else {
            let name = match t.name.strip_suffix("ffn_down_exps.scale") {
                Some(prefix) => format!("{prefix}ffn_gate_inp.per_expert_scale"),
                None => t.name.clone(),
            };
            specs.push(TensorSpec::new(name, t.dtype, &t.dims));
            data.push(raw.to_vec());
        }
    }
    specs.push(TensorSpec::new(
        "v.patch_embd.weight",
        GgmlType::F32,
        &[32, 2],
    ));
    data.push(vec![0; 256]);
    let mut w = GgufWriter::new(Vec::new(), &meta, specs, 32).unwrap();
    for d in &data {
        w.write_tensor(d).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn ollama_blob_layout_gives_the_same_model() {
    let (_, bytes, json) = MODELS[1];
    let ollama = to_ollama_layout(bytes);
    let parse = |b: &[u8]| wgemma_gguf::Gguf::parse(b).unwrap();
    let (g1, g2) = (parse(bytes), parse(&ollama));
    assert!(g2.tensor("blk.0.ffn_gate_exps.weight").is_some());
    assert!(g2.tensor("blk.0.ffn_gate_up_exps.weight").is_none());
    let (c1, c2) = (
        wgemma_text::TextConfig::from_gguf(&g1).unwrap(),
        wgemma_text::TextConfig::from_gguf(&g2).unwrap(),
    );
    assert_eq!(c1, c2);
    let tok = |g: &wgemma_gguf::Gguf| {
        wgemma_text::tokenizer::Tokenizer::from_metadata(&g.metadata, "gemma4").unwrap()
    };
    let text = "hello <|turn>world";
    assert_eq!(
        tok(&g1).encode(text, true, true),
        tok(&g2).encode(text, true, true)
    );
    let case = &golden(json)[0];
    let src = Arc::new(wgemma_gguf::BytesSource::new(ollama.clone()));
    let cpu = CpuModel::load(&g2, &c2, src).unwrap();
    let rows = cpu.forward(&mut cpu.new_state(), &case.tokens).unwrap();
    for (t, row) in rows.iter().enumerate() {
        check_position("ollama layout cpu", case, t, argmax(row));
    }
    let Some(ctx) = ctx() else { return };
    let m = load(ollama, ctx);
    let mut s = scoring_session(&m.gpu);
    let scored = pollster::block_on(s.score(&case.tokens)).unwrap();
    for (t, &p) in scored.iter().enumerate() {
        check_position("ollama layout gpu", case, t, p);
    }
}

/// The MoE fixture with its experts streamed from host memory (one layer's worth of expert
/// weights on the GPU, rewritten before each expert layer) computes what the resident model
/// computes: the same logits through prefill and decode, the same tokens with steps queued
/// ahead, and the goldens' tokens; one-token steps copy only the experts their router chose.
#[test]
fn streamed_experts_match_resident_experts() {
    use wgemma_text::{ExpertPlacement, GpuModel, LoadOptions, SamplingParams};
    let Some(ctx) = ctx() else { return };
    let (_, bytes, json) = MODELS[1];
    let g = wgemma_gguf::Gguf::parse(bytes).unwrap();
    let cfg = wgemma_text::TextConfig::from_gguf(&g).unwrap();
    let src = wgemma_gguf::BytesSource::new(bytes.to_vec());
    let placed = |experts| {
        let opts = LoadOptions {
            experts,
            ..LoadOptions::default()
        };
        let m = GpuModel::load_with(ctx.clone(), &g, &cfg, &src, None, opts, |_| {});
        Arc::new(pollster::block_on(m).unwrap())
    };
    let (resident, streamed) = (
        placed(ExpertPlacement::Resident),
        placed(ExpertPlacement::Streamed),
    );
    assert!(!resident.streams_experts() && streamed.streams_experts());
    // The fixture fits, so the default keeps the experts on the GPU.
    assert!(!placed(ExpertPlacement::Auto).streams_experts());
    assert!(
        streamed.gpu_bytes() < resident.gpu_bytes(),
        "streamed layers share one set of expert weights ({} vs {} bytes)",
        streamed.gpu_bytes(),
        resident.gpu_bytes()
    );
    let moe = cfg.moe.unwrap();
    assert!(
        moe.n_used < moe.n_expert,
        "a one-token step copies only its chosen experts"
    );
    for case in golden(json) {
        let (mut a, mut b) = (scoring_session(&resident), scoring_session(&streamed));
        let first = 4;
        // Bytes copied by the prompt's step (every expert of every layer) and by a one-token
        // step (at most n_used of the n_expert experts of each layer).
        let mut all_layers = 0;
        for t in first..case.tokens.len() {
            let fed = if t == first {
                &case.tokens[..=t]
            } else {
                &case.tokens[t..=t]
            };
            pollster::block_on(a.feed(fed)).unwrap();
            let before = b.experts_streamed_bytes();
            pollster::block_on(b.feed(fed)).unwrap();
            let copied = b.experts_streamed_bytes() - before;
            if t == first {
                all_layers = copied;
                assert!(copied > 0, "the prompt's step copies experts");
            } else {
                // Copies widened to 4-byte boundaries add at most 6 bytes per expert weight.
                let slack = (12 * moe.n_used * cfg.n_layer * moe.n_expert) as u64;
                assert!(
                    copied > 0
                        && copied * moe.n_expert as u64 <= all_layers * moe.n_used as u64 + slack,
                    "a one-token step copied {copied} bytes of {all_layers}"
                );
            }
            let (want, got) = (
                pollster::block_on(a.logits()).unwrap(),
                pollster::block_on(b.logits()).unwrap(),
            );
            assert!(
                rel_err(&got, &want) < 1e-6,
                "position {t}: {}",
                rel_err(&got, &want)
            );
            let best = got
                .iter()
                .enumerate()
                .max_by(|x, y| x.1.total_cmp(y.1))
                .unwrap();
            check_position("streamed experts", &case, t, (best.0 as u32, *best.1));
        }
        // Steps queued ahead: each one's expert copies land between its own layers.
        let p = SamplingParams::default();
        let generate = |m: &Arc<GpuModel>| {
            generate_pipelined(&mut scoring_session(m), &case.tokens[..6], &p, 8)
        };
        assert_eq!(generate(&streamed), generate(&resident));
    }
}

/// Soft tokens (an encoder's rows in place of some tokens' embeddings) through the GPU forward
/// agree with the CPU reference, in one chunk and across chunk boundaries, with a span at the
/// last position; per-layer embeddings read the padding token there (staged from the file,
/// and gathered from the table on the GPU).
#[test]
fn soft_tokens_match_the_cpu_reference() {
    use wgemma_kernels::View;
    use wgemma_text::{Input, SoftTokens};
    let Some(ctx) = ctx() else { return };
    for (name, bytes, json) in MODELS {
        let m = load(bytes.to_vec(), ctx.clone());
        let d = m.gpu.cfg.n_embd;
        let tokens: Vec<u32> = golden(json)[0].tokens.iter().copied().take(13).collect();
        // Rows of an encoder's scale: random, around the size of scaled embeddings.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rows = |n: usize| -> Vec<f32> {
            (0..n * d)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
                })
                .collect()
        };
        let (a, b) = (rows(4), rows(2));
        let upload = |v: &[f32]| View::of(&ctx.storage_init("soft", bytemuck::cast_slice(v)));
        let soft = [
            SoftTokens {
                at: 2,
                rows: upload(&a),
                bidirectional: false,
            },
            SoftTokens {
                at: 11,
                rows: upload(&b),
                bidirectional: false,
            },
        ];
        let inputs: Vec<Input<'_>> = (0..tokens.len())
            .map(|t| match t {
                2..=5 => Input::Embedding(&a[(t - 2) * d..][..d]),
                11 | 12 => Input::Embedding(&b[(t - 11) * d..][..d]),
                _ => Input::Token(tokens[t]),
            })
            .collect();
        let mut st = m.cpu.new_state();
        let want = m
            .cpu
            .forward_inputs(&mut st, &inputs)
            .unwrap()
            .pop()
            .unwrap();
        let mut models = vec![(m.gpu.clone(), "rows from the file")];
        if m.gpu.cfg.n_ple > 0 {
            let table = gpu_model_table_on_gpu(ctx.clone(), bytes.to_vec());
            models.push((table, "table on the GPU"));
        }
        for ((gpu, rows_from), chunk) in models.iter().flat_map(|m| [4, 12, 32].map(|c| (m, c))) {
            let mut s = session_in_chunks(gpu, chunk);
            pollster::block_on(s.feed_with(&tokens, &soft)).unwrap();
            let got = pollster::block_on(s.logits()).unwrap();
            let e = rel_err(&got, &want);
            assert!(
                e < 1e-4,
                "{name}, {rows_from}, chunks of {chunk}: soft tokens off the CPU by {e}"
            );
            // The session goes on from there as usual.
            pollster::block_on(s.feed(&tokens[..1])).unwrap();
        }
        if m.gpu.cfg.n_ple == 0 {
            // Without per-layer embeddings, a token's own scaled row as a soft token is the
            // token itself.
            let own: Vec<f32> = tokens[2..6].iter().flat_map(|&t| m.cpu.embed(t)).collect();
            let mut s = session_in_chunks(&m.gpu, 8);
            pollster::block_on(s.feed_with(
                &tokens,
                &[SoftTokens {
                    at: 2,
                    rows: upload(&own),
                    bidirectional: false,
                }],
            ))
            .unwrap();
            let as_soft = pollster::block_on(s.logits()).unwrap();
            let mut s = session_in_chunks(&m.gpu, 8);
            pollster::block_on(s.feed(&tokens)).unwrap();
            let as_tokens = pollster::block_on(s.logits()).unwrap();
            assert!(
                rel_err(&as_soft, &as_tokens) < 1e-5,
                "{name}: own rows differ"
            );
        }
    }
}

/// Spans that do not fit what is fed are refused with an error, and the session stays usable.
#[test]
fn bad_soft_token_spans_are_refused() {
    use wgemma_kernels::View;
    use wgemma_text::{ForwardError, SoftTokens};
    let Some(ctx) = ctx() else { return };
    let m = load(MODELS[2].1.to_vec(), ctx.clone());
    let d = m.gpu.cfg.n_embd;
    let rows = |n: usize| View::of(&ctx.storage("soft", (n * d * 4) as u64));
    let tokens = [2u32, 5, 6, 7, 8];
    let mut s = session_in_chunks(&m.gpu, 8);
    let cases = [
        vec![SoftTokens {
            at: 4,
            rows: rows(2),
            bidirectional: false,
        }],
        vec![
            SoftTokens {
                at: 0,
                rows: rows(3),
                bidirectional: false,
            },
            SoftTokens {
                at: 2,
                rows: rows(1),
                bidirectional: false,
            },
        ],
        vec![SoftTokens {
            at: 1,
            rows: View::of(&ctx.storage("odd", (d * 4 + 4) as u64)),
            bidirectional: false,
        }],
        vec![SoftTokens {
            at: usize::MAX,
            rows: rows(1),
            bidirectional: false,
        }],
    ];
    for soft in cases {
        let e = pollster::block_on(s.feed_with(&tokens, &soft)).unwrap_err();
        assert!(matches!(e, ForwardError::SoftTokens(_)), "{e}");
    }
    assert_eq!(s.position(), 0);
    pollster::block_on(s.feed(&tokens)).unwrap();
    assert_eq!(s.position(), tokens.len());
}

/// Every fusion rule against the ops it replaces: the same logits in prefill and decode with
/// the rule off (and with every rule off), and each rule changes some model's plan here. The
/// 8-bit activations are for Q4_K and Q6_K products, which these models do not have: their
/// kernels are held to the CPU in the parity tests, and the pinned E2B and E4B plans use them.
#[test]
fn each_fusion_agrees_with_the_ops_it_replaces() {
    use std::collections::HashSet;
    use wgemma_text::Fusions;
    let Some(ctx) = ctx() else { return };
    let mut changed: HashSet<&str> = HashSet::new();
    for (name, bytes, json) in MODELS {
        let m = load(bytes.to_vec(), ctx.clone());
        let tokens: Vec<u32> = golden(json)[0].tokens.iter().copied().take(12).collect();
        // The logits after the 6-token prompt and after each token decoded from there, and
        // the plans of a decode step and an 8-token chunk.
        let run = |f: Fusions| -> (Vec<Vec<f32>>, Vec<String>) {
            let mut s = session_in_chunks(&m.gpu, 32);
            s.set_fusions(f).unwrap();
            let lines = [s.plan_lines(1).unwrap(), s.plan_lines(8).unwrap()].concat();
            pollster::block_on(s.feed(&tokens[..6])).unwrap();
            let mut rows = vec![pollster::block_on(s.logits()).unwrap()];
            for &t in &tokens[6..] {
                pollster::block_on(s.feed(&[t])).unwrap();
                rows.push(pollster::block_on(s.logits()).unwrap());
            }
            (rows, lines)
        };
        let (want, plan) = run(Fusions::ALL);
        for (rule, f) in Fusions::each_off()
            .into_iter()
            .chain([("every", Fusions::NONE)])
        {
            let (got, lines) = run(f);
            if lines != plan {
                changed.insert(rule);
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = rel_err(g, w);
                assert!(e < 1e-4, "{name} without {rule}: row {} off by {e}", i + 5);
            }
        }
    }
    for (rule, _) in Fusions::each_off() {
        // `lora_in_product` is for products with adapters, held to the CPU in
        // `adapters_agree_with_the_cpu_reference`; `few_token_products` and
        // `batched_heads_in_attention` for batched decode steps (batch.rs holds them to the
        // CPU; a session's own steps never take them).
        let batched = ["few_token_products", "batched_heads_in_attention"];
        if ["int8_activations", "lora_in_product"].contains(&rule) || batched.contains(&rule) {
            continue;
        }
        assert!(changed.contains(rule), "no model here uses {rule}");
    }
}

/// The decoder's graph, lowered without fusions, writes every named value; each equals the
/// CPU reference's value of that name, layer by layer, in a 6-token step and a one-token
/// step. With fusions, a value that a kernel takes in cannot be traced, and saying so leaves
/// the session as it was.
#[test]
fn every_named_value_agrees_with_the_cpu_reference() {
    use std::collections::HashMap;
    use wgemma_text::{Fusions, Input};
    let Some(ctx) = ctx() else { return };
    for (name, bytes, json) in MODELS {
        let m = load(bytes.to_vec(), ctx.clone());
        let tokens: Vec<u32> = golden(json)[0].tokens.iter().copied().take(7).collect();
        let inputs: Vec<Input<'_>> = tokens.iter().map(|&t| Input::Token(t)).collect();
        let mut want: HashMap<String, Vec<Vec<f32>>> = HashMap::new();
        let mut st = m.cpu.new_state();
        m.cpu
            .forward_traced(&mut st, &inputs, &mut |n, v| {
                want.entry(n.to_string()).or_default().push(v.to_vec());
            })
            .unwrap();
        let mut names = vec!["inp_embd".to_string()];
        for il in 0..m.gpu.cfg.n_layer {
            for v in ["attn_out", "ffn_inp", "ffn_out", "out"] {
                names.push(format!("blk.{il}.{v}"));
            }
        }
        names.extend(["result_norm".into(), "result_output".into()]);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut s = session_in_chunks(&m.gpu, 32);
        s.set_fusions(Fusions::NONE).unwrap();
        for (first, chunk) in [(0, &tokens[..6]), (6, &tokens[6..])] {
            let got = pollster::block_on(s.trace(chunk, &names)).unwrap();
            assert_eq!(got.len(), names.len());
            for t in got {
                // The logits are the last row's only.
                let row0 = first + chunk.len() - t.rows;
                for r in 0..t.rows {
                    let w = &want[&t.name][row0 + r];
                    let e = rel_err(&t.values[r * t.cols..][..t.cols], w);
                    assert!(e < 1e-4, "{name}: {} at {} off by {e}", t.name, row0 + r);
                }
            }
        }
        let mut s = session_in_chunks(&m.gpu, 32);
        pollster::block_on(s.feed(&tokens[..6])).unwrap();
        let before = pollster::block_on(s.logits()).unwrap();
        assert!(pollster::block_on(s.trace(&tokens[6..], &["no.such.value"])).is_err());
        if m.gpu.cfg.n_head <= 8 {
            // The merge in front of the output product never writes the attention's output.
            let e = pollster::block_on(s.trace(&tokens[6..], &["blk.0.kqv_out"])).unwrap_err();
            assert!(e.to_string().contains("blk.0.kqv_out"), "{e}");
        }
        assert_eq!(pollster::block_on(s.logits()).unwrap(), before);
        pollster::block_on(s.feed(&tokens[6..])).unwrap();
        let next = pollster::block_on(s.logits()).unwrap();
        assert!(rel_err(&next, &want["result_output"][6]) < 1e-4);
    }
}

/// A random adapter on every projection the model has (rank `rank`), small enough to keep
/// the logits finite, large enough to move them; with pairs on the K and V of shared-KV layers
/// too, as PEFT trains them (they change nothing).
fn random_adapter(
    gpu: &wgemma_text::GpuModel,
    rank: usize,
    projs: &[wgemma_text::lora::Proj],
    seed: u64,
) -> wgemma_text::lora::LoraAdapter {
    use wgemma_text::lora::{LoraAdapter, LoraPair};
    let mut rng = wgemma_test_support::Rng(seed);
    let mut a = LoraAdapter::default();
    for il in 0..gpu.cfg.n_layer {
        for &p in projs {
            let unused = !wgemma_text::lora::LoraAdapter::applies(&gpu.cfg, il, p);
            if !gpu.has_projection(il, p) && !unused {
                continue;
            }
            let (rows, cols) = p.shape(&gpu.cfg, il);
            let pair = LoraPair {
                a: rng.vec(rank * cols, 0.5),
                b: rng.vec(rows * rank, 0.5),
                rank,
                cols,
                rows,
                scale: 2.0 / rank as f32,
            };
            a.pairs.insert((il, p), pair);
        }
    }
    a
}

/// Two adapters at once (one on every projection, one on q and down) on the GPU agree with
/// the CPU reference with the same adapters, through prefill chunks and decode steps, with
/// their deltas joined to the products and added by products of their own; they
/// move the logits; an adapter of scale 0 gives the base model's logits exactly, and taking
/// the adapters off gives the base model back.
#[test]
fn adapters_agree_with_the_cpu_reference() {
    use wgemma_text::Fusions;
    use wgemma_text::lora::Proj;
    let Some(ctx) = ctx() else { return };
    for (name, bytes, json) in MODELS {
        let mut m = load(bytes.to_vec(), ctx.clone());
        let tokens: Vec<u32> = golden(json)[0].tokens.iter().copied().take(9).collect();
        let every = random_adapter(&m.gpu, 3, &Proj::ALL, 7);
        let some = random_adapter(&m.gpu, 2, &[Proj::Q, Proj::Down], 8);
        let scales = [0.7, -1.3];
        let base = m.cpu.forward(&mut m.cpu.new_state(), &tokens).unwrap();
        m.cpu
            .set_adapters(vec![(every.clone(), scales[0]), (some.clone(), scales[1])])
            .unwrap();
        let want = m.cpu.forward(&mut m.cpu.new_state(), &tokens).unwrap();
        let moved = rel_err(&want[8], &base[8]);
        assert!(
            moved > 1e-2,
            "{name}: the adapters moved the logits by {moved} only"
        );
        let uploaded = [
            (m.gpu.prepare_adapter(&every).unwrap(), scales[0]),
            (m.gpu.prepare_adapter(&some).unwrap(), scales[1]),
        ];
        // The deltas joined to their products, added by products of their own, and with no
        // fusion at all: the joined decode step is the shortest.
        let mut off = Fusions::ALL;
        off.lora_in_product = false;
        let mut decode_steps = Vec::new();
        let mut runs = Vec::new();
        for fusions in [off, Fusions::NONE, Fusions::ALL] {
            let mut s = session_in_chunks(&m.gpu, 8);
            s.set_fusions(fusions).unwrap();
            s.set_adapters(&uploaded).unwrap();
            decode_steps.push(s.plan_lines(1).unwrap().len());
            pollster::block_on(s.feed(&tokens[..7])).unwrap();
            let mut got = vec![pollster::block_on(s.logits()).unwrap()];
            for &t in &tokens[7..] {
                pollster::block_on(s.feed(&[t])).unwrap();
                got.push(pollster::block_on(s.logits()).unwrap());
            }
            for (i, g) in got.iter().enumerate() {
                let e = rel_err(g, &want[6 + i]);
                assert!(
                    e < 1e-4,
                    "{name}: with adapters and {fusions:?}, position {} off by {e}",
                    6 + i
                );
            }
            runs.push((s, got));
        }
        assert!(
            decode_steps[2] < decode_steps[0],
            "{name}: {decode_steps:?} dispatches a decode step"
        );
        let (mut s, got) = runs.pop().unwrap();
        // Pairs on shared-KV layers' K and V change nothing, as in transformers.
        let mut used = every.clone();
        used.pairs
            .retain(|&(il, p), _| wgemma_text::lora::LoraAdapter::applies(&m.gpu.cfg, il, p));
        assert_eq!(name == "e2b", used.pairs.len() < every.pairs.len());
        if used.pairs.len() < every.pairs.len() {
            let mut only_used = session_in_chunks(&m.gpu, 8);
            let used = m.gpu.prepare_adapter(&used).unwrap();
            only_used
                .set_adapters(&[(used, scales[0]), uploaded[1].clone()])
                .unwrap();
            pollster::block_on(only_used.feed(&tokens[..7])).unwrap();
            for &t in &tokens[7..] {
                pollster::block_on(only_used.feed(&[t])).unwrap();
            }
            let same = pollster::block_on(only_used.logits()).unwrap();
            assert_eq!(
                same,
                got[got.len() - 1],
                "{name}: unused pairs changed the logits"
            );
        }
        // A pair whose A or B does not hold its rank's values is refused.
        let mut short = random_adapter(&m.gpu, 2, &[Proj::Q], 10);
        short.pairs.values_mut().next().unwrap().a.pop();
        let e = m.gpu.prepare_adapter(&short).err().unwrap();
        assert!(e.to_string().contains("values of A"), "{e}");
        // An adapter uploaded for another model is refused, and the session stays as it was.
        let other = load(MODELS[(name == "e2b") as usize].1.to_vec(), ctx.clone());
        let foreign = other
            .gpu
            .prepare_adapter(&random_adapter(&other.gpu, 2, &[Proj::Q], 9));
        let e = s.set_adapters(&[(foreign.unwrap(), 1.0)]).unwrap_err();
        assert!(e.to_string().contains("another model"), "{e}");
        assert_eq!(pollster::block_on(s.logits()).unwrap(), got[got.len() - 1]);
        // Scale 0, and no adapter: the base model's plan and logits, bit for bit.
        let mut plain = session_in_chunks(&m.gpu, 8);
        pollster::block_on(plain.feed(&tokens)).unwrap();
        let want_base = pollster::block_on(plain.logits()).unwrap();
        for adapters in [vec![(uploaded[0].0.clone(), 0.0)], vec![]] {
            s.set_adapters(&adapters).unwrap();
            assert_eq!(s.plan_lines(1).unwrap(), plain.plan_lines(1).unwrap());
            s.rewind(0).unwrap();
            pollster::block_on(s.feed(&tokens)).unwrap();
            assert_eq!(pollster::block_on(s.logits()).unwrap(), want_base, "{name}");
        }
    }
}

/// PEFT adapters made by transformers + PEFT on the tiny E2B model
/// (`xtask/scripts/gemma4_lora_golden.py`: every projection at r 4, and an rsLoRA one on q and
/// down) give transformers + PEFT's logits, on the GPU and on the CPU reference.
#[test]
fn peft_adapters_match_transformers_and_peft() {
    use wgemma_text::lora::LoraAdapter;
    let Some(ctx) = ctx() else { return };
    let mut m = load(MODELS[0].1.to_vec(), ctx.clone());
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/gemma4_tiny_e2b_lora.json")).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (variant, v) in golden["variants"].as_object().unwrap() {
        let adapter =
            LoraAdapter::from_peft_dir(&root.join(v["adapter"].as_str().unwrap())).unwrap();
        m.cpu.set_adapters(vec![(adapter.clone(), 1.0)]).unwrap();
        let gpu = [(m.gpu.prepare_adapter(&adapter).unwrap(), 1.0)];
        for case in v["cases"].as_array().unwrap() {
            let tokens: Vec<u32> = serde_json::from_value(case["tokens"].clone()).unwrap();
            let cpu = m.cpu.forward(&mut m.cpu.new_state(), &tokens).unwrap();
            let mut s = session_in_chunks(&m.gpu, 32);
            s.set_adapters(&gpu).unwrap();
            for (pos, row) in case["rows"].as_object().unwrap() {
                let pos: usize = pos.parse().unwrap();
                let want: Vec<f32> = serde_json::from_value(row.clone()).unwrap();
                s.rewind(0).unwrap();
                pollster::block_on(s.feed(&tokens[..=pos])).unwrap();
                let got = pollster::block_on(s.logits()).unwrap();
                let (eg, ec) = (rel_err(&got, &want), rel_err(&cpu[pos], &want));
                assert!(
                    eg < 1e-4 && ec < 1e-4,
                    "{variant} at {pos}: GPU off by {eg}, CPU by {ec}"
                );
            }
        }
    }
}

/// Sessions of one model share one arena of batched-step activations, each keeping one row's
/// worth for its decode steps: prefills of two sessions interleaved, one between the other's
/// queued decode steps, and both from two threads at once, give each session what it gets
/// alone, bit for bit.
#[test]
fn sessions_of_one_model_share_the_batch_activations() {
    use wgemma_text::SamplingParams;
    let Some(ctx) = ctx() else { return };
    for (name, bytes, json) in MODELS {
        let m = load(bytes.to_vec(), ctx.clone());
        let tokens: Vec<u32> = golden(json)[0].tokens.iter().copied().take(20).collect();
        let other: Vec<u32> = tokens.iter().rev().copied().collect();
        // Fed in the same pieces, for the same chunks' rounding.
        let alone = |pieces: [&[u32]; 2]| {
            let mut s = session_in_chunks(&m.gpu, 8);
            pieces
                .iter()
                .for_each(|t| pollster::block_on(s.feed(t)).unwrap());
            pollster::block_on(s.logits()).unwrap()
        };
        let want_a = alone([&tokens[..11], &tokens[11..]]);
        let want_b = alone([&other[..13], &other[13..]]);
        let (mut a, mut b) = (session_in_chunks(&m.gpu, 8), session_in_chunks(&m.gpu, 8));
        assert!(a.shares_arena(&b), "{name}");
        let wide = session_in_chunks(&m.gpu, 16);
        assert!(!wide.shares_arena(&a) && session_in_chunks(&m.gpu, 4).shares_arena(&wide));
        assert!(a.gpu_bytes() + a.arena_bytes() > a.gpu_bytes());
        pollster::block_on(a.feed(&tokens[..11])).unwrap();
        pollster::block_on(b.feed(&other[..13])).unwrap();
        pollster::block_on(a.feed(&tokens[11..])).unwrap();
        pollster::block_on(b.feed(&other[13..])).unwrap();
        assert_eq!(pollster::block_on(a.logits()).unwrap(), want_a, "{name}");
        assert_eq!(pollster::block_on(b.logits()).unwrap(), want_b, "{name}");
        // A prefill between another session's queued decode steps.
        let p = SamplingParams::default();
        let mut plain = session_in_chunks(&m.gpu, 8);
        let want = generate_pipelined(&mut plain, &tokens, &p, 6);
        a.rewind(0).unwrap();
        b.rewind(0).unwrap();
        pollster::block_on(a.begin(&tokens, &p, 0)).unwrap();
        let mut got = Vec::new();
        for step in 1..6 {
            pollster::block_on(a.advance(&p, step)).unwrap();
            pollster::block_on(b.feed(&other[..9 + step as usize])).unwrap();
            b.rewind(0).unwrap();
            got.push(pollster::block_on(a.next_token()).unwrap());
        }
        got.push(pollster::block_on(a.next_token()).unwrap());
        assert_eq!(
            got, want,
            "{name}: decode with another session's prefills between"
        );
        // Two threads at once.
        std::thread::scope(|scope| {
            for (t, cut, want) in [(&tokens, 11, &want_a), (&other, 13, &want_b)] {
                let gpu = m.gpu.clone();
                scope.spawn(move || {
                    let mut s = session_in_chunks(&gpu, 8);
                    for _ in 0..4 {
                        s.rewind(0).unwrap();
                        pollster::block_on(s.feed(&t[..cut])).unwrap();
                        pollster::block_on(s.feed(&t[cut..])).unwrap();
                        assert_eq!(&pollster::block_on(s.logits()).unwrap(), want);
                    }
                });
            }
        });
    }
}

/// The session's futures can move between threads, as a multi-threaded async runtime (a
/// server's) moves them: checked when this compiles.
#[allow(dead_code)]
fn session_futures_are_send(s: &mut wgemma_text::GpuSession, p: &wgemma_text::SamplingParams) {
    fn send<T: Send>(_: T) {}
    send(s.feed(&[]));
    send(s.feed_with(&[], &[]));
    send(s.begin(&[], p, 0));
    send(s.advance(p, 0));
    send(s.next_token());
    send(s.sample(p, 0));
    send(s.score(&[]));
    send(s.trace(&[], &[]));
    send(s.fetch_rows(&[]));
}
