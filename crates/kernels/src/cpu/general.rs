//! CPU references of the general ops (contiguous row-major data, f64 accumulation).

use crate::ops::{Activation, Binary, RopePairs, Window2d};

/// The logical elements (row-major over `dims`) of a strided tensor in `data`.
pub fn gather(data: &[f32], dims: &[u32], strides: &[u32], offset: u32) -> Vec<f32> {
    let n: usize = dims.iter().map(|&d| d as usize).product();
    (0..n)
        .map(|i| {
            let mut rest = i;
            let mut at = offset as usize;
            for (&d, &s) in dims.iter().zip(strides).rev() {
                at += (rest % d as usize) * s as usize;
                rest /= d as usize;
            }
            data[at]
        })
        .collect()
}

/// erf by its Taylor series (|x| <= 4, f64), ±1 beyond (erf(4) = 1 - 1.5e-8).
pub fn erf(x: f64) -> f64 {
    if x.abs() > 4.0 {
        return x.signum();
    }
    let (mut term, mut sum) = (x, x);
    for n in 1..200 {
        term *= -x * x / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// An activation of one value.
pub fn activation(act: Activation, v: f32) -> f32 {
    let x = f64::from(v);
    let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
    let y = match act {
        Activation::Identity => x,
        Activation::GeluTanh => return super::gelu_tanh(v),
        Activation::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        Activation::QuickGelu => x * sigmoid(1.702 * x),
        Activation::Silu => x * sigmoid(x),
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => sigmoid(x),
        Activation::Clamp { min, max } => x.clamp(f64::from(min), f64::from(max)),
        Activation::Scale(s) => x * f64::from(s),
        Activation::Affine { scale, shift } => x * f64::from(scale) + f64::from(shift),
    };
    y as f32
}

/// A binary operation of two values.
pub fn binary(op: Binary, a: f32, b: f32) -> f32 {
    match op {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Gated(act) => activation(act, a) * b,
    }
}

/// LayerNorm of each `n`-long row, then `* weight + bias` where given.
pub fn layer_norm(
    x: &[f32],
    n: usize,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    eps: f32,
) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter().enumerate().map(move |(i, &v)| {
                let mut y = (f64::from(v) - mean) * inv;
                if let Some(w) = weight {
                    y *= f64::from(w[i]);
                }
                if let Some(b) = bias {
                    y += f64::from(b[i]);
                }
                y as f32
            })
        })
        .collect()
}

/// Softmax of each `n`-long row times `scale`.
pub fn softmax(x: &[f32], n: usize, scale: f32) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let z: Vec<f64> = row.iter().map(|&v| f64::from(v * scale)).collect();
            let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = z.iter().map(|v| (v - m).exp()).sum();
            z.into_iter().map(move |v| ((v - m).exp() / sum) as f32)
        })
        .collect()
}

/// Per row of `n` logits: (argmax, max, log-sum-exp, entropy) of softmax(row / temperature).
pub fn row_stats(x: &[f32], n: usize, temperature: f32) -> Vec<(u32, f32, f32, f32)> {
    x.chunks(n)
        .map(|row| {
            let (arg, max) = super::argmax(row);
            let z: Vec<f64> = row
                .iter()
                .map(|&v| f64::from(v) / f64::from(temperature))
                .collect();
            let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = z.iter().map(|v| (v - m).exp()).sum();
            let lse = m + sum.ln();
            let entropy: f64 = z.iter().map(|v| -(v - lse).exp() * (v - lse)).sum();
            (arg, max, lse as f32, entropy as f32)
        })
        .collect()
}

/// Sizes of a batched product: `a` `[batch, m, k]`, `bt` `[batch, n, k]`.
#[derive(Clone, Copy, Debug)]
pub struct ProductShape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// `y[b, i, j] = alpha * sum_k a[b, i, k] * bt[b, j, k] + bias[j]`.
pub fn product(
    s: ProductShape,
    a: &[f32],
    bt: &[f32],
    bias: Option<&[f32]>,
    alpha: f32,
) -> Vec<f32> {
    let mut y = vec![0.0; s.batch * s.m * s.n];
    for b in 0..s.batch {
        for i in 0..s.m {
            let ar = &a[(b * s.m + i) * s.k..][..s.k];
            for j in 0..s.n {
                let br = &bt[(b * s.n + j) * s.k..][..s.k];
                let dot: f64 = ar
                    .iter()
                    .zip(br)
                    .map(|(&x, &w)| f64::from(x) * f64::from(w))
                    .sum();
                let bias = bias.map_or(0.0, |v| f64::from(v[j]));
                y[(b * s.m + i) * s.n + j] = (dot * f64::from(alpha) + bias) as f32;
            }
        }
    }
    y
}

/// 2-D convolution of `x` `[c, h, w]` by `weight` `[out, c, kh, kw]`: `[oh * ow, out]`.
pub fn conv2d(x: &[f32], chw: [usize; 3], weight: &[f32], out: usize, win: Window2d) -> Vec<f32> {
    let [c, h, w] = chw;
    let [kh, kw] = win.kernel.map(|v| v as usize);
    let [sh, sw] = win.stride.map(|v| v as usize);
    let [ph, pw] = win.pad.map(|v| v as i64);
    let oh = (h + 2 * ph as usize - kh) / sh + 1;
    let ow = (w + 2 * pw as usize - kw) / sw + 1;
    let mut y = vec![0.0; oh * ow * out];
    for oy in 0..oh {
        for ox in 0..ow {
            for o in 0..out {
                let mut s = 0.0f64;
                for ci in 0..c {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let iy = (oy * sh + ky) as i64 - ph;
                            let ix = (ox * sw + kx) as i64 - pw;
                            if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                                continue;
                            }
                            let xv = x[(ci * h + iy as usize) * w + ix as usize];
                            let wv = weight[((o * c + ci) * kh + ky) * kw + kx];
                            s += f64::from(xv) * f64::from(wv);
                        }
                    }
                }
                y[(oy * ow + ox) * out + o] = s as f32;
            }
        }
    }
    y
}

/// Causal depthwise convolution of `x` `[t, c]` by `w` `[c, k]`.
pub fn depthwise_conv1d(
    x: &[f32],
    c: usize,
    w: &[f32],
    k: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let t = x.len() / c;
    let mut y = vec![0.0; t * c];
    for ti in 0..t {
        for ci in 0..c {
            let mut s = bias.map_or(0.0, |b| f64::from(b[ci]));
            for j in 0..k {
                let back = k - 1 - j;
                if ti >= back {
                    s += f64::from(w[ci * k + j]) * f64::from(x[(ti - back) * c + ci]);
                }
            }
            y[ti * c + ci] = s as f32;
        }
    }
    y
}

/// Average pooling of `x` `[h, w, c]` (no padding).
pub fn avg_pool2d(x: &[f32], hwc: [usize; 3], win: Window2d) -> Vec<f32> {
    let [h, w, c] = hwc;
    let [kh, kw] = win.kernel.map(|v| v as usize);
    let [sh, sw] = win.stride.map(|v| v as usize);
    let (oh, ow) = ((h - kh) / sh + 1, (w - kw) / sw + 1);
    let mut y = vec![0.0; oh * ow * c];
    for oy in 0..oh {
        for ox in 0..ow {
            for ci in 0..c {
                let mut s = 0.0f64;
                for ky in 0..kh {
                    for kx in 0..kw {
                        s += f64::from(x[((oy * sh + ky) * w + ox * sw + kx) * c + ci]);
                    }
                }
                y[(oy * ow + ox) * c + ci] = (s / (kh * kw) as f64) as f32;
            }
        }
    }
    y
}

/// Inputs of [`attend`]: `q` `[tq, heads, d]`, `k`, `v` `[tk, kv_heads, d]`, `relative`
/// `[rel_len, heads, d]`.
pub struct AttendRef<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub q_pos0: usize,
    pub scale: f32,
    pub softcap: f32,
    pub relative: Option<&'a [f32]>,
}

/// Attention where query position `qp` sees key position `kp` when `visible(qp, kp)`; a row
/// seeing no key is zeros.
pub fn attend(a: &AttendRef<'_>, visible: impl Fn(usize, usize) -> bool) -> Vec<f32> {
    let (d, heads) = (a.d, a.heads);
    let tq = a.q.len() / (heads * d);
    let tk = a.k.len() / (a.kv_heads * d);
    let group = heads / a.kv_heads;
    let dot = |x: &[f32], y: &[f32]| -> f64 {
        x.iter()
            .zip(y)
            .map(|(&p, &q)| f64::from(p) * f64::from(q))
            .sum()
    };
    let mut out = vec![0.0; a.q.len()];
    for t in 0..tq {
        let qp = a.q_pos0 + t;
        for h in 0..heads {
            let kvh = h / group;
            let qh = &a.q[(t * heads + h) * d..][..d];
            let keys: Vec<usize> = (0..tk).filter(|&j| visible(qp, j)).collect();
            let scores: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    let mut s = dot(qh, &a.k[(j * a.kv_heads + kvh) * d..][..d]);
                    if let Some(r) = a.relative {
                        let len = r.len() / (heads * d);
                        if j <= qp && qp - j < len {
                            s += dot(qh, &r[((qp - j) * heads + h) * d..][..d]);
                        }
                    }
                    s *= f64::from(a.scale);
                    if a.softcap > 0.0 {
                        s = f64::from(a.softcap) * (s / f64::from(a.softcap)).tanh();
                    }
                    s
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            let o = &mut out[(t * heads + h) * d..][..d];
            for (&j, s) in keys.iter().zip(&scores) {
                let p = (s - max).exp() / sum;
                let vj = &a.v[(j * a.kv_heads + kvh) * d..][..d];
                for (oi, &vi) in o.iter_mut().zip(vj) {
                    *oi += (p * f64::from(vi)) as f32;
                }
            }
        }
    }
    out
}

/// Rotary embedding of `x` `[tokens, heads, head_dim]` by `positions` `[tokens, axes]`: the
/// head in `axes` sections, each rotating its first `n_rot` dimensions by its axis.
pub struct RopeRef<'a> {
    pub heads: usize,
    pub head_dim: usize,
    pub positions: &'a [u32],
    pub axes: usize,
    pub n_rot: usize,
    pub pairs: RopePairs,
    pub base: f32,
    pub freq_scale: f32,
    pub freq_factors: Option<&'a [f32]>,
}

/// [`RopeRef`]'s rotation, in place.
pub fn rope_axes(x: &mut [f32], r: &RopeRef<'_>) {
    let half = r.n_rot / 2;
    let section = r.head_dim / r.axes;
    for (row_i, row) in x.chunks_mut(r.head_dim).enumerate() {
        let t = row_i / r.heads;
        for a in 0..r.axes {
            let pos = f64::from(r.positions[t * r.axes + a]);
            for i in 0..half {
                let mut theta = pos
                    * f64::from(r.freq_scale)
                    * f64::from(r.base).powf(-2.0 * i as f64 / r.n_rot as f64);
                if let Some(ff) = r.freq_factors {
                    theta /= f64::from(ff[i]);
                }
                let (d0, d1) = match r.pairs {
                    RopePairs::Neox => (section * a + i, section * a + i + half),
                    RopePairs::Interleaved => (section * a + 2 * i, section * a + 2 * i + 1),
                };
                let (s, c) = theta.sin_cos();
                let (x0, x1) = (f64::from(row[d0]), f64::from(row[d1]));
                row[d0] = (x0 * c - x1 * s) as f32;
                row[d1] = (x0 * s + x1 * c) as f32;
            }
        }
    }
}

/// Per row of `n` logits, the draw from softmax(row / temperature) by inverse CDF against
/// `u[row]`: the first index whose cumulative probability exceeds it (the argmax past the
/// total mass).
pub fn canvas_draw(x: &[f32], n: usize, temperature: f32, u: &[f32]) -> Vec<u32> {
    x.chunks(n)
        .zip(u)
        .map(|(row, &target)| {
            let p = softmax(row, n, 1.0 / temperature);
            let mut acc = 0.0f64;
            p.iter()
                .position(|&pv| {
                    acc += f64::from(pv);
                    acc > f64::from(target.max(0.0))
                })
                .map_or_else(|| super::argmax(row).0, |i| i as u32)
        })
        .collect()
}

/// The entropy-bound acceptance of one denoising step ([`canvas_accept`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CanvasAccept {
    pub accepted: Vec<bool>,
    /// The drawn token where accepted, the renoise token elsewhere.
    pub next: Vec<u32>,
    pub mean_entropy: f32,
    /// Steps the argmax canvas has stayed the same, this one included.
    pub same: u32,
    /// Stable for `stability` steps and mean entropy under the confidence threshold.
    pub done: bool,
}

/// One step's inputs to [`canvas_accept`], per position.
#[derive(Clone, Copy, Debug)]
pub struct CanvasStep<'a> {
    pub entropy: &'a [f32],
    pub argmax: &'a [u32],
    pub drawn: &'a [u32],
    pub renoise: &'a [u32],
    /// The previous step's argmax canvas (none on a block's first step) and its count of
    /// steps the same.
    pub previous: Option<(&'a [u32], u32)>,
}

/// The entropy-bound sampler's step settings of [`canvas_accept`].
#[derive(Clone, Copy, Debug)]
pub struct AcceptRule {
    pub bound: f32,
    pub stability: u32,
    pub confidence: f32,
}

/// Positions sorted by ascending entropy (ties by position) are accepted while the entropy of
/// those before them stays within `rule.bound`; then the stop rule.
pub fn canvas_accept(s: &CanvasStep<'_>, rule: AcceptRule) -> CanvasAccept {
    let h: Vec<f32> = s.entropy.iter().map(|&e| e.max(0.0)).collect();
    let mut order: Vec<usize> = (0..h.len()).collect();
    order.sort_by(|&a, &b| h[a].total_cmp(&h[b]).then(a.cmp(&b)));
    let mut accepted = vec![false; h.len()];
    let mut before = 0.0f32;
    for &i in &order {
        if before > rule.bound {
            break;
        }
        accepted[i] = true;
        before += h[i];
    }
    let next = (0..h.len())
        .map(|i| {
            if accepted[i] {
                s.drawn[i]
            } else {
                s.renoise[i]
            }
        })
        .collect();
    let mean_entropy = h.iter().sum::<f32>() / h.len().max(1) as f32;
    let same = match s.previous {
        Some((prev, same)) if prev == s.argmax => same + 1,
        _ => 0,
    };
    CanvasAccept {
        accepted,
        next,
        mean_entropy,
        same,
        done: same >= rule.stability && mean_entropy < rule.confidence,
    }
}
