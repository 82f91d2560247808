//! Batched decode: sessions whose caches are slots of one pool step together, each row's
//! logits equal to the CPU reference of that sequence alone, while sequences join and leave.

mod common;

use std::sync::Arc;

use common::{ctx, gpu_model_table_on_gpu, load, rel_err};
use wgemma_gguf::GgmlType;
use wgemma_text::synth::{DtypeMix, SynthMoe, SynthSpec, synthetic_bytes};
use wgemma_text::{
    BatchDecoder, BatchRow, CpuModel, ForwardError, Fusions, GpuModel, GpuSession, KvPool,
    SamplingParams, SessionOptions,
};

/// A sequence of the batch: its session on the GPU and its state in the CPU reference.
struct Sequence {
    session: GpuSession,
    cpu: wgemma_text::reference::CpuState,
    /// Logits the reference gives after the sequence's tokens so far.
    want: Vec<f32>,
}

fn prompt(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % vocab)
        .collect()
}

/// A pooled session that has read `tokens` and sampled its first token (greedily).
fn start(gpu: &Arc<GpuModel>, cpu: &CpuModel, pool: &Arc<KvPool>, tokens: &[u32]) -> Sequence {
    let opts = SessionOptions {
        context: 64,
        max_batch: 8,
    };
    let mut session = GpuSession::in_pool(gpu.clone(), opts, pool).unwrap();
    let mut state = cpu.new_state();
    let want = cpu.forward(&mut state, tokens).unwrap().pop().unwrap();
    let p = SamplingParams::default();
    let first = pollster::block_on(session.feed_and_sample(tokens, &p, 0)).unwrap();
    assert_eq!(first, wgemma_kernels::cpu::argmax(&want).0);
    Sequence {
        session,
        cpu: state,
        want,
    }
}

/// One batched step over `seqs`: each row's logits against the reference fed the same token.
fn step(batch: &mut BatchDecoder, cpu: &CpuModel, seqs: &mut [&mut Sequence], what: &str) {
    step_within(batch, cpu, seqs, what, 2e-4);
}

/// [`step`] to within `tol`; where that is loose (inputs rounded to 8-bit integers), each
/// row's token is the reference's argmax wherever the reference's top two are further apart
/// than the error allows.
fn step_within(
    batch: &mut BatchDecoder,
    cpu: &CpuModel,
    seqs: &mut [&mut Sequence],
    what: &str,
    tol: f32,
) {
    let p = SamplingParams::default();
    let fed: Vec<u32> = seqs
        .iter()
        .map(|s| wgemma_kernels::cpu::argmax(&s.want).0)
        .collect();
    let mut rows: Vec<BatchRow<'_>> = seqs
        .iter_mut()
        .map(|s| BatchRow {
            session: &mut s.session,
            params: &p,
            step: 1,
        })
        .collect();
    let got = pollster::block_on(batch.step(&mut rows)).unwrap();
    for ((s, token), fed) in seqs.iter_mut().zip(got).zip(fed) {
        let pos = s.session.position();
        assert_eq!(s.session.tokens().last(), Some(&fed), "{what}: fed token");
        s.want = cpu.forward(&mut s.cpu, &[fed]).unwrap().pop().unwrap();
        let logits = pollster::block_on(s.session.logits()).unwrap();
        let e = rel_err(&logits, &s.want);
        assert!(e < tol, "{what}: at {pos}, relative error {e}");
        let peak = s.want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut sorted = s.want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 2.0 * tol * peak {
            assert_eq!(
                token.unwrap(),
                wgemma_kernels::cpu::argmax(&s.want).0,
                "{what}: token at {pos}"
            );
        }
    }
}

fn specs() -> Vec<SynthSpec> {
    let mut moe = SynthSpec::tiny_gemma4(GgmlType::Q8_0);
    if let Some(g) = moe.gemma4.as_mut() {
        (g.n_ple, g.shared_kv_layers, g.k_eq_v) = (0, 0, true);
        g.moe = Some(SynthMoe {
            n_expert: 5,
            n_used: 2,
            n_ff: 64,
        });
    }
    vec![
        SynthSpec::tiny_gemma3(GgmlType::F32),
        // Per-layer embeddings (rows staged per token) and layers that share KV.
        SynthSpec::tiny_gemma4(GgmlType::Q8_0),
        moe,
    ]
}

/// Batched steps against each sequence's CPU reference, their head work inside the split
/// attention (rule `batched_heads_in_attention`) and in a dispatch of its own.
#[test]
fn batched_steps_match_each_sequence_alone() {
    let Some(ctx) = ctx() else { return };
    let apart = Fusions {
        batched_heads_in_attention: false,
        ..Fusions::ALL
    };
    for (spec, fusions) in specs()
        .into_iter()
        .flat_map(|s| [(s.clone(), Fusions::ALL), (s, apart)])
    {
        let heads_fused = fusions.batched_heads_in_attention;
        let what = format!("{} {:?} heads fused {heads_fused}", spec.arch, spec.mix);
        let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
        let vocab = spec.n_vocab as u32;
        let pool = KvPool::new(m.gpu.clone(), 4, 64).unwrap();
        assert_eq!(
            (pool.slots(), pool.slot_rows(), pool.free_slots()),
            (4, 64, 4)
        );
        // Room for many more slots of a short context than of a long one.
        let (short, long) = (
            KvPool::max_slots(&m.gpu, 64),
            KvPool::max_slots(&m.gpu, 256),
        );
        assert!(short >= 4 * long && long >= 4, "{short} {long}");
        let mut batch = BatchDecoder::new(pool.clone(), 4).unwrap();
        batch.set_fusions(fusions).unwrap();
        // Prompts shorter and longer than the sliding window (6), in slots 0, 1 and 2.
        let mut a = start(&m.gpu, &m.cpu, &pool, &prompt(11, 1, vocab));
        let mut b = start(&m.gpu, &m.cpu, &pool, &prompt(3, 2, vocab));
        let mut c = start(&m.gpu, &m.cpu, &pool, &prompt(23, 3, vocab));
        assert_eq!(pool.free_slots(), 1);
        for i in 0..4 {
            step(
                &mut batch,
                &m.cpu,
                &mut [&mut a, &mut b, &mut c],
                &format!("{what} abc {i}"),
            );
        }
        // b leaves; its slot goes to d, whose steps must not see b's stale keys.
        drop(b);
        assert_eq!(pool.free_slots(), 2);
        let mut d = start(&m.gpu, &m.cpu, &pool, &prompt(2, 4, vocab));
        for i in 0..3 {
            step(
                &mut batch,
                &m.cpu,
                &mut [&mut c, &mut d, &mut a],
                &format!("{what} cda {i}"),
            );
        }
        // Rows of one: the session's own decode step.
        step(&mut batch, &m.cpu, &mut [&mut d], &format!("{what} d"));
        drop((a, c, d));
        assert_eq!(pool.free_slots(), 4);
    }
}

/// Gemma 4 with its per-layer table on the GPU: the batched step gathers every row's table
/// row by the ids it stages, as the reference computes each sequence alone.
#[test]
fn batched_steps_gather_the_per_layer_table_on_the_gpu() {
    let Some(ctx) = ctx() else { return };
    let spec = SynthSpec::tiny_gemma4(GgmlType::Q8_0);
    let bytes = synthetic_bytes(&spec).unwrap();
    let cpu = load(bytes.clone(), ctx.clone()).cpu;
    let gpu = gpu_model_table_on_gpu(ctx, bytes);
    let vocab = spec.n_vocab as u32;
    let pool = KvPool::new(gpu.clone(), 3, 64).unwrap();
    let mut batch = BatchDecoder::new(pool.clone(), 3).unwrap();
    let mut a = start(&gpu, &cpu, &pool, &prompt(9, 5, vocab));
    let mut b = start(&gpu, &cpu, &pool, &prompt(4, 6, vocab));
    let mut c = start(&gpu, &cpu, &pool, &prompt(13, 7, vocab));
    for i in 0..3 {
        step(
            &mut batch,
            &cpu,
            &mut [&mut a, &mut b, &mut c],
            &format!("table on the GPU {i}"),
        );
    }
}

/// A model of K-quant products (Q4_K_M's mix at widths of whole 256-blocks): batched steps of
/// 3 and 4 rows take the few-token kernel (inputs rounded to 8-bit integers, as one token's
/// down and head products round theirs), within 3% of the reference's largest logit (one
/// token's rounded products reach 1.5% on Gemma 3 270M), the same tokens where the
/// reference is not close to a tie.
#[test]
fn batched_steps_of_k_quants_round_their_inputs_within_tolerance() {
    let Some(ctx) = ctx() else { return };
    assert!(wgemma_kernels::ops::few_tokens_max(&ctx) >= 4);
    let mut spec = SynthSpec::tiny_gemma4(GgmlType::Q8_0);
    (spec.n_embd, spec.n_ff, spec.head_dim) = (256, 256, 64);
    spec.mix = DtypeMix::Q4KM;
    if let Some(g) = spec.gemma4.as_mut() {
        g.head_dim_global = 128;
    }
    let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
    let vocab = spec.n_vocab as u32;
    let pool = KvPool::new(m.gpu.clone(), 4, 64).unwrap();
    let mut batch = BatchDecoder::new(pool.clone(), 4).unwrap();
    let mut a = start(&m.gpu, &m.cpu, &pool, &prompt(11, 8, vocab));
    let mut b = start(&m.gpu, &m.cpu, &pool, &prompt(3, 9, vocab));
    let mut c = start(&m.gpu, &m.cpu, &pool, &prompt(7, 10, vocab));
    let mut d = start(&m.gpu, &m.cpu, &pool, &prompt(5, 11, vocab));
    for i in 0..3 {
        let what = format!("k-quants abcd {i}");
        step_within(
            &mut batch,
            &m.cpu,
            &mut [&mut a, &mut b, &mut c, &mut d],
            &what,
            3e-2,
        );
        let what = format!("k-quants cab {i}");
        step_within(
            &mut batch,
            &m.cpu,
            &mut [&mut c, &mut a, &mut b],
            &what,
            3e-2,
        );
    }
}

/// Rows with their own samplers in one step: greedy and plain temperature rows are drawn
/// together (one argmax over all rows), a top-k row and a penalized row by their sessions;
/// each row's token is what its sampler draws from its logits: the argmax, or the Gumbel-max
/// sample of its seed and step (the CPU's draw of the GPU's noise).
#[test]
fn rows_with_their_own_samplers_draw_as_alone() {
    let Some(ctx) = ctx() else { return };
    let spec = SynthSpec::tiny_gemma3(GgmlType::F32);
    let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
    let vocab = spec.n_vocab as u32;
    let pool = KvPool::new(m.gpu.clone(), 4, 64).unwrap();
    let mut batch = BatchDecoder::new(pool.clone(), 4).unwrap();
    let mut seqs: Vec<Sequence> = (0..4)
        .map(|i| start(&m.gpu, &m.cpu, &pool, &prompt(6 + i, 20 + i as u32, vocab)))
        .collect();
    let warm = |seed: u64| SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let params = [
        SamplingParams::default(),
        warm(7),
        SamplingParams {
            top_k: 5,
            ..warm(8)
        },
        SamplingParams {
            repeat_penalty: 1.3,
            ..warm(9)
        },
    ];
    for step in 1..4u32 {
        let mut rows: Vec<BatchRow<'_>> = seqs
            .iter_mut()
            .zip(&params)
            .map(|(s, p)| BatchRow {
                session: &mut s.session,
                params: p,
                step,
            })
            .collect();
        let got = pollster::block_on(batch.step(&mut rows)).unwrap();
        drop(rows);
        for (i, (s, token)) in seqs.iter_mut().zip(got).enumerate() {
            let token = token.unwrap();
            assert!(token < vocab, "row {i} step {step}: {token}");
            // The penalized row's logits are rewritten by its penalties; the top-k row's
            // draw has its own tests.
            if i >= 2 {
                continue;
            }
            let logits = pollster::block_on(s.session.logits()).unwrap();
            let p = &params[i];
            let want = match i {
                0 => wgemma_kernels::cpu::argmax(&logits).0,
                _ => wgemma_kernels::cpu::gumbel_argmax(&logits, p.seed32(), step, p.temperature),
            };
            assert_eq!(token, want, "row {i} at step {step}");
        }
    }
}

#[test]
fn sessions_that_cannot_join_a_step_are_refused() {
    let Some(ctx) = ctx() else { return };
    let spec = SynthSpec::tiny_gemma3(GgmlType::F32);
    let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
    let vocab = spec.n_vocab as u32;
    let pool = KvPool::new(m.gpu.clone(), 2, 8).unwrap();
    let mut batch = BatchDecoder::new(pool.clone(), 2).unwrap();
    let p = SamplingParams::default();
    let opts = SessionOptions {
        context: 64,
        max_batch: 8,
    };
    let mut a = GpuSession::in_pool(m.gpu.clone(), opts, &pool).unwrap();
    let mut b = GpuSession::in_pool(m.gpu.clone(), opts, &pool).unwrap();
    // The slots (64 positions after rounding) bound the context asked for.
    assert_eq!(a.capacity(), 64);
    assert!(matches!(
        GpuSession::in_pool(m.gpu.clone(), opts, &pool),
        Err(ForwardError::PoolFull { slots: 2 })
    ));
    let mut outside = GpuSession::new(m.gpu.clone(), opts).unwrap();
    let tokens = prompt(5, 1, vocab);
    for s in [&mut a, &mut outside] {
        pollster::block_on(s.feed_and_sample(&tokens, &p, 0)).unwrap();
    }
    // b has sampled nothing; `outside` holds its own cache.
    let err = pair(&mut batch, &mut a, &mut b).unwrap_err();
    assert!(matches!(err, ForwardError::NothingSampled), "{err}");
    let err = pair(&mut batch, &mut a, &mut outside).unwrap_err();
    assert!(matches!(err, ForwardError::Batch(_)), "{err}");
    assert!(matches!(
        pollster::block_on(batch.step(&mut [])),
        Err(ForwardError::Empty)
    ));
    // Nothing ran: a still steps on, and so does b once it has a token.
    pollster::block_on(b.feed_and_sample(&tokens, &p, 0)).unwrap();
    pair(&mut batch, &mut a, &mut b).unwrap();
    assert_eq!(a.position(), 6);
    assert_eq!(a.tokens()[5..], b.tokens()[5..]);
    // A full context is refused.
    a.rewind(0).unwrap();
    let long = prompt(64, 2, vocab);
    pollster::block_on(a.feed_and_sample(&long, &p, 0)).unwrap();
    let err = pair(&mut batch, &mut a, &mut b).unwrap_err();
    assert!(matches!(err, ForwardError::ContextOverflow { .. }), "{err}");
}

/// A greedy step of `a` and `b` together.
fn pair(
    batch: &mut BatchDecoder,
    a: &mut GpuSession,
    b: &mut GpuSession,
) -> Result<(), ForwardError> {
    let p = SamplingParams::default();
    let row = |session| BatchRow {
        session,
        params: &p,
        step: 1,
    };
    pollster::block_on(batch.step(&mut [row(a), row(b)])).map(|_| ())
}

/// A pooled session that takes another slot's cached prefix reads only the rest of a prompt
/// that starts like it, and then gives the logits the CPU reference gives for the whole
/// prompt; the slot it took them from keeps its own. Refusals leave the session as it was.
#[test]
fn a_slot_takes_the_cached_prefix_of_another() {
    let Some(ctx) = ctx() else { return };
    for spec in specs() {
        let what = format!("{} {:?}", spec.arch, spec.mix);
        let m = load(synthetic_bytes(&spec).unwrap(), ctx.clone());
        let vocab = spec.n_vocab as u32;
        let pool = KvPool::new(m.gpu.clone(), 3, 64).unwrap();
        let shared = prompt(19, 5, vocab);
        let a = start(&m.gpu, &m.cpu, &pool, &shared);
        let opts = SessionOptions {
            context: 64,
            max_batch: 8,
        };
        let mut b = GpuSession::in_pool(m.gpu.clone(), opts, &pool).unwrap();
        // b's own conversation first: what it takes replaces it.
        pollster::block_on(b.feed(&prompt(7, 9, vocab))).unwrap();
        let mut tokens = shared[..15].to_vec();
        tokens.extend(prompt(6, 6, vocab));
        b.adopt_prefix(&a.session, 15).unwrap();
        assert_eq!(b.tokens(), &shared[..15], "{what}");
        pollster::block_on(b.feed(&tokens[15..])).unwrap();
        let got = pollster::block_on(b.logits()).unwrap();
        let mut state = m.cpu.new_state();
        let want = m.cpu.forward(&mut state, &tokens).unwrap().pop().unwrap();
        let e = rel_err(&got, &want);
        assert!(e < 2e-4, "{what}: relative error {e}");
        // a's cache is untouched: its next step still matches its reference.
        let mut a = a;
        let mut batch = BatchDecoder::new(pool.clone(), 3).unwrap();
        step(
            &mut batch,
            &m.cpu,
            &mut [&mut a],
            &format!("{what} a after"),
        );
        // Refused: more than a holds, from a session outside the pool.
        let held = a.session.tokens().len();
        assert!(b.adopt_prefix(&a.session, held + 1).is_err());
        let outside = GpuSession::new(m.gpu.clone(), opts).unwrap();
        assert!(b.adopt_prefix(&outside, 0).is_err());
        assert_eq!(b.tokens(), &tokens[..], "{what}: refusals change nothing");
    }
}

/// Which sequences each step of [`queued_steps_give_the_tokens_of_steps_read_one_by_one`]
/// takes: all three, one leaving, a fourth joining, the fourth alone (its session's own
/// pipelined step), the first coming back beside it.
const SCHEDULE: [&[usize]; 10] = [
    &[0, 1, 2],
    &[0, 1, 2],
    &[2, 0, 1],
    &[1, 2],
    &[1, 2, 3],
    &[3, 1, 2],
    &[3],
    &[3],
    &[0, 3],
    &[3, 0, 1, 2],
];

/// Calls `f` with the rows of `seqs` that `which` names, in its order (greedy).
fn with_rows<R>(
    seqs: &mut [GpuSession],
    which: &[usize],
    f: impl FnOnce(&mut [BatchRow<'_>]) -> R,
) -> R {
    let p = SamplingParams::default();
    let mut picked: Vec<Option<&mut GpuSession>> = seqs.iter_mut().map(Some).collect();
    let mut rows: Vec<BatchRow<'_>> = which
        .iter()
        .map(|&i| BatchRow {
            session: picked[i].take().unwrap(),
            params: &p,
            step: 1,
        })
        .collect();
    f(&mut rows)
}

/// Runs [`SCHEDULE`] over sessions that have read `prompts`, `depth` steps queued ahead of
/// the readback (1: each step read before the next is queued); every sequence's tokens, and
/// its logits after its last step.
fn run_schedule(
    gpu: &Arc<GpuModel>,
    pool: &Arc<KvPool>,
    prompts: &[Vec<u32>],
    depth: usize,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let opts = SessionOptions {
        context: 64,
        max_batch: 8,
    };
    let p = SamplingParams::default();
    let mut batch = BatchDecoder::new(pool.clone(), 4).unwrap();
    let mut seqs: Vec<GpuSession> = prompts
        .iter()
        .map(|tokens| {
            let mut s = GpuSession::in_pool(gpu.clone(), opts, pool).unwrap();
            pollster::block_on(s.feed_and_sample(tokens, &p, 0)).unwrap();
            s
        })
        .collect();
    let mut sampled: Vec<Vec<u32>> = vec![Vec::new(); seqs.len()];
    let mut read = |which: &[usize], seqs: &mut [GpuSession], batch: &mut BatchDecoder| {
        let got = with_rows(seqs, which, |rows| pollster::block_on(batch.collect(rows)));
        for (&i, token) in which.iter().zip(got.unwrap()) {
            sampled[i].push(token.unwrap());
        }
    };
    // The steps queued and not read yet, oldest first. A step that cannot feed a token not
    // yet read (Busy: the table read on the CPU, between a row alone and rows together)
    // waits for the steps before it to be read.
    let mut unread = std::collections::VecDeque::new();
    for which in SCHEDULE {
        loop {
            match with_rows(&mut seqs, which, |rows| {
                pollster::block_on(batch.submit(rows))
            }) {
                Ok(()) => break,
                Err(ForwardError::Busy) if !unread.is_empty() => {
                    read(unread.pop_front().unwrap(), &mut seqs, &mut batch);
                }
                Err(e) => panic!("{e}"),
            }
        }
        unread.push_back(which);
        if unread.len() == depth {
            read(unread.pop_front().unwrap(), &mut seqs, &mut batch);
        }
    }
    while let Some(which) = unread.pop_front() {
        read(which, &mut seqs, &mut batch);
    }
    assert_eq!(batch.in_flight(), 0);
    for (s, tokens) in seqs.iter().zip(&sampled) {
        // Every token but the newest sampled one is in the cache.
        let fed = &s.tokens()[s.tokens().len() - (tokens.len() - 1)..];
        assert_eq!(fed, &tokens[..tokens.len() - 1]);
    }
    let logits = seqs
        .iter_mut()
        .map(|s| pollster::block_on(s.logits()).unwrap())
        .collect();
    (sampled, logits)
}

/// Steps queued ahead of their readback ([`BatchDecoder::submit`], then
/// [`BatchDecoder::collect`] oldest first), whose rows feed tokens still on the GPU, give the
/// tokens of steps read one by one, while rows leave, join and step alone. Where the
/// per-layer table is read on the CPU, a step that feeds tokens not yet read is recorded and
/// held until they are: two steps at most.
#[test]
fn queued_steps_give_the_tokens_of_steps_read_one_by_one() {
    let Some(ctx) = ctx() else { return };
    let moe = specs().pop().unwrap();
    let ple = SynthSpec::tiny_gemma4(GgmlType::Q8_0);
    let models = [
        load(
            synthetic_bytes(&SynthSpec::tiny_gemma3(GgmlType::F32)).unwrap(),
            ctx.clone(),
        )
        .gpu,
        load(synthetic_bytes(&moe).unwrap(), ctx.clone()).gpu,
        gpu_model_table_on_gpu(ctx.clone(), synthetic_bytes(&ple).unwrap()),
        load(synthetic_bytes(&ple).unwrap(), ctx.clone()).gpu,
    ];
    for gpu in &models {
        let most = BatchDecoder::new(KvPool::new(gpu.clone(), 1, 64).unwrap(), 1)
            .unwrap()
            .pipeline_depth();
        let vocab = gpu.cfg.n_vocab as u32;
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|i| prompt(3 + 4 * i, 30 + i as u32, vocab))
            .collect();
        let pool = KvPool::new(gpu.clone(), 4, 64).unwrap();
        let (tokens, logits) = run_schedule(gpu, &pool, &prompts, 1);
        for depth in (2..=3).filter(|&d| d <= most) {
            let (got, got_logits) = run_schedule(gpu, &pool, &prompts, depth);
            assert_eq!(got, tokens, "depth {depth}");
            for (a, b) in got_logits.iter().zip(&logits) {
                let e = rel_err(a, b);
                assert!(e < 1e-6, "depth {depth}: last logits, relative error {e}");
            }
        }
    }
    // The table read on the CPU.
    let m = load(synthetic_bytes(&ple).unwrap(), ctx.clone());
    let pool = KvPool::new(m.gpu.clone(), 2, 64).unwrap();
    let mut batch = BatchDecoder::new(pool.clone(), 2).unwrap();
    assert_eq!(batch.pipeline_depth(), 2);
    let p = SamplingParams::default();
    let opts = SessionOptions {
        context: 64,
        max_batch: 8,
    };
    let vocab = m.gpu.cfg.n_vocab as u32;
    let mut seqs: Vec<GpuSession> = (0..2)
        .map(|i| {
            let mut s = GpuSession::in_pool(m.gpu.clone(), opts, &pool).unwrap();
            pollster::block_on(s.feed_and_sample(&prompt(4, 9 + i, vocab), &p, 0)).unwrap();
            s
        })
        .collect();
    let mut on = |which: &[usize], submit: bool| {
        with_rows(&mut seqs, which, |rows| {
            if submit {
                pollster::block_on(batch.submit(rows)).map(|()| Vec::new())
            } else {
                pollster::block_on(batch.collect(rows))
            }
        })
    };
    on(&[0, 1], true).unwrap();
    // Recorded, and held until the first step's tokens are read.
    on(&[1, 0], true).unwrap();
    let err = on(&[0, 1], true).unwrap_err();
    assert!(matches!(err, ForwardError::Busy), "{err}");
    // Read in another order: refused, and the step stays queued.
    let err = on(&[1, 0], false).unwrap_err();
    assert!(matches!(err, ForwardError::Batch(_)), "{err}");
    assert_eq!(on(&[0, 1], false).unwrap().len(), 2);
    assert_eq!(on(&[1, 0], false).unwrap().len(), 2);
    let err = on(&[0, 1], false).unwrap_err();
    assert!(matches!(err, ForwardError::NothingSampled), "{err}");
    on(&[0, 1], true).unwrap();
}
