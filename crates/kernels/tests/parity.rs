//! Every GPU kernel against its CPU reference, on random non-zero data, at several shapes
//! including sizes that are not multiples of the workgroup or block size. Outputs are
//! poisoned with NaN first, so an element the kernel fails to write fails the test.

use wgemma_gguf::{GgmlType, dequantize_to_vec, quantize};
use wgemma_kernels::ops::{
    self, AttentionArgs, AttentionKernel, Elementwise, MatmulArgs, NormOut, RopeArgs,
};
use wgemma_kernels::params::ElementwiseParams;
use wgemma_kernels::{
    ContextOptions, Dispatch, GPU_DTYPES, GpuContext, GpuWeight, Params, Recorder, View, WaitMode,
    cpu, wgpu,
};
use wgemma_test_support::{
    Rng, assert_close, gpu, poisoned, read, rel_err_rms as rel_err, run, upload, upload_u32,
};

#[path = "parity/general.rs"]
mod general;

/// The test binary's context (`wgemma_test_support::gpu`).
fn ctx() -> Option<&'static GpuContext> {
    gpu().map(|c| &**c)
}

/// A product's operands as the CPU takes them: `n` rows of `k` dequantized values of a
/// `dtype` weight, and `m` tokens of inputs.
#[derive(Clone, Copy)]
struct Operands<'a> {
    dtype: GgmlType,
    w: &'a [f32],
    n: usize,
    k: usize,
    x: &'a [f32],
    m: usize,
}

impl<'a> Operands<'a> {
    /// `w` of `[n, k]`, `m` tokens in `x`.
    fn of(dtype: GgmlType, w: &'a [f32], [n, k]: [usize; 2], x: &'a [f32], m: usize) -> Self {
        Self {
            dtype,
            w,
            n,
            k,
            x,
            m,
        }
    }
}

/// The CPU product the GPU's `ops::matmul` is held to, with its tolerance, for the kernel the
/// tokens take (`tiled`, or matrix-vector): the tiled kernels multiply f16 operands on a
/// device with cooperative matrices, and K-quant rows with inputs rounded to 8-bit integers
/// on one without (both rounded the same way here).
fn matmul_reference(ctx: &GpuContext, o: Operands<'_>, tiled: bool) -> (Vec<f32>, f32) {
    let Operands { w, n, k, x, m, .. } = o;
    if tiled && ctx.features.coop_matmul {
        (cpu::matmul_f16_inputs(w, n, k, x, m), 3e-4)
    } else if tiled && ops::tiles_round_inputs(ctx, o.dtype) {
        let rounded: Vec<f32> = x.chunks(k).flat_map(cpu::round_to_int8).collect();
        (cpu::matmul(w, n, k, &rounded, m), 1e-4)
    } else {
        (cpu::matmul(w, n, k, x, m), 2e-5)
    }
}

/// Moves inputs off the 8-bit rounding's ties: a value whose `x * 127 / max|x|` (per 32
/// values of each `k`-long row, rows `stride` apart) lies within 1e-3 of a half step is
/// shrunk until none does. Vulkan lets a division be 2.5 ULP off, so on some GPUs (NVIDIA's)
/// such a value rounds the other way than on the CPU, which moves a product by one step of
/// the rounding; away from the ties the integer products must equal the reference.
fn off_ties(x: &mut [f32], k: usize, stride: usize) {
    for row in x.chunks_mut(stride) {
        let n = k.min(row.len());
        for b in row[..n].chunks_mut(32) {
            let a = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            if a == 0.0 {
                continue;
            }
            // Shrinking a value other than the largest leaves the scale as it is.
            let inv = 127.0 / a;
            for v in b.iter_mut() {
                while ((*v * inv).abs().fract() - 0.5).abs() < 1e-3 {
                    *v *= 0.997;
                }
            }
        }
    }
}

/// `ops::matmul`'s output as the device routes it (a CPU adapter takes every token count as
/// matrix-vector products) and through the tiled kernel past `MATVEC_MAX_TOKENS` on every
/// device, each run into `a.y` poisoned again first, with whether the tiled kernel ran.
fn matmul_both_ways(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
) -> [(&'static str, bool, Vec<f32>); 2] {
    let tiled = a.m > ops::MATVEC_MAX_TOKENS;
    [
        (
            "routed",
            tiled && a.m > ops::matvec_max_tokens(ctx),
            ops::matmul(ctx, w, a).unwrap(),
        ),
        ("tiled", tiled, ops::matmul_in_parts(ctx, w, a, 1).unwrap()),
    ]
    .map(|(how, tiled, ds)| {
        let nan = vec![f32::NAN; a.y.len32() as usize];
        ctx.write(&a.y.buffer, a.y.offset, bytemuck::cast_slice(&nan));
        run(ctx, &ds.iter().collect::<Vec<_>>());
        (how, tiled, read(ctx, a.y))
    })
}

/// Interleaved gate/up rows' gated activation: gelu(gate) * up per pair.
fn gated(rows: &[f32]) -> Vec<f32> {
    rows.chunks(2)
        .map(|p| cpu::gelu_tanh(p[0]) * p[1])
        .collect()
}

#[test]
fn matmul_matches_cpu_for_every_dtype_and_shape() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for dtype in GPU_DTYPES {
        let kq = dtype.block_size().max(32) as u64;
        // (k, n, m): matvec (m <= 4) and tiled (m > 4), odd row and token counts.
        let shapes = [
            (kq, 1, 1),
            (kq * 2, 37, 1),
            (kq * 3, 70, 3),
            (kq, 65, 5),
            (kq * 2, 129, 37),
            (kq * 4, 3, 2),
            (kq * 3, 260, 130),
        ];
        // Float rows that end inside a 32-value unit (Gemma 4's tiny per-layer width 8).
        let short_rows = [(8, 37, 1), (36, 70, 3), (100, 65, 40), (8, 130, 9)];
        let float = dtype.block_size() == 1;
        for (k, n, m) in shapes
            .into_iter()
            .chain(short_rows.into_iter().filter(|_| float))
        {
            let wf = rng.vec((k * n) as usize, 0.5);
            let wq = quantize(dtype, &wf).unwrap();
            let wd = dequantize_to_vec(dtype, &wq).unwrap();
            let mut x = rng.vec((m * k) as usize, 1.0);
            off_ties(&mut x, k as usize, k as usize);
            let operands = Operands::of(dtype, &wd, [n as usize, k as usize], &x, m as usize);
            let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
            let xv = upload(ctx, &x);
            let yv = poisoned(ctx, (m * n) as usize);
            let args = MatmulArgs {
                x: &xv,
                y: &yv,
                m: m as u32,
                x_stride: k as u32,
                y_stride: n as u32,
                out: ops::MatvecOut::Rows { softcap: 0.0 },
                y_offset: 0,
                partials: None,
            };
            for (how, tiled, y) in matmul_both_ways(ctx, &w, &args) {
                let (want, tol) = matmul_reference(ctx, operands, tiled);
                assert_close(&format!("{how} {dtype} k={k} n={n} m={m}"), &y, &want, tol);
            }
        }
    }
}

/// `clamp(W clamp(x))` with the clamps inside the tiled product, at token counts either side
/// of the matrix-vector limit (a clamped product is always tiled), against the CPU; bad
/// ranges and gated outputs are refused.
#[test]
fn clamped_products_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0xc1a4_9000);
    // F16 rows that end inside a unit (the vision tower's), and Q8_0 ones (integer dot
    // products where the device has them on: the input clamp before the rounding).
    for (dtype, k) in [(GgmlType::F16, 100u64), (GgmlType::Q8_0, 96)] {
        clamped_products_on(ctx, &mut rng, dtype, k);
    }
}

fn clamped_products_on(ctx: &GpuContext, rng: &mut Rng, dtype: GgmlType, k: u64) {
    let n = 70u64;
    let wq = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
    let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
    let wd = dequantize_to_vec(dtype, &wq).unwrap();
    let clamp = ops::ProductClamp {
        input: Some([-0.4, 0.6]),
        output: Some([-1.5, 0.9]),
    };
    for m in [3u32, 41] {
        let mut x = rng.vec((m as u64 * k) as usize, 1.0);
        // Off the ties as the kernel sees the inputs, clamped: a value moved inside the
        // bounds is the input itself.
        let mut clamped: Vec<f32> = x.iter().map(|v| v.clamp(-0.4, 0.6)).collect();
        off_ties(&mut clamped, k as usize, k as usize);
        for (v, c) in x.iter_mut().zip(&clamped) {
            if *c != v.clamp(-0.4, 0.6) {
                *v = *c;
            }
        }
        // A clamped product is always tiled.
        let operands = Operands::of(dtype, &wd, [n as usize, k as usize], &clamped, m as usize);
        let (mut want, tol) = matmul_reference(ctx, operands, true);
        let hit = want.iter().filter(|v| **v < -1.5 || **v > 0.9).count();
        assert!(hit > 0, "the output clamp bites somewhere");
        want.iter_mut().for_each(|v| *v = v.clamp(-1.5, 0.9));
        let (xv, yv) = (upload(ctx, &x), poisoned(ctx, (m as u64 * n) as usize));
        let args = MatmulArgs {
            x: &xv,
            y: &yv,
            m,
            x_stride: k as u32,
            y_stride: n as u32,
            out: ops::MatvecOut::Rows { softcap: 0.0 },
            y_offset: 0,
            partials: None,
        };
        let ds = ops::matmul_clamped(ctx, &w, &args, clamp).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        assert_close(
            &format!("{dtype} clamped m={m}"),
            &read(ctx, &yv),
            &want,
            tol,
        );
        // Split over k in two: the input clamp in each part, the output clamp on the sum.
        let partials = poisoned(ctx, (2 * m as u64 * n) as usize);
        let (yv, split) = (poisoned(ctx, (m as u64 * n) as usize), partials.clone());
        let in_parts = MatmulArgs {
            y: &yv,
            partials: Some(&split),
            ..args
        };
        let ds = ops::matmul_clamped_in_parts(ctx, &w, &in_parts, clamp, 2).unwrap();
        assert!(
            ds.len() > w.tiles.len(),
            "a summing dispatch after the parts"
        );
        run(ctx, &ds.iter().collect::<Vec<_>>());
        assert_close(
            &format!("{dtype} clamped m={m} in 2 parts"),
            &read(ctx, &yv),
            &want,
            tol,
        );
        let inverted = ops::ProductClamp {
            input: Some([1.0, -1.0]),
            output: None,
        };
        assert!(ops::matmul_clamped(ctx, &w, &args, inverted).is_err());
        let gated = MatmulArgs {
            out: ops::MatvecOut::Geglu,
            ..args
        };
        assert!(ops::matmul_clamped(ctx, &w, &gated, clamp).is_err());
        // A gate times another factor read in y's layout: columns 3.. of rows 75 apart.
        let stride = n as u32 + 5;
        let by = rng.vec((m * stride) as usize, 1.0);
        let (byv, yv) = (upload(ctx, &by), poisoned(ctx, (m * stride) as usize));
        let gate = MatmulArgs {
            y: &yv,
            y_stride: stride,
            y_offset: 3,
            out: ops::MatvecOut::GeluTimes {
                by: &byv,
                offset: 3,
            },
            ..args
        };
        let ds = ops::matmul_clamped(ctx, &w, &gate, clamp).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let got = read(ctx, &yv);
        let got: Vec<f32> = (0..(m * n as u32) as usize)
            .map(|i| got[(i / n as usize) * stride as usize + 3 + i % n as usize])
            .collect();
        let gated_want: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, &g)| {
                let at = (i / n as usize) * stride as usize + 3 + i % n as usize;
                cpu::activation(ops::Activation::GeluTanh, g) * by[at]
            })
            .collect();
        assert_close(
            &format!("{dtype} clamped gate m={m}"),
            &got,
            &gated_want,
            tol,
        );
        let elsewhere = MatmulArgs {
            out: ops::MatvecOut::GeluTimes {
                by: &byv,
                offset: 0,
            },
            ..gate
        };
        assert!(ops::matmul_clamped(ctx, &w, &elsewhere, clamp).is_err());
    }
}

#[test]
fn matmul_across_tiles_with_strides_and_softcap() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(77);
    for dtype in [GgmlType::Q8_0, GgmlType::Q6K, GgmlType::F32] {
        let (k, n) = (256u64, 301u64);
        let wf = rng.vec((k * n) as usize, 0.5);
        let wq = quantize(dtype, &wf).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        // Tiles of ~50 rows: 7 tiles, the last one short.
        let tile = dtype.bytes_for(k).unwrap() * 50 + 16;
        let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, Some(tile)).unwrap();
        assert_eq!(w.tiles.len(), 7);
        for m in [1u32, 2, 9, 70] {
            let (xs, ys) = (k as u32 + 36, n as u32 + 5);
            // Rows land 2 columns in: weights side by side in one output.
            let mut x = rng.vec((m * xs) as usize, 1.0);
            off_ties(&mut x, k as usize, xs as usize);
            let packed: Vec<f32> = (0..m as usize)
                .flat_map(|t| x[t * xs as usize..][..k as usize].to_vec())
                .collect();
            let operands = Operands::of(dtype, &wd, [n as usize, k as usize], &packed, m as usize);
            x.truncate((m * xs) as usize);
            let xv = upload(ctx, &x);
            let yv = poisoned(ctx, (m * ys) as usize);
            let args = MatmulArgs {
                x: &xv,
                y: &yv,
                m,
                x_stride: xs,
                y_stride: ys,
                out: ops::MatvecOut::Rows { softcap: 3.0 },
                y_offset: 2,
                partials: None,
            };
            for (how, tiled, y) in matmul_both_ways(ctx, &w, &args) {
                let (mut want, tol) = matmul_reference(ctx, operands, tiled);
                want.iter_mut().for_each(|v| *v = cpu::softcap(*v, 3.0));
                let got: Vec<f32> = (0..m as usize)
                    .flat_map(|t| y[t * ys as usize + 2..][..n as usize].to_vec())
                    .collect();
                assert_close(&format!("{how} {dtype} m={m}"), &got, &want, tol);
                // The columns around the rows stay untouched.
                assert!(
                    y[..2]
                        .iter()
                        .chain(&y[n as usize + 2..ys as usize])
                        .all(|v| v.is_nan())
                );
            }
        }
    }
}

/// A tiled product split over k: every part's sums (the partials start as NaN, so a part left
/// unwritten would show) add up, softcapped, at the output's offset across weight tiles, to
/// the unsplit product; at an even split, one whose last part is shorter, and one step a
/// part. A gated output, a split into unequal parts, or one without room is refused.
#[test]
fn matmul_split_over_k_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(83);
    // 20 steps of 64 values.
    let (k, n) = (1280u64, 301u64);
    for dtype in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::F16] {
        let wq = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let tile = dtype.bytes_for(k).unwrap() * 130 + 16;
        let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, Some(tile)).unwrap();
        assert_eq!(w.tiles.len(), 3);
        for (m, parts) in [(5u32, 2u32), (70, 3), (9, 20)] {
            let mut x = rng.vec(m as usize * k as usize, 1.0);
            off_ties(&mut x, k as usize, k as usize);
            let operands = Operands::of(dtype, &wd, [n as usize, k as usize], &x, m as usize);
            let (mut want, tol) = matmul_reference(ctx, operands, true);
            want.iter_mut().for_each(|v| *v = cpu::softcap(*v, 3.0));
            let ys = n as u32 + 5;
            let yv = poisoned(ctx, (m * ys) as usize);
            let partials = poisoned(ctx, (parts * m) as usize * n as usize);
            let xv = upload(ctx, &x);
            let args = MatmulArgs {
                x: &xv,
                y: &yv,
                m,
                x_stride: k as u32,
                y_stride: ys,
                out: ops::MatvecOut::Rows { softcap: 3.0 },
                y_offset: 2,
                partials: Some(&partials),
            };
            let ds = ops::matmul_in_parts(ctx, &w, &args, parts).unwrap();
            assert_eq!(ds.len(), w.tiles.len() + 1);
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let y = read(ctx, &yv);
            let got: Vec<f32> = y
                .chunks(ys as usize)
                .flat_map(|r| r[2..][..n as usize].to_vec())
                .collect();
            assert_close(&format!("{dtype} m={m} in {parts} parts"), &got, &want, tol);
            assert!(y.chunks(ys as usize).all(|r| {
                r[..2]
                    .iter()
                    .chain(&r[n as usize + 2..])
                    .all(|v| v.is_nan())
            }));
            let short = poisoned(ctx, (parts * m) as usize * n as usize - 1);
            let cramped = MatmulArgs {
                partials: Some(&short),
                ..args
            };
            assert!(ops::matmul_in_parts(ctx, &w, &cramped, parts).is_err());
            let roomless = MatmulArgs {
                partials: None,
                ..args
            };
            assert!(ops::matmul_in_parts(ctx, &w, &roomless, parts).is_err());
            let gated = MatmulArgs {
                out: ops::MatvecOut::Geglu,
                ..args
            };
            assert!(ops::matmul_in_parts(ctx, &w, &gated, parts).is_err());
        }
        // 20 steps in parts of 4 make 5 parts, not 6.
        let x = upload(ctx, &rng.vec(5 * k as usize, 1.0));
        let (y, partials) = (
            poisoned(ctx, 5 * n as usize),
            poisoned(ctx, 30 * n as usize),
        );
        let args = MatmulArgs {
            x: &x,
            y: &y,
            m: 5,
            x_stride: k as u32,
            y_stride: n as u32,
            out: ops::MatvecOut::Rows { softcap: 0.0 },
            y_offset: 0,
            partials: Some(&partials),
        };
        assert!(ops::matmul_in_parts(ctx, &w, &args, 6).is_err());
    }
}

/// Dispatches built in one parameter batch share uniform buffers: each still runs with its
/// own parameters, also past one buffer's worth of blocks, and a block rewritten later
/// changes only its own dispatch.
#[test]
fn dispatches_of_a_params_batch_keep_their_parameters() {
    let Some(ctx) = ctx() else { return };
    let n = 300u32;
    let views: Vec<View> = (0..300)
        .map(|_| upload(ctx, &vec![1.0; n as usize]))
        .collect();
    let factor = |i: usize| 1.0 + i as f32 / 64.0;
    let ds: Vec<Dispatch> = ctx.with_params_batch(|| {
        views
            .iter()
            .enumerate()
            .map(|(i, v)| ops::elementwise(ctx, Elementwise::Scale(factor(i)), v, n).unwrap())
            .collect()
    });
    run(ctx, &ds.iter().collect::<Vec<_>>());
    for (i, v) in views.iter().enumerate() {
        assert!(read(ctx, v).iter().all(|&x| x == factor(i)), "dispatch {i}");
    }
    // The op's parameter block, with another factor.
    let rewritten = Params::of(&ElementwiseParams::over(n, 2.0));
    ds[7].update_params(ctx, &rewritten);
    run(ctx, &[&ds[7], &ds[8]]);
    assert!(read(ctx, &views[7]).iter().all(|&x| x == factor(7) * 2.0));
    assert!(
        read(ctx, &views[8])
            .iter()
            .all(|&x| x == factor(8) * factor(8))
    );
}

#[test]
fn matmul_gated_output_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(91);
    for dtype in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::F16] {
        let k = dtype.block_size().max(64) as u64;
        // 70 gate/up pairs: a partial tile in both kernels' row tiles.
        let (n, ff) = (140u64, 70u32);
        let wf = rng.vec((k * n) as usize, 0.5);
        let wq = quantize(dtype, &wf).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
        // Matrix-vector (3 tokens) and tiled (37, 130) paths; outputs land 5 columns into
        // rows of ff + 9.
        for m in [3usize, 37, 130] {
            let mut x = rng.vec(m * k as usize, 1.0);
            off_ties(&mut x, k as usize, k as usize);
            let operands = Operands::of(dtype, &wd, [n as usize, k as usize], &x, m);
            let (stride, offset) = (ff + 9, 5u32);
            let yv = poisoned(ctx, m * stride as usize);
            let args = MatmulArgs {
                x: &upload(ctx, &x),
                y: &yv,
                m: m as u32,
                x_stride: k as u32,
                y_stride: stride,
                out: ops::MatvecOut::Geglu,
                y_offset: offset,
                partials: None,
            };
            for (how, tiled, y) in matmul_both_ways(ctx, &w, &args) {
                let (rows, tol) = matmul_reference(ctx, operands, tiled);
                let want = gated(&rows);
                let got: Vec<f32> = y
                    .chunks(stride as usize)
                    .flat_map(|r| r[offset as usize..][..ff as usize].to_vec())
                    .collect();
                assert_close(
                    &format!("{how} {dtype} gated m={m}"),
                    &got,
                    &want,
                    3.0 * tol,
                );
                assert!(y.chunks(stride as usize).all(|r| {
                    r[..offset as usize]
                        .iter()
                        .chain(&r[(offset + ff) as usize..])
                        .all(|v| v.is_nan())
                }));
            }
        }
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let Some(ctx) = ctx() else { return };
    let w =
        GpuWeight::upload(ctx, "w", GgmlType::F32, 64, 4, &vec![0u8; 64 * 4 * 4], None).unwrap();
    let small = upload(ctx, &[1.0; 10]);
    let y = upload(ctx, &[0.0; 4]);
    let args = MatmulArgs {
        x: &small,
        y: &y,
        m: 1,
        x_stride: 64,
        y_stride: 4,
        out: ops::MatvecOut::Rows { softcap: 0.0 },
        y_offset: 0,
        partials: None,
    };
    assert!(ops::matmul(ctx, &w, &args).is_err());
    // Rows that land past the end of a token's output row.
    let x = upload(ctx, &[1.0; 64 * 8]);
    let wide = upload(ctx, &[0.0; 8 * 6]);
    let past = MatmulArgs {
        x: &x,
        y: &wide,
        m: 8,
        x_stride: 64,
        y_stride: 6,
        out: ops::MatvecOut::Rows { softcap: 0.0 },
        y_offset: 3,
        partials: None,
    };
    assert!(ops::matmul(ctx, &w, &past).is_err());
    // A gated output needs gate/up pairs.
    let odd =
        GpuWeight::upload(ctx, "w", GgmlType::F32, 64, 3, &vec![0u8; 64 * 3 * 4], None).unwrap();
    let gated = MatmulArgs {
        out: ops::MatvecOut::Geglu,
        y_offset: 0,
        ..past
    };
    assert!(ops::matmul(ctx, &odd, &gated).is_err());
    assert!(GpuWeight::upload(ctx, "w", GgmlType::F32, 64, 4, &[0u8; 12], None).is_err());
    assert!(GpuWeight::upload(ctx, "w", GgmlType::Iq2Xxs, 256, 1, &[0u8; 66], None).is_err());
    // Float rows are read as whole vec4s.
    assert!(GpuWeight::upload(ctx, "w", GgmlType::F32, 50, 1, &[0u8; 200], None).is_err());
}

#[test]
fn embed_gathers_rows_across_tiles() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(5);
    // Float rows of lengths that end inside a 32-value unit.
    for (dtype, k) in [
        (GgmlType::Q8_0, 256u64),
        (GgmlType::Q4K, 256),
        (GgmlType::F16, 256),
        (GgmlType::Q6K, 256),
        (GgmlType::F32, 72),
        (GgmlType::F16, 8),
        // Rows of more than 64 units take several workgroups a token.
        (GgmlType::Q8_0, 4352),
        (GgmlType::F32, 2180),
    ] {
        let rows = 103u64;
        let wq = quantize(dtype, &rng.vec((k * rows) as usize, 1.0)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let tile = dtype.bytes_for(k).unwrap() * 20 + 16;
        let table = GpuWeight::upload(ctx, "emb", dtype, k, rows, &wq, Some(tile)).unwrap();
        let ids = [0u32, 19, 20, 102, 55, 19, 7];
        let idv = upload_u32(ctx, &ids);
        let m = ids.len() as u32;
        let out = poisoned(ctx, ids.len() * k as usize);
        let ds = ops::embed(ctx, &table, &idv, &out, m, 1.5, ops::EmbedOut::Write).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                wd[i as usize * k as usize..][..k as usize]
                    .iter()
                    .map(|v| v * 1.5)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(
            &format!("embed {dtype} k={k}"),
            &read(ctx, &out),
            &want,
            1e-6,
        );
        // Added to what the output holds.
        let base = rng.vec(want.len(), 1.0);
        let acc = upload(ctx, &base);
        let ds = ops::embed(ctx, &table, &idv, &acc, m, -0.5, ops::EmbedOut::Add).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let want: Vec<f32> = base
            .iter()
            .zip(&want)
            .map(|(b, w)| b + w / 1.5 * -0.5)
            .collect();
        assert_close(
            &format!("embed added {dtype} k={k}"),
            &read(ctx, &acc),
            &want,
            1e-6,
        );
    }
}

#[test]
fn rms_norm_in_all_three_forms() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(11);
    for (rows, dim, stride) in [
        (1u32, 1u32, 1u32),
        (3, 640, 640),
        (7, 257, 300),
        (2, 1536, 1536),
        (33, 256, 256),
        (2, ops::MAX_NORM_DIM, ops::MAX_NORM_DIM + 3),
    ] {
        let x = rng.vec((rows * stride) as usize, 2.0);
        let w = rng.vec(dim as usize, 1.0);
        let packed: Vec<f32> = (0..rows as usize)
            .flat_map(|r| x[r * stride as usize..][..dim as usize].to_vec())
            .collect();
        let (xv, wv) = (upload(ctx, &x), upload(ctx, &w));
        for weighted in [false, true] {
            let wopt = weighted.then_some(&wv);
            let want = cpu::rms_norm(
                &packed,
                dim as usize,
                weighted.then_some(w.as_slice()),
                1e-6,
            );
            let y = poisoned(ctx, (rows * dim) as usize);
            let d = ops::rms_norm(
                ctx,
                ops::RmsNorm {
                    x: &xv,
                    out: NormOut::To(&y),
                    weight: wopt,
                    rows,
                    dim,
                    x_stride: stride,
                    eps: 1e-6,
                },
            )
            .unwrap();
            run(ctx, &[&d]);
            assert_close(&format!("norm {rows}x{dim}"), &read(ctx, &y), &want, 1e-5);

            let res0 = rng.vec((rows * dim) as usize, 1.0);
            let res = upload(ctx, &res0);
            let d = ops::rms_norm(
                ctx,
                ops::RmsNorm {
                    x: &xv,
                    out: NormOut::AddTo(&res),
                    weight: wopt,
                    rows,
                    dim,
                    x_stride: stride,
                    eps: 1e-6,
                },
            )
            .unwrap();
            run(ctx, &[&d]);
            let want_res: Vec<f32> = res0.iter().zip(&want).map(|(a, b)| a + b).collect();
            assert_close(
                &format!("norm+residual {rows}x{dim}"),
                &read(ctx, &res),
                &want_res,
                1e-5,
            );
        }
        let inplace = upload(ctx, &packed);
        let d = ops::rms_norm(
            ctx,
            ops::RmsNorm {
                x: &inplace,
                out: NormOut::InPlace,
                weight: Some(&wv),
                rows,
                dim,
                x_stride: dim,
                eps: 1e-6,
            },
        )
        .unwrap();
        run(ctx, &[&d]);
        let want = cpu::rms_norm(&packed, dim as usize, Some(&w), 1e-6);
        assert_close(
            &format!("norm in place {rows}x{dim}"),
            &read(ctx, &inplace),
            &want,
            1e-5,
        );
    }
    // Rows longer than the threads' registers hold are refused, not truncated.
    let long = upload(ctx, &vec![1.0; ops::MAX_NORM_DIM as usize + 1]);
    let d = ops::MAX_NORM_DIM + 1;
    assert!(
        ops::rms_norm(
            ctx,
            ops::RmsNorm {
                x: &long,
                out: NormOut::InPlace,
                weight: None,
                rows: 1,
                dim: d,
                x_stride: d,
                eps: 1e-6
            }
        )
        .is_err()
    );
}

#[test]
fn rope_matches_cpu_with_partial_dims_and_freq_factors() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(13);
    for (tokens, heads, hd, n_rot, ff) in [
        (1u32, 4u32, 256u32, 256u32, false),
        (5, 3, 64, 32, false),
        (3, 2, 512, 512, true),
        (7, 1, 96, 64, true),
    ] {
        let x = rng.vec((tokens * heads * hd) as usize, 1.0);
        let positions: Vec<u32> = (0..tokens).map(|t| 3 + t * 977).collect();
        let factors: Vec<f32> = (0..n_rot / 2)
            .map(|i| {
                if i < n_rot / 8 {
                    1.0
                } else if i % 3 == 0 {
                    1e30
                } else {
                    2.5
                }
            })
            .collect();
        let mut want = x.clone();
        cpu::rope_neox(
            &mut want,
            &cpu::NeoxRope {
                heads: heads as usize,
                head_dim: hd as usize,
                n_rot: n_rot as usize,
                positions: &positions,
                base: 10000.0,
                freq_scale: 0.5,
                freq_factors: ff.then_some(factors.as_slice()),
            },
        );
        let xv = upload(ctx, &x);
        let ffv = upload(ctx, &factors);
        let args = RopeArgs {
            x: &xv,
            positions: &upload_u32(ctx, &positions),
            tokens,
            heads,
            head_dim: hd,
            n_rot,
            base: 10000.0,
            freq_scale: 0.5,
            freq_factors: ff.then_some(&ffv),
        };
        run(ctx, &[&ops::rope(ctx, &args).unwrap()]);
        // Angles reach ~1e4 radians, where f32 argument reduction differs by ~1e-3 between
        // implementations; the reference computes the same f32 angles.
        assert_close(
            &format!("rope hd={hd} n_rot={n_rot}"),
            &read(ctx, &xv),
            &want,
            2e-3,
        );
    }
}

#[test]
fn attention_matches_cpu_for_prefill_decode_window_and_gqa() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(17);
    // (n_head, n_kv_head, head_dim, capacity, positions, window, softcap)
    type Case = (u32, u32, u32, u32, Vec<u32>, u32, f32);
    let cases: Vec<Case> = vec![
        // The tiny vision model's shape, within and past the first 64-key chunk (Chromium
        // once carried a chunk's scores into the next).
        (4, 1, 32, 80, (0..60).collect(), 0, 0.0),
        (4, 1, 32, 80, (0..76).collect(), 8, 0.0),
        (4, 1, 32, 80, (0..76).collect(), 0, 0.0),
        (4, 1, 256, 64, (0..9).collect(), 0, 0.0),
        (4, 1, 256, 64, vec![40], 0, 0.0),
        (8, 2, 64, 700, vec![600], 0, 0.0),
        (8, 2, 64, 700, (520..540).collect(), 512, 0.0),
        (2, 2, 512, 300, vec![299], 100, 0.0),
        (3, 1, 96, 260, vec![0, 257, 258, 259], 0, 0.0),
        (8, 1, 512, 150, vec![0, 63, 64, 65, 129, 149], 0, 0.0),
        (6, 1, 64, 100, vec![5, 99], 0, 2.0),
        (10, 2, 128, 90, (70..77).collect(), 9, 0.0),
    ];
    for (nh, nkv, hd, cap, positions, window, softcap) in cases {
        let t = positions.len() as u32;
        let q = rng.vec((t * nh * hd) as usize, 1.0);
        let kc = rng.vec((cap * nkv * hd) as usize, 1.0);
        let vc = rng.vec((cap * nkv * hd) as usize, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let want = cpu::attention(&cpu::CausalAttention {
            q: &q,
            k_cache: &kc,
            v_cache: &vc,
            positions: &positions,
            n_head: nh as usize,
            n_kv_head: nkv as usize,
            head_dim: hd as usize,
            window: window as usize,
            scale,
            softcap,
        });
        let out = poisoned(ctx, want.len());
        let args = AttentionArgs {
            q: &upload(ctx, &q),
            k_cache: &upload(ctx, &kc),
            v_cache: &upload(ctx, &vc),
            positions: &upload_u32(ctx, &positions),
            out: &out,
            tokens: t,
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            window,
            scale,
            softcap,
            q_stride: nh * hd,
            last_key: None,
            first_key: None,
            slot_rows: 0,
        };
        run(
            ctx,
            &[&ops::attention_with(ctx, &args, AttentionKernel::Fma).unwrap()],
        );
        assert_close(
            &format!("attention h={nh}/{nkv} hd={hd} t={t} w={window}"),
            &read(ctx, &out),
            &want,
            1e-4,
        );
    }
}

/// A prefill attention over a cache of `cap` rows for the tokens at `p0..p0 + t`, each with
/// its own key bounds (`last`, `first`, a u32 per token where given).
struct BoundedAttention {
    heads: (u32, u32, u32),
    cap: u32,
    p0: u32,
    t: u32,
    window: u32,
    last: Option<Vec<u32>>,
    first: Option<Vec<u32>>,
    /// Cache rows per sequence (0: one sequence).
    slot_rows: u32,
    softcap: f32,
    /// On cooperative matrices (`ops::attention_coop`), which round to f16.
    coop: bool,
}

impl BoundedAttention {
    /// `heads` over a cache of `cap` rows for the tokens at `p0..p0 + t`, no other bounds.
    fn plain(heads: (u32, u32, u32), cap: u32, p0: u32, t: u32) -> Self {
        Self {
            heads,
            cap,
            p0,
            t,
            window: 0,
            last: None,
            first: None,
            slot_rows: 0,
            softcap: 0.0,
            coop: false,
        }
    }

    /// The GPU's output against the CPU's attention over the keys `sees(query, key)` allows.
    fn check(
        &self,
        ctx: &GpuContext,
        rng: &mut Rng,
        sees: impl Fn(usize, usize) -> bool,
        what: &str,
    ) {
        let ((nh, nkv, hd), (p0, t)) = (self.heads, (self.p0, self.t));
        let positions: Vec<u32> = (p0..p0 + t).collect();
        let q = rng.vec((t * nh * hd) as usize, 1.0);
        let kc = rng.vec((self.cap * nkv * hd) as usize, 1.0);
        let vc = rng.vec((self.cap * nkv * hd) as usize, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let reference = cpu::AttendRef {
            q: &q,
            k: &kc,
            v: &vc,
            heads: nh as usize,
            kv_heads: nkv as usize,
            d: hd as usize,
            q_pos0: p0 as usize,
            scale,
            softcap: self.softcap,
            relative: None,
        };
        let want = cpu::attend(&reference, sees);
        let out = poisoned(ctx, want.len());
        let bounds = |b: &Option<Vec<u32>>| b.as_ref().map(|v| upload_u32(ctx, v));
        let (last, first) = (bounds(&self.last), bounds(&self.first));
        let args = AttentionArgs {
            q: &upload(ctx, &q),
            k_cache: &upload(ctx, &kc),
            v_cache: &upload(ctx, &vc),
            positions: &upload_u32(ctx, &positions),
            out: &out,
            tokens: t,
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            window: self.window,
            scale,
            softcap: self.softcap,
            q_stride: nh * hd,
            last_key: last.as_ref(),
            first_key: first.as_ref(),
            slot_rows: self.slot_rows,
        };
        // The cooperative-matrix kernel rounds queries, keys, values and weights to f16.
        let (d, tol) = if self.coop {
            (ops::attention_with(ctx, &args, AttentionKernel::Coop), 5e-3)
        } else {
            (ops::attention_with(ctx, &args, AttentionKernel::Fma), 1e-4)
        };
        run(ctx, &[&d.unwrap()]);
        assert_close(what, &read(ctx, &out), &want, tol);
        if self.coop {
            // Split over the keys (a few blocks here: the most parts, some of them empty).
            let scratch = poisoned(ctx, ops::attention_parts_floats(t, nh, hd) as usize);
            let out2 = poisoned(ctx, want.len());
            let parts =
                ops::attention_in_parts(ctx, &AttentionArgs { out: &out2, ..args }, &scratch)
                    .unwrap();
            assert_eq!(parts.len(), 2, "{what}: split over the keys");
            run(ctx, &parts.iter().collect::<Vec<_>>());
            assert_close(&format!("{what}, in parts"), &read(ctx, &out2), &want, tol);
        }
    }
}

/// A prefill attention with no KV heads, or more query heads than a KV group takes, is a
/// typed error from every entry point (none divides by the KV heads first).
#[test]
fn attention_refuses_impossible_head_counts() {
    let Some(ctx) = ctx() else { return };
    let v = upload(ctx, &[0.5; 4096]);
    let positions = upload_u32(ctx, &[0, 1]);
    for (n_head, n_kv_head) in [(4, 0), (64, 1)] {
        let args = AttentionArgs {
            q: &v,
            k_cache: &v,
            v_cache: &v,
            positions: &positions,
            out: &v,
            tokens: 2,
            n_head,
            n_kv_head,
            head_dim: 256,
            window: 0,
            scale: 1.0,
            softcap: 0.0,
            q_stride: n_head * 256,
            last_key: None,
            first_key: None,
            slot_rows: 0,
        };
        let what = format!("{n_head} heads over {n_kv_head}");
        assert!(ops::attention(ctx, &args).is_err(), "{what}");
        assert!(
            ops::attention_in_parts(ctx, &args, &v).is_err(),
            "{what}, in parts"
        );
        for kernel in [AttentionKernel::Fma, AttentionKernel::Coop] {
            assert!(
                ops::attention_with(ctx, &args, kernel).is_err(),
                "{what}, {kernel:?}"
            );
        }
    }
}

/// `attention_parts.wgsl` against the CPU: each row's keys split into parts of random sizes
/// (some empty), each part's output normalised by its own sum; combined, they are the
/// softmax over all the keys.
#[test]
fn attention_parts_combine_to_the_whole_softmax() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(43);
    let (rows, hd, parts) = (7usize, 12usize, 3usize);
    let mut scratch = vec![0.0f32; parts * rows * (hd + 2)];
    let mut whole = vec![0.0f32; rows * hd];
    for r in 0..rows {
        // Row r: part z takes (r + z) % 4 keys (row 0's first part none, row 1's every part
        // some), scores up to 8 apart and values in [-1, 1].
        let mut all: Vec<(f64, Vec<f64>)> = Vec::new();
        for z in 0..parts {
            let n = (r + z) % 4;
            let keys: Vec<(f64, Vec<f64>)> = (0..n)
                .map(|_| {
                    let s = f64::from(rng.vec(1, 8.0)[0]);
                    (s, rng.vec(hd, 1.0).into_iter().map(f64::from).collect())
                })
                .collect();
            let at = parts * rows * hd + 2 * (z * rows + r);
            if keys.is_empty() {
                scratch[at] = -3.0e38;
                continue;
            }
            let top = keys.iter().map(|k| k.0).fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = keys.iter().map(|k| (k.0 - top).exp()).sum();
            for c in 0..hd {
                let o: f64 = keys.iter().map(|k| (k.0 - top).exp() * k.1[c]).sum();
                scratch[(z * rows + r) * hd + c] = (o / l) as f32;
            }
            (scratch[at], scratch[at + 1]) = (top as f32, l as f32);
            all.extend(keys);
        }
        let top = all.iter().map(|k| k.0).fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = all.iter().map(|k| (k.0 - top).exp()).sum();
        for c in 0..hd {
            let o: f64 = all.iter().map(|k| (k.0 - top).exp() * k.1[c]).sum();
            whole[r * hd + c] = if l > 0.0 { (o / l) as f32 } else { 0.0 };
        }
    }
    let want = cpu::attention_parts_combine(&scratch, rows, hd, parts);
    assert_close("attention parts, CPU reference", &want, &whole, 1e-5);
    let out = poisoned(ctx, rows * hd);
    let shape = wgemma_kernels::params::AttentionPartsParams {
        rows: rows as u32,
        head_dim: hd as u32,
        parts: parts as u32,
    };
    let d = ops::attention_parts_combine(ctx, &upload(ctx, &scratch), &out, shape).unwrap();
    run(ctx, &[&d]);
    assert_close("attention parts", &read(ctx, &out), &want, 1e-5);
}

/// Prefill attention with `last_key`: the tokens of a span (an image) also see the span's later
/// tokens, within the sliding window's reach back.
#[test]
fn attention_sees_the_rest_of_its_span() {
    let Some(ctx) = ctx() else { return };
    let (p0, t, window) = (3u32, 40u32, 6u32);
    // Spans at positions 10..=24 and 30..=33; other tokens see only themselves and back.
    let last: Vec<u32> = (p0..p0 + t)
        .map(|p| match p {
            10..=24 => 24,
            30..=33 => 33,
            _ => p,
        })
        .collect();
    let case = BoundedAttention {
        heads: (4, 2, 64),
        cap: 80,
        p0,
        t,
        window,
        last: Some(last.clone()),
        ..BoundedAttention::plain((4, 2, 64), 80, p0, t)
    };
    let sees = |qp: usize, kp: usize| {
        let causal = kp <= qp && qp - kp < window as usize;
        causal || (kp > qp && kp <= last[qp - p0 as usize] as usize)
    };
    case.check(ctx, &mut Rng(29), sees, "attention with spans");
}

/// Prefill attention with `first_key` and `last_key` as a DiffusionGemma canvas step sets
/// them: every canvas row sees the last `window - 1` prompt positions and the whole canvas,
/// wherever it stands in the canvas.
#[test]
fn attention_of_a_canvas_sees_a_fixed_stretch() {
    let Some(ctx) = ctx() else { return };
    let (prompt, canvas, window) = (37u32, 21u32, 9u32);
    let first = prompt + 1 - window;
    let case = BoundedAttention {
        heads: (8, 2, 64),
        cap: 100,
        p0: prompt,
        t: canvas,
        window,
        last: Some(vec![prompt + canvas - 1; canvas as usize]),
        first: Some(vec![first; canvas as usize]),
        ..BoundedAttention::plain((8, 2, 64), 100, prompt, canvas)
    };
    let sees = |_: usize, kp: usize| (first as usize..(prompt + canvas) as usize).contains(&kp);
    case.check(ctx, &mut Rng(31), sees, "attention of a canvas");
}

/// The prefill attention on cooperative matrices against the CPU, at Gemma's head
/// dimensions and past a block of rows: causal within a window, a DiffusionGemma canvas's
/// fixed stretch, spans, a cache of several sequences, a soft cap, and a block of rows cut
/// short. A device without them refuses the kernel.
#[test]
fn attention_on_tensor_cores_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(37);
    let plain = BoundedAttention::plain((16, 8, 256), 400, 170, 130);
    if !ctx.features.coop_matmul {
        let args = AttentionArgs {
            q: &upload(ctx, &[0.5; 256]),
            k_cache: &upload(ctx, &[0.5; 256]),
            v_cache: &upload(ctx, &[0.5; 256]),
            positions: &upload_u32(ctx, &[0]),
            out: &poisoned(ctx, 256),
            tokens: 1,
            n_head: 1,
            n_kv_head: 1,
            head_dim: 256,
            window: 0,
            scale: 1.0,
            softcap: 0.0,
            q_stride: 256,
            last_key: None,
            first_key: None,
            slot_rows: 0,
        };
        assert!(ops::attention_with(ctx, &args, AttentionKernel::Coop).is_err());
        return;
    }
    let window = 100u32;
    let causal = BoundedAttention {
        window,
        coop: true,
        ..plain
    };
    causal.check(
        ctx,
        &mut rng,
        |q, k| k <= q && q - k < window as usize,
        "coop causal, window 100, hd 256",
    );
    let wide = BoundedAttention {
        coop: true,
        softcap: 4.0,
        ..BoundedAttention::plain((16, 2, 512), 300, 200, 41)
    };
    wide.check(
        ctx,
        &mut rng,
        |q, k| k <= q,
        "coop causal, hd 512, soft cap",
    );
    let (prompt, canvas) = (150u32, 70u32);
    let first = prompt + 1 - window;
    let fixed = BoundedAttention {
        window,
        last: Some(vec![prompt + canvas - 1; canvas as usize]),
        first: Some(vec![first; canvas as usize]),
        coop: true,
        ..BoundedAttention::plain((8, 4, 256), 260, prompt, canvas)
    };
    let sees = |_: usize, kp: usize| (first as usize..(prompt + canvas) as usize).contains(&kp);
    fixed.check(ctx, &mut rng, sees, "coop canvas");
    let last: Vec<u32> = (0..90u32)
        .map(|p| if (20..=60).contains(&p) { 60 } else { p })
        .collect();
    let spans = BoundedAttention {
        last: Some(last.clone()),
        coop: true,
        ..BoundedAttention::plain((4, 1, 128), 90, 0, 90)
    };
    let sees = |q: usize, k: usize| k <= q || k <= last[q] as usize;
    spans.check(ctx, &mut rng, sees, "coop spans, hd 128");
    let slots = BoundedAttention {
        slot_rows: 50,
        coop: true,
        ..BoundedAttention::plain((6, 2, 192), 100, 25, 50)
    };
    let sees = |q: usize, k: usize| k <= q && k / 50 == q / 50;
    slots.check(ctx, &mut rng, sees, "coop across two slots, hd 192");
}

/// A cache of several sequences (a batch of decode steps): each token sees only its own
/// slot's keys, within the window, whatever lies in the slots beside it.
#[test]
fn attention_keeps_to_each_tokens_slot() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(31);
    let (nh, nkv, hd, slot_rows, slots) = (6u32, 2u32, 64u32, 40u32, 3u32);
    let cap = slot_rows * slots;
    // (slot, position in the slot): the first rows, the last, and in between.
    let rows = [(0u32, 5u32), (1, 0), (1, 39), (2, 17), (0, 39), (2, 2)];
    let positions: Vec<u32> = rows.iter().map(|(s, p)| s * slot_rows + p).collect();
    for window in [0u32, 8] {
        let t = positions.len() as u32;
        let q = rng.vec((t * nh * hd) as usize, 1.0);
        let kc = rng.vec((cap * nkv * hd) as usize, 1.0);
        let vc = rng.vec((cap * nkv * hd) as usize, 1.0);
        let scale = 0.125;
        let mut want = Vec::new();
        for (ti, &pos) in positions.iter().enumerate() {
            let one = (nh * hd) as usize;
            let reference = cpu::AttendRef {
                q: &q[ti * one..(ti + 1) * one],
                k: &kc,
                v: &vc,
                heads: nh as usize,
                kv_heads: nkv as usize,
                d: hd as usize,
                q_pos0: pos as usize,
                scale,
                softcap: 0.0,
                relative: None,
            };
            let slot = |p: usize| p / slot_rows as usize;
            want.extend(cpu::attend(&reference, |qp, kp| {
                let near = |d: usize| window == 0 || d < window as usize;
                slot(qp) == slot(kp) && kp <= qp && near(qp - kp)
            }));
        }
        let out = poisoned(ctx, want.len());
        let args = AttentionArgs {
            q: &upload(ctx, &q),
            k_cache: &upload(ctx, &kc),
            v_cache: &upload(ctx, &vc),
            positions: &upload_u32(ctx, &positions),
            out: &out,
            tokens: t,
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            window,
            scale,
            softcap: 0.0,
            q_stride: nh * hd,
            last_key: None,
            first_key: None,
            slot_rows,
        };
        run(
            ctx,
            &[&ops::attention_with(ctx, &args, AttentionKernel::Fma).unwrap()],
        );
        assert_close(
            &format!("attention in slots, window {window}"),
            &read(ctx, &out),
            &want,
            1e-4,
        );
        // Split over chunks of keys, the tokens side by side (batched decode's kernel).
        let floats = ops::DecodeAttention::scratch_floats_for(nh, hd, slot_rows, t);
        let scratch = poisoned(ctx, floats as usize);
        let split_out = poisoned(ctx, want.len());
        let split_args = AttentionArgs {
            out: &split_out,
            ..args
        };
        let d = ops::attention_decode(ctx, &split_args, 0, &scratch, None).unwrap();
        run(ctx, &[&d.split, &d.combine]);
        assert_close(
            &format!("split attention in slots, window {window}"),
            &read(ctx, &split_out),
            &want,
            1e-4,
        );
    }
}

#[test]
fn kv_store_writes_rows_at_their_positions() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(19);
    let (row, m, stride, cap) = (96u32, 3u32, 100u32, 10u32);
    let src = rng.vec((m * stride) as usize, 1.0);
    let cache = upload(ctx, &vec![0.0; (cap * row) as usize]);
    let positions = [7u32, 2, 12];
    let d = ops::kv_store(
        ctx,
        &upload(ctx, &src),
        &cache,
        &upload_u32(ctx, &positions),
        row,
        m,
        stride,
    )
    .unwrap();
    run(ctx, &[&d]);
    let got = read(ctx, &cache);
    let mut want = vec![0.0; (cap * row) as usize];
    for (i, &p) in positions.iter().enumerate() {
        if p < cap {
            want[(p * row) as usize..][..row as usize]
                .copy_from_slice(&src[i * stride as usize..][..row as usize]);
        }
    }
    assert_eq!(got, want);
}

#[test]
fn elementwise_ops_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(23);
    let (rows, cols) = (3u32, 517u32);
    let gate = rng.vec((rows * 2 * cols) as usize, 3.0);
    let up = rng.vec((rows * cols) as usize, 1.0);
    let y = poisoned(ctx, (rows * cols) as usize);
    let gv = upload(ctx, &gate);
    let uv = upload(ctx, &up);
    let op = Elementwise::Geglu {
        gate: &gv,
        up: &uv,
        cols,
        gate_stride: 2 * cols,
        up_stride: cols,
        up_offset: 0,
    };
    run(ctx, &[&ops::elementwise(ctx, op, &y, rows * cols).unwrap()]);
    let want: Vec<f32> = (0..rows as usize)
        .flat_map(|r| {
            cpu::geglu(
                &gate[r * 2 * cols as usize..][..cols as usize],
                &up[r * cols as usize..][..cols as usize],
            )
        })
        .collect();
    assert_close("geglu", &read(ctx, &y), &want, 1e-5);

    let n = 70_001u32;
    let a = rng.vec(n as usize, 1.0);
    let b = rng.vec(n as usize, 20.0);
    let yv = upload(ctx, &b);
    let av = upload(ctx, &a);
    run(
        ctx,
        &[
            &ops::elementwise(ctx, Elementwise::Add(&av), &yv, n).unwrap(),
            &ops::elementwise(ctx, Elementwise::Scale(0.5), &yv, n).unwrap(),
            &ops::elementwise(ctx, Elementwise::Softcap(5.0), &yv, n).unwrap(),
        ],
    );
    let want: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| cpu::softcap((x + y) * 0.5, 5.0))
        .collect();
    assert_close("add, scale, softcap", &read(ctx, &yv), &want, 1e-5);
}

#[test]
fn argmax_and_gumbel_sampling_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(29);
    for n in [1u32, 1000, 1025, 262_149] {
        let mut x = rng.vec(n as usize, 10.0);
        if n > 10 {
            // A tie at the top: the smaller index wins. A NaN never wins.
            x[n as usize / 2] = 50.0;
            x[n as usize - 3] = 50.0;
            x[3] = f32::NAN;
        }
        let xv = upload(ctx, &x);
        let scratch = upload_u32(ctx, &vec![0; ops::Argmax::scratch_words(n) as usize]);
        let result = upload_u32(ctx, &[7, 7]);
        let a = ops::argmax(ctx, &xv, n, &scratch, &result, None).unwrap();
        run(ctx, &[&a.partial, &a.finish]);
        let got = pollster::block_on(ctx.read_u32(&result)).unwrap();
        assert_eq!(got[0], cpu::argmax(&x).0, "argmax n={n}");

        let g = ops::Gumbel {
            seed: 42,
            step: 3,
            temperature: 0.7,
        };
        let s = ops::argmax(ctx, &xv, n, &scratch, &result, Some(g)).unwrap();
        for step in [3u32, 4, 5] {
            s.set_gumbel(ctx, n, ops::Gumbel { step, ..g });
            run(ctx, &[&s.partial, &s.finish]);
            let got = pollster::block_on(ctx.read_u32(&result)).unwrap();
            assert_eq!(
                got[0],
                cpu::gumbel_argmax(&x, 42, step, 0.7),
                "gumbel n={n} step={step}"
            );
        }
    }
}

/// Rows sampled together (a batched decode step's): each row's argmax or Gumbel-max sample
/// as its draw says, as one row's sampling draws it on the CPU.
#[test]
fn argmax_rows_draw_each_row_as_alone() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(37);
    for (n, rows) in [(1000u32, 3u32), (262_149, 5)] {
        let mut x = rng.vec((n * rows) as usize, 10.0);
        // A NaN never wins, in any row.
        x[(n + n / 3) as usize] = f32::NAN;
        // Odd rows draw Gumbel-max samples, even rows take the argmax.
        let gumbels: Vec<Option<ops::Gumbel>> = (0..rows)
            .map(|r| {
                (r % 2 == 1).then_some(ops::Gumbel {
                    seed: 40 + r,
                    step: 3 * r,
                    temperature: 0.5 + 0.25 * r as f32,
                })
            })
            .collect();
        let draws: Vec<ops::RowDraw> = gumbels
            .iter()
            .map(|g| g.map_or(ops::RowDraw::greedy(), ops::RowDraw::gumbel))
            .collect();
        let words: Vec<u32> = draws
            .iter()
            .flat_map(|d| [d.seed, d.step, d.inv_temp.to_bits(), d.gumbel])
            .collect();
        let scratch = vec![0; (ops::Argmax::scratch_words(n) * u64::from(rows)) as usize];
        let (scratch, result) = (
            upload_u32(ctx, &scratch),
            upload_u32(ctx, &vec![7; 2 * rows as usize]),
        );
        let (xv, dv) = (upload(ctx, &x), upload_u32(ctx, &words));
        let a = ops::argmax_rows(ctx, &xv, n, rows, &scratch, &result, &dv).unwrap();
        run(ctx, &[&a.partial, &a.finish]);
        let got = pollster::block_on(ctx.read_u32(&result)).unwrap();
        for (r, g) in gumbels.iter().enumerate() {
            let row = &x[r * n as usize..][..n as usize];
            let want = match g {
                None => cpu::argmax(row).0,
                Some(g) => cpu::gumbel_argmax(row, g.seed, g.step, g.temperature),
            };
            assert_eq!(got[2 * r], want, "row {r} of {rows}, n={n}");
            if g.is_none() {
                assert_eq!(f32::from_bits(got[2 * r + 1]), row[want as usize]);
            }
        }
    }
}

#[test]
fn top_k_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(31);
    for (n, k) in [(5u32, 5u32), (1000, 40), (262_144, 64), (70_000, 1)] {
        let x = rng.vec(n as usize, 10.0);
        let scratch = upload_u32(ctx, &vec![0; ops::TopK::scratch_words(n, k) as usize]);
        let out = upload_u32(ctx, &vec![0; 2 * k as usize]);
        let t = ops::top_k(ctx, &upload(ctx, &x), n, k, &scratch, &out).unwrap();
        run(ctx, &[&t.partial, &t.finish]);
        let got = pollster::block_on(ctx.read_u32(&out)).unwrap();
        let want = cpu::top_k(&x, k as usize);
        for (r, (id, v)) in want.iter().enumerate() {
            assert_eq!(got[2 * r], *id, "top_k n={n} rank {r}");
            assert_eq!(f32::from_bits(got[2 * r + 1]), *v);
        }
    }
}

#[test]
fn penalties_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(37);
    let mut logits = rng.vec(1000, 5.0);
    let tokens = [(3u32, 1u32), (999, 4), (500, 2), (5000, 1)];
    let flat: Vec<u32> = tokens.iter().flat_map(|&(a, b)| [a, b]).collect();
    let p = ops::PenaltyParams {
        repeat: 1.3,
        frequency: 0.2,
        presence: 0.5,
    };
    let lv = upload(ctx, &logits);
    let d = ops::penalties(
        ctx,
        &upload_u32(ctx, &flat),
        tokens.len() as u32,
        &lv,
        1000,
        p,
    )
    .unwrap();
    run(ctx, &[&d]);
    cpu::penalties(&mut logits, &tokens, p);
    assert_close("penalties", &read(ctx, &lv), &logits, 1e-6);
}

#[test]
fn many_dispatches_share_one_pass_and_pipelines_are_cached() {
    let Some(shared) = ctx() else { return };
    // A context of its own: the other tests compile pipelines on the shared one meanwhile.
    let own = pollster::block_on(GpuContext::new(ContextOptions {
        adapter_name: Some(shared.info.name.clone()),
        ..ContextOptions::default().with_env()
    }))
    .unwrap();
    let ctx = &own;
    let n = 1000u32;
    let y = upload(ctx, &vec![1.0; n as usize]);
    let d = ops::elementwise(ctx, Elementwise::Scale(1.001), &y, n).unwrap();
    let before = ctx.pipeline_count();
    let again = ops::elementwise(ctx, Elementwise::Scale(2.0), &y, n).unwrap();
    assert_eq!(
        ctx.pipeline_count(),
        before,
        "same variant, no new pipeline"
    );
    let mut rec = Recorder::new(ctx, "many");
    for _ in 0..200 {
        rec.run(&d);
    }
    rec.run(&again);
    assert_eq!(rec.dispatch_count(), 201);
    rec.submit();
    ctx.wait().unwrap();
    let got = read(ctx, &y);
    let want = 1.001f32.powi(200) * 2.0;
    assert!(
        got.iter().all(|v| (v - want).abs() < 1e-3),
        "{} vs {want}",
        got[0]
    );
}

/// The one-token matvec against the CPU for every dtype: plain rows (with an output offset
/// and softcap) and interleaved gate/up rows with the gated activation.
#[test]
fn one_token_matvec_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(41);
    for dtype in GPU_DTYPES {
        let kq = dtype.block_size().max(32) as u64;
        // Short and long rows; row counts not a multiple of the rows per workgroup.
        let long = if dtype.block_size() == 1 {
            8192
        } else {
            kq * (20_000 / kq + 1)
        };
        // Few rows take 1 or 2 rows per thread group; 8194 rows of 2048 keep 4.
        let many = if [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K].contains(&dtype)
        {
            Some((2048, 8194))
        } else {
            None
        };
        for (k, n) in [(kq * 2, 38u64), (kq * 5, 302), (long, 10)]
            .into_iter()
            .chain(many)
        {
            let ku = k as usize;
            let wf = rng.vec((k * n) as usize, 0.5);
            let wq = quantize(dtype, &wf).unwrap();
            let wd = dequantize_to_vec(dtype, &wq).unwrap();
            let x = rng.vec(ku, 1.0);
            let xv = upload(ctx, &x);
            let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
            let mut want = cpu::matmul(&wd, n as usize, ku, &x, 1);
            want.iter_mut().for_each(|v| *v = cpu::softcap(*v, 4.0));
            let y = poisoned(ctx, n as usize + 3);
            let ds =
                ops::matvec(ctx, &w, &xv, &y, 3, ops::MatvecOut::Rows { softcap: 4.0 }).unwrap();
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let got = read(ctx, &y);
            assert!(
                got[..3].iter().all(|v| v.is_nan()),
                "{dtype}: wrote before its offset"
            );
            assert_close(
                &format!("matvec {dtype} k={k} n={n}"),
                &got[3..],
                &want,
                3e-5,
            );
            // The same rows read as interleaved gate/up pairs.
            {
                let rows: Vec<f32> = cpu::matmul(&wd, n as usize, ku, &x, 1);
                let want = gated(&rows);
                let y = poisoned(ctx, want.len());
                let ds = ops::matvec(ctx, &w, &xv, &y, 0, ops::MatvecOut::Geglu).unwrap();
                run(ctx, &ds.iter().collect::<Vec<_>>());
                assert_close(
                    &format!("matvec {dtype} gated k={k} n={n}"),
                    &read(ctx, &y),
                    &want,
                    3e-5,
                );
            }
        }
    }
}

/// An adapter's delta joined to a one-token product's rows: each row adds its segment's
/// `t` dotted with its B row, before the output is formed (a gated output gains it on the gate
/// and up rows). Weights across tiles (each tile's first row places its rows in B), three
/// segments by ranges and gate/up pairs; a delta that does not fit the product is refused.
#[test]
fn matvec_adds_an_adapters_delta_like_the_cpu() {
    use ops::{Epilogue, LoraDelta, LoraSegments};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(83);
    let (k, n, rank) = (320u64, 302usize, 5u32);
    for (dtype, tiled) in [
        (GgmlType::F32, false),
        (GgmlType::Q8_0, true),
        (GgmlType::F16, false),
    ] {
        let wq = quantize(dtype, &rng.vec(k as usize * n, 0.5)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let tile = tiled.then(|| dtype.bytes_for(k).unwrap() * 50 + 16);
        let w = GpuWeight::upload(ctx, "w", dtype, k, n as u64, &wq, tile).unwrap();
        assert_eq!(w.tiles.len() > 1, tiled);
        let x = rng.vec(k as usize, 1.0);
        let rows = cpu::matmul(&wd, n, k as usize, &x, 1);
        let b = rng.vec(n * rank as usize, 0.5);
        let (bv, xv) = (upload(ctx, &b), upload(ctx, &x));
        for (segments, out) in [
            (
                LoraSegments::Ranges([101, 257]),
                ops::MatvecOut::Rows { softcap: 0.0 },
            ),
            (
                LoraSegments::Ranges([7, u32::MAX]),
                ops::MatvecOut::Rows { softcap: 0.0 },
            ),
            (LoraSegments::Pairs, ops::MatvecOut::Geglu),
        ] {
            let segs = segments.count(n as u32);
            let t = rng.vec((segs * rank) as usize, 1.0);
            let tv = upload(ctx, &t);
            let adapted: Vec<f32> = (0..n as u32)
                .map(|r| {
                    let s = (0..segs)
                        .find(|&s| {
                            let (first, count, step) = segments.rows(s, n as u32);
                            r >= first && (r - first) % step == 0 && (r - first) / step < count
                        })
                        .unwrap();
                    let d: f32 = (0..rank as usize)
                        .map(|i| t[(s * rank) as usize + i] * b[r as usize * rank as usize + i])
                        .sum();
                    rows[r as usize] + d
                })
                .collect();
            let geglu = segments == LoraSegments::Pairs;
            let want = if geglu { gated(&adapted) } else { adapted };
            let lora = LoraDelta {
                t: &tv,
                b: &bv,
                rank,
                segments,
            };
            let y = poisoned(ctx, want.len() + 2);
            let e = Epilogue {
                out,
                lora: Some(&lora),
            };
            let ds = ops::matvec(ctx, &w, &xv, &y, 2, e).unwrap();
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let got = read(ctx, &y);
            assert!(got[..2].iter().all(|v| v.is_nan()));
            assert_close(&format!("{dtype} {segments:?}"), &got[2..], &want, 3e-5);
            // The same rows' other output kind: pairs need a gated output and back.
            let other = if geglu {
                ops::MatvecOut::Rows { softcap: 0.0 }
            } else {
                ops::MatvecOut::Geglu
            };
            let e = Epilogue {
                out: other,
                lora: Some(&lora),
            };
            assert!(ops::matvec(ctx, &w, &xv, &y, 0, e).is_err());
        }
        // A t shorter than its segments, a B shorter than the rows.
        let short = upload(ctx, &vec![1.0; 2 * rank as usize]);
        for (t, b) in [(&short, &bv), (&bv, &short)] {
            let lora = LoraDelta {
                t,
                b,
                rank,
                segments: LoraSegments::Ranges([101, 257]),
            };
            let y = poisoned(ctx, n);
            let e = Epilogue {
                out: ops::MatvecOut::Rows { softcap: 0.0 },
                lora: Some(&lora),
            };
            assert!(ops::matvec(ctx, &w, &xv, &y, 0, e).is_err());
        }
    }
}

/// Every thread-group shape of the matvec (threads per group 4..256, 1/2/4 rows per group),
/// whatever the device would pick: groups wider than a subgroup and single-row groups are
/// the paths a big GPU takes and a CPU adapter never chooses by itself.
#[test]
fn matvec_matches_cpu_at_every_tuning() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(67);
    // One dtype of each step size (32 and 64 values) and both K-quant kernels; each tuning is a pipeline to compile.
    for dtype in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K] {
        let (k, n) = (1024u64, 38u64);
        let wq = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let x = rng.vec(k as usize, 1.0);
        let xv = upload(ctx, &x);
        let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
        let rows = cpu::matmul(&wd, n as usize, k as usize, &x, 1);
        let gated = gated(&rows);
        // The kernel holds at most 4 rows per group.
        let eight = Some(ops::MatvecTuning {
            tpr: 4,
            rpt: 8,
            prefetch: false,
            int8_input: false,
        });
        let y = poisoned(ctx, n as usize);
        let rows_out = ops::MatvecOut::Rows { softcap: 0.0 };
        assert!(ops::matvec_tuned(ctx, &w, &xv, &y, 1, rows_out, eight).is_err());
        for (tpr, prefetch) in [(4u32, true), (4, false), (64, true), (256, false)] {
            for rpt in [1u32, 2, 4] {
                let t = Some(ops::MatvecTuning {
                    tpr,
                    rpt,
                    prefetch,
                    int8_input: false,
                });
                let what = format!("{dtype} tpr {tpr} rpt {rpt} prefetch {prefetch}");
                let y = poisoned(ctx, n as usize);
                let rows_out = ops::MatvecOut::Rows { softcap: 0.0 };
                let ds = ops::matvec_tuned(ctx, &w, &xv, &y, 1, rows_out, t).unwrap();
                run(ctx, &ds.iter().collect::<Vec<_>>());
                assert_close(&what, &read(ctx, &y), &rows, 3e-5);
                let y = poisoned(ctx, gated.len());
                let gate = ops::matvec_tuned(ctx, &w, &xv, &y, 1, ops::MatvecOut::Geglu, t);
                if rpt == 1 {
                    assert!(gate.is_err(), "{what}: a gated output needs row pairs");
                    continue;
                }
                run(ctx, &gate.unwrap().iter().collect::<Vec<_>>());
                assert_close(&format!("{what} gated"), &read(ctx, &y), &gated, 3e-5);
            }
        }
    }
}

/// Q4_K and Q6_K products of an input rounded to 8-bit integers per 32 values: equal to the
/// float product of the input as rounded (`cpu::round_to_int8`), close to the exact one, at
/// every group shape, rows of odd counts and several lengths, and for several tokens; other
/// dtypes refuse the tuning (`residual_matvec_matches_cpu` covers it behind the residual
/// step).
#[test]
fn int8_input_matvec_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(71);
    let int8 = |tpr, rpt, prefetch| {
        Some(ops::MatvecTuning {
            tpr,
            rpt,
            prefetch,
            int8_input: true,
        })
    };
    let rows_out = ops::MatvecOut::Rows { softcap: 0.0 };
    for dtype in [GgmlType::Q4K, GgmlType::Q6K] {
        for (k, n) in [(256u64, 37u64), (1536, 301), (2560, 8)] {
            let ku = k as usize;
            let wq = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
            let wd = dequantize_to_vec(dtype, &wq).unwrap();
            // Blocks of very different magnitudes, one all zero: each has its own scale.
            let mut x = rng.vec(ku, 1.0);
            for (b, chunk) in x.chunks_mut(32).enumerate() {
                let scale = [1.0, 0.01, 30.0, 0.0][b % 4];
                chunk.iter_mut().for_each(|v| *v *= scale);
            }
            let xv = upload(ctx, &x);
            let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
            let want = cpu::matmul(&wd, n as usize, ku, &cpu::round_to_int8(&x), 1);
            let exact = cpu::matmul(&wd, n as usize, ku, &x, 1);
            for (tpr, rpt, prefetch) in [
                (4u32, 4u32, true),
                (4, 1, false),
                (64, 2, false),
                (256, 4, true),
            ] {
                let what = format!("{dtype} k={k} n={n} tpr {tpr} rpt {rpt} prefetch {prefetch}");
                let y = poisoned(ctx, n as usize);
                let t = int8(tpr, rpt, prefetch);
                let ds = ops::matvec_tuned(ctx, &w, &xv, &y, 1, rows_out, t).unwrap();
                run(ctx, &ds.iter().collect::<Vec<_>>());
                let got = read(ctx, &y);
                assert_close(&what, &got, &want, 3e-5);
                let e = rel_err(&got, &exact);
                // The rounding's own error (about 2% of these softcapped rows on the CPU too).
                assert!(e < 5e-2, "{what}: {e} from the exact product");
            }
        }
        // Several tokens, each rounded on its own, through the gated output.
        let (k, n, m) = (512u64, 64u64, 3u32);
        let wq = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let x = rng.vec(k as usize * m as usize, 2.0);
        let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, None).unwrap();
        let rows = cpu::matmul(
            &wd,
            n as usize,
            k as usize,
            &cpu::round_to_int8(&x),
            m as usize,
        );
        let want = gated(&rows);
        let y = poisoned(ctx, want.len());
        let ds = ops::matvec_tuned(
            ctx,
            &w,
            &upload(ctx, &x),
            &y,
            m,
            ops::MatvecOut::Geglu,
            int8(8, 2, false),
        )
        .unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        assert_close(
            &format!("{dtype} gated, {m} tokens"),
            &read(ctx, &y),
            &want,
            3e-5,
        );
    }
    let (k, n) = (256u64, 8u64);
    let wq = quantize(GgmlType::Q8_0, &rng.vec((k * n) as usize, 0.5)).unwrap();
    let w = GpuWeight::upload(ctx, "w", GgmlType::Q8_0, k, n, &wq, None).unwrap();
    let (xv, y) = (
        upload(ctx, &rng.vec(k as usize, 1.0)),
        poisoned(ctx, n as usize),
    );
    assert!(ops::matvec_tuned(ctx, &w, &xv, &y, 1, rows_out, int8(4, 4, false)).is_err());
}

/// A few tokens of a Q4_K or Q6_K weight through `ops::matmul_few_tokens`: the few-token
/// kernel (each workgroup rounding its group of tokens' inputs, groups as even as they
/// divide) equals the CPU product of the inputs as rounded and comes close to the exact one,
/// for every count from the fewest it takes to a group and some past it (two groups), plain rows with a softcap
/// and strides, gated rows, weights in several tiles, and rows long enough that a workgroup
/// holds fewer than 8 tokens on some devices.
#[test]
fn few_token_products_match_cpu() {
    let Some(ctx) = ctx() else { return };
    assert!(
        ops::few_tokens_max(ctx) >= 2,
        "the test context takes few-token products"
    );
    // A context that takes more tokens than a workgroup holds: groups of them.
    let wide = pollster::block_on(GpuContext::new(ContextOptions {
        few_tokens: 2 * ops::FEW_TOKENS_PER_GROUP,
        ..ContextOptions::default().with_env()
    }))
    .unwrap();
    let mut rng = Rng(0xf3e7);
    for ctx in [ctx, &wide] {
        for (dtype, k) in [
            (GgmlType::Q4K, 512u64),
            (GgmlType::Q6K, 512),
            (GgmlType::Q4K, 8192),
        ] {
            few_token_products_on(ctx, &mut rng, dtype, k);
        }
    }
}

fn few_token_products_on(ctx: &GpuContext, rng: &mut Rng, dtype: GgmlType, k: u64) {
    let max = ops::few_tokens_max(ctx);
    let n = 301u64;
    let wq = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
    let wd = dequantize_to_vec(dtype, &wq).unwrap();
    // Tiles of ~100 rows (4 tiles).
    let tile = dtype.bytes_for(k).unwrap() * 100;
    let w = GpuWeight::upload(ctx, "w", dtype, k, n, &wq, Some(tile)).unwrap();
    let gu_n = 2 * 150u64;
    let guq = quantize(dtype, &rng.vec((k * gu_n) as usize, 0.5)).unwrap();
    let gud = dequantize_to_vec(dtype, &guq).unwrap();
    let gu = GpuWeight::upload(ctx, "gu", dtype, k, gu_n, &guq, None).unwrap();
    let counts = (ops::FEW_TOKENS_MIN..=max.min(ops::FEW_TOKENS_PER_GROUP)).chain([9, 11, 16]);
    for m in counts.filter(|&m| m <= max) {
        let (xs, ys) = (k as u32 + 32, n as u32 + 5);
        // Outputs of about the same size at every length (the softcap bites the same).
        let mut x = rng.vec((m * xs) as usize, (512.0 / k as f32).sqrt());
        for row in x.chunks_mut(xs as usize) {
            away_from_halves(&mut row[..k as usize]);
        }
        let packed: Vec<f32> = (0..m as usize)
            .flat_map(|t| x[t * xs as usize..][..k as usize].to_vec())
            .collect();
        let rounded = cpu::round_to_int8(&packed);
        let (xv, yv) = (upload(ctx, &x), poisoned(ctx, (m * ys) as usize));
        let args = MatmulArgs {
            x: &xv,
            y: &yv,
            m,
            x_stride: xs,
            y_stride: ys,
            out: ops::MatvecOut::Rows { softcap: 3.0 },
            y_offset: 2,
            partials: None,
        };
        let ds = ops::matmul_few_tokens(ctx, &w, &args).unwrap();
        assert!(
            ds.iter().all(|d| d.label == "few_token_matvec"),
            "{m} tokens take the few-token kernel"
        );
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let got = read(ctx, &yv);
        let rows: Vec<f32> = (0..m as usize)
            .flat_map(|t| got[t * ys as usize + 2..][..n as usize].to_vec())
            .collect();
        let soft = |v: Vec<f32>| {
            v.into_iter()
                .map(|v| cpu::softcap(v, 3.0))
                .collect::<Vec<_>>()
        };
        let what = format!("{dtype} k={k} {m} tokens");
        let want = soft(cpu::matmul(
            &wd, n as usize, k as usize, &rounded, m as usize,
        ));
        assert_close(&what, &rows, &want, 3e-5);
        let exact = soft(cpu::matmul(
            &wd, n as usize, k as usize, &packed, m as usize,
        ));
        let e = rel_err(&rows, &exact);
        // The rounding's own error (about 2% of these softcapped rows on the CPU too).
        assert!(e < 5e-2, "{what}: {e} from the exact product");

        let gy = poisoned(ctx, (m as u64 * gu_n / 2) as usize);
        let gated_args = MatmulArgs {
            y: &gy,
            y_stride: (gu_n / 2) as u32,
            out: ops::MatvecOut::Geglu,
            y_offset: 0,
            ..args
        };
        let ds = ops::matmul_few_tokens(ctx, &gu, &gated_args).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let want = gated(&cpu::matmul(
            &gud,
            gu_n as usize,
            k as usize,
            &rounded,
            m as usize,
        ));
        assert_close(&format!("{what} gated"), &read(ctx, &gy), &want, 3e-5);
    }
}

/// Moves every input that its block's scale puts within 1e-3 of a half between two integers
/// to 0.1 below it. A GPU's `127 / max` need not be correctly rounded (Vulkan allows 2.5
/// ulp), so such an input may round the other way there than on the CPU; kept away from the
/// halves, the rounding is the same on both, and the products agree to the sums' order.
fn away_from_halves(x: &mut [f32]) {
    for block in x.chunks_mut(32) {
        let a = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if a == 0.0 {
            continue;
        }
        let inv = 127.0 / a;
        for v in block.iter_mut() {
            let s = *v * inv;
            if (s - s.floor() - 0.5).abs() < 1e-3 {
                *v = (s.floor() + 0.4) / inv;
            }
        }
    }
}

/// Products of a few tokens go the usual way for a dtype the few-token kernel does not read,
/// for rows too long for a workgroup to hold two tokens' inputs, and through plain `matmul`.
#[test]
fn few_token_products_are_for_k_quants_that_fit() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0xf3e8);
    let few = |ds: Vec<Dispatch>| ds.iter().any(|d| d.label == "few_token_matvec");
    let room = ctx.limits.max_compute_workgroup_storage_size as u64;
    let too_long = 256 * (room / 384 + 1);
    assert!(ops::few_tokens_per_workgroup(ctx, GgmlType::Q4K, too_long as u32) < 2);
    let m = 3u32;
    for (dtype, k, taken) in [
        (GgmlType::Q8_0, 256u64, false),
        (GgmlType::Q4K, too_long, false),
        (GgmlType::Q4K, 256, true),
    ] {
        let n = 40u64;
        let q = quantize(dtype, &rng.vec((k * n) as usize, 0.5)).unwrap();
        let w = GpuWeight::upload(ctx, "w", dtype, k, n, &q, None).unwrap();
        let (xv, yv) = (
            upload(ctx, &rng.vec((m as u64 * k) as usize, 1.0)),
            poisoned(ctx, (m as u64 * n) as usize),
        );
        let args = MatmulArgs {
            x: &xv,
            y: &yv,
            m,
            x_stride: k as u32,
            y_stride: n as u32,
            out: ops::MatvecOut::Rows { softcap: 0.0 },
            y_offset: 0,
            partials: None,
        };
        assert_eq!(
            few(ops::matmul_few_tokens(ctx, &w, &args).unwrap()),
            taken,
            "{dtype} k={k}"
        );
        assert!(!few(ops::matmul(ctx, &w, &args).unwrap()));
    }
}

/// The values of a vector rounded to 8-bit integers as `MatvecOut::GegluInt8` lays it out,
/// and per 16 values the sum word it carries next to its scale.
fn rounded_vector(words: &[u32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let scale = |j: usize| f32::from_bits(words[n / 4 + 2 * j]);
    let values: Vec<f32> = (0..n)
        .map(|i| f32::from((words[i / 4] >> (8 * (i % 4))) as u8 as i8) * scale(i / 16))
        .collect();
    let sums = (0..n / 16)
        .map(|j| f32::from_bits(words[n / 4 + 2 * j + 1]))
        .collect();
    (values, sums)
}

/// One token's gated product writing its activations rounded to 8-bit integers, and a
/// product reading them: the rounded vector is the CPU's gated activations as rounded
/// (`cpu::round_to_int8`) to within one step of the rounding, with sums that match its
/// integers; the second product matches the CPU product of the vector as written; for
/// Q4_K and Q6_K, at workgroups of 32 and 64 outputs, plain and behind the residual step
/// (on 8-bit inputs there too). Outputs from another column, workgroups that split a 32,
/// other dtypes and short inputs are refused.
#[test]
fn int8_activations_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(97);
    let (k, ff) = (512u64, 1024u64);
    let tuning = |tpr, rpt, int8_input| {
        Some(ops::MatvecTuning {
            tpr,
            rpt,
            prefetch: false,
            int8_input,
        })
    };
    let gq = quantize(GgmlType::Q4K, &rng.vec((2 * ff * k) as usize, 0.5)).unwrap();
    let gd = dequantize_to_vec(GgmlType::Q4K, &gq).unwrap();
    let gate_up = GpuWeight::upload(ctx, "gate_up", GgmlType::Q4K, k, 2 * ff, &gq, None).unwrap();
    let x = rng.vec(k as usize, 1.0);
    let xv = upload(ctx, &x);
    let (res, post, pre) = (
        rng.vec(k as usize, 1.0),
        rng.vec(k as usize, 1.0),
        rng.vec(k as usize, 1.0),
    );
    let (rv, pv, prv) = (upload(ctx, &res), upload(ctx, &post), upload(ctx, &pre));
    let dn = cpu::rms_norm(&x, k as usize, Some(&post), 1e-6);
    let h: Vec<f32> = res.iter().zip(&dn).map(|(a, b)| a + b).collect();
    let xn = cpu::rms_norm(&h, k as usize, Some(&pre), 1e-6);
    for down_dtype in [GgmlType::Q4K, GgmlType::Q6K] {
        let dq = quantize(down_dtype, &rng.vec((k * ff) as usize, 0.5)).unwrap();
        let dd = dequantize_to_vec(down_dtype, &dq).unwrap();
        let down = GpuWeight::upload(ctx, "down", down_dtype, ff, k, &dq, None).unwrap();
        for (tpr, rpt, behind_residual) in [(16u32, 4u32, false), (8, 4, false), (16, 4, true)] {
            let what = format!("{down_dtype} tpr {tpr} rpt {rpt} residual {behind_residual}");
            let act = poisoned(ctx, ff as usize);
            let (res_out, normed) = (poisoned(ctx, k as usize), poisoned(ctx, k as usize));
            let step = ops::ResidualStep {
                res: &rv,
                delta: ops::Delta::Row(&xv),
                post: &pv,
                scale: 1.0,
                eps: 1e-6,
                res_out: &res_out,
                next_norm: Some((&prv, &normed)),
            };
            let (ds, input) = if behind_residual {
                let t = tuning(tpr, rpt, true);
                let out = ops::MatvecOut::GegluInt8;
                let ds = ops::matvec_after_residual_tuned(ctx, &gate_up, &step, &act, 0, out, t);
                (ds.unwrap(), cpu::round_to_int8(&xn))
            } else {
                let t = tuning(tpr, rpt, false);
                let ds =
                    ops::matvec_tuned(ctx, &gate_up, &xv, &act, 1, ops::MatvecOut::GegluInt8, t);
                (ds.unwrap(), x.clone())
            };
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let words: Vec<u32> = read(ctx, &act).iter().map(|v| v.to_bits()).collect();
            let (values, sums) = rounded_vector(&words, ff as usize);
            let gated_cpu = gated(&cpu::matmul(&gd, 2 * ff as usize, k as usize, &input, 1));
            let want = cpu::round_to_int8(&gated_cpu);
            for (b, ((got, want), exact)) in values
                .chunks(32)
                .zip(want.chunks(32))
                .zip(gated_cpu.chunks(32))
                .enumerate()
            {
                let step = exact.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (g - w).abs() <= 1.01 * step + 1e-6,
                        "{what}: block {b}: {g} vs {w}"
                    );
                }
            }
            for (j, (s, v)) in sums.iter().zip(values.chunks(16)).enumerate() {
                let direct: f32 = v.iter().sum();
                assert!(
                    (s - direct).abs() <= 1e-4 * (1.0 + direct.abs()),
                    "{what}: sum {j}"
                );
            }
            let y = poisoned(ctx, k as usize);
            let plain = ops::MatvecOut::Rows { softcap: 0.0 };
            let ds = ops::matvec_int8_input(ctx, &down, &act, &y, 0, plain).unwrap();
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let want = cpu::matmul(&dd, k as usize, ff as usize, &values, 1);
            assert_close(&format!("{what}: down"), &read(ctx, &y), &want, 3e-5);
        }
        // A rounded input that is too short, and a dtype without integer dot products.
        let short = poisoned(ctx, ops::int8_vector_words(ff as u32) as usize - 1);
        let y = poisoned(ctx, k as usize);
        let plain = ops::MatvecOut::Rows { softcap: 0.0 };
        assert!(ops::matvec_int8_input(ctx, &down, &short, &y, 0, plain).is_err());
    }
    let act = poisoned(ctx, 2 * ff as usize);
    let out = ops::MatvecOut::GegluInt8;
    // 8 outputs a workgroup split a 32; outputs from column 32.
    assert!(ops::matvec_tuned(ctx, &gate_up, &xv, &act, 1, out, tuning(64, 4, false)).is_err());
    assert!(ops::matvec(ctx, &gate_up, &xv, &act, 32, out).is_err());
    let q8 = quantize(GgmlType::Q8_0, &rng.vec((k * ff) as usize, 0.5)).unwrap();
    let q8_down = GpuWeight::upload(ctx, "down", GgmlType::Q8_0, ff, k, &q8, None).unwrap();
    let y = poisoned(ctx, k as usize);
    let plain = ops::MatvecOut::Rows { softcap: 0.0 };
    assert!(ops::matvec_int8_input(ctx, &q8_down, &act, &y, 0, plain).is_err());
    assert!(!ops::int8_activations_fit(ctx, &gate_up, &q8_down, false));
}

/// The residual step fused in front of the one-token product: the product, the updated stream
/// and the normed input all match the separate CPU steps, for plain and gated outputs, at the
/// chosen tuning and at 16 lanes a group, also on 8-bit inputs for K-quants; and without the next norm, the product of the stream
/// itself through GELU times a given vector.
#[test]
fn residual_matvec_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(71);
    for (dtype, k, n) in [
        (GgmlType::Q4K, 1536u32, 2050u64),
        (GgmlType::Q6K, 512, 38),
        (GgmlType::Q8_0, 2816, 302),
        (GgmlType::F32, 640, 10),
        (GgmlType::Q4K, 5376, 10),
    ] {
        let ku = k as usize;
        let wq = quantize(dtype, &rng.vec(ku * n as usize, 0.5)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let w = GpuWeight::upload(ctx, "w", dtype, u64::from(k), n, &wq, None).unwrap();
        let (res, delta) = (rng.vec(ku, 1.0), rng.vec(ku, 3.0));
        let (post, pre) = (rng.vec(ku, 1.0), rng.vec(ku, 1.0));
        let times = rng.vec(n as usize + 5, 1.0);
        let dn = cpu::rms_norm(&delta, ku, Some(&post), 1e-6);
        let h: Vec<f32> = res.iter().zip(&dn).map(|(a, b)| (a + b) * 0.75).collect();
        let xn = cpu::rms_norm(&h, ku, Some(&pre), 1e-6);
        // The products' outputs from the input as it is, or as rounded to 8-bit integers.
        let outputs = |int8: bool| {
            let input = |v: &[f32]| {
                if int8 {
                    cpu::round_to_int8(v)
                } else {
                    v.to_vec()
                }
            };
            let rows = cpu::matmul(&wd, n as usize, ku, &input(&xn), 1);
            let times_h: Vec<f32> = cpu::matmul(&wd, n as usize, ku, &input(&h), 1)
                .iter()
                .zip(&times[5..])
                .map(|(r, t)| cpu::gelu_tanh(*r) * t)
                .collect();
            (gated(&rows), rows, times_h)
        };
        let int8 = ops::int8_input_fits(ctx, dtype, k, true);
        let (rv, dv) = (upload(ctx, &res), upload(ctx, &delta));
        let (pv, prv, tv) = (upload(ctx, &post), upload(ctx, &pre), upload(ctx, &times));
        let times_out = ops::MatvecOut::GeluTimes { by: &tv, offset: 5 };
        // The chosen tuning, the one chosen on GPUs for many rows (16 lanes a group), and that
        // one on 8-bit inputs where the dtype and row allow.
        let narrow = |int8_input| {
            Some(ops::MatvecTuning {
                tpr: 16,
                rpt: 4,
                prefetch: false,
                int8_input,
            })
        };
        let tunings = [None, narrow(false)]
            .into_iter()
            .chain(int8.then(|| narrow(true)));
        for (tuning, out, norm) in tunings.flat_map(|t| {
            [
                (t, ops::MatvecOut::Rows { softcap: 0.0 }, true),
                (t, ops::MatvecOut::Geglu, true),
                (t, times_out, false),
            ]
        }) {
            let what = format!("{dtype} k={k} n={n} {out:?} {tuning:?}");
            let geglu = matches!(out, ops::MatvecOut::Geglu);
            let chosen = ops::MatvecTuning::choose(ctx, dtype, k, n, geglu, true);
            let (gated, rows, times_h) = outputs(tuning.unwrap_or(chosen).int8_input);
            let want = match out {
                ops::MatvecOut::Rows { .. } => rows,
                ops::MatvecOut::Geglu | ops::MatvecOut::GegluInt8 => gated,
                ops::MatvecOut::GeluTimes { .. } => times_h,
            };
            let (res_out, normed) = (poisoned(ctx, ku), poisoned(ctx, ku));
            let step = ops::ResidualStep {
                res: &rv,
                delta: ops::Delta::Row(&dv),
                post: &pv,
                scale: 0.75,
                eps: 1e-6,
                res_out: &res_out,
                next_norm: norm.then_some((&prv, &normed)),
            };
            let y = poisoned(ctx, want.len() + 1);
            let ds = ops::matvec_after_residual_tuned(ctx, &w, &step, &y, 1, out, tuning).unwrap();
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let got = read(ctx, &y);
            assert!(got[0].is_nan(), "{what}: wrote before its offset");
            assert_close(&what, &got[1..], &want, 3e-5);
            assert_close(&format!("{what} stream"), &read(ctx, &res_out), &h, 1e-5);
            if norm {
                assert_close(&format!("{what} normed"), &read(ctx, &normed), &xn, 1e-5);
            }
            assert_eq!(
                read(ctx, &rv),
                res,
                "{what}: the stream read is left as it was"
            );
        }
    }
    // A thread holds at most 8 of the row's vec4s.
    assert!(!ops::matvec_input_fits(ctx, 8196));
}

/// [`residual_matvec_matches_cpu`]'s step with a mixture-of-experts FFN's output as the
/// delta, computed inside the product: the dense branch and the experts' weighted rows, each
/// normalised, added (what `moe_mix` writes).
#[test]
fn residual_matvec_with_an_experts_delta_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(72);
    // SwiftShader (the browser's Vulkan without a GPU, which CI runs these tests on too) binds
    // fewer, and so do WebGPU's limits.
    assert!(
        ops::moe_delta_fits(ctx)
            || std::env::var("CI").is_err()
            || std::env::var_os("WGEMMA_WEBGPU_LIMITS").is_some()
            || ctx.info.name.contains("SwiftShader"),
        "CI's lavapipe binds 12 storage buffers"
    );
    if !ops::moe_delta_fits(ctx) {
        return;
    }
    // Unweighted: one row, the slots' sum as `expert_matvec_mixed` leaves it.
    for (dtype, k, n, slots, weighted) in [
        (GgmlType::Q8_0, 2816u32, 131u64, 8u32, true),
        (GgmlType::F32, 516, 9, 3, true),
        (GgmlType::Q4K, 768, 37, 1, false),
    ] {
        let ku = k as usize;
        let wq = quantize(dtype, &rng.vec(ku * n as usize, 0.5)).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let w = GpuWeight::upload(ctx, "w", dtype, u64::from(k), n, &wq, None).unwrap();
        let (res, dense) = (rng.vec(ku, 1.0), rng.vec(ku, 3.0));
        let experts = rng.vec(ku * slots as usize, 2.0);
        let weights = if weighted {
            rng.vec(slots as usize, 1.0)
        } else {
            vec![1.0]
        };
        let (post, pre) = (rng.vec(ku, 1.0), rng.vec(ku, 1.0));
        let (dense_post, experts_post) = (rng.vec(ku, 1.0), rng.vec(ku, 1.0));
        let mix: Vec<f32> = (0..ku)
            .map(|i| {
                (0..slots as usize)
                    .map(|s| weights[s] * experts[s * ku + i])
                    .sum()
            })
            .collect();
        let delta: Vec<f32> = cpu::rms_norm(&dense, ku, Some(&dense_post), 1e-6)
            .iter()
            .zip(cpu::rms_norm(&mix, ku, Some(&experts_post), 1e-6))
            .map(|(a, b)| a + b)
            .collect();
        let dn = cpu::rms_norm(&delta, ku, Some(&post), 1e-6);
        let h: Vec<f32> = res.iter().zip(&dn).map(|(a, b)| (a + b) * 0.5).collect();
        let xn = cpu::rms_norm(&h, ku, Some(&pre), 1e-6);
        let want = cpu::matmul(&wd, n as usize, ku, &xn, 1);
        let views = [
            &res,
            &dense,
            &experts,
            &weights,
            &post,
            &pre,
            &dense_post,
            &experts_post,
        ]
        .map(|v| upload(ctx, v));
        let [rv, dv, ev, wv, pv, prv, dpv, epv] = &views;
        let mix = ops::MoeMix {
            experts: ev,
            weight: weighted.then_some(wv),
            experts_post: epv,
            dense: dv,
            dense_post: dpv,
            tokens: 1,
            k: slots,
            dim: k,
            eps: 1e-6,
        };
        let (res_out, normed) = (poisoned(ctx, ku), poisoned(ctx, ku));
        let step = ops::ResidualStep {
            res: rv,
            delta: ops::Delta::Moe(mix),
            post: pv,
            scale: 0.5,
            eps: 1e-6,
            res_out: &res_out,
            next_norm: Some((prv, &normed)),
        };
        let y = poisoned(ctx, n as usize);
        let plain = ops::MatvecOut::Rows { softcap: 0.0 };
        let ds = ops::matvec_after_residual(ctx, &w, &step, &y, 0, plain).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let what = format!("experts' output joining, {dtype} k={k} weighted={weighted}");
        assert_close(&what, &read(ctx, &y), &want, 3e-5);
        assert_close(&format!("{what} stream"), &read(ctx, &res_out), &h, 1e-5);
        assert_close(&format!("{what} normed"), &read(ctx, &normed), &xn, 1e-5);
    }
}

#[test]
fn residual_norm_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(59);
    for (rows, dim) in [(1u32, 640u32), (5, 257), (2, 1536), (2, 5376)] {
        let n = (rows * dim) as usize;
        let (res, delta) = (rng.vec(n, 1.0), rng.vec(n, 3.0));
        let (post, pre) = (rng.vec(dim as usize, 1.0), rng.vec(dim as usize, 1.0));
        let dn = cpu::rms_norm(&delta, dim as usize, Some(&post), 1e-6);
        let h: Vec<f32> = res.iter().zip(&dn).map(|(a, b)| (a + b) * 0.5).collect();
        let want = cpu::rms_norm(&h, dim as usize, Some(&pre), 1e-6);
        let (rv, out) = (upload(ctx, &res), poisoned(ctx, n));
        let d = ops::residual_norm(
            ctx,
            &ops::ResidualNorm {
                res: &rv,
                delta: &upload(ctx, &delta),
                post: &upload(ctx, &post),
                weight: &upload(ctx, &pre),
                out: &out,
                rows,
                dim,
                scale: 0.5,
                eps: 1e-6,
            },
        )
        .unwrap();
        run(ctx, &[&d]);
        assert_close("residual stream", &read(ctx, &rv), &h, 1e-5);
        assert_close("next input", &read(ctx, &out), &want, 1e-5);
    }
}

/// Layout and settings of one token's `[q | k | v]` row for the CPU head work.
struct HeadShape {
    nh: u32,
    nkv: u32,
    hd: u32,
    n_rot: u32,
    k_is_v: bool,
    v_norm: bool,
    freq_scale: f32,
}

/// `head_post`'s work on the CPU for one token at `pos`: Q normed and roped, and K (normed,
/// roped) and V (raw, or normed without weight) as their cache rows.
fn heads_on_cpu(
    row: &[f32],
    s: &HeadShape,
    pos: u32,
    qn: &[f32],
    kn: &[f32],
    ff: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (nh, nkv, hd) = (s.nh as usize, s.nkv as usize, s.hd as usize);
    let rope = |x: &mut Vec<f32>, heads| {
        cpu::rope_neox(
            x,
            &cpu::NeoxRope {
                heads,
                head_dim: hd,
                n_rot: s.n_rot as usize,
                positions: &[pos],
                base: 10000.0,
                freq_scale: s.freq_scale,
                freq_factors: ff,
            },
        )
    };
    let mut q = cpu::rms_norm(&row[..nh * hd], hd, Some(qn), 1e-6);
    rope(&mut q, nh);
    let kv = nkv * hd;
    let k_raw = &row[nh * hd..][..kv];
    let mut k = cpu::rms_norm(k_raw, hd, Some(kn), 1e-6);
    rope(&mut k, nkv);
    let v_raw = if s.k_is_v {
        k_raw
    } else {
        &row[nh * hd + kv..][..kv]
    };
    let v = if s.v_norm {
        cpu::rms_norm(v_raw, hd, None, 1e-6)
    } else {
        v_raw.to_vec()
    };
    (q, k, v)
}

#[test]
fn head_post_matches_norm_rope_and_store() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(43);
    // (heads, kv heads, head_dim, n_rot, tokens, k_is_v, v_norm, freq factors, rows a slot:
    // the cache holds several sequences and the RoPE position is the row within the slot)
    for (nh, nkv, hd, n_rot, t, k_is_v, v_norm, ff, slot_rows) in [
        (4u32, 1u32, 256u32, 256u32, 1u32, false, false, false, 0u32),
        (8, 2, 512, 512, 3, true, true, true, 4),
        (3, 3, 64, 32, 2, false, true, false, 3),
    ] {
        let width = (nh + nkv * if k_is_v { 1 } else { 2 }) * hd;
        let stride = width + 8;
        let qkv = rng.vec((t * stride) as usize, 2.0);
        let qn = rng.vec(hd as usize, 1.0);
        let kn = rng.vec(hd as usize, 1.0);
        let factors: Vec<f32> = (0..n_rot / 2)
            .map(|i| if i < n_rot / 8 { 1.0 } else { 1e30 })
            .collect();
        let positions: Vec<u32> = (0..t).map(|i| 5 + 2 * i).collect();
        let cap = 16u32;
        let row = (nkv * hd) as usize;
        let (kc, vc) = (
            upload(ctx, &vec![0.0; cap as usize * row]),
            upload(ctx, &vec![0.0; cap as usize * row]),
        );
        let qkv_v = upload(ctx, &qkv);
        let (qnv, knv, ffv) = (upload(ctx, &qn), upload(ctx, &kn), upload(ctx, &factors));
        let pos_v = upload_u32(ctx, &positions);
        let args = ops::HeadPostArgs {
            qkv: &qkv_v,
            q_norm: &qnv,
            kv: Some(ops::HeadPostKv {
                k_norm: &knv,
                k_cache: &kc,
                v_cache: &vc,
                n_kv: nkv,
                k_is_v,
                v_norm,
            }),
            positions: &pos_v,
            tokens: t,
            n_head: nh,
            head_dim: hd,
            stride,
            n_rot,
            base: 10000.0,
            freq_scale: 1.0,
            freq_factors: ff.then_some(&ffv),
            eps: 1e-6,
            slot_rows,
        };
        run(ctx, &[&ops::head_post(ctx, &args).unwrap()]);
        let got_qkv = read(ctx, &qkv_v);
        let (got_k, got_v) = (read(ctx, &kc), read(ctx, &vc));
        let ffo = ff.then_some(factors.as_slice());
        let shape = HeadShape {
            nh,
            nkv,
            hd,
            n_rot,
            k_is_v,
            v_norm,
            freq_scale: 1.0,
        };
        for (ti, &pos) in positions.iter().enumerate() {
            let base = ti * stride as usize;
            let rope_pos = if slot_rows > 0 { pos % slot_rows } else { pos };
            let (q, k, v) = heads_on_cpu(&qkv[base..], &shape, rope_pos, &qn, &kn, ffo);
            assert_close("head_post q", &got_qkv[base..][..q.len()], &q, 1e-4);
            let slot = pos as usize * row;
            assert_close("head_post k", &got_k[slot..slot + row], &k, 1e-4);
            assert_close("head_post v", &got_v[slot..slot + row], &v, 1e-5);
        }
    }
    // A shared-KV layer: Q only, the rest of the row untouched.
    let (nh, hd, t, stride) = (3u32, 96u32, 2u32, 3 * 96 + 40);
    let qkv = rng.vec((t * stride) as usize, 2.0);
    let qn = rng.vec(hd as usize, 1.0);
    let (qkv_v, qnv) = (upload(ctx, &qkv), upload(ctx, &qn));
    let positions = [3u32, 9];
    let pos_v = upload_u32(ctx, &positions);
    let args = ops::HeadPostArgs {
        qkv: &qkv_v,
        q_norm: &qnv,
        kv: None,
        positions: &pos_v,
        tokens: t,
        n_head: nh,
        head_dim: hd,
        stride,
        n_rot: 64,
        base: 10000.0,
        freq_scale: 1.0,
        freq_factors: None,
        eps: 1e-6,
        slot_rows: 0,
    };
    run(ctx, &[&ops::head_post(ctx, &args).unwrap()]);
    let got = read(ctx, &qkv_v);
    for ti in 0..t as usize {
        let base = ti * stride as usize;
        let q_len = (nh * hd) as usize;
        let mut q = cpu::rms_norm(&qkv[base..base + q_len], hd as usize, Some(&qn), 1e-6);
        cpu::rope_neox(
            &mut q,
            &cpu::NeoxRope {
                heads: nh as usize,
                head_dim: hd as usize,
                n_rot: 64,
                positions: &positions[ti..ti + 1],
                base: 10000.0,
                freq_scale: 1.0,
                freq_factors: None,
            },
        );
        assert_close("shared head_post q", &got[base..base + q_len], &q, 1e-4);
        let rest = base + q_len..base + stride as usize;
        assert_eq!(
            &got[rest.clone()],
            &qkv[rest],
            "shared head_post wrote past Q"
        );
    }
}

#[test]
fn split_decode_attention_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(47);
    // (n_head, n_kv_head, head_dim, capacity, position, window)
    for (nh, nkv, hd, cap, pos, window) in [
        (4u32, 1u32, 256u32, 600u32, 0u32, 0u32),
        (4, 1, 256, 600, 63, 0),
        (4, 1, 256, 600, 64, 0),
        (8, 2, 512, 300, 299, 0),
        (8, 1, 256, 2000, 1500, 512),
        (2, 2, 64, 130, 129, 100),
        (3, 1, 80, 200, 150, 0),
    ] {
        let kv = (cap * nkv * hd) as usize;
        let q_offset = 5u32;
        let q = rng.vec((q_offset + nh * hd) as usize, 1.0);
        let (kc, vc) = (rng.vec(kv, 1.0), rng.vec(kv, 1.0));
        let scale = 0.1;
        let want = cpu::attention(&cpu::CausalAttention {
            q: &q[q_offset as usize..],
            k_cache: &kc,
            v_cache: &vc,
            positions: &[pos],
            n_head: nh as usize,
            n_kv_head: nkv as usize,
            head_dim: hd as usize,
            window: window as usize,
            scale,
            softcap: 0.0,
        });
        let out = poisoned(ctx, want.len());
        let scratch = upload(
            ctx,
            &vec![0.0; ops::DecodeAttention::scratch_floats(nh, hd, cap) as usize],
        );
        let args = AttentionArgs {
            q: &upload(ctx, &q),
            k_cache: &upload(ctx, &kc),
            v_cache: &upload(ctx, &vc),
            positions: &upload_u32(ctx, &[pos]),
            out: &out,
            tokens: 1,
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            window,
            scale,
            softcap: 0.0,
            q_stride: nh * hd,
            last_key: None,
            first_key: None,
            slot_rows: 0,
        };
        let a = ops::attention_decode(ctx, &args, q_offset, &scratch, None).unwrap();
        run(ctx, &[&a.split, &a.combine]);
        assert_close(
            &format!("decode attention h={nh}/{nkv} hd={hd} pos={pos} w={window}"),
            &read(ctx, &out),
            &want,
            1e-4,
        );
    }
}

/// The GPU side of a head-work attention case: the raw projection, norms, caches (a layer
/// that owns its cache, `own`), positions and output.
struct HeadWorkViews<'v> {
    qkv: &'v View,
    qn: &'v View,
    kn: &'v View,
    kc: &'v View,
    vc: &'v View,
    positions: &'v View,
    out: &'v View,
    factors: Option<&'v View>,
    own: bool,
}

/// `v`'s head work ([`ops::HeadPostArgs`]) and its attention over `tokens` tokens of shape
/// `s` (scale 0.1, RoPE base 10000, rows of Q, K and V one after another per token).
fn head_work_args<'v>(
    v: &HeadWorkViews<'v>,
    s: &HeadShape,
    tokens: u32,
    window: u32,
    slot_rows: u32,
) -> (ops::HeadPostArgs<'v>, AttentionArgs<'v>) {
    let width = (s.nh + s.nkv * if s.k_is_v { 1 } else { 2 }) * s.hd;
    let post = ops::HeadPostArgs {
        qkv: v.qkv,
        q_norm: v.qn,
        kv: v.own.then_some(ops::HeadPostKv {
            k_norm: v.kn,
            k_cache: v.kc,
            v_cache: v.vc,
            n_kv: s.nkv,
            k_is_v: s.k_is_v,
            v_norm: s.v_norm,
        }),
        positions: v.positions,
        tokens,
        n_head: s.nh,
        head_dim: s.hd,
        stride: width,
        n_rot: s.n_rot,
        base: 10000.0,
        freq_scale: s.freq_scale,
        freq_factors: v.factors,
        eps: 1e-6,
        slot_rows,
    };
    let args = AttentionArgs {
        q: v.qkv,
        k_cache: v.kc,
        v_cache: v.vc,
        positions: v.positions,
        out: v.out,
        tokens,
        n_head: s.nh,
        n_kv_head: s.nkv,
        head_dim: s.hd,
        window,
        scale: 0.1,
        softcap: 0.0,
        q_stride: width,
        last_key: None,
        first_key: None,
        slot_rows,
    };
    (post, args)
}

/// Several sequences' decode steps with their head work inside the split attention (rule
/// `batched_heads_in_attention`): each token's Q and K normed and roped at its position in
/// its slot, its K and V into the cache at its row, its attention over its own slot.
#[test]
fn batched_decode_attention_with_head_work_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(59);
    let (slot_rows, slots) = (40u32, 3u32);
    // (slot, position in the slot) of each token: the slot's first row, its last, between.
    let rows = [(0u32, 21u32), (1, 39), (2, 0)];
    let positions: Vec<u32> = rows.iter().map(|(s, p)| s * slot_rows + p).collect();
    let t = positions.len() as u32;
    // (heads, kv heads, head_dim, n_rot, window, k_is_v, v_norm)
    for (nh, nkv, hd, n_rot, window, k_is_v, v_norm) in [
        (4u32, 2u32, 64u32, 64u32, 0u32, false, true),
        (8, 1, 128, 64, 8, true, true),
        (3, 3, 64, 32, 0, false, false),
    ] {
        let what = format!("h={nh}/{nkv} hd={hd} w={window} k_is_v={k_is_v}");
        let width = (nh + nkv * if k_is_v { 1 } else { 2 }) * hd;
        let qkv = rng.vec((t * width) as usize, 2.0);
        let (qn, kn) = (rng.vec(hd as usize, 1.0), rng.vec(hd as usize, 1.0));
        let cap = slot_rows * slots;
        let kv_len = (cap * nkv * hd) as usize;
        let (kc, vc) = (rng.vec(kv_len, 1.0), rng.vec(kv_len, 1.0));
        let shape = HeadShape {
            nh,
            nkv,
            hd,
            n_rot,
            k_is_v,
            v_norm,
            freq_scale: 0.5,
        };
        let (mut want_k, mut want_v) = (kc.clone(), vc.clone());
        let mut qs = Vec::new();
        for (ti, &pos) in positions.iter().enumerate() {
            let row = &qkv[ti * width as usize..(ti + 1) * width as usize];
            let (q, k, v) = heads_on_cpu(row, &shape, pos % slot_rows, &qn, &kn, None);
            let at = pos as usize * k.len();
            want_k[at..at + k.len()].copy_from_slice(&k);
            want_v[at..at + v.len()].copy_from_slice(&v);
            qs.push(q);
        }
        let mut want = Vec::new();
        for (q, &pos) in qs.iter().zip(&positions) {
            let reference = cpu::AttendRef {
                q,
                k: &want_k,
                v: &want_v,
                heads: nh as usize,
                kv_heads: nkv as usize,
                d: hd as usize,
                q_pos0: pos as usize,
                scale: 0.1,
                softcap: 0.0,
                relative: None,
            };
            let slot = |p: usize| p / slot_rows as usize;
            want.extend(cpu::attend(&reference, |qp, kp| {
                let near = |d: usize| window == 0 || d < window as usize;
                slot(qp) == slot(kp) && kp <= qp && near(qp - kp)
            }));
        }
        let (qnv, knv) = (upload(ctx, &qn), upload(ctx, &kn));
        let (kcv, vcv) = (upload(ctx, &kc), upload(ctx, &vc));
        let (qkv_v, pos_v) = (upload(ctx, &qkv), upload_u32(ctx, &positions));
        let out = poisoned(ctx, want.len());
        let floats = ops::DecodeAttention::scratch_floats_for(nh, hd, slot_rows, t);
        let scratch = poisoned(ctx, floats as usize);
        let views = HeadWorkViews {
            qkv: &qkv_v,
            qn: &qnv,
            kn: &knv,
            kc: &kcv,
            vc: &vcv,
            positions: &pos_v,
            out: &out,
            factors: None,
            own: true,
        };
        let (post, args) = head_work_args(&views, &shape, t, window, slot_rows);
        let a = ops::attention_decode(ctx, &args, 0, &scratch, Some(&post)).unwrap();
        run(ctx, &[&a.split, &a.combine]);
        assert_close(&format!("{what} output"), &read(ctx, &out), &want, 1e-4);
        assert_close(&format!("{what} k cache"), &read(ctx, &kcv), &want_k, 1e-4);
        assert_close(&format!("{what} v cache"), &read(ctx, &vcv), &want_v, 1e-5);
        assert_eq!(
            read(ctx, &qkv_v),
            qkv,
            "{what}: the fused kernel leaves the projection as it is"
        );
    }
}

/// The head work fused into the split kernel against the CPU (head norms and RoPE, then
/// attention over the cache with the token's K/V in its slot): the attention output and the
/// stored K/V, for layers that own their cache (K as V, V norm, frequency factors, the token
/// first or inside its chunk, a window) and a layer reading another's (no store).
#[test]
fn decode_attention_with_head_work_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(53);
    // (heads, kv heads, head_dim, n_rot, capacity, position, window, k_is_v, v_norm, factors, own cache)
    for (nh, nkv, hd, n_rot, cap, pos, window, k_is_v, v_norm, ff, own) in [
        (
            8u32, 1u32, 256u32, 256u32, 300u32, 70u32, 0u32, false, true, false, true,
        ),
        (4, 2, 512, 128, 200, 64, 0, true, true, true, true),
        (3, 3, 64, 32, 130, 129, 100, false, false, false, true),
        (4, 1, 128, 128, 100, 0, 0, false, true, false, true),
        (8, 2, 256, 256, 300, 201, 64, false, true, false, false),
        (4, 2, 64, 64, 2500, 2400, 0, false, true, false, true),
    ] {
        let what = format!("h={nh}/{nkv} hd={hd} pos={pos} w={window} own={own}");
        let width = (nh + nkv * if k_is_v { 1 } else { 2 }) * hd;
        let qkv = rng.vec(width as usize, 2.0);
        let (qn, kn) = (rng.vec(hd as usize, 1.0), rng.vec(hd as usize, 1.0));
        let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.1).collect();
        let kv_len = (cap * nkv * hd) as usize;
        let (kc, vc) = (rng.vec(kv_len, 1.0), rng.vec(kv_len, 1.0));
        let shape = HeadShape {
            nh,
            nkv,
            hd,
            n_rot,
            k_is_v,
            v_norm,
            freq_scale: 0.5,
        };
        let ffo = ff.then_some(factors.as_slice());
        let (q, k, v) = heads_on_cpu(&qkv, &shape, pos, &qn, &kn, ffo);
        // A layer that owns its cache sees the token's own K/V at its position; a shared
        // layer's cache already holds that slot.
        let (mut want_k, mut want_v) = (kc.clone(), vc.clone());
        if own {
            let slot = pos as usize * k.len();
            want_k[slot..slot + k.len()].copy_from_slice(&k);
            want_v[slot..slot + v.len()].copy_from_slice(&v);
        }
        let want = cpu::attention(&cpu::CausalAttention {
            q: &q,
            k_cache: &want_k,
            v_cache: &want_v,
            positions: &[pos],
            n_head: nh as usize,
            n_kv_head: nkv as usize,
            head_dim: hd as usize,
            window: window as usize,
            scale: 0.1,
            softcap: 0.0,
        });
        // The merge in its own dispatch, and in front of the output product (Q8_0, 37 rows).
        let (k_in, n) = (u64::from(nh * hd), 37u64);
        let wq = quantize(GgmlType::Q8_0, &rng.vec((k_in * n) as usize, 0.5)).unwrap();
        let wd = dequantize_to_vec(GgmlType::Q8_0, &wq).unwrap();
        let w = GpuWeight::upload(ctx, "o", GgmlType::Q8_0, k_in, n, &wq, None).unwrap();
        let want_y = cpu::matmul(&wd, n as usize, k_in as usize, &want, 1);
        let (qnv, knv, ffv) = (upload(ctx, &qn), upload(ctx, &kn), upload(ctx, &factors));
        let pos_v = upload_u32(ctx, &[pos]);
        let qkv_v = upload(ctx, &qkv);
        // RoPE angles grow with the position: an f32 angle near 2400 is only good to 2.4e-4
        // rad, and GPUs' sin/cos add their own error there.
        let tol = 1e-4f32.max(pos as f32 * 2.5e-7);
        for fused in [false, true] {
            let what = format!("{what} fused product {fused}");
            let (kcv, vcv) = (upload(ctx, &kc), upload(ctx, &vc));
            let out = poisoned(ctx, (nh * hd) as usize);
            let scratch = upload(
                ctx,
                &vec![0.0; ops::DecodeAttention::scratch_floats(nh, hd, cap) as usize],
            );
            let views = HeadWorkViews {
                qkv: &qkv_v,
                qn: &qnv,
                kn: &knv,
                kc: &kcv,
                vc: &vcv,
                positions: &pos_v,
                out: &out,
                factors: ff.then_some(&ffv),
                own,
            };
            let (post, args) = head_work_args(&views, &shape, 1, window, 0);
            if fused {
                let (split, merge) =
                    ops::attention_split(ctx, &args, 0, &scratch, Some(&post)).unwrap();
                let y = poisoned(ctx, n as usize);
                let plain = ops::MatvecOut::Rows { softcap: 0.0 };
                let product = ops::matvec_after_attention(ctx, &w, &merge, &y, 0, plain).unwrap();
                run(ctx, &[&split, &product[0]]);
                assert_close(&format!("{what} product"), &read(ctx, &y), &want_y, tol);
                assert!(
                    read(ctx, &out).iter().all(|v| v.is_nan()),
                    "{what}: the heads' output stays in the product's workgroups"
                );
            } else {
                let a = ops::attention_decode(ctx, &args, 0, &scratch, Some(&post)).unwrap();
                run(ctx, &[&a.split, &a.combine]);
                assert_close(&format!("{what} output"), &read(ctx, &out), &want, tol);
            }
            assert_eq!(
                read(ctx, &qkv_v),
                qkv,
                "{what}: the fused kernel leaves the projection as it is"
            );
            assert_close(&format!("{what} k cache"), &read(ctx, &kcv), &want_k, tol);
            assert_close(&format!("{what} v cache"), &read(ctx, &vcv), &want_v, 1e-5);
            if !own {
                assert_eq!(
                    read(ctx, &kcv),
                    kc,
                    "{what}: a shared layer writes no cache"
                );
            }
        }
    }
    // The product's input is the heads' output.
    let (nh, hd, cap) = (2u32, 64u32, 64u32);
    let v = |n: u32| upload(ctx, &vec![0.5; n as usize]);
    let (q, kc, vc, out) = (v(nh * hd), v(cap * hd), v(cap * hd), v(nh * hd));
    let (pos_v, scratch) = (
        upload_u32(ctx, &[3]),
        v(ops::DecodeAttention::scratch_floats(nh, hd, cap) as u32),
    );
    let args = AttentionArgs {
        q: &q,
        k_cache: &kc,
        v_cache: &vc,
        positions: &pos_v,
        out: &out,
        tokens: 1,
        n_head: nh,
        n_kv_head: 1,
        head_dim: hd,
        window: 0,
        scale: 1.0,
        softcap: 0.0,
        q_stride: nh * hd,
        last_key: None,
        first_key: None,
        slot_rows: 0,
    };
    let (_, merge) = ops::attention_split(ctx, &args, 0, &scratch, None).unwrap();
    let wq = quantize(GgmlType::Q8_0, &vec![0.25; 96 * 4]).unwrap();
    let w = GpuWeight::upload(ctx, "o", GgmlType::Q8_0, 96, 4, &wq, None).unwrap();
    let plain = ops::MatvecOut::Rows { softcap: 0.0 };
    assert!(ops::matvec_after_attention(ctx, &w, &merge, &v(4), 0, plain).is_err());
}

#[test]
fn gpu_sampling_kernels_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(53);
    let vocab = 5000u32;
    let base = ops::SampleParams {
        k: 40,
        seed: 7,
        step: 0,
        temperature: 1.3,
        top_p: 1.0,
        min_p: 0.0,
        last_n: 64,
        penalties: ops::PenaltyParams {
            repeat: 1.2,
            frequency: 0.1,
            presence: 0.3,
        },
        vocab,
    };
    // Draws: several settings and steps, candidates from the GPU's own top-k.
    let logits = rng.vec(vocab as usize, 4.0);
    let lv = upload(ctx, &logits);
    let scratch = upload_u32(ctx, &vec![0; ops::TopK::scratch_words(vocab, 64) as usize]);
    let cand = upload_u32(ctx, &[0; 128]);
    let result = upload_u32(ctx, &[0, 0]);
    for (top_p, min_p, k) in [
        (1.0, 0.0, 40u32),
        (0.8, 0.0, 64),
        (1.0, 0.05, 20),
        (0.5, 0.1, 3),
    ] {
        let t = ops::top_k(ctx, &lv, vocab, k, &scratch, &cand).unwrap();
        let p = ops::SampleParams {
            k,
            top_p,
            min_p,
            ..base
        };
        let d = ops::sample_kernel(ctx, ops::SampleKernel::Draw, &cand, &result, &p).unwrap();
        for step in 0..6u32 {
            d.update_params(ctx, &ops::SampleParams { step, ..p }.params());
            run(ctx, &[&t.partial, &t.finish, &d]);
            let got = pollster::block_on(ctx.read_u32(&result)).unwrap()[0];
            let want = cpu::draw(
                &cpu::top_k(&logits, k as usize),
                p.temperature,
                top_p,
                min_p,
                cpu::uniform(7, step, u32::MAX),
            );
            assert_eq!(
                Some(got),
                want,
                "draw top_p={top_p} min_p={min_p} k={k} step={step}"
            );
        }
    }
    // The ring: push tokens through result[0], then penalise from the last 64.
    let ring = upload_u32(ctx, &vec![0; 1 + ops::RING_CAP as usize]);
    let push = ops::sample_kernel(ctx, ops::SampleKernel::RingPush, &result, &ring, &base).unwrap();
    let mut history = Vec::new();
    for i in 0..1100u32 {
        let tok = (i * 7919) % 97 + if i % 5 == 0 { 4990 } else { 0 };
        history.push(tok);
        ctx.write(&result.buffer, 0, bytemuck::bytes_of(&tok));
        run(ctx, &[&push]);
    }
    let mut want = logits.clone();
    cpu::penalties(&mut want, &cpu::recent_counts(&history, 64), base.penalties);
    let lv2 = upload(ctx, &logits);
    let pen = ops::sample_kernel(ctx, ops::SampleKernel::PenaltyRing, &ring, &lv2, &base).unwrap();
    run(ctx, &[&pen]);
    assert_close("ring penalties", &read(ctx, &lv2), &want, 1e-6);
    // The sampled token's logit, and the floor for a token past the vocabulary.
    let pick_out = upload_u32(ctx, &[0, 0]);
    let pick = ops::sample_kernel(ctx, ops::SampleKernel::Pick, &lv2, &pick_out, &base).unwrap();
    for tok in [0u32, 4991, base.vocab - 1, base.vocab] {
        ctx.write(&pick_out.buffer, 0, bytemuck::bytes_of(&tok));
        run(ctx, &[&pick]);
        let got = f32::from_bits(pollster::block_on(ctx.read_u32(&pick_out)).unwrap()[1]);
        let want = want.get(tok as usize).copied().unwrap_or(-3.4e38);
        assert_eq!(got, want, "pick of token {tok}");
    }
}

/// Stacked experts of `rows` rows each, `dtype`, in tiles of two experts (three tiles for six),
/// with their dequantized values.
fn stacked_experts(
    ctx: &GpuContext,
    rng: &mut Rng,
    dtype: GgmlType,
    n_expert: u64,
    rows: u64,
    cols: u64,
) -> (GpuWeight, Vec<f32>) {
    let wf = rng.vec((n_expert * rows * cols) as usize, 0.5);
    let wq = quantize(dtype, &wf).unwrap();
    let wd = dequantize_to_vec(dtype, &wq).unwrap();
    let tile = dtype.bytes_for(cols).unwrap() * rows * 2 + 16;
    let w = GpuWeight::allocate_in_groups(
        ctx,
        "experts",
        dtype,
        cols,
        n_expert * rows,
        rows,
        Some(tile),
    )
    .unwrap();
    assert_eq!(w.tiles.len() as u64, n_expert.div_ceil(2));
    for i in 0..w.tiles.len() {
        let r = w.tile_range(i);
        w.write_tile(ctx, i, &wq[r.start as usize..r.end as usize])
            .unwrap();
    }
    (w, wd)
}

#[test]
fn experts_grouped_for_many_tokens_match_the_cpu() {
    let Some(ctx) = ctx() else { return };
    // 140 tokens: 64-slot tiles, more slots than the grouping's 256 threads; on tensor-core
    // devices 40 (13 slots an expert on average) takes 32-slot tiles, 30 (10) 16-slot ones.
    for tokens in [140, 40, 30] {
        check_grouped_experts(ctx, tokens);
    }
}

fn check_grouped_experts(ctx: &GpuContext, tokens: u32) {
    let mut rng = Rng(67);
    // Every token picks expert 0 (three tiles' worth at the tile size each count is for) and
    // one of experts 1-4 in turn; expert 5 gets none.
    let (n_expert, k) = (6u32, 2u32);
    let (n, slots) = (n_expert as usize, tokens * k);
    let sel: Vec<u32> = (0..tokens).flat_map(|t| [1 + t % 4, 0]).collect();
    let selv = upload_u32(ctx, &sel);
    let groups = upload_u32(ctx, &vec![u32::MAX; 2 * n + slots as usize]);
    let eg = ops::ExpertGroups {
        groups: &groups,
        n_expert,
        tokens,
    };
    let expert_slots = |rows_per_expert, x_group| ops::ExpertSlots {
        sel: &selv,
        slots,
        rows_per_expert,
        x_group,
    };
    run(
        ctx,
        // Grouping reads only the expert ids: the rows per expert do not matter here.
        &[&ops::moe_group(ctx, &expert_slots(192, k), &eg).unwrap()],
    );
    let mut got = pollster::block_on(ctx.read_u32(&groups)).unwrap();
    for e in 0..n {
        let at = slots as usize;
        let (count, first) = (got[at + e] as usize, got[at + n + e] as usize);
        got[first..][..count].sort_unstable();
    }
    assert_eq!(got, cpu::group_by_expert(&sel, n), "slots by expert");

    // Per slot, its expert's product of its token's input, out of the product of every
    // expert with every input row.
    let per_slot =
        |dtype: GgmlType, wd: &[f32], rows: usize, cols: usize, x: &[f32], x_group: usize| {
            let m = x.len() / cols;
            let (by_expert, tol): (Vec<Vec<f32>>, Vec<f32>) = (0..n)
                .map(|e| {
                    let operands = Operands::of(
                        dtype,
                        &wd[e * rows * cols..][..rows * cols],
                        [rows, cols],
                        x,
                        m,
                    );
                    matmul_reference(ctx, operands, true)
                })
                .unzip();
            let want: Vec<f32> = (0..slots as usize)
                .flat_map(|s| by_expert[sel[s] as usize][(s / x_group) * rows..][..rows].to_vec())
                .collect();
            (want, tol[0])
        };
    let product =
        |w: &GpuWeight, x: &View, y: &View, y_stride, slots: &ops::ExpertSlots<'_>, out| {
            let ds = ops::expert_matmul(
                ctx,
                w,
                &ops::ExpertIo {
                    x,
                    y,
                    y_stride,
                    slots,
                },
                &eg,
                out,
            )
            .unwrap();
            run(ctx, &ds.iter().collect::<Vec<_>>());
            read(ctx, y)
        };
    // Q4_K's rows are whole blocks of 256.
    for (dtype, d, ff) in [
        (GgmlType::Q8_0, 96u64, 96u64),
        (GgmlType::F32, 96, 96),
        (GgmlType::Q4K, 256, 256),
    ] {
        let mut x = rng.vec((u64::from(tokens) * d) as usize, 1.0);
        let mut act = rng.vec((u64::from(slots) * ff) as usize, 1.0);
        off_ties(&mut x, d as usize, d as usize);
        off_ties(&mut act, ff as usize, ff as usize);
        let (xv, actv) = (upload(ctx, &x), upload(ctx, &act));
        let (gate_up, gate_up_d) =
            stacked_experts(ctx, &mut rng, dtype, n_expert.into(), 2 * ff, d);
        let out = poisoned(ctx, (u64::from(slots) * ff) as usize);
        let gate_up_slots = expert_slots(2 * ff as u32, k);
        let got = product(
            &gate_up,
            &xv,
            &out,
            ff as u32,
            &gate_up_slots,
            ops::MatvecOut::Geglu,
        );
        let (rows, tol) = per_slot(
            dtype,
            &gate_up_d,
            2 * ff as usize,
            d as usize,
            &x,
            k as usize,
        );
        assert_close(
            &format!("grouped expert gate/up {dtype}, {tokens} tokens"),
            &got,
            &gated(&rows),
            tol,
        );

        let (down, down_d) = stacked_experts(ctx, &mut rng, dtype, n_expert.into(), d, ff);
        let out = poisoned(ctx, (u64::from(slots) * d) as usize);
        let plain = ops::MatvecOut::Rows { softcap: 0.0 };
        let got = product(
            &down,
            &actv,
            &out,
            d as u32,
            &expert_slots(d as u32, 1),
            plain,
        );
        let (want, tol) = per_slot(dtype, &down_d, d as usize, ff as usize, &act, 1);
        assert_close(
            &format!("grouped expert down {dtype}, {tokens} tokens"),
            &got,
            &want,
            tol,
        );
    }
}

/// The MoE tests' shape (3 tokens, 2 of 6 experts, width 64, experts 96 wide) and inputs.
struct MoeCase {
    tokens: u32,
    n_expert: u32,
    k: u32,
    d: u64,
    ff: u64,
    x: Vec<f32>,
    pre: Vec<f32>,
}

impl MoeCase {
    fn new(rng: &mut Rng) -> Self {
        let (tokens, d) = (3u32, 64u64);
        Self {
            tokens,
            n_expert: 6,
            k: 2,
            d,
            ff: 96,
            x: rng.vec((u64::from(tokens) * d) as usize, 1.0),
            pre: rng.vec(d as usize, 1.0),
        }
    }
}

/// A routing's outputs on the GPU (checked against the CPU): the experts and weights of each
/// slot, as buffers and as read back.
struct Routed {
    sel: View,
    weight: View,
    got_sel: Vec<u32>,
    got_w: Vec<f32>,
}

/// Routes `tokens` tokens' `logits` to `k` of `n_expert` experts on the GPU (weights times
/// `scale`), checked against the CPU.
fn route_like_cpu(
    ctx: &GpuContext,
    (tokens, n_expert, k): (u32, u32, u32),
    logits: &[f32],
    scale: &[f32],
) -> Routed {
    let (sel, weight) = (
        upload_u32(ctx, &vec![u32::MAX; (tokens * k) as usize]),
        poisoned(ctx, (tokens * k) as usize),
    );
    let (lv, sv) = (upload(ctx, logits), upload(ctx, scale));
    let route = ops::ExpertRoute {
        logits: &lv,
        weight: &weight,
        expert_scale: Some(&sv),
        n_expert,
    };
    run(
        ctx,
        &[&ops::moe_route(ctx, &route, &sel, tokens, k).unwrap()],
    );
    let got_sel = pollster::block_on(ctx.read_u32(&sel)).unwrap();
    let got_w = read(ctx, &weight);
    let mut want_w = Vec::new();
    for t in 0..tokens as usize {
        let routed = cpu::route(
            &logits[t * n_expert as usize..][..n_expert as usize],
            k as usize,
        );
        for (j, (e, w)) in routed.iter().enumerate() {
            assert_eq!(
                got_sel[t * k as usize + j],
                *e,
                "{n_expert}: token {t} slot {j}"
            );
            want_w.push(w * scale[*e as usize]);
        }
    }
    assert_close("route weights", &got_w, &want_w, 1e-5);
    Routed {
        sel,
        weight,
        got_sel,
        got_w,
    }
}

/// The 26B-A4B's routing shape, 8 of 128 experts for 2 tokens, with tied logits: the lower
/// index goes first, and a tie across the k-th place picks the lower. Logits and scales.
fn tied_big_logits(rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
    let mut big = rng.vec(2 * 128, 3.0);
    big[5] = big[9];
    big[40] = 10.0;
    big[41] = 10.0;
    big[128 + 7] = 9.0;
    big[128 + 100] = 9.0;
    for i in 0..7 {
        big[128 + 20 + i] = 12.0;
    }
    (big, rng.vec(128, 1.0))
}

/// The small case's routing: its logits and scales, and the GPU's result.
fn small_routing(ctx: &GpuContext, rng: &mut Rng, c: &MoeCase) -> (Vec<f32>, Vec<f32>, Routed) {
    let logits = rng.vec((c.tokens * c.n_expert) as usize, 3.0);
    let scale = rng.vec(c.n_expert as usize, 1.0);
    let routed = route_like_cpu(ctx, (c.tokens, c.n_expert, c.k), &logits, &scale);
    (logits, scale, routed)
}

#[test]
fn moe_router_product_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(61);
    let c = MoeCase::new(&mut rng);
    let (x, d, n_expert) = (&c.x, c.d, c.n_expert);
    let du = d as usize;
    let router_scale = rng.vec(du, 1.0);
    let (xv, rsv) = (upload(ctx, x), upload(ctx, &router_scale));
    let router_norm = ops::InputNorm {
        weight: &rsv,
        eps: 1e-6,
    };
    // The router's product of one token with its input norm in front, for odd row counts.
    for (dtype, rows) in [(GgmlType::Q8_0, n_expert), (GgmlType::F32, 37)] {
        let wf = rng.vec(rows as usize * du, 0.5);
        let wq = quantize(dtype, &wf).unwrap();
        let wd = dequantize_to_vec(dtype, &wq).unwrap();
        let w = GpuWeight::upload(ctx, "router", dtype, d, u64::from(rows), &wq, None).unwrap();
        let logits = poisoned(ctx, rows as usize + 1);
        let plain = ops::MatvecOut::Rows { softcap: 0.0 };
        let ds = ops::matvec_normed(ctx, &w, &xv, &router_norm, &logits, 1, plain).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let xn = cpu::rms_norm(&x[..du], du, Some(&router_scale), 1e-6);
        let got = read(ctx, &logits);
        assert!(got[0].is_nan(), "normed product wrote before its offset");
        let want = cpu::matmul(&wd, rows as usize, du, &xn, 1);
        assert_close(&format!("normed router {dtype}"), &got[1..], &want, 3e-5);
    }
}

#[test]
fn moe_route_matches_cpu_with_ties() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(62);
    let (big, big_scale) = tied_big_logits(&mut rng);
    route_like_cpu(ctx, (2, 128, 8), &big, &big_scale);
    let c = MoeCase::new(&mut rng);
    small_routing(ctx, &mut rng, &c);
}

#[test]
fn expert_gate_up_products_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(63);
    let c = MoeCase::new(&mut rng);
    let (tokens, n_expert, k, d, ff) = (c.tokens, c.n_expert, c.k, c.d, c.ff);
    let (du, x, pre) = (d as usize, &c.x, &c.pre);
    let (xv, prev) = (upload(ctx, x), upload(ctx, pre));
    let pre_norm = ops::InputNorm {
        weight: &prev,
        eps: 1e-6,
    };
    let (_, _, small) = small_routing(ctx, &mut rng, &c);
    let (sel, got_sel) = (&small.sel, &small.got_sel);
    // Gate/up experts (interleaved pairs), tiles holding two experts each, on the input as
    // it is and normalised in front of the product.
    for dtype in [GgmlType::Q8_0, GgmlType::F32] {
        let (w, wd) = stacked_experts(ctx, &mut rng, dtype, n_expert.into(), 2 * ff, d);
        let slots = ops::ExpertSlots {
            sel,
            slots: tokens * k,
            rows_per_expert: 2 * ff as u32,
            x_group: k,
        };
        for norm in [None, Some(&pre_norm)] {
            let out = poisoned(ctx, (u64::from(tokens * k) * ff) as usize);
            let ds = ops::expert_matvec(
                ctx,
                &w,
                &ops::ExpertIo {
                    x: &xv,
                    y: &out,
                    y_stride: ff as u32,
                    slots: &slots,
                },
                norm,
                None,
                ops::MatvecOut::Geglu,
            )
            .unwrap();
            run(ctx, &ds.iter().collect::<Vec<_>>());
            let input = if norm.is_some() {
                cpu::rms_norm(x, du, Some(pre), 1e-6)
            } else {
                x.clone()
            };
            let mut want = Vec::new();
            for s in 0..(tokens * k) as usize {
                let e = got_sel[s] as usize;
                let rows = &wd[e * 2 * ff as usize * du..][..2 * ff as usize * du];
                let xr = &input[(s / k as usize) * du..][..du];
                let y = cpu::matmul(rows, 2 * ff as usize, du, xr, 1);
                want.extend(gated(&y));
            }
            let what = format!("expert gate/up {dtype} normed={}", norm.is_some());
            assert_close(&what, &read(ctx, &out), &want, 3e-5);
        }
    }
}

#[test]
fn expert_gate_up_routing_itself_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(64);
    let c = MoeCase::new(&mut rng);
    let (d, ff, du) = (c.d, c.ff, c.d as usize);
    let prev = upload(ctx, &c.pre);
    let (pre, pre_norm) = (
        &c.pre,
        ops::InputNorm {
            weight: &prev,
            eps: 1e-6,
        },
    );
    let (logits, scale, small) = small_routing(ctx, &mut rng, &c);
    let (big, big_scale) = tied_big_logits(&mut rng);
    let big_routed = route_like_cpu(ctx, (2, 128, 8), &big, &big_scale);
    let (x, (n_expert, k, tokens)) = (&c.x, (c.n_expert, c.k, c.tokens));
    let (got_sel, got_w) = (&small.got_sel, &small.got_w);
    let (big_got_sel, big_got_w) = (&big_routed.got_sel, &big_routed.got_w);
    // Routed inside the gate/up product (a decode step's experts): the experts and weights
    // the route kernel gives, and the same products; at the small shape and at the
    // 26B-A4B's 8 of 128, with ties.
    let big_x = rng.vec(2 * du, 1.0);
    for (n_expert, k, tokens, xs, logits, scale, want_sel, want_w) in [
        (n_expert, k, tokens, x, &logits, &scale, got_sel, got_w),
        (128, 8, 2, &big_x, &big, &big_scale, big_got_sel, big_got_w),
    ] {
        let (w, wd) = stacked_experts(ctx, &mut rng, GgmlType::Q8_0, n_expert.into(), 2 * ff, d);
        let n_slots = (tokens * k) as usize;
        let (sel, weight) = (
            upload_u32(ctx, &vec![u32::MAX; n_slots]),
            poisoned(ctx, n_slots),
        );
        let (lv, sv, xsv) = (upload(ctx, logits), upload(ctx, scale), upload(ctx, xs));
        let slots = ops::ExpertSlots {
            sel: &sel,
            slots: tokens * k,
            rows_per_expert: 2 * ff as u32,
            x_group: k,
        };
        let routing = ops::ExpertRoute {
            logits: &lv,
            weight: &weight,
            expert_scale: Some(&sv),
            n_expert,
        };
        let out = poisoned(ctx, n_slots * ff as usize);
        let product = |r: &ops::ExpertRoute<'_>| {
            let (x, gated) = (&xsv, ops::MatvecOut::Geglu);
            ops::expert_matvec(
                ctx,
                &w,
                &ops::ExpertIo {
                    x,
                    y: &out,
                    y_stride: ff as u32,
                    slots: &slots,
                },
                Some(&pre_norm),
                Some(r),
                gated,
            )
        };
        let ds = product(&routing).unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let what = format!("gate/up routing {k} of {n_expert} itself");
        let got_sel = pollster::block_on(ctx.read_u32(&sel)).unwrap();
        assert_eq!(&got_sel, want_sel, "{what}: experts");
        assert_close(
            &format!("{what}: weights"),
            &read(ctx, &weight),
            want_w,
            1e-6,
        );
        let input = cpu::rms_norm(xs, du, Some(pre), 1e-6);
        let mut want = Vec::new();
        for (s, &e) in want_sel.iter().enumerate() {
            let rows = &wd[e as usize * 2 * ff as usize * du..][..2 * ff as usize * du];
            let xr = &input[(s / k as usize) * du..][..du];
            want.extend(gated(&cpu::matmul(rows, 2 * ff as usize, du, xr, 1)));
        }
        assert_close(&what, &read(ctx, &out), &want, 3e-5);
        // Routing from more experts than a workgroup ranks.
        let too_many = ops::ExpertRoute {
            n_expert: 257,
            ..routing
        };
        assert!(product(&too_many).is_err(), "{what}: 257 experts");
    }
}

#[test]
fn expert_down_products_mix_their_slots_like_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(65);
    let c = MoeCase::new(&mut rng);
    let (n_expert, k, d, ff, du) = (c.n_expert, c.k, c.d, c.ff, c.d as usize);
    let (_, _, small) = small_routing(ctx, &mut rng, &c);
    let (big, big_scale) = tied_big_logits(&mut rng);
    let big_r = route_like_cpu(ctx, (2, 128, 8), &big, &big_scale);
    let (sel, got_sel, got_w, weight) = (&small.sel, &small.got_sel, &small.got_w, &small.weight);
    let (big_sel, big_got_sel, big_got_w, big_w) =
        (&big_r.sel, &big_r.got_sel, &big_r.got_w, &big_r.weight);
    // Down experts, each token's slots weighted and summed in the product: tiles of two
    // experts (the tiles after the first add to what the first wrote), 6 experts 2 a token
    // and the 26B-A4B's 8 of 128.
    for (dtype, n_expert, k, sel, got_sel, got_w, weight) in [
        (GgmlType::Q8_0, n_expert, k, sel, got_sel, got_w, weight),
        (GgmlType::F32, n_expert, k, sel, got_sel, got_w, weight),
        (
            GgmlType::Q5_0,
            128,
            8,
            big_sel,
            big_got_sel,
            big_got_w,
            big_w,
        ),
    ] {
        let slots = got_sel.len();
        let (w, wd) = stacked_experts(ctx, &mut rng, dtype, n_expert.into(), d, ff);
        let act = rng.vec(slots * ff as usize, 1.0);
        let down_slots = ops::ExpertSlots {
            sel,
            slots: slots as u32,
            rows_per_expert: d as u32,
            x_group: 1,
        };
        let tokens = slots / k as usize;
        let out = poisoned(ctx, tokens * du);
        let ds = ops::expert_matvec_mixed(
            ctx,
            &w,
            &ops::ExpertIo {
                x: &upload(ctx, &act),
                y: &out,
                y_stride: d as u32,
                slots: &down_slots,
            },
            weight,
            k,
        )
        .unwrap();
        run(ctx, &ds.iter().collect::<Vec<_>>());
        let mut want = vec![0.0f32; tokens * du];
        for s in 0..slots {
            let e = got_sel[s] as usize;
            let y = cpu::matmul(
                &wd[e * du * ff as usize..][..du * ff as usize],
                du,
                ff as usize,
                &act[s * ff as usize..][..ff as usize],
                1,
            );
            for (o, v) in want[(s / k as usize) * du..][..du].iter_mut().zip(y) {
                *o += got_w[s] * v;
            }
        }
        let what = format!("expert down, mixed, {dtype} {k} of {n_expert}");
        assert_close(&what, &read(ctx, &out), &want, 3e-5);
        // More slots a token than a workgroup holds, or slots that are not whole tokens.
        let av = upload(ctx, &act);
        for bad_k in [ops::MIXED_SLOTS_MAX + 1, slots as u32 + 1] {
            let mixed = ops::expert_matvec_mixed(
                ctx,
                &w,
                &ops::ExpertIo {
                    x: &av,
                    y: &out,
                    y_stride: d as u32,
                    slots: &down_slots,
                },
                weight,
                bad_k,
            );
            assert!(mixed.is_err(), "{what}: {bad_k} slots a token");
        }
    }
}

#[test]
fn moe_mix_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(66);
    let c = MoeCase::new(&mut rng);
    let (tokens, k, d, du) = (c.tokens, c.k, c.d, c.d as usize);
    let (_, _, small) = small_routing(ctx, &mut rng, &c);
    let (weight, got_w) = (&small.weight, &small.got_w);
    // The mix: the dense branch and the experts' weighted sum, each normalised; unweighted,
    // one row a token that a mixed product summed.
    for weighted in [true, false] {
        let kk = if weighted { k } else { 1 };
        let y = rng.vec((u64::from(tokens * kk) * d) as usize, 1.0);
        let dense = rng.vec((u64::from(tokens) * d) as usize, 2.0);
        let (dense_post, experts_post) = (rng.vec(du, 1.0), rng.vec(du, 1.0));
        let (yv, dv) = (upload(ctx, &y), upload(ctx, &dense));
        let (dpv, epv) = (upload(ctx, &dense_post), upload(ctx, &experts_post));
        let mix = ops::MoeMix {
            experts: &yv,
            weight: weighted.then_some(weight),
            experts_post: &epv,
            dense: &dv,
            dense_post: &dpv,
            tokens,
            k: kk,
            dim: d as u32,
            eps: 1e-6,
        };
        let out = poisoned(ctx, (u64::from(tokens) * d) as usize);
        run(ctx, &[&ops::moe_mix(ctx, &mix, &out).unwrap()]);
        let slot_weight = |s: usize| if weighted { got_w[s] } else { 1.0 };
        let sums: Vec<f32> = (0..tokens as usize)
            .flat_map(|t| {
                let y = &y;
                (0..du).map(move |i| {
                    (0..kk as usize)
                        .map(|j| {
                            slot_weight(t * kk as usize + j) * y[(t * kk as usize + j) * du + i]
                        })
                        .sum()
                })
            })
            .collect();
        let experts_part = cpu::rms_norm(&sums, du, Some(&experts_post), 1e-6);
        let dense_part = cpu::rms_norm(&dense, du, Some(&dense_post), 1e-6);
        let want: Vec<f32> = experts_part
            .iter()
            .zip(&dense_part)
            .map(|(a, b)| a + b)
            .collect();
        assert_close(
            &format!("experts' mix weighted={weighted}"),
            &read(ctx, &out),
            &want,
            1e-5,
        );
    }
    // Unweighted means one row a token.
    let z = upload(ctx, &[0.0; 64]);
    let unweighted = ops::MoeMix {
        experts: &z,
        weight: None,
        experts_post: &z,
        dense: &z,
        dense_post: &z,
        tokens: 1,
        k: 2,
        dim: 8,
        eps: 1e-6,
    };
    let err = ops::moe_mix(ctx, &unweighted, &z)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.is_some_and(|e| e.contains("unweighted")),
        "two unweighted rows a token"
    );
}

/// `WGEMMA_EXPECT_COOP=1` (set by `benches/h100.sh`) turns a device that should have
/// cooperative matrices but came up without them into a failure, so the tests above cannot
/// pass there on the fallback path unnoticed.
#[test]
fn cooperative_matrices_are_used_where_expected() {
    let Some(ctx) = ctx() else { return };
    if std::env::var("WGEMMA_EXPECT_COOP").is_ok_and(|v| v == "1") {
        assert!(
            ctx.features.coop_matmul,
            "no cooperative matrices on {}",
            ctx.info.name
        );
    }
}

#[test]
fn wait_for_returns_once_the_work_is_done() {
    let Some(ctx) = ctx() else { return };
    // Enough work that the device is still busy when the wait starts.
    let n = 1 << 22;
    let v = upload(ctx, &Rng(29).vec(n as usize, 1.0));
    let d = ops::elementwise(ctx, Elementwise::Scale(1.0), &v, n).unwrap();
    for mode in [WaitMode::Sleep, WaitMode::Spin, ctx.urgent_wait()] {
        let mut rec = Recorder::new(ctx, "wait");
        for _ in 0..16 {
            rec.run(&d);
        }
        let submission = ctx.submit([rec.finish()]);
        ctx.wait_for(submission.clone(), mode).unwrap();
        let finished = ctx.poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: Some(std::time::Duration::ZERO),
        });
        assert!(
            finished.is_ok(),
            "{mode:?}: returned before the work was done"
        );
    }
}

/// An async wait leaves its thread to other tasks while the GPU works (natively a background
/// thread polls the device): on one thread, a task counting while another awaits a long
/// submission counts before the wait resolves. A wait given up before it resolves (its future
/// dropped) leaves the next ones working.
#[test]
fn async_waits_leave_their_thread_free() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let Some(ctx) = ctx() else { return };
    let n = 1 << 22;
    let v = upload(ctx, &Rng(37).vec(n as usize, 1.0));
    let d = ops::elementwise(ctx, Elementwise::Scale(1.0), &v, n).unwrap();
    let long = || {
        let mut rec = Recorder::new(ctx, "long");
        for _ in 0..32 {
            rec.run(&d);
        }
        ctx.submit([rec.finish()])
    };
    // Given up after one poll.
    let mut dropped = Box::pin(ctx.done(Some(long()), WaitMode::Sleep));
    let _ = futures::FutureExt::poll_unpin(
        &mut dropped,
        &mut std::task::Context::from_waker(futures::task::noop_waker_ref()),
    );
    drop(dropped);
    for mode in [WaitMode::Sleep, ctx.urgent_wait()] {
        let (done, counted) = (AtomicBool::new(false), AtomicUsize::new(0));
        let submission = long();
        let counter = async {
            while !done.load(Ordering::SeqCst) {
                counted.fetch_add(1, Ordering::SeqCst);
                YieldNow(false).await;
            }
        };
        let waiter = async {
            ctx.done(Some(submission.clone()), mode).await.unwrap();
            done.store(true, Ordering::SeqCst);
            counted.load(Ordering::SeqCst)
        };
        // The waiter is polled first: a wait that held the thread would be over before the
        // counter ever ran.
        let (before, ()) = pollster::block_on(async { futures::join!(waiter, counter) });
        assert!(before > 0, "{mode:?}: the wait held its thread");
        let finished = ctx.poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: Some(std::time::Duration::ZERO),
        });
        assert!(
            finished.is_ok(),
            "{mode:?}: resolved before the work was done"
        );
    }
}

/// Pending once, asking to be polled again at once: lets the other futures of a `join!` run.
struct YieldNow(bool);

impl std::future::Future for YieldNow {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Threads that submit and wait on one context at once (on their own threads and through the
/// background poller), beside one that only polls: wgpu-core's
/// device maintenance panicked when another thread retired newer submissions in the middle of
/// a wait's (`GpuContext::poll` serialises them). Without that lock this failed in 8 runs of 8
/// on an H200; lavapipe never showed it.
#[test]
fn waits_and_submissions_from_several_threads_agree() {
    let Some(ctx) = ctx() else { return };
    let n = 1 << 12;
    let v = upload(ctx, &Rng(31).vec(n as usize, 1.0));
    let d = ops::elementwise(ctx, Elementwise::Scale(1.0), &v, n).unwrap();
    let rounds = 150;
    let running = std::sync::atomic::AtomicUsize::new(3);
    /// Counts a worker out however it ends, so that the poller stops when one panics.
    struct Leaving<'a>(&'a std::sync::atomic::AtomicUsize);
    impl Drop for Leaving<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        for t in 0..3 {
            let (d, running) = (&d, &running);
            s.spawn(move || {
                let _leaving = Leaving(running);
                let modes = [WaitMode::Sleep, WaitMode::Spin];
                for i in 0..rounds {
                    let mut rec = Recorder::new(ctx, "threads");
                    rec.run(d);
                    let submission = ctx.submit([rec.finish()]);
                    match (i + t) % 4 {
                        3 => ctx.wait().unwrap(),
                        2 => pollster::block_on(ctx.done(Some(submission), modes[i % 2])).unwrap(),
                        k => ctx.wait_for(submission, modes[k]).unwrap(),
                    }
                }
            });
        }
        // A thread that only retires finished work, as a runtime's poller would.
        s.spawn(|| {
            while running.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                ctx.poll(wgpu::PollType::Poll).unwrap();
            }
        });
    });
    let done = ctx.poll(wgpu::PollType::Poll);
    assert!(done.is_ok(), "{done:?}");
}

/// A span copied onto another place in the same buffer, as `slice::copy_within` does on the
/// CPU, in both directions and at an odd length; overlapping or misaligned spans are refused.
#[test]
fn copy_within_moves_a_span_inside_one_buffer() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(83);
    let data: Vec<u32> = rng.vec(4 * 1003, 1.0).iter().map(|v| v.to_bits()).collect();
    let buf = upload_u32(ctx, &data);
    // (from, to, length) in words: forward, backward.
    for (from, to, len) in [(8usize, 2000usize, 1500usize), (2500, 12, 1236)] {
        let span = |at: usize| buf.slice(4 * at as u64, 4 * len as u64).unwrap();
        run(
            ctx,
            &[&ops::copy_within(ctx, &span(from), &span(to)).unwrap()],
        );
        let mut want = data.clone();
        want.copy_within(from..from + len, to);
        let got = pollster::block_on(ctx.read_u32(&buf)).unwrap();
        assert_eq!(got, want, "copy {len} words from {from} to {to}");
        // Back to the original data for the next case.
        run(
            ctx,
            &[&ops::copy_within(ctx, &span(to), &span(from)).unwrap()],
        );
        ctx.write(&buf.buffer, 0, bytemuck::cast_slice(&data));
    }
    let at = |o: u64, n: u64| buf.slice(o, n).unwrap();
    assert!(
        ops::copy_within(ctx, &at(0, 160), &at(64, 160)).is_err(),
        "overlap"
    );
    assert!(
        ops::copy_within(ctx, &at(4, 160), &at(400, 160)).is_err(),
        "misaligned"
    );
    assert!(
        ops::copy_within(ctx, &at(0, 160), &at(400, 176)).is_err(),
        "sizes"
    );
}
