//! The general ops (tensors of any layout) against their CPU references.

use super::*;
use wgemma_kernels::ops::{
    Activation, Affine, Attend, AttendKernel, Binary, Mask, Product, RopeAxes, RopePairs, RowOp,
    RowRope, Window2d,
};
use wgemma_kernels::{DType, Tensor};
use wgemma_test_support::{Built, ParityCase, check, logical};

/// A contiguous f32 tensor of random values, and the values.
fn random(ctx: &GpuContext, rng: &mut Rng, dims: &[u32]) -> (Tensor, Vec<f32>) {
    let n: u32 = dims.iter().product();
    let data = rng.vec(n as usize, 1.0);
    (Tensor::new(&upload(ctx, &data), dims).unwrap(), data)
}

/// A contiguous f32 tensor of NaN.
fn nan_tensor(ctx: &GpuContext, dims: &[u32]) -> Tensor {
    let n: u32 = dims.iter().product();
    Tensor::new(&poisoned(ctx, n as usize), dims).unwrap()
}

const ACTIVATIONS: [Activation; 10] = [
    Activation::Identity,
    Activation::GeluTanh,
    Activation::GeluErf,
    Activation::QuickGelu,
    Activation::Silu,
    Activation::Relu,
    Activation::Sigmoid,
    Activation::Clamp {
        min: -0.3,
        max: 0.45,
    },
    Activation::Scale(-1.75),
    Activation::Affine {
        scale: 2.0,
        shift: -0.6,
    },
];

#[test]
fn pointwise_ops_match_cpu_over_strided_and_broadcast_layouts() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x51ed_2701_9a3c_44f1);
    // A transposed input: y[i, j] = act(a[j, i]), values spread to ±4 to reach the tails.
    let data: Vec<f32> = rng.vec(7 * 13, 4.0);
    let a = Tensor::new(&upload(ctx, &data), &[7, 13]).unwrap();
    let at = a.transpose(0, 1).unwrap();
    for act in ACTIVATIONS {
        let y = nan_tensor(ctx, &[13, 7]);
        run(ctx, &[&ops::unary(ctx, act, &at, &y).unwrap()]);
        let want: Vec<f32> = logical(ctx, &at)
            .iter()
            .map(|&v| cpu::activation(act, v))
            .collect();
        assert_close(&format!("{act:?}"), &read(ctx, y.view()), &want, 2e-6);
    }
    // Binary ops with a broadcast row, into a column slice of a wider output.
    let (a, ad) = random(ctx, &mut rng, &[3, 5, 9]);
    let (b, bd) = random(ctx, &mut rng, &[9]);
    for op in [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Gated(Activation::Sigmoid),
        Binary::Gated(Activation::GeluTanh),
    ] {
        let wide = nan_tensor(ctx, &[3, 5, 20]);
        let y = wide.narrow(2, 4, 9).unwrap();
        run(ctx, &[&ops::binary(ctx, op, &a, &b, &y).unwrap()]);
        let want: Vec<f32> = ad
            .iter()
            .enumerate()
            .map(|(i, &v)| cpu::binary(op, v, bd[i % 9]))
            .collect();
        assert_close(&format!("{op:?}"), &logical(ctx, &y), &want, 2e-6);
        let untouched = read(ctx, wide.view());
        assert!(
            untouched[0].is_nan() && untouched[19].is_nan(),
            "{op:?} wrote outside its slice"
        );
    }
    // In place: y += b, and the GLU of a row's two halves.
    let (y, yd) = random(ctx, &mut rng, &[4, 6]);
    let (b, bd) = random(ctx, &mut rng, &[4, 6]);
    run(ctx, &[&ops::binary(ctx, Binary::Add, &y, &b, &y).unwrap()]);
    let want: Vec<f32> = yd.iter().zip(&bd).map(|(a, b)| a + b).collect();
    assert_close("in-place add", &read(ctx, y.view()), &want, 1e-6);
    let (x, xd) = random(ctx, &mut rng, &[5, 22]);
    let out = nan_tensor(ctx, &[5, 11]);
    let (first, second) = (x.narrow(1, 0, 11).unwrap(), x.narrow(1, 11, 11).unwrap());
    run(
        ctx,
        &[&ops::binary(
            ctx,
            Binary::Gated(Activation::Sigmoid),
            &second,
            &first,
            &out,
        )
        .unwrap()],
    );
    let want: Vec<f32> = (0..55)
        .map(|i| {
            xd[(i / 11) * 22 + i % 11]
                * cpu::activation(Activation::Sigmoid, xd[(i / 11) * 22 + 11 + i % 11])
        })
        .collect();
    assert_close("glu", &read(ctx, out.view()), &want, 2e-6);
    // Reading one buffer in another layout than the output's would race: refused.
    assert!(
        ops::unary(
            ctx,
            Activation::Relu,
            &x.narrow(1, 1, 11).unwrap(),
            &x.narrow(1, 0, 11).unwrap()
        )
        .is_err()
    );
    assert!(ops::binary(ctx, Binary::Add, &a, &b, &nan_tensor(ctx, &[3, 5, 8])).is_err());
}

/// A per-row op over `rows` rows of `n` values stored `[n, rows]` (each row strided), with
/// or without a weight and a bias.
struct RowsCase {
    op: RowOp,
    rows: u32,
    n: u32,
    stored: Vec<f32>,
    weight: Option<Vec<f32>>,
    bias: Option<Vec<f32>>,
}

impl RowsCase {
    fn new(rng: &mut Rng, op: RowOp, (rows, n): (u32, u32), (weight, bias): (bool, bool)) -> Self {
        let mut vec = |on: bool| on.then(|| rng.vec(n as usize, 1.0));
        let (weight, bias) = (vec(weight), vec(bias));
        let stored = rng.vec((rows * n) as usize, 1.0);
        Self {
            op,
            rows,
            n,
            stored,
            weight,
            bias,
        }
    }

    fn x(&self, view: &wgemma_kernels::View) -> Tensor {
        Tensor::new(view, &[self.n, self.rows])
            .unwrap()
            .transpose(0, 1)
            .unwrap()
    }
}

impl ParityCase for RowsCase {
    fn name(&self) -> String {
        let (w, b) = (self.weight.is_some(), self.bias.is_some());
        format!(
            "{:?} over {} rows of {}, weight {w}, bias {b}",
            self.op, self.rows, self.n
        )
    }

    fn build(&self, ctx: &GpuContext) -> Result<Built, wgemma_kernels::GpuError> {
        let x = self.x(&upload(ctx, &self.stored));
        let vector = |v: &Option<Vec<f32>>| {
            v.as_ref()
                .map(|v| Tensor::new(&upload(ctx, v), &[self.n]).unwrap())
        };
        let (w, b) = (vector(&self.weight), vector(&self.bias));
        let y = nan_tensor(ctx, &[self.rows, self.n]);
        let affine = Affine {
            weight: w.as_ref(),
            bias: b.as_ref(),
        };
        let d = ops::rows(ctx, self.op, affine, &x, &y)?;
        Ok(Built {
            dispatches: vec![d],
            output: y,
        })
    }

    fn reference(&self) -> Vec<f32> {
        // Row r, column c of x is stored at c * rows + r.
        let (rows, stored) = (self.rows as usize, &self.stored);
        let xd: Vec<f32> = (0..rows)
            .flat_map(|r| (0..self.n as usize).map(move |c| stored[c * rows + r]))
            .collect();
        let n = self.n as usize;
        match self.op {
            RowOp::LayerNorm { eps } => {
                cpu::layer_norm(&xd, n, self.weight.as_deref(), self.bias.as_deref(), eps)
            }
            RowOp::RmsNorm { eps } => cpu::rms_norm(&xd, n, self.weight.as_deref(), eps),
            RowOp::Softmax { scale } => cpu::softmax(&xd, n, scale),
        }
    }

    fn tolerance(&self) -> f32 {
        // LayerNorm of one value is 0 (its own mean): compare absolutely there.
        if self.n == 1 { 1e-3 } else { 1e-5 }
    }
}

#[test]
fn norms_and_softmax_match_cpu_along_rows_of_any_layout() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x0dd5_eed5_1234_5678);
    // Rows of up to ops::LANE_ROWS_MAX values take a subgroup each (where subgroups have one
    // size), longer ones a workgroup; 70 rows fill several workgroups of subgroup rows.
    for (rows, n) in [
        (5u32, 1u32),
        (5, 37),
        (70, 37),
        (5, 300),
        (5, 1000),
        (3, 3000),
    ] {
        let ops = [
            (RowOp::LayerNorm { eps: 1e-6 }, (true, true)),
            (RowOp::LayerNorm { eps: 1e-5 }, (false, false)),
            (RowOp::RmsNorm { eps: 1e-6 }, (true, false)),
            (RowOp::RmsNorm { eps: 1e-6 }, (false, false)),
            (RowOp::Softmax { scale: 1.7 }, (false, false)),
        ];
        for (op, affine) in ops {
            check(ctx, &RowsCase::new(&mut rng, op, (rows, n), affine));
        }
    }
    // In place over a 3-D tensor (per-head norms are rows of the last dimension).
    let (y, yd) = random(ctx, &mut rng, &[3, 4, 24]);
    run(
        ctx,
        &[&ops::rows(ctx, RowOp::RmsNorm { eps: 1e-6 }, Affine::default(), &y, &y).unwrap()],
    );
    assert_close(
        "in-place rms",
        &read(ctx, y.view()),
        &cpu::rms_norm(&yd, 24, None, 1e-6),
        1e-5,
    );
    let (w, _) = random(ctx, &mut rng, &[23]);
    let bad = Affine {
        weight: Some(&w),
        bias: None,
    };
    assert!(ops::rows(ctx, RowOp::LayerNorm { eps: 1e-6 }, bad, &y, &y).is_err());
}

/// A buffer of `data` as f16 (padded to whole words).
fn upload_halves(ctx: &GpuContext, data: &[f32]) -> wgemma_kernels::View {
    let mut bits: Vec<u16> = data
        .iter()
        .map(|&x| half::f16::from_f32(x).to_bits())
        .collect();
    if bits.len() % 2 == 1 {
        bits.push(0);
    }
    wgemma_kernels::View::of(&ctx.storage_init("test", bytemuck::cast_slice(&bits)))
}

/// The f16 values of `view`, as f32.
fn read_halves(ctx: &GpuContext, view: &wgemma_kernels::View) -> Vec<f32> {
    read(ctx, view)
        .iter()
        .flat_map(|w| {
            let b = w.to_bits();
            [b as u16, (b >> 16) as u16].map(|h| half::f16::from_bits(h).to_f32())
        })
        .collect()
}

#[test]
fn norms_then_rope_match_cpu_into_f32_and_f16() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x4e0a_77e5_0b1d_2a11);
    let (tokens, heads) = (7u32, 3u32);
    let cases = [
        // (head_dim, axes, n_rot, pairs, weight): the vision tower's heads; a partial
        // interleaved rope; rows too long for a subgroup each.
        (64u32, 2u32, 32u32, RopePairs::Neox, true),
        (40, 1, 24, RopePairs::Interleaved, false),
        (1100, 1, 1000, RopePairs::Neox, true),
    ];
    for (hd, axes, n_rot, pairs, weighted) in cases {
        // The heads of q inside a token's [q | k | v] row.
        let (qkv, qkv_d) = random(ctx, &mut rng, &[tokens, 3 * heads * hd]);
        let x = qkv.reshape(&[tokens, 3 * heads, hd]).unwrap();
        let x = x.narrow(1, heads, heads).unwrap();
        let xd = cpu::gather(&qkv_d, x.dims(), x.strides(), x.offset());
        let positions: Vec<u32> = (0..tokens * axes).map(|i| (i * 5 + 2) % 19).collect();
        let pos = Tensor::of(&upload_u32(ctx, &positions), DType::U32, &[tokens, axes]).unwrap();
        let (w, wd) = random(ctx, &mut rng, &[hd]);
        let affine = Affine {
            weight: weighted.then_some(&w),
            bias: None,
        };
        let rope = RowRope {
            positions: &pos,
            n_rot,
            pairs,
            base: 100.0,
            freq_scale: 0.8,
        };
        let mut want = cpu::rms_norm(&xd, hd as usize, weighted.then_some(wd.as_slice()), 1e-6);
        let r = cpu::RopeRef {
            heads: heads as usize,
            head_dim: hd as usize,
            positions: &positions,
            axes: axes as usize,
            n_rot: n_rot as usize,
            pairs,
            base: 100.0,
            freq_scale: 0.8,
            freq_factors: None,
        };
        cpu::rope_axes(&mut want, &r);
        let op = RowOp::RmsNorm { eps: 1e-6 };
        let name = format!("norm + rope {hd}/{axes}/{n_rot} {pairs:?}");
        let y = nan_tensor(ctx, &[tokens, heads, hd]);
        run(
            ctx,
            &[&ops::rows_roped(ctx, op, affine, &rope, &x, &y).unwrap()],
        );
        assert_close(&name, &read(ctx, y.view()), &want, 2e-5);
        let n = (tokens * heads * hd) as usize;
        let halves = Tensor::of(
            &upload_halves(ctx, &vec![f32::NAN; n]),
            DType::F16,
            &[tokens, heads, hd],
        )
        .unwrap();
        let d = ops::rows_roped(ctx, op, affine, &rope, &x, &halves);
        if !ctx.features.shader_f16 {
            assert!(d.is_err(), "{name}: f16 output without shader-f16");
            continue;
        }
        run(ctx, &[&d.unwrap()]);
        let rounded: Vec<f32> = want
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        assert_close(
            &format!("{name} into f16"),
            &read_halves(ctx, halves.view())[..n],
            &rounded,
            1e-3,
        );
    }
    // In place, or sharing the input's buffer, a rotation would read rotated partners.
    let (y, _) = random(ctx, &mut rng, &[2, 2, 8]);
    let pos = Tensor::of(&upload_u32(ctx, &[1, 2]), DType::U32, &[2, 1]).unwrap();
    let rope = RowRope {
        positions: &pos,
        n_rot: 8,
        pairs: RopePairs::Neox,
        base: 100.0,
        freq_scale: 1.0,
    };
    let op = RowOp::RmsNorm { eps: 1e-6 };
    assert!(ops::rows_roped(ctx, op, Affine::default(), &rope, &y, &y).is_err());
    let odd = RowRope { n_rot: 7, ..rope };
    let out = nan_tensor(ctx, &[2, 2, 8]);
    assert!(ops::rows_roped(ctx, op, Affine::default(), &odd, &y, &out).is_err());
    // Positions not at their view's start (the kernel reads them from 0).
    let three = Tensor::of(&upload_u32(ctx, &[1, 2, 3]), DType::U32, &[3, 1]).unwrap();
    let shifted = RowRope {
        positions: &three.narrow(0, 1, 2).unwrap(),
        ..rope
    };
    assert!(ops::rows_roped(ctx, op, Affine::default(), &shifted, &y, &out).is_err());
    assert!(ops::rows_roped(ctx, op, Affine::default(), &rope, &y, &out).is_ok());
}

#[test]
fn row_stats_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x7777_1234_abcd_0001);
    for (rows, n) in [(1u32, 7u32), (3, 1000), (4, 5003)] {
        let (x, mut xd) = random(ctx, &mut rng, &[rows, n]);
        // A tie for the maximum in row 0: the first index wins.
        let (arg, max) = cpu::argmax(&xd[..n as usize]);
        if n > 4 {
            let dup = (arg as usize + 3) % n as usize;
            xd[dup.max(arg as usize)] = max;
            xd[dup.min(arg as usize)] = max;
            ctx.write(&x.view().buffer, 0, bytemuck::cast_slice(&xd));
        }
        let out = nan_tensor(ctx, &[rows * 4]);
        run(ctx, &[&ops::row_stats(ctx, &x, 0.7, &out).unwrap()]);
        let got = read(ctx, out.view());
        for (r, want) in cpu::row_stats(&xd, n as usize, 0.7).into_iter().enumerate() {
            let g = &got[r * 4..][..4];
            assert_eq!(g[0].to_bits(), want.0, "row {r} of {n}: argmax");
            assert_eq!(g[1], want.1, "row {r}: max");
            assert!(
                (g[2] - want.2).abs() < 1e-4 && (g[3] - want.3).abs() < 1e-4,
                "row {r} of {n}: {g:?} vs {want:?}"
            );
        }
    }
    let (x, _) = random(ctx, &mut rng, &[2, 9]);
    assert!(ops::row_stats(ctx, &x, 0.0, &nan_tensor(ctx, &[8])).is_err());
}

/// A graph's row softmax (into another buffer, then in place) and sum, lowered, against
/// the CPU; a sum written anywhere but its first term is an error.
#[test]
fn graph_softmax_and_sum_lower_to_their_ops() {
    use wgemma_kernels::graph::{Fusions, Graph, Lowering, Name, Node, PlanOp, Scratch};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0f9a_4f00);
    let (rows, n) = (5u32, 37u32);
    let (xd, yd) = (
        rng.vec((rows * n) as usize, 2.0),
        rng.vec((rows * n) as usize, 1.0),
    );
    let (x, y, p) = (
        upload(ctx, &xd),
        upload(ctx, &yd),
        poisoned(ctx, (rows * n) as usize),
    );
    let partials = poisoned(ctx, 4);
    let name = |name| Name { name, layer: None };
    let lower = |g: &Graph<'_, ()>| {
        let l = Lowering {
            fusions: Fusions::NONE,
            scratch: Scratch::for_products(&partials),
            taps: Vec::new(),
        };
        l.lower(ctx, g).map(|plan| {
            let ds: Vec<Dispatch> = plan
                .ops
                .into_iter()
                .map(|op| match op {
                    PlanOp::Run(d) => d,
                    _ => panic!("only dispatches"),
                })
                .collect();
            ds
        })
    };
    let mut g: Graph<'_, ()> = Graph::new(rows);
    let xv = g.rows_in(name("x"), &x, n, n, 0);
    let probs = g.rows_in(name("probs"), &p, n, n, 0);
    let again = g.rows_in(name("again"), &p, n, n, 0);
    let yv = g.rows_in(name("y"), &y, n, n, 0);
    let sum = g.rows_in(name("sum"), &y, n, n, 0);
    g.push(Node::Softmax {
        x: xv,
        scale: 0.7,
        out: probs,
    });
    g.push(Node::Softmax {
        x: probs,
        scale: 3.0,
        out: again,
    });
    g.push(Node::Add {
        a: yv,
        b: again,
        out: sum,
    });
    let ds = lower(&g).unwrap();
    run(ctx, &ds.iter().collect::<Vec<_>>());
    let twice = cpu::softmax(&cpu::softmax(&xd, n as usize, 0.7), n as usize, 3.0);
    let want: Vec<f32> = yd.iter().zip(&twice).map(|(a, b)| a + b).collect();
    assert_close(
        "graph softmax twice, then the sum",
        &read(ctx, &y),
        &want,
        1e-5,
    );

    let mut g: Graph<'_, ()> = Graph::new(rows);
    let (a, b) = (
        g.rows_in(name("a"), &x, n, n, 0),
        g.rows_in(name("b"), &y, n, n, 0),
    );
    let elsewhere = g.rows_in(name("sum"), &p, n, n, 0);
    g.push(Node::Add {
        a,
        b,
        out: elsewhere,
    });
    assert!(lower(&g).is_err(), "a sum written elsewhere");
}

#[test]
fn products_of_activations_match_cpu_with_transposes_batches_and_bias() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x1357_9bdf_2468_ace0);
    let s = cpu::ProductShape {
        batch: 3,
        m: 17,
        n: 19,
        k: 33,
    };
    // a stored [batch, k, m] and read transposed; bt one [n, k] matrix shared by the batch.
    let (a_stored, ad) = random(ctx, &mut rng, &[3, 33, 17]);
    let a = a_stored.transpose(1, 2).unwrap();
    let (b_one, bd) = random(ctx, &mut rng, &[1, 19, 33]);
    let bt = b_one.broadcast(&[3, 19, 33]).unwrap();
    let (bias, biasd) = random(ctx, &mut rng, &[19]);
    let y = nan_tensor(ctx, &[3, 17, 19]);
    let p = Product {
        a: &a,
        bt: &bt,
        bias: Some(&bias),
        alpha: 0.6,
        accumulate: false,
    };
    run(ctx, &[&ops::product(ctx, &p, &y).unwrap()]);
    let a_logical = cpu::gather(&ad, a.dims(), a.strides(), 0);
    let b_logical: Vec<f32> = (0..3).flat_map(|_| bd.clone()).collect();
    let want = cpu::product(s, &a_logical, &b_logical, Some(&biasd), 0.6);
    assert_close("product", &read(ctx, y.view()), &want, 1e-5);
    // Accumulating into a column slice of a wider output: the rest stays as it was.
    let (wide, wide_d) = random(ctx, &mut rng, &[3, 17, 23]);
    let add = Product {
        accumulate: true,
        ..p
    };
    run(
        ctx,
        &[&ops::product(ctx, &add, &wide.narrow(2, 3, 19).unwrap()).unwrap()],
    );
    let mut want_wide = wide_d.clone();
    for (r, row) in want.chunks(19).enumerate() {
        for (j, v) in row.iter().enumerate() {
            want_wide[r * 23 + 3 + j] += v;
        }
    }
    assert_close("product +=", &read(ctx, wide.view()), &want_wide, 1e-5);
    let wrong = Product {
        a: &a,
        bt: &a,
        bias: None,
        alpha: 1.0,
        accumulate: false,
    };
    assert!(ops::product(ctx, &wrong, &y).is_err());
}

#[test]
fn convolutions_and_pooling_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x2468_1357_fdb9_7531);
    // Conv2d 3x3 stride 2 pad 1 (the audio front end) over an input held channels-last.
    let (c, h, w, out) = (3u32, 11u32, 9u32, 5u32);
    let (hwc, hwc_d) = random(ctx, &mut rng, &[h, w, c]);
    let x = hwc.permute(&[2, 0, 1]).unwrap();
    let xd = cpu::gather(&hwc_d, x.dims(), x.strides(), 0);
    let win = Window2d {
        kernel: [3, 3],
        stride: [2, 2],
        pad: [1, 1],
    };
    let [oh, ow] = win.output([h, w]).unwrap();
    let cols = nan_tensor(ctx, &[oh * ow, c * 9]);
    let (weight, wd) = random(ctx, &mut rng, &[1, out, c * 9]);
    let y = nan_tensor(ctx, &[1, oh * ow, out]);
    let p = Product {
        a: &cols.reshape(&[1, oh * ow, c * 9]).unwrap(),
        bt: &weight,
        bias: None,
        alpha: 1.0,
        accumulate: false,
    };
    run(
        ctx,
        &[
            &ops::im2col(ctx, &x, win, &cols).unwrap(),
            &ops::product(ctx, &p, &y).unwrap(),
        ],
    );
    let want = cpu::conv2d(
        &xd,
        [c as usize, h as usize, w as usize],
        &wd,
        out as usize,
        win,
    );
    assert_close("conv2d", &read(ctx, y.view()), &want, 1e-5);

    // Causal depthwise conv1d over a column slice, with and without bias.
    let (t, ch, k) = (13u32, 6u32, 5u32);
    let (wide, wide_d) = random(ctx, &mut rng, &[t, ch + 3]);
    let x = wide.narrow(1, 2, ch).unwrap();
    let xd = cpu::gather(&wide_d, x.dims(), x.strides(), x.offset());
    let (wk, wkd) = random(ctx, &mut rng, &[ch, k]);
    let (bias, bd) = random(ctx, &mut rng, &[ch]);
    for b in [None, Some((&bias, &bd))] {
        let y = nan_tensor(ctx, &[t, ch]);
        run(
            ctx,
            &[&ops::depthwise_conv1d(ctx, &x, &wk, b.map(|b| b.0), &y).unwrap()],
        );
        let want = cpu::depthwise_conv1d(
            &xd,
            ch as usize,
            &wkd,
            k as usize,
            b.map(|b| b.1.as_slice()),
        );
        assert_close("depthwise", &read(ctx, y.view()), &want, 1e-5);
    }

    // Average pooling: the vision tower's 3x3 blocks, and an overlapping 2x2 window.
    let (x, xd) = random(ctx, &mut rng, &[7, 10, 5]);
    for win in [
        Window2d {
            kernel: [3, 3],
            stride: [3, 3],
            pad: [0, 0],
        },
        Window2d {
            kernel: [2, 2],
            stride: [1, 1],
            pad: [0, 0],
        },
    ] {
        let [oh, ow] = win.output([7, 10]).unwrap();
        let y = nan_tensor(ctx, &[oh, ow, 5]);
        run(ctx, &[&ops::avg_pool2d(ctx, &x, win, &y).unwrap()]);
        assert_close(
            &format!("pool {win:?}"),
            &read(ctx, y.view()),
            &cpu::avg_pool2d(&xd, [7, 10, 5], win),
            1e-6,
        );
    }
    let huge = Window2d {
        kernel: [9, 9],
        stride: [1, 1],
        pad: [0, 0],
    };
    assert!(ops::avg_pool2d(ctx, &x, huge, &nan_tensor(ctx, &[1, 1, 5])).is_err());
}

/// One attention case: the mask, the CPU's visibility rule, and sizes.
struct AttendCase<'a> {
    name: &'static str,
    mask: Mask<'a>,
    visible: Box<dyn Fn(usize, usize) -> bool + 'a>,
    tq: u32,
    tk: u32,
    q_pos0: u32,
    d: u32,
    softcap: f32,
    relative: bool,
}

/// Random values that f16 holds exactly, so that the cooperative-matrix kernels' scores
/// match the CPU's to f32 rounding even where they are large.
fn random_halves(ctx: &GpuContext, rng: &mut Rng, dims: &[u32]) -> (Tensor, Vec<f32>) {
    let n: u32 = dims.iter().product();
    let data: Vec<f32> = rng
        .vec(n as usize, 1.0)
        .into_iter()
        .map(|x| half::f16::from_f32(x).to_f32())
        .collect();
    (Tensor::new(&upload(ctx, &data), dims).unwrap(), data)
}

/// `a` again with its queries, keys and values as f16 (values f16 holds exactly, `(q stored,
/// k, v)`): the tensor-core kernel takes them where it takes `a`, every other refuses them.
fn check_attend_halves(
    ctx: &GpuContext,
    a: &Attend<'_>,
    (q_stored, kd, vd): (&[f32], &[f32], &[f32]),
    want: &[f32],
    name: &str,
) {
    let q_view = upload_halves(ctx, q_stored);
    let stored = [a.q.dim(1), a.q.dim(0), a.q.dim(2)];
    let q = Tensor::of(&q_view, DType::F16, &stored)
        .unwrap()
        .permute(&[1, 0, 2])
        .unwrap();
    let k = Tensor::of(&upload_halves(ctx, kd), DType::F16, a.k.dims()).unwrap();
    let v = Tensor::of(&upload_halves(ctx, vd), DType::F16, a.v.dims()).unwrap();
    let halves = Attend {
        q: &q,
        k: &k,
        v: &v,
        ..*a
    };
    let out = nan_tensor(ctx, a.q.dims());
    let takes = a.relative.is_none()
        && ctx.features.coop_matmul
        && a.q.dim(2) <= ops::COOP_MAX_HEAD_DIM
        && a.q.dim(0) >= ops::TILED_MIN_QUERIES;
    let d = ops::attend(ctx, &halves, &out);
    assert!(
        ops::attend_with(ctx, &halves, &out, AttendKernel::Tiled).is_err(),
        "{name}: the tiled kernel refuses f16"
    );
    if !takes {
        assert!(
            d.is_err(),
            "{name}: f16 inputs without the tensor-core kernel"
        );
        return;
    }
    run(ctx, &[&d.unwrap()]);
    assert_close(
        &format!("{name} (Coop, f16 inputs)"),
        &read(ctx, out.view()),
        want,
        3e-3,
    );
}

/// Case `c` on every kernel that takes it, against the CPU; the scale is `sharpen / sqrt(d)`
/// (large multiples spread the scores far apart, so that a row's largest score grows by much
/// from tile to tile).
fn check_attend_case(ctx: &GpuContext, rng: &mut Rng, c: AttendCase<'_>, sharpen: f32) {
    let (heads, kv_heads) = (4u32, 2u32);
    // q stored [heads, tq, d] and read as [tq, heads, d]: a strided query.
    let (q_stored, q_d) = random_halves(ctx, rng, &[heads, c.tq, c.d]);
    let q = q_stored.permute(&[1, 0, 2]).unwrap();
    let qd = cpu::gather(&q_d, q.dims(), q.strides(), 0);
    let (k, kd) = random_halves(ctx, rng, &[c.tk, kv_heads, c.d]);
    let (v, vd) = random_halves(ctx, rng, &[c.tk, kv_heads, c.d]);
    let (r, rd) = random(ctx, rng, &[13, heads, c.d]);
    let out = nan_tensor(ctx, &[c.tq, heads, c.d]);
    let scale = sharpen / (c.d as f32).sqrt();
    let a = Attend {
        q: &q,
        k: &k,
        v: &v,
        mask: c.mask,
        q_pos0: c.q_pos0,
        scale,
        softcap: c.softcap,
        relative: c.relative.then_some(&r),
    };
    let reference = cpu::AttendRef {
        q: &qd,
        k: &kd,
        v: &vd,
        heads: heads as usize,
        kv_heads: kv_heads as usize,
        d: c.d as usize,
        q_pos0: c.q_pos0 as usize,
        scale,
        softcap: c.softcap,
        relative: c.relative.then_some(rd.as_slice()),
    };
    let want = cpu::attend(&reference, &c.visible);
    let tiles = !c.relative && c.d <= ops::TILED_MAX_HEAD_DIM;
    let coop = !c.relative && c.d <= ops::COOP_MAX_HEAD_DIM && ctx.features.coop_matmul;
    for kernel in [
        AttendKernel::PerQuery,
        AttendKernel::Tiled,
        AttendKernel::Coop,
    ] {
        let d = ops::attend_with(ctx, &a, &out, kernel);
        let takes = match kernel {
            AttendKernel::Tiled => tiles,
            AttendKernel::Coop => coop,
            _ => true,
        };
        if !takes {
            assert!(d.is_err(), "{}: {kernel:?} refuses it", c.name);
            continue;
        }
        run(ctx, &[&d.unwrap()]);
        let what = format!("{} ({kernel:?})", c.name);
        // The cooperative-matrix kernel rounds queries, keys, values and weights to f16.
        let tol = if kernel == AttendKernel::Coop {
            3e-3
        } else {
            2e-5
        };
        assert_close(&what, &read(ctx, out.view()), &want, tol);
    }
    check_attend_halves(ctx, &a, (&q_d, &kd, &vd), &want, c.name);
}

#[test]
fn attention_matches_cpu_in_every_mask_mode() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0xa77e_4d00_1111_2222);
    let causal = |w: usize| move |q: usize, k: usize| k <= q && (w == 0 || q - k < w);
    // Span ids per position: an "image" at 6..15, another at 20..23.
    let spans: Vec<u32> = (0..40u32)
        .map(|p| match p {
            6..=14 => 1,
            20..=22 => 2,
            _ => 0,
        })
        .collect();
    let span = Tensor::of(&upload_u32(ctx, &spans), DType::U32, &[40]).unwrap();
    let sp = spans.clone();
    let canvas = |prefix: usize, w: usize| {
        move |q: usize, k: usize| {
            if q < prefix {
                k <= q && (w == 0 || q - k < w)
            } else {
                k >= prefix || w == 0 || k + w > prefix
            }
        }
    };
    let cases = vec![
        AttendCase {
            name: "causal, cached prefix",
            mask: Mask::Causal { window: None },
            visible: Box::new(causal(0)),
            tq: 9,
            tk: 30,
            q_pos0: 21,
            d: 40,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "causal window 7",
            mask: Mask::Causal { window: Some(7) },
            visible: Box::new(causal(7)),
            tq: 19,
            tk: 19,
            q_pos0: 0,
            d: 40,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "full, 300 keys, head 300",
            mask: Mask::Full,
            visible: Box::new(|_, _| true),
            tq: 5,
            tk: 300,
            q_pos0: 0,
            d: 300,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "full, 150 queries over 2 blocks, head 72",
            mask: Mask::Full,
            visible: Box::new(|_, _| true),
            tq: 150,
            tk: 133,
            q_pos0: 0,
            d: 72,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "causal window 20, cached prefix, 70 queries, head 64",
            mask: Mask::Causal { window: Some(20) },
            visible: Box::new(causal(20)),
            tq: 70,
            tk: 101,
            q_pos0: 31,
            d: 64,
            softcap: 3.0,
            relative: false,
        },
        AttendCase {
            name: "canvas",
            mask: Mask::Canvas {
                prefix: 11,
                window: None,
            },
            visible: Box::new(canvas(11, 0)),
            tq: 30,
            tk: 30,
            q_pos0: 0,
            d: 24,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "canvas, window 5",
            mask: Mask::Canvas {
                prefix: 11,
                window: Some(5),
            },
            visible: Box::new(canvas(11, 5)),
            tq: 30,
            tk: 30,
            q_pos0: 0,
            d: 24,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "spans, window 4",
            mask: Mask::Spans {
                span: &span,
                window: Some(4),
            },
            visible: Box::new(move |q, k| (k <= q && q - k < 4) || (sp[q] != 0 && sp[q] == sp[k])),
            tq: 40,
            tk: 40,
            q_pos0: 0,
            d: 16,
            softcap: 0.0,
            relative: false,
        },
        AttendCase {
            name: "local with relative term and softcap",
            mask: Mask::Local { back: 12, ahead: 0 },
            visible: Box::new(|q, k| k <= q && q - k <= 12),
            tq: 37,
            tk: 37,
            q_pos0: 0,
            d: 32,
            softcap: 5.0,
            relative: true,
        },
        AttendCase {
            name: "local, lookahead 2",
            mask: Mask::Local { back: 3, ahead: 2 },
            visible: Box::new(|q, k| k + 3 >= q && k <= q + 2),
            tq: 17,
            tk: 17,
            q_pos0: 0,
            d: 8,
            softcap: 0.0,
            relative: false,
        },
    ];
    for c in cases {
        check_attend_case(ctx, &mut rng, c, 1.0);
    }
}

/// Scores spread far apart (scale 48 / sqrt(d)), so that a row's largest score grows by much
/// from tile to tile (the cooperative-matrix kernel rescales its outputs then), at the image
/// attention's head sizes; and a head of no whole vec4s.
#[test]
fn attention_matches_cpu_with_sharp_scores_and_odd_heads() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5a4f_0e5c_0e55_0001);
    let full = |name, (tq, tk, d): (u32, u32, u32)| AttendCase {
        name,
        mask: Mask::Full,
        visible: Box::new(|_, _| true),
        tq,
        tk,
        q_pos0: 0,
        d,
        softcap: 0.0,
        relative: false,
    };
    let cases = [
        (
            full("sharp, 300 queries, 3 blocks, head 64", (300, 257, 64)),
            48.0,
        ),
        (full("sharp, 150 queries, head 72", (150, 133, 72)), 48.0),
        (
            full("70 queries, head 30 (no whole vec4s)", (70, 45, 30)),
            1.0,
        ),
    ];
    for (c, sharpen) in cases {
        check_attend_case(ctx, &mut rng, c, sharpen);
    }
}

#[test]
fn attention_rejects_mismatched_inputs() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(3);
    let (q, _) = random(ctx, &mut rng, &[3, 3, 8]);
    let (k, _) = random(ctx, &mut rng, &[5, 2, 8]);
    let out = nan_tensor(ctx, &[3, 3, 8]);
    let a = Attend {
        q: &q,
        k: &k,
        v: &k,
        mask: Mask::Full,
        q_pos0: 0,
        scale: 1.0,
        softcap: 0.0,
        relative: None,
    };
    assert!(
        ops::attend(ctx, &a, &out).is_err(),
        "3 query heads over 2 KV heads"
    );
}

#[test]
fn rope_by_axes_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x0707_0707_3131_3131);
    let (tokens, heads) = (7u32, 3u32);
    let cases = [
        // (head_dim, axes, n_rot, pairs, base, freq factors)
        (40u32, 1u32, 24u32, RopePairs::Neox, 10000.0f32, true),
        (40, 1, 40, RopePairs::Interleaved, 500.0, false),
        (64, 2, 32, RopePairs::Neox, 100.0, false),
    ];
    for (head_dim, axes, n_rot, pairs, base, with_ff) in cases {
        let (x_wide, xd_wide) = random(ctx, &mut rng, &[tokens, heads, head_dim + 4]);
        let x = x_wide.narrow(2, 4, head_dim).unwrap();
        let positions: Vec<u32> = (0..tokens * axes).map(|i| (i * 7 + 3) % 23).collect();
        let pos = Tensor::of(&upload_u32(ctx, &positions), DType::U32, &[tokens, axes]).unwrap();
        let ffd: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.37).collect();
        let ff = Tensor::new(&upload(ctx, &ffd), &[n_rot / 2]).unwrap();
        let a = RopeAxes {
            x: &x,
            positions: &pos,
            n_rot,
            pairs,
            base,
            freq_scale: 0.9,
            freq_factors: with_ff.then_some(&ff),
        };
        run(ctx, &[&ops::rope_axes(ctx, &a).unwrap()]);
        let mut want = cpu::gather(&xd_wide, x.dims(), x.strides(), x.offset());
        let r = cpu::RopeRef {
            heads: heads as usize,
            head_dim: head_dim as usize,
            positions: &positions,
            axes: axes as usize,
            n_rot: n_rot as usize,
            pairs,
            base,
            freq_scale: 0.9,
            freq_factors: with_ff.then_some(ffd.as_slice()),
        };
        cpu::rope_axes(&mut want, &r);
        assert_close(
            &format!("rope {head_dim}/{axes}/{n_rot} {pairs:?}"),
            &logical(ctx, &x),
            &want,
            2e-5,
        );
        let untouched = read(ctx, x_wide.view());
        assert_eq!(untouched[..4], xd_wide[..4], "rope wrote outside its slice");
    }
}

#[test]
fn top_k_of_many_rows_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x70b_4e11_5eed_0042);
    let (rows, n, stride) = (3u32, 5003u32, 5010u32);
    let (wide, mut data) = random(ctx, &mut rng, &[rows, stride]);
    // A tie for row 1's best value: the smaller index first.
    let row1 = &data[stride as usize..][..n as usize];
    let (best, top) = cpu::argmax(row1);
    let twin = (best as usize + 4000) % n as usize;
    data[stride as usize + twin] = top;
    ctx.write(&wide.view().buffer, 0, bytemuck::cast_slice(&data));
    let logits = wide.narrow(1, 2, n).unwrap();
    for k in [1u32, 7, 64] {
        let scratch = upload_u32(
            ctx,
            &vec![0; (rows as u64 * ops::TopK::scratch_words(n, k)) as usize],
        );
        let out = upload_u32(ctx, &vec![u32::MAX; (rows * k * 2) as usize]);
        let t = ops::top_k_rows(ctx, &logits, k, &scratch, &out).unwrap();
        run(ctx, &[&t.partial, &t.finish]);
        let got = pollster::block_on(ctx.read_u32(&out)).unwrap();
        for r in 0..rows as usize {
            let row = &data[r * stride as usize + 2..][..n as usize];
            let want = cpu::top_k(row, k as usize);
            for (j, (i, v)) in want.into_iter().enumerate() {
                let g = &got[(r * k as usize + j) * 2..][..2];
                assert_eq!((g[0], g[1]), (i, v.to_bits()), "row {r}, k = {k}, rank {j}");
            }
        }
    }
    let bad = wide.transpose(0, 1).unwrap();
    let scratch = upload_u32(ctx, &[0; 64]);
    assert!(ops::top_k_rows(ctx, &bad, 4, &scratch, &scratch).is_err());
}

/// The weight store reads any set of tensors of a GGUF: matrices as stored (stacked and
/// interleaved), vectors as scaled f32, with progress up to the total; stacking tensors of
/// two dtypes is refused.
#[test]
fn weight_store_uploads_what_the_file_holds() {
    use wgemma_gguf::{BytesSource, Gguf, TensorSpec, Value, write_gguf};
    use wgemma_kernels::store::{RowSource, WeightStore};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5703_e5ee_d000_0001);
    let f16 = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    };
    let (a, b, g, u) = (
        rng.vec(64 * 3, 1.0),
        rng.vec(64 * 2, 1.0),
        rng.vec(64 * 4, 1.0),
        rng.vec(64 * 4, 1.0),
    );
    let norm = rng.vec(64, 1.0);
    let q8 = quantize(GgmlType::Q8_0, &rng.vec(64 * 5, 1.0)).unwrap();
    let tensors = vec![
        (TensorSpec::new("a", GgmlType::F16, &[64, 3]), f16(&a)),
        (TensorSpec::new("b", GgmlType::F16, &[64, 2]), f16(&b)),
        (TensorSpec::new("gate", GgmlType::F16, &[64, 4]), f16(&g)),
        (TensorSpec::new("up", GgmlType::F16, &[64, 4]), f16(&u)),
        (TensorSpec::new("q", GgmlType::Q8_0, &[64, 5]), q8.clone()),
        (
            TensorSpec::new("norm", GgmlType::F32, &[64]),
            bytemuck::cast_slice(&norm).to_vec(),
        ),
    ];
    let meta = [(
        "general.architecture".to_string(),
        Value::String("test".into()),
    )];
    let file = write_gguf(&meta, &tensors, 32).unwrap();
    let gguf = Gguf::parse(&file).unwrap();
    let src = BytesSource::new(file.clone());
    let t = |name: &str| gguf.tensor(name).unwrap();
    // In one piece per tile, and in pieces of 4 rows (every write but a tile's first at an
    // offset, interleaved pairs split across pieces).
    for chunk in [None, Some(1)] {
        let mut store = WeightStore::new(ctx);
        if let Some(c) = chunk {
            store.set_upload_chunk(c);
        }
        let ab = store.matrix(vec![t("a"), t("b")], 1).unwrap();
        let gu = store
            .interleaved(RowSource::whole(t("gate")), RowSource::whole(t("up")), 4, 1)
            .unwrap();
        let q = store.matrix(vec![t("q")], 1).unwrap();
        let nv = store.vector_scaled(t("norm"), 0.5);
        assert!(
            store.matrix(vec![t("a"), t("q")], 1).is_err(),
            "two dtypes stacked"
        );
        let mut last = (0, 0);
        pollster::block_on(store.upload((&gguf, &src), &mut |done, total| last = (done, total)))
            .unwrap();
        assert_eq!(last, (store.bytes(), store.bytes()));
        let bytes = |w: &GpuWeight| -> Vec<u8> {
            w.tiles
                .iter()
                .flat_map(|tile| {
                    let n = tile.rows * w.row_bytes;
                    let raw = pollster::block_on(ctx.read_u32(&View::of(&tile.buffer))).unwrap();
                    bytemuck::cast_slice::<u32, u8>(&raw)[..n as usize].to_vec()
                })
                .collect()
        };
        assert_eq!(bytes(&ab), [f16(&a), f16(&b)].concat());
        let rows = |v: &[f32], r: usize| f16(&v[r * 64..(r + 1) * 64]);
        let want_gu: Vec<u8> = (0..4)
            .flat_map(|r| [rows(&g, r), rows(&u, r)].concat())
            .collect();
        assert_eq!(bytes(&gu), want_gu);
        assert_eq!(bytes(&q), q8);
        let want_norm: Vec<f32> = norm.iter().map(|v| v * 0.5).collect();
        assert_eq!(read(ctx, &nv), want_norm);
    }
}

/// Draws by inverse CDF: each GPU draw is the CPU's, or (where the uniform lies within
/// rounding of a boundary of the cumulative sum) its neighbour across that boundary.
#[test]
fn canvas_draws_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_d1ff_0000_0001);
    for (rows, n, temperature) in [(5u32, 7u32, 1.0f32), (37, 1003, 0.55), (3, 5000, 0.8)] {
        let logits: Vec<f32> = rng.vec((rows * n) as usize, 4.0);
        let mut u: Vec<f32> = (0..rows).map(|_| rng.uniform().abs()).collect();
        u[0] = 0.0;
        let x = upload(ctx, &logits);
        let stats = poisoned(ctx, (4 * rows) as usize);
        let out = poisoned(ctx, rows as usize);
        let xt = Tensor::new(&x, &[rows, n]).unwrap();
        let st = Tensor::new(&stats, &[4 * rows]).unwrap();
        let draw = ops::CanvasDraw {
            logits: &x,
            rows,
            n,
            temperature,
            stats: &stats,
            uniforms: &upload(ctx, &u),
            out: &out,
        };
        run(
            ctx,
            &[
                &ops::row_stats(ctx, &xt, temperature, &st).unwrap(),
                &ops::canvas_draw(ctx, &draw).unwrap(),
            ],
        );
        let got: Vec<u32> = read(ctx, &out).iter().map(|v| v.to_bits()).collect();
        let want = cpu::canvas_draw(&logits, n as usize, temperature, &u);
        for r in 0..rows as usize {
            let p = cpu::softmax(
                &logits[r * n as usize..][..n as usize],
                n as usize,
                1.0 / temperature,
            );
            let cdf = |i: u32| p[..=i as usize].iter().map(|&v| f64::from(v)).sum::<f64>();
            let near = (cdf(want[r]) - f64::from(u[r])).abs() < 1e-5
                || (want[r] > 0 && (cdf(want[r] - 1) - f64::from(u[r])).abs() < 1e-5);
            assert!(
                got[r] == want[r] || (near && got[r].abs_diff(want[r]) == 1),
                "rows {rows} of {n}, row {r}: drew {} for {}",
                got[r],
                want[r]
            );
        }
        assert_eq!(
            got[0], want[0],
            "a uniform of 0 draws the first token of any mass"
        );
    }
}

/// The acceptance, renoise and stop rule against the CPU's, over odd canvas sizes and a run of
/// steps that share the state (the argmax canvas kept the same for a while, then changed).
#[test]
fn canvas_acceptance_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0xacce_0000_1111_2222);
    for rows in [1u32, 5, 37, 256, 1000] {
        let r = rows as usize;
        let state = upload_u32(ctx, &[vec![0u32], vec![u32::MAX; r]].concat());
        let (next, accepted, status) = (poisoned(ctx, r), poisoned(ctx, r), poisoned(ctx, 4));
        let mut previous: Option<(Vec<u32>, u32)> = None;
        let mut argmax: Vec<u32> = (0..rows).map(|i| i * 7 % 11).collect();
        for step in 0..4 {
            if step == 3 {
                argmax[r / 2] += 1;
            }
            // Entropies spread wide, with ties, so that some but not all are accepted.
            let entropy: Vec<f32> = (0..r)
                .map(|i| {
                    if i % 5 == 0 {
                        0.01
                    } else {
                        rng.uniform() * 0.2
                    }
                })
                .collect();
            let stats: Vec<f32> = (0..r)
                .flat_map(|i| [f32::from_bits(argmax[i]), 1.0, 2.0, entropy[i]])
                .collect();
            let drawn: Vec<u32> = (0..rows).map(|i| 1000 + i).collect();
            let renoise: Vec<u32> = (0..rows).map(|i| 5000 + i + step).collect();
            let (bound, stability, confidence) = (0.3, 2, 0.2);
            let args = ops::CanvasAcceptArgs {
                rows,
                stats: &upload(ctx, &stats),
                drawn: &upload_u32(ctx, &drawn),
                renoise: &upload_u32(ctx, &renoise),
                next: &next,
                accepted: &accepted,
                state: &state,
                status: &status,
                bound,
                stability,
                confidence,
            };
            run(ctx, &[&ops::canvas_accept(ctx, &args).unwrap()]);
            let want = cpu::canvas_accept(
                &cpu::CanvasStep {
                    entropy: &entropy,
                    argmax: &argmax,
                    drawn: &drawn,
                    renoise: &renoise,
                    previous: previous.as_ref().map(|(a, s)| (a.as_slice(), *s)),
                },
                cpu::AcceptRule {
                    bound,
                    stability,
                    confidence,
                },
            );
            let bits =
                |v: &View| -> Vec<u32> { read(ctx, v).iter().map(|x| x.to_bits()).collect() };
            let got_accepted: Vec<bool> = bits(&accepted).iter().map(|&a| a == 1).collect();
            assert_eq!(got_accepted, want.accepted, "{rows} rows, step {step}");
            assert!(want.accepted.iter().any(|&a| a));
            assert_eq!(bits(&next), want.next, "{rows} rows, step {step}");
            let s = bits(&status);
            let count = want.accepted.iter().filter(|&&a| a).count() as u32;
            assert_eq!(s[0], count);
            assert!((f32::from_bits(s[1]) - want.mean_entropy).abs() < 1e-5);
            assert_eq!(
                (s[2], s[3] == 1),
                (want.same, want.done),
                "{rows} rows, step {step}"
            );
            previous = Some((argmax.clone(), want.same));
        }
    }
}
