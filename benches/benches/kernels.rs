//! Kernel benchmarks at Gemma 4 E2B shapes: matrix-vector products of every weight dtype
//! (throughput in GB/s of weight bytes), decode attention at context 512 and 4096, and the
//! vision tower's attention over an image's patches.
//!
//!     cargo bench -p wgemma-benches --bench kernels
//!
//! Criterion's "throughput" column is weight bytes read per second.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgemma_benches::{context, time_in_one_pass};
use wgemma_gguf::{GgmlType, quantize};
use wgemma_kernels::ops::{self, AttentionArgs, MatmulArgs};
use wgemma_kernels::{DType, GpuContext, GpuWeight, Tensor, View};

/// (rows, cols) of E2B's matrices: attention out, FFN up/gate, FFN down, output head; then
/// Gemma 3 270M's QKV, interleaved gate/up and down (rows of 640 take no K-quant).
const SHAPES: [(u64, u64); 7] = [
    (1536, 2048),
    (6144, 1536),
    (1536, 6144),
    (262_144, 1536),
    (1536, 640),
    (4096, 640),
    (640, 2048),
];
const DTYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// A `rows x cols` weight of `dtype` (one quantized block of 64 random rows, repeated:
/// realistic bytes, fast set-up), an input and an output for it, and the weight's bytes. None
/// when the dtype cannot take the shape.
fn matvec_operands(
    ctx: &GpuContext,
    dtype: GgmlType,
    rows: u64,
    cols: u64,
) -> Option<(GpuWeight, View, View, u64)> {
    let block_rows = 64u64;
    let q = quantize(dtype, &random((block_rows * cols) as usize, rows ^ cols)).ok()?;
    let bytes = q.repeat((rows / block_rows) as usize);
    let w = GpuWeight::upload(ctx, "w", dtype, cols, rows, &bytes, None).ok()?;
    let x = View::of(&ctx.storage_init("x", bytemuck::cast_slice(&random(cols as usize, 7))));
    let y = View::of(&ctx.storage("y", rows * 4));
    Some((w, x, y, bytes.len() as u64))
}

fn matvec(c: &mut Criterion) {
    let ctx = context();
    let quick = std::env::var_os("WGEMMA_BENCH_QUICK").is_some();
    let mut group = c.benchmark_group("matvec");
    for dtype in DTYPES {
        for (rows, cols) in SHAPES {
            if quick && rows > 6144 && dtype != GgmlType::Q4K && dtype != GgmlType::Q6K {
                continue;
            }
            let Some((w, x, y, bytes)) = matvec_operands(&ctx, dtype, rows, cols) else {
                continue;
            };
            let args = MatmulArgs {
                x: &x,
                y: &y,
                m: 1,
                x_stride: cols as u32,
                y_stride: rows as u32,
                out: ops::MatvecOut::Rows { softcap: 0.0 },
                y_offset: 0,
                partials: None,
            };
            let ds = ops::matmul(&ctx, &w, &args).unwrap();
            group.throughput(Throughput::Bytes(bytes));
            group.bench_with_input(
                BenchmarkId::new(dtype.name(), format!("{rows}x{cols}")),
                &ds,
                |b, ds| b.iter_custom(|iters| time_in_one_pass(&ctx, ds, iters)),
            );
        }
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("attention_decode");
    // E2B: 8 query heads over 1 KV head; head_dim 256 (sliding) and 512 (global).
    for (head_dim, context_len) in [(256u32, 512u32), (256, 4096), (512, 4096)] {
        let (nh, nkv) = (8u32, 1u32);
        let kv = (context_len * nkv * head_dim) as usize;
        let width = (nh + 2 * nkv) * head_dim;
        let vector = |n: u32, seed| {
            View::of(&ctx.storage_init("v", bytemuck::cast_slice(&random(n as usize, seed))))
        };
        let qkv = vector(width, 1);
        let kc = View::of(&ctx.storage_init("k", bytemuck::cast_slice(&random(kv, 2))));
        let vc = View::of(&ctx.storage_init("v", bytemuck::cast_slice(&random(kv, 3))));
        let (q_norm, k_norm) = (vector(head_dim, 4), vector(head_dim, 5));
        let positions = View::of(&ctx.storage_init("pos", bytemuck::bytes_of(&(context_len - 1))));
        let out = View::of(&ctx.storage("out", u64::from(nh * head_dim) * 4));
        let scratch = View::of(&ctx.storage(
            "part",
            ops::DecodeAttention::scratch_floats(nh, head_dim, context_len) * 4,
        ));
        let args = AttentionArgs {
            q: &qkv,
            k_cache: &kc,
            v_cache: &vc,
            positions: &positions,
            out: &out,
            tokens: 1,
            n_head: nh,
            n_kv_head: nkv,
            head_dim,
            window: 0,
            scale: 1.0,
            softcap: 0.0,
            q_stride: width,
            last_key: None,
            first_key: None,
            slot_rows: 0,
        };
        let heads = ops::HeadPostArgs {
            qkv: &qkv,
            q_norm: &q_norm,
            kv: Some(ops::HeadPostKv {
                k_norm: &k_norm,
                k_cache: &kc,
                v_cache: &vc,
                n_kv: nkv,
                k_is_v: false,
                v_norm: true,
            }),
            positions: &positions,
            tokens: 1,
            n_head: nh,
            head_dim,
            stride: width,
            n_rot: head_dim,
            base: 10000.0,
            freq_scale: 1.0,
            freq_factors: None,
            eps: 1e-6,
            slot_rows: 0,
        };
        let a = ops::attention_decode(&ctx, &args, 0, &scratch, None).unwrap();
        let post = ops::head_post(&ctx, &heads).unwrap();
        let f = ops::attention_decode(&ctx, &args, 0, &scratch, Some(&heads)).unwrap();
        let variants = [
            ("split", vec![a.split.clone(), a.combine.clone()]),
            ("head_post+split", vec![post, a.split, a.combine]),
            ("fused", vec![f.split, f.combine]),
        ];
        group.throughput(Throughput::Bytes(2 * kv as u64 * 4));
        for (name, ds) in &variants {
            group.bench_function(
                BenchmarkId::new(format!("hd{head_dim}/{name}"), context_len),
                |b| b.iter_custom(|iters| time_in_one_pass(&ctx, ds, iters)),
            );
        }
    }
    group.finish();
    attention_prefill(c);
    attend_image(c);
}

/// A 512-token prompt's causal attention at E2B's shapes (8 query heads over 1 KV head);
/// throughput in query-key pairs, reported as elements.
fn attention_prefill(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("attention_prefill");
    let (nh, nkv, tokens) = (8u32, 1u32, 512u32);
    for head_dim in [256u32, 512] {
        let kv = (tokens * nkv * head_dim) as usize;
        let q = View::of(&ctx.storage_init(
            "q",
            bytemuck::cast_slice(&random((tokens * nh * head_dim) as usize, 1)),
        ));
        let kc = View::of(&ctx.storage_init("k", bytemuck::cast_slice(&random(kv, 2))));
        let vc = View::of(&ctx.storage_init("v", bytemuck::cast_slice(&random(kv, 3))));
        let pos: Vec<u32> = (0..tokens).collect();
        let positions = View::of(&ctx.storage_init("pos", bytemuck::cast_slice(&pos)));
        let out = View::of(&ctx.storage("out", u64::from(tokens * nh * head_dim) * 4));
        let args = AttentionArgs {
            q: &q,
            k_cache: &kc,
            v_cache: &vc,
            positions: &positions,
            out: &out,
            tokens,
            n_head: nh,
            n_kv_head: nkv,
            head_dim,
            window: 0,
            scale: 0.05,
            softcap: 0.0,
            q_stride: nh * head_dim,
            last_key: None,
            first_key: None,
            slot_rows: 0,
        };
        let ds = [ops::attention(&ctx, &args).unwrap()];
        group.throughput(Throughput::Elements(
            u64::from(nh) * u64::from(tokens) * u64::from(tokens + 1) / 2,
        ));
        group.bench_function(BenchmarkId::new(format!("hd{head_dim}"), tokens), |b| {
            b.iter_custom(|iters| time_in_one_pass(&ctx, &ds, iters))
        });
    }
    group.finish();
}

/// The vision tower's attention (`ops::attend`, full mask, scale 1) at the E2B tower's shapes
/// (12 heads of 64, q|k|v side by side in one buffer) for 2,457 and 10,080 patches (the 280
/// and 1120 budgets), on each kernel the device has; throughput in query-key pairs.
fn attend_image(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("attend_image");
    group.sample_size(10);
    let (heads, d) = (12u32, 64u32);
    for n in [2457u32, 10_080] {
        let width = 3 * heads * d;
        let qkv = View::of(&ctx.storage_init(
            "qkv",
            bytemuck::cast_slice(&random((n * width) as usize, 11)),
        ));
        let out = View::of(&ctx.storage("out", u64::from(n * heads * d) * 4));
        let head = |i: u32| {
            Tensor::strided(
                &qkv,
                DType::F32,
                &[n, heads, d],
                &[width, d, 1],
                i * heads * d,
            )
            .unwrap()
        };
        let (q, k, v) = (head(0), head(1), head(2));
        let o = Tensor::new(&out, &[n, heads, d]).unwrap();
        let a = ops::Attend {
            q: &q,
            k: &k,
            v: &v,
            mask: ops::Mask::Full,
            q_pos0: 0,
            scale: 1.0,
            softcap: 0.0,
            relative: None,
        };
        group.throughput(Throughput::Elements(
            u64::from(heads) * u64::from(n) * u64::from(n),
        ));
        for kernel in [ops::AttendKernel::Tiled, ops::AttendKernel::Coop] {
            let Ok(d) = ops::attend_with(&ctx, &a, &o, kernel) else {
                continue;
            };
            let ds = [d];
            group.bench_function(BenchmarkId::new(format!("{kernel:?}"), n), |b| {
                b.iter_custom(|iters| time_in_one_pass(&ctx, &ds, iters))
            });
        }
        // The tower's form where the device has tensor cores: q, k and v as f16.
        let bits: Vec<u16> = random((n * width) as usize, 12)
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let halves = View::of(&ctx.storage_init("qkv f16", bytemuck::cast_slice(&bits)));
        let half_head = |i: u32| {
            let dims = [n, heads, d];
            Tensor::strided(&halves, DType::F16, &dims, &[width, d, 1], i * heads * d).unwrap()
        };
        let (hq, hk, hv) = (half_head(0), half_head(1), half_head(2));
        let h = ops::Attend {
            q: &hq,
            k: &hk,
            v: &hv,
            ..a
        };
        if let Ok(d) = ops::attend(&ctx, &h, &o) {
            let ds = [d];
            group.bench_function(BenchmarkId::new("CoopF16", n), |b| {
                b.iter_custom(|iters| time_in_one_pass(&ctx, &ds, iters))
            });
        }
    }
    group.finish();
}

/// The matrix-vector product at each (threads per row, rows per group) for the quantized
/// dtypes of Gemma's matrices (Q4_K heads loading a step ahead, as chosen): the table
/// [`ops::MatvecTuning::choose`] is fitted to. The head shape, then E2B's decode shapes
/// (Q, O, interleaved gate/up, down, per-layer gate and projection); Gemma 3 270M's head.
fn matvec_tuning(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("matvec_tuning");
    for dtype in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0] {
        for (rows, cols) in [
            (262_144u64, 1536u64),
            (262_144, 640),
            (2048, 1536),
            (1536, 2048),
            (12288, 1536),
            (1536, 6144),
            (256, 1536),
            (1536, 256),
        ] {
            // Rows of 640 (Gemma 3 270M's head) take no K-quant.
            let Some((w, x, y, bytes)) = matvec_operands(&ctx, dtype, rows, cols) else {
                continue;
            };
            let head = rows > 12288;
            if !head && dtype == GgmlType::Q8_0 {
                continue;
            }
            for tpr in [4u32, 8, 16, 32, 64, 128] {
                for rpt in [1u32, 2, 4] {
                    if (head && (tpr > 32 || rpt < 2)) || (!head && tpr == 4) {
                        continue;
                    }
                    // Heads of K-quants also with 8-bit inputs.
                    let int8 = if head && ops::int8_input_fits(&ctx, dtype, cols as u32, false) {
                        &[false, true][..]
                    } else {
                        &[false][..]
                    };
                    for &int8_input in int8 {
                        let tuning = ops::MatvecTuning {
                            tpr,
                            rpt,
                            prefetch: head && dtype == GgmlType::Q4K,
                            int8_input,
                        };
                        let rows_out = ops::MatvecOut::Rows { softcap: 0.0 };
                        let ds =
                            ops::matvec_tuned(&ctx, &w, &x, &y, 1, rows_out, Some(tuning)).unwrap();
                        let name = if int8_input { "i8" } else { "" };
                        group.throughput(Throughput::Bytes(bytes));
                        group.bench_with_input(
                            BenchmarkId::new(
                                dtype.name(),
                                format!("{rows}x{cols}/t{tpr}r{rpt}{name}"),
                            ),
                            &ds,
                            |b, ds| b.iter_custom(|iters| time_in_one_pass(&ctx, ds, iters)),
                        );
                    }
                }
            }
            let chosen =
                ops::matvec(&ctx, &w, &x, &y, 0, ops::MatvecOut::Rows { softcap: 0.0 }).unwrap();
            group.bench_with_input(
                BenchmarkId::new(dtype.name(), format!("{rows}x{cols}/chosen")),
                &chosen,
                |b, ds| b.iter_custom(|iters| time_in_one_pass(&ctx, ds, iters)),
            );
        }
    }
    group.finish();
}

/// The vectors of a residual step between blocks of width d (random stream, delta and norm
/// weights; the outputs), for [`ResidualVectors::step`].
struct ResidualVectors {
    res: View,
    delta: View,
    post: View,
    pre: View,
    res_out: View,
    normed: View,
}

impl ResidualVectors {
    fn new(ctx: &GpuContext, d: u64) -> Self {
        let vector = |seed| {
            View::of(&ctx.storage_init("v", bytemuck::cast_slice(&random(d as usize, seed))))
        };
        Self {
            res: vector(1),
            delta: vector(2),
            post: vector(3),
            pre: vector(4),
            res_out: vector(5),
            normed: vector(6),
        }
    }

    /// The step with the next block's norm, at scale 1.
    fn step(&self) -> ops::ResidualStep<'_> {
        ops::ResidualStep {
            res: &self.res,
            delta: ops::Delta::Row(&self.delta),
            post: &self.post,
            scale: 1.0,
            eps: 1e-6,
            res_out: &self.res_out,
            next_norm: Some((&self.pre, &self.normed)),
        }
    }
}

/// The step between two blocks and the next block's first product (E2B's Q and gate/up
/// shapes, Q4_K): as two dispatches, and fused into one.
fn residual_matvec(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("residual_matvec");
    let d = 1536u64;
    let v = ResidualVectors::new(&ctx, d);
    let (res, delta, post, pre, normed) = (&v.res, &v.delta, &v.post, &v.pre, &v.normed);
    for (rows, out) in [
        (2048u64, ops::MatvecOut::Rows { softcap: 0.0 }),
        (12288, ops::MatvecOut::Geglu),
    ] {
        let (w, _, y, bytes) = matvec_operands(&ctx, GgmlType::Q4K, rows, d).unwrap();
        let mut two = vec![
            ops::residual_norm(
                &ctx,
                &ops::ResidualNorm {
                    res,
                    delta,
                    post,
                    weight: pre,
                    out: normed,
                    rows: 1,
                    dim: d as u32,
                    scale: 1.0,
                    eps: 1e-6,
                },
            )
            .unwrap(),
        ];
        two.extend(ops::matvec(&ctx, &w, normed, &y, 0, out).unwrap());
        let one = ops::matvec_after_residual(&ctx, &w, &v.step(), &y, 0, out).unwrap();
        group.throughput(Throughput::Bytes(bytes));
        for (name, ds) in [("separate", &two), ("fused", &one)] {
            group.bench_with_input(
                BenchmarkId::new(name, format!("{rows}x{d}")),
                ds,
                |b, ds| b.iter_custom(|iters| time_in_one_pass(&ctx, ds, iters)),
            );
        }
    }
    group.finish();
}

/// The layers' matrices of E2B and E4B at the tuning chosen for them and at others: plain
/// products (O and down) and products behind the residual step (Q|K and gate/up), whose
/// prologue every workgroup pays. Each round runs over copies of the weight that together
/// overflow the GPU's cache many times, as a decode step's layers do (one matrix read over
/// and over would be served from the cache); times are per product. Names: `chosen`, or
/// `t{lanes}r{rows}`.
fn layer_tuning(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("layer_tuning");
    let tuning = |tpr, rpt| {
        Some(ops::MatvecTuning {
            tpr,
            rpt,
            prefetch: false,
            int8_input: false,
        })
    };
    let copies_of = |dtype, rows, cols| {
        let (w, x, y, bytes) = matvec_operands(&ctx, dtype, rows, cols).unwrap();
        let mut ws = vec![w];
        while (ws.len() as u64) * bytes < 512 << 20 {
            ws.push(matvec_operands(&ctx, dtype, rows, cols).unwrap().0);
        }
        (ws, x, y, bytes)
    };
    let mut bench =
        |what: &str, shape: String, bytes, t: Option<ops::MatvecTuning>, ds: Vec<Vec<_>>| {
            let name = t.map_or("chosen".into(), |t| format!("t{}r{}", t.tpr, t.rpt));
            let copies = ds.len() as u32;
            let ds: Vec<_> = ds.into_iter().flatten().collect();
            group.throughput(Throughput::Bytes(bytes));
            group.bench_with_input(
                BenchmarkId::new(what, format!("{shape}/{name}")),
                &ds,
                |b, ds| b.iter_custom(|iters| time_in_one_pass(&ctx, ds, iters) / copies),
            );
        };
    for dtype in [GgmlType::Q4K, GgmlType::Q6K] {
        for (rows, cols) in [
            (1536u64, 2048u64),
            (1536, 6144),
            (1536, 12288),
            (2560, 10240),
        ] {
            let (ws, x, y, bytes) = copies_of(dtype, rows, cols);
            let mut tunings = vec![None];
            for tpr in [64u32, 128, 256] {
                tunings.extend([1, 2, 4].map(|rpt| tuning(tpr, rpt)));
            }
            for t in tunings {
                let out = ops::MatvecOut::Rows { softcap: 0.0 };
                let ds = ws
                    .iter()
                    .map(|w| ops::matvec_tuned(&ctx, w, &x, &y, 1, out, t).unwrap())
                    .collect();
                bench(dtype.name(), format!("{rows}x{cols}"), bytes, t, ds);
            }
        }
    }
    for (rows, d, geglu) in [
        (2304u64, 1536u64, false),
        (12288, 1536, true),
        (24576, 1536, true),
        (2560, 2560, false),
        (20480, 2560, true),
    ] {
        let v = ResidualVectors::new(&ctx, d);
        let step = v.step();
        let (ws, _, y, bytes) = copies_of(GgmlType::Q4K, rows, d);
        let out = if geglu {
            ops::MatvecOut::Geglu
        } else {
            ops::MatvecOut::Rows { softcap: 0.0 }
        };
        let mut tunings = vec![None];
        tunings.extend([16u32, 32, 64, 128].map(|tpr| tuning(tpr, 4)));
        for t in tunings {
            let ds = ws
                .iter()
                .map(|w| ops::matvec_after_residual_tuned(&ctx, w, &step, &y, 0, out, t).unwrap())
                .collect();
            bench("residual", format!("{rows}x{d}"), bytes, t, ds);
        }
    }
    group.finish();
}

/// Prefill: 512 tokens through a weight, and 64 (a short prompt: one tile of tokens);
/// throughput in multiply-adds, reported as elements.
fn matmul_prefill(c: &mut Criterion) {
    for m in [512u64, 64] {
        matmul_tokens(c, m);
    }
}

fn matmul_tokens(c: &mut Criterion, m: u64) {
    let ctx = context();
    let mut group = c.benchmark_group(format!("matmul{m}"));
    for dtype in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::F16] {
        // E2B's Q, gate or up, down and per-layer gate.
        let mut shapes = vec![(2048u64, 1536u64), (6144, 1536), (1536, 6144), (256, 1536)];
        if std::env::var_os("WGEMMA_BENCH_SQUARE").is_some() {
            shapes.extend([(1536, 1536), (6144, 6144), (1536, 3072), (3072, 6144)]);
        }
        for (rows, cols) in shapes {
            bench_product(&ctx, &mut group, dtype, (rows, cols, m), dtype.name());
        }
    }
    group.finish();
}

/// The towers' products (f16 weights): the E2B vision tower's over a 273-token image's
/// 2,457 patches and a 1,120-token one's 10,080, the audio tower's over a 30 s chunk's 750
/// frames.
fn matmul_towers(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("matmul_towers");
    let shapes = [
        ("vision", 768u64, 768u64, 2457u64),
        ("vision", 3072, 768, 2457),
        ("vision", 768, 3072, 2457),
        ("vision", 768, 768, 10080),
        ("vision", 3072, 768, 10080),
        ("audio", 1024, 1024, 750),
        ("audio", 4096, 1024, 750),
        ("audio", 1024, 4096, 750),
    ];
    for (tower, rows, cols, m) in shapes {
        let name = format!("{tower}/F16/m{m}");
        bench_product(&ctx, &mut group, GgmlType::F16, (rows, cols, m), &name);
    }
    group.finish();
}

/// One product of a random `rows` x `cols` weight of `dtype` over `m` tokens, named
/// `name/ROWSxCOLS`; throughput in multiply-adds, reported as elements.
fn bench_product(
    ctx: &GpuContext,
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    dtype: GgmlType,
    (rows, cols, m): (u64, u64, u64),
    name: &str,
) {
    let q = quantize(dtype, &random((rows * cols) as usize, 3)).unwrap();
    let w = GpuWeight::upload(ctx, "w", dtype, cols, rows, &q, None).unwrap();
    let x = View::of(&ctx.storage_init("x", bytemuck::cast_slice(&random((m * cols) as usize, 5))));
    let y = View::of(&ctx.storage("y", m * rows * 4));
    let args = MatmulArgs {
        x: &x,
        y: &y,
        m: m as u32,
        x_stride: cols as u32,
        y_stride: rows as u32,
        out: ops::MatvecOut::Rows { softcap: 0.0 },
        y_offset: 0,
        partials: None,
    };
    let ds = ops::matmul(ctx, &w, &args).unwrap();
    group.throughput(Throughput::Elements(m * rows * cols));
    group.bench_with_input(
        BenchmarkId::new(name, format!("{rows}x{cols}")),
        &ds,
        |b, ds| b.iter_custom(|iters| time_in_one_pass(ctx, ds, iters)),
    );
}

/// What one dependent dispatch costs in a pass: a tiny elementwise op on a 1536-vector (each
/// waits for the one before), and the residual+norm step between blocks. Every decode step
/// pays the first once per kernel; it is the budget fused kernels save.
fn dispatch_floor(c: &mut Criterion) {
    let ctx = context();
    let mut group = c.benchmark_group("dispatch");
    let d = 1536u32;
    let x = View::of(&ctx.storage_init("x", bytemuck::cast_slice(&random(d as usize, 1))));
    let delta = View::of(&ctx.storage_init("delta", bytemuck::cast_slice(&random(d as usize, 2))));
    let w = View::of(&ctx.storage_init("w", bytemuck::cast_slice(&random(d as usize, 3))));
    let y = View::of(&ctx.storage("y", u64::from(d) * 4));
    let scale = [ops::elementwise(&ctx, ops::Elementwise::Scale(1.0), &x, d).unwrap()];
    group.bench_function("scale/1536", |b| {
        b.iter_custom(|iters| time_in_one_pass(&ctx, &scale, iters))
    });
    let norm = [ops::residual_norm(
        &ctx,
        &ops::ResidualNorm {
            res: &x,
            delta: &delta,
            post: &w,
            weight: &w,
            out: &y,
            rows: 1,
            dim: d,
            scale: 1.0,
            eps: 1e-6,
        },
    )
    .unwrap()];
    group.bench_function("residual_norm/1536", |b| {
        b.iter_custom(|iters| time_in_one_pass(&ctx, &norm, iters))
    });
    group.finish();
}

criterion_group!(
    benches,
    dispatch_floor,
    matvec,
    matvec_tuning,
    residual_matvec,
    layer_tuning,
    matmul_prefill,
    matmul_towers,
    attention
);
criterion_main!(benches);
