//! CPU references of every kernel, written for clarity: the GPU kernels are tested against
//! these, and the model crates build their f32 reference forwards from them.

use crate::ops::PenaltyParams;

mod general;
pub use general::*;

/// `y[t, r] = sum_k w[r, k] * x[t, k]` for a row-major `n x k` weight and `m` tokens
/// (accumulated in f64).
pub fn matmul(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    assert_eq!(w.len(), n * k, "weight size");
    assert_eq!(x.len(), m * k, "input size");
    let mut y = vec![0.0; m * n];
    for t in 0..m {
        let xt = &x[t * k..(t + 1) * k];
        for r in 0..n {
            let wr = &w[r * k..(r + 1) * k];
            let s: f64 = wr
                .iter()
                .zip(xt)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            y[t * n + r] = s as f32;
        }
    }
    y
}

/// The input as a matrix-vector product with [`MatvecTuning::int8_input`] sees it: per 32
/// values, integers in -127..127 times max|x| / 127 (rounded half to even, as WGSL's `round`).
///
/// [`MatvecTuning::int8_input`]: crate::ops::MatvecTuning::int8_input
pub fn round_to_int8(x: &[f32]) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|b| {
            let a = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (d, inv) = if a > 0.0 {
                (a / 127.0, 127.0 / a)
            } else {
                (0.0, 0.0)
            };
            b.iter().map(move |v| (v * inv).round_ties_even() * d)
        })
        .collect()
}

/// [`matmul`] on inputs rounded to f16 first: what the cooperative-matrix kernel computes
/// (f16 operands, f32 accumulation).
pub fn matmul_f16_inputs(w: &[f32], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let round =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect() };
    matmul(&round(w), n, k, &round(x), m)
}

/// RMS normalisation of each `dim`-long row, times `weight` when given.
pub fn rms_norm(x: &[f32], dim: usize, weight: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    for row in y.chunks_mut(dim) {
        let ss: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = 1.0 / ((ss / dim as f64) as f32 + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            *v *= inv;
            if let Some(w) = weight {
                *v *= w[i];
            }
        }
    }
    y
}

/// A NeoX rotary embedding of `[tokens, heads, head_dim]` rows at `positions`: the first
/// `n_rot` dims of each head rotate.
#[derive(Clone, Copy)]
pub struct NeoxRope<'a> {
    pub heads: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub positions: &'a [u32],
    pub base: f32,
    pub freq_scale: f32,
    pub freq_factors: Option<&'a [f32]>,
}

/// NeoX rotary embedding in place, as `r` says.
pub fn rope_neox(x: &mut [f32], r: &NeoxRope<'_>) {
    let NeoxRope {
        heads,
        head_dim,
        n_rot,
        positions,
        base,
        freq_scale,
        freq_factors,
    } = *r;
    let half = n_rot / 2;
    for (row_i, row) in x.chunks_mut(head_dim).enumerate() {
        let pos = positions[row_i / heads] as f32;
        for i in 0..half {
            let mut theta = pos * freq_scale * base.powf(-2.0 * i as f32 / n_rot as f32);
            if let Some(ff) = freq_factors {
                theta /= ff[i];
            }
            let (s, c) = theta.sin_cos();
            let (a, b) = (row[i], row[i + half]);
            row[i] = a * c - b * s;
            row[i + half] = a * s + b * c;
        }
    }
}

/// Arguments of [`attention`]: queries at `positions`, the cache, the heads' shape, the
/// window (0: every earlier key), the scale of q·k and the scores' softcap (0: none).
#[derive(Clone, Copy)]
pub struct CausalAttention<'a> {
    pub q: &'a [f32],
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub positions: &'a [u32],
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub window: usize,
    pub scale: f32,
    pub softcap: f32,
}

/// `attention_parts.wgsl`: each of `rows` output rows from `parts` parts, `scratch` holding
/// each part's `rows x head_dim` outputs (normalised by its own sum) and then per part and row
/// its largest score and sum; a part with a zero sum saw no key and weighs nothing.
pub fn attention_parts_combine(
    scratch: &[f32],
    rows: usize,
    head_dim: usize,
    parts: usize,
) -> Vec<f32> {
    let stats = |z: usize, r: usize| {
        let at = parts * rows * head_dim + 2 * (z * rows + r);
        (f64::from(scratch[at]), f64::from(scratch[at + 1]))
    };
    let mut out = vec![0.0; rows * head_dim];
    for r in 0..rows {
        let seen = (0..parts).map(|z| stats(z, r)).filter(|s| s.1 > 0.0);
        let top = seen.map(|s| s.0).fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = (0..parts)
            .map(|z| {
                let (m, l) = stats(z, r);
                if l > 0.0 { l * (m - top).exp() } else { 0.0 }
            })
            .collect();
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            continue;
        }
        for c in 0..head_dim {
            let sum: f64 = (0..parts)
                .map(|z| weights[z] * f64::from(scratch[(z * rows + r) * head_dim + c]))
                .sum();
            out[r * head_dim + c] = (sum / total) as f32;
        }
    }
    out
}

/// Causal attention of `[tokens, n_head, head_dim]` queries (at `positions`) over a cache of
/// `[capacity, n_kv_head, head_dim]` keys and values.
pub fn attention(a: &CausalAttention<'_>) -> Vec<f32> {
    let CausalAttention {
        q,
        k_cache,
        v_cache,
        positions,
        n_head,
        n_kv_head,
        head_dim,
        window,
        scale,
        softcap,
    } = *a;
    let row = n_kv_head * head_dim;
    let group = n_head / n_kv_head;
    let mut out = vec![0.0; q.len()];
    for (t, &pos) in positions.iter().enumerate() {
        let pos = pos as usize;
        let lo = if window > 0 {
            (pos + 1).saturating_sub(window)
        } else {
            0
        };
        for h in 0..n_head {
            let kvh = h / group;
            let qh = &q[(t * n_head + h) * head_dim..][..head_dim];
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    let kj = &k_cache[j * row + kvh * head_dim..][..head_dim];
                    let mut s = qh
                        .iter()
                        .zip(kj)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        * f64::from(scale);
                    if softcap > 0.0 {
                        s = f64::from(softcap) * (s / f64::from(softcap)).tanh();
                    }
                    s
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            let o = &mut out[(t * n_head + h) * head_dim..][..head_dim];
            for (jj, e) in exps.iter().enumerate() {
                let vj = &v_cache[(lo + jj) * row + kvh * head_dim..][..head_dim];
                for d in 0..head_dim {
                    o[d] += (e / sum * f64::from(vj[d])) as f32;
                }
            }
        }
    }
    out
}

/// GELU, tanh approximation (what Gemma's `gelu_pytorch_tanh` computes).
pub fn gelu_tanh(x: f32) -> f32 {
    let inner = 0.797_884_6 * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// `gelu_tanh(gate) * up`, elementwise.
pub fn geglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| gelu_tanh(g) * u)
        .collect()
}

/// `c * tanh(x / c)`.
pub fn softcap(x: f32, c: f32) -> f32 {
    c * (x / c).tanh()
}

/// Index and value of the largest element (first on ties; NaN counts as -inf).
pub fn argmax(x: &[f32]) -> (u32, f32) {
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
        if best.0 == u32::MAX || v > best.1 {
            best = (i as u32, v);
        }
    }
    best
}

fn hash(a: u32) -> u32 {
    let s = a.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let w = ((s >> ((s >> 28) + 4)) ^ s).wrapping_mul(277_803_737);
    (w >> 22) ^ w
}

/// A uniform number in (0, 1) for (seed, step, i): the stream the GPU sampling kernels use.
pub fn uniform(seed: u32, step: u32, i: u32) -> f32 {
    let h = hash(hash(hash(seed) ^ step) ^ i);
    ((h >> 8) as f32 + 0.5) / 16_777_216.0
}

/// The Gumbel noise the GPU's sampling argmax adds to logit `i` at `step` for `seed`.
pub fn gumbel(seed: u32, step: u32, i: u32) -> f32 {
    -(-uniform(seed, step, i).ln()).ln()
}

/// The token a Gumbel-max sampling step picks.
pub fn gumbel_argmax(logits: &[f32], seed: u32, step: u32, temperature: f32) -> u32 {
    let inv = 1.0 / temperature.max(1e-6);
    let noisy: Vec<f32> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| l * inv + gumbel(seed, step, i as u32))
        .collect();
    argmax(&noisy).0
}

/// Mixture-of-experts routing: softmax over the router logits, the `k` most likely experts,
/// their probabilities renormalised to sum to one (floored as llama.cpp does).
pub fn route(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    let probs: Vec<f32> = exps.iter().map(|e| e / total).collect();
    let top = top_k(&probs, k);
    let sum: f32 = top.iter().map(|t| t.1).sum::<f32>().max(6.103_515_6e-5);
    top.into_iter().map(|(i, p)| (i, p / sum)).collect()
}

/// Routed slots grouped by expert: `[slots, expert by expert | count of each expert | first
/// entry of each]`, each expert's slots in ascending order (the GPU's order within an expert
/// varies).
pub fn group_by_expert(sel: &[u32], n_expert: usize) -> Vec<u32> {
    let mut counts = vec![0u32; n_expert];
    for &e in sel {
        counts[(e as usize).min(n_expert - 1)] += 1;
    }
    let starts = counts.iter().scan(0, |at, &c| {
        let first = *at;
        *at += c;
        Some(first)
    });
    let starts: Vec<u32> = starts.collect();
    let mut out: Vec<u32> = (0..n_expert)
        .flat_map(|e| {
            (0..sel.len() as u32)
                .filter(move |&s| (sel[s as usize] as usize).min(n_expert - 1) == e)
        })
        .collect();
    out.extend(counts.iter().chain(&starts));
    out
}

/// The `k` largest values with their indices, best first, ties to the smaller index.
pub fn top_k(x: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    let key = |i: u32| {
        let v = x[i as usize];
        if v.is_nan() { f32::NEG_INFINITY } else { v }
    };
    idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| (i, key(i))).collect()
}

/// The distinct tokens among the last `last_n` of `history` with their counts, most recent
/// first (what the penalties apply to).
pub fn recent_counts(history: &[u32], last_n: usize) -> Vec<(u32, u32)> {
    let recent = &history[history.len().saturating_sub(last_n)..];
    let mut counts: Vec<(u32, u32)> = Vec::new();
    for &t in recent.iter().rev() {
        match counts.iter_mut().find(|(id, _)| *id == t) {
            Some(e) => e.1 += 1,
            None => counts.push((t, 1)),
        }
    }
    counts
}

/// Draws among candidates sorted best first: softmax at the temperature, min-p, top-p, then
/// the token where the cumulative probability passes `u` (what the GPU's DRAW kernel does).
pub fn draw(
    candidates: &[(u32, f32)],
    temperature: f32,
    top_p: f32,
    min_p: f32,
    u: f32,
) -> Option<u32> {
    let first = candidates.first()?;
    let t = temperature.max(1e-6);
    let top = first.1 / t;
    let mut probs: Vec<(u32, f32)> = candidates
        .iter()
        .map(|&(id, l)| (id, (l / t - top).exp()))
        .collect();
    let total: f32 = probs.iter().map(|x| x.1).sum();
    probs.iter_mut().for_each(|x| x.1 /= total);
    if min_p > 0.0 {
        let floor = probs[0].1 * min_p;
        let kept = probs
            .iter()
            .rposition(|x| x.1 >= floor)
            .map_or(0, |i| i + 1);
        probs.truncate(kept);
    }
    if top_p < 1.0 {
        let mut acc = 0.0;
        if let Some(i) = probs.iter().position(|x| {
            acc += x.1;
            acc >= top_p
        }) {
            probs.truncate(i + 1);
        }
    }
    probs.truncate(probs.len().max(1));
    let total: f32 = probs.iter().map(|x| x.1).sum();
    let target = u * total;
    let mut acc = 0.0;
    for x in &probs {
        acc += x.1;
        if acc > target {
            return Some(x.0);
        }
    }
    probs.last().map(|x| x.0)
}

/// Repetition, frequency and presence penalties (as the GPU kernel applies them).
pub fn penalties(logits: &mut [f32], tokens: &[(u32, u32)], p: PenaltyParams) {
    for &(id, count) in tokens {
        let Some(l) = logits.get_mut(id as usize) else {
            continue;
        };
        *l = if *l > 0.0 {
            *l / p.repeat
        } else {
            *l * p.repeat
        };
        *l -= count as f32 * p.frequency + p.presence;
    }
}
