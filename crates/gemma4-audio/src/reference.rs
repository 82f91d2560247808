//! The f32 CPU reference forward of the audio tower and its embedder: the oracle the GPU tower
//! will be tested against, written as transformers' `Gemma4AudioModel` +
//! `Gemma4MultimodalEmbedder` read (reference/multimodal.md §2).

use wgemma_kernels::cpu;
use wgemma_kernels::ops::Window2d;

use crate::mel::N_MELS;
use crate::tensors::{AudioLayout, ClampedLinear, ConformerLayer, FeedForward, Tower};

/// The audio tower's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioConfig {
    pub layout: AudioLayout,
    pub n_layer: usize,
    /// The conformer's width.
    pub hidden: usize,
    pub n_head: usize,
    pub ff: usize,
    /// Output channels of the two subsampling convolutions.
    pub sscp_channels: [usize; 2],
    /// The light convolution's depthwise kernel.
    pub conv_kernel: usize,
    /// Queries per attention block.
    pub chunk: usize,
    /// Keys a query sees back from itself, itself included.
    pub context_left: usize,
    pub logit_cap: f32,
    pub eps: f32,
    /// Width of the output projection (the embedder's input).
    pub output_dims: usize,
    /// The text model's width the soft tokens are projected to.
    pub text_width: usize,
}

/// What the half-step feed-forward residual is scaled by (transformers' `residual_weight`).
const RESIDUAL_WEIGHT: f32 = 0.5;

impl AudioConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.n_head
    }

    /// Keys an attention block reads: the chunk and `context_left - 1` before it.
    pub fn context_size(&self) -> usize {
        self.chunk + self.context_left - 1
    }

    /// Relative positions with a term: distances `0..=context_size / 2`.
    pub fn relative_positions(&self) -> usize {
        self.context_size() / 2 + 1
    }

    /// Mel bins after both subsamplings (32 for 128 bins).
    pub fn sscp_freq(&self) -> usize {
        subsampled(subsampled(N_MELS))
    }
}

/// `(n - 1) / 2 + 1`: a 3-wide, stride-2, pad-1 convolution's output length.
pub fn subsampled(n: usize) -> usize {
    n.saturating_sub(1) / 2 + 1
}

/// The tower's weights as f32.
pub type AudioWeights = Tower<Vec<f32>, Vec<f32>>;

/// The tower's values on one chunk of features, each row-major `[rows, width]`.
#[derive(Clone, Debug, Default)]
pub struct AudioTrace {
    /// After the subsampling convolutions and the input projection, `[T', hidden]`.
    pub sscp: Vec<f32>,
    /// Validity of each of the `T'` positions.
    pub mask: Vec<bool>,
    /// Each conformer block's output, `[T', hidden]`.
    pub layers: Vec<Vec<f32>>,
    /// The output projection, `[T', output_dims]`.
    pub output: Vec<f32>,
    /// The embedder's output for the valid positions: `[tokens, text width]`.
    pub soft_tokens: Vec<f32>,
}

/// `y[t] = W x[t]` for `W` `[out, in]` row-major and `x` `[rows, in]`.
fn matmul(x: &[f32], w: &[f32], inputs: usize) -> Vec<f32> {
    let outputs = w.len() / inputs;
    let mut y = Vec::with_capacity(x.len() / inputs * outputs);
    for row in x.chunks_exact(inputs) {
        y.extend(
            w.chunks_exact(inputs)
                .map(|wr| wr.iter().zip(row).map(|(a, b)| a * b).sum::<f32>()),
        );
    }
    y
}

impl ClampedLinear<Vec<f32>> {
    fn apply(&self, x: &[f32], inputs: usize) -> Vec<f32> {
        let [lo, hi] = self.input;
        let clamped: Vec<f32> = x.iter().map(|v| v.clamp(lo, hi)).collect();
        let [lo, hi] = self.output;
        let mut y = matmul(&clamped, &self.w, inputs);
        y.iter_mut().for_each(|v| *v = v.clamp(lo, hi));
        y
    }
}

/// transformers' `Gemma4RMSNorm` per row of `width`: `x (mean x² + eps)^-½ w` (no `1 + w`).
fn rms_norm(x: &[f32], w: Option<&[f32]>, width: usize, eps: f32) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(width) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / width as f32 + eps;
        let r = ms.powf(-0.5);
        match w {
            Some(w) => y.extend(row.iter().zip(w).map(|(v, g)| v * r * g)),
            None => y.extend(row.iter().map(|v| v * r)),
        }
    }
    y
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

fn add_assign(x: &mut [f32], y: &[f32], scale: f32) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += scale * b);
}

/// One subsampling step: the frame mask on the input rows, a 3x3 stride-2 pad-1 convolution
/// without bias over (time, frequency) (the kernel crate's `cpu::conv2d`), LayerNorm over the
/// channels (weight, no bias), ReLU. `x` is `[cin, t, f]`; returns `[t', f', cout]`
/// (channels last).
fn sscp_layer(
    x: &[f32],
    (cin, t, f): (usize, usize, usize),
    mask: &[bool],
    (w, norm): (&[f32], &[f32]),
    eps: f32,
) -> Vec<f32> {
    let cout = norm.len();
    let mut masked = x.to_vec();
    for (i, row) in masked.chunks_exact_mut(f).enumerate() {
        if !mask[i % t] {
            row.fill(0.0);
        }
    }
    let window = Window2d {
        kernel: [3, 3],
        stride: [2, 2],
        pad: [1, 1],
    };
    let mut y = cpu::conv2d(&masked, [cin, t, f], w, cout, window);
    for row in y.chunks_exact_mut(cout) {
        let mean = row.iter().sum::<f32>() / cout as f32;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / cout as f32;
        let r = 1.0 / (var + eps).sqrt();
        row.iter_mut()
            .zip(norm)
            .for_each(|(v, g)| *v = ((*v - mean) * r * g).max(0.0));
    }
    y
}

/// `[t, f, c]` to `[c, t, f]`.
fn channels_first(x: &[f32], (t, f, c): (usize, usize, usize)) -> Vec<f32> {
    (0..c)
        .flat_map(|ci| (0..t * f).map(move |p| x[p * c + ci]))
        .collect()
}

impl AudioWeights {
    /// The subsampling: `features` `[t, 128]` and their mask to `[t', hidden]` and its mask.
    fn subsample(
        &self,
        cfg: &AudioConfig,
        features: &[f32],
        mask: &[bool],
    ) -> (Vec<f32>, Vec<bool>) {
        let t = mask.len();
        let [c0, c1] = cfg.sscp_channels;
        let y0 = sscp_layer(
            features,
            (1, t, N_MELS),
            mask,
            (&self.conv[0], &self.conv_norm[0]),
            cfg.eps,
        );
        let mask0: Vec<bool> = mask.iter().step_by(2).copied().collect();
        let (t0, f0) = (subsampled(t), subsampled(N_MELS));
        let y0 = channels_first(&y0, (t0, f0, c0));
        // Channels last, as transformers flattens (frequency, channel) with channel fastest.
        let flat = sscp_layer(
            &y0,
            (c0, t0, f0),
            &mask0,
            (&self.conv[1], &self.conv_norm[1]),
            cfg.eps,
        );
        let mask1: Vec<bool> = mask0.iter().step_by(2).copied().collect();
        let f1 = subsampled(f0);
        (matmul(&flat, &self.input_projection, f1 * c1), mask1)
    }

    /// The whole tower on one chunk's features (`[frames, 128]` row-major) and frame mask.
    pub fn forward(&self, cfg: &AudioConfig, features: &[f32], mask: &[bool]) -> AudioTrace {
        let (mut x, mask) = self.subsample(cfg, features, mask);
        let mut trace = AudioTrace {
            sscp: x.clone(),
            ..AudioTrace::default()
        };
        let positions = relative_sinusoids(cfg);
        for layer in &self.layers {
            x = layer.forward(cfg, &x, &positions);
            trace.layers.push(x.clone());
        }
        let mut out = matmul(&x, &self.output_projection, cfg.hidden);
        for row in out.chunks_exact_mut(cfg.output_dims) {
            add_assign(row, &self.output_bias, 1.0);
        }
        let valid: Vec<f32> = out
            .chunks_exact(cfg.output_dims)
            .zip(&mask)
            .filter(|(_, m)| **m)
            .flat_map(|(r, _)| r.iter().copied())
            .collect();
        let normed = rms_norm(&valid, None, cfg.output_dims, cfg.eps);
        trace.soft_tokens = matmul(&normed, &self.embedding_projection, cfg.output_dims);
        trace.output = out;
        trace.mask = mask;
        trace
    }
}

/// `dh^-½ / ln 2`: what transformers scales queries by before the per-dimension scale.
pub(crate) fn query_scale(cfg: &AudioConfig) -> f32 {
    (cfg.head_dim() as f32).powf(-0.5) / std::f32::consts::LN_2
}

/// `ln(1 + e) / ln 2`: what transformers scales keys by.
pub(crate) fn key_scale() -> f32 {
    (1.0 + std::f32::consts::E).ln() / std::f32::consts::LN_2
}

/// `[sin(p ω_i), cos(p ω_i)]` over the width for the distances `p` = `context/2, …, 1, 0`
/// (transformers' `Gemma4AudioRelPositionalEncoding`), `[positions, hidden]`.
fn relative_sinusoids(cfg: &AudioConfig) -> Vec<f32> {
    sinusoids(cfg.hidden, (0..cfg.relative_positions()).rev())
}

/// `[sin(p ω_i), cos(p ω_i)]` rows of `width` for each distance `p` in turn.
pub(crate) fn sinusoids(width: usize, distances: impl Iterator<Item = usize>) -> Vec<f32> {
    let half = width / 2;
    let step = (1e4f32).ln() / (half.saturating_sub(1).max(1)) as f32;
    let inv: Vec<f32> = (0..half).map(|i| (-(i as f32) * step).exp()).collect();
    let mut out = Vec::new();
    for p in distances {
        out.extend(inv.iter().map(|w| (p as f32 * w).sin()));
        out.extend(inv.iter().map(|w| (p as f32 * w).cos()));
    }
    out
}

impl FeedForward<Vec<f32>, Vec<f32>> {
    /// `x + ½ post_norm(down silu(up pre_norm(x)))`.
    fn forward(&self, cfg: &AudioConfig, x: &[f32]) -> Vec<f32> {
        let d = cfg.hidden;
        let h = rms_norm(x, Some(&self.pre_norm), d, cfg.eps);
        let mut h = self.up.apply(&h, d);
        h.iter_mut().for_each(|v| *v = silu(*v));
        let h = self.down.apply(&h, cfg.ff);
        let h = rms_norm(&h, Some(&self.post_norm), d, cfg.eps);
        let mut y = x.to_vec();
        add_assign(&mut y, &h, RESIDUAL_WEIGHT);
        y
    }
}

impl ConformerLayer<Vec<f32>, Vec<f32>> {
    fn forward(&self, cfg: &AudioConfig, x: &[f32], positions: &[f32]) -> Vec<f32> {
        let d = cfg.hidden;
        let mut x = self.ffn1.forward(cfg, x);
        let h = rms_norm(&x, Some(&self.attn_pre_norm), d, cfg.eps);
        let a = self.attention(cfg, &h, positions);
        add_assign(
            &mut x,
            &rms_norm(&a, Some(&self.attn_post_norm), d, cfg.eps),
            1.0,
        );
        let c = self.light_conv(cfg, &x);
        add_assign(&mut x, &c, 1.0);
        let x = self.ffn2.forward(cfg, &x);
        rms_norm(&x, Some(&self.out_norm), d, cfg.eps)
    }

    /// Chunked local attention with a relative-position term, through the kernel crate's
    /// attention reference (`cpu::attend`, what `ops::attend` with `Mask::Local` computes):
    /// query `q` sees key `k` when `0 <= q - k < context_left - 1`, the logit is
    /// `cap tanh((q . k + q . rel[q - k]) / cap)`. transformers' blocks of `chunk` queries
    /// see the same keys; it also masks keys past the valid frames, which only the padding
    /// positions after them could see (the valid frames are a prefix), so the valid positions
    /// agree and the padding positions (dropped from the soft tokens) may not.
    fn attention(&self, cfg: &AudioConfig, x: &[f32], positions: &[f32]) -> Vec<f32> {
        let (d, dh) = (cfg.hidden, cfg.head_dim());
        let (q_scale, k_scale) = (query_scale(cfg), key_scale());
        let mut q = self.q.apply(x, d);
        let mut k = self.k.apply(x, d);
        let v = self.v.apply(x, d);
        for row in q.chunks_exact_mut(dh) {
            row.iter_mut()
                .zip(&self.query_scale)
                .for_each(|(a, s)| *a *= q_scale * s);
        }
        k.iter_mut().for_each(|a| *a *= k_scale);
        // The sinusoids run from the largest distance down to 0; the attention takes the key
        // term of each distance 0..window in order.
        let window = cfg.context_left - 1;
        let rel_desc = matmul(positions, &self.relative_k, d);
        let n_pos = cfg.relative_positions();
        let rel: Vec<f32> = (0..window)
            .flat_map(|dist| rel_desc[(n_pos - 1 - dist) * d..][..d].iter().copied())
            .collect();
        let out = cpu::attend(
            &cpu::AttendRef {
                q: &q,
                k: &k,
                v: &v,
                heads: cfg.n_head,
                kv_heads: cfg.n_head,
                d: dh,
                q_pos0: 0,
                scale: 1.0,
                softcap: cfg.logit_cap,
                relative: Some(&rel),
            },
            |qp, kp| kp <= qp && qp - kp < window,
        );
        self.post.apply(&out, d)
    }

    /// The light convolution: GLU of `conv_start`, a causal depthwise convolution, RMSNorm,
    /// SiLU, `conv_end`.
    fn light_conv(&self, cfg: &AudioConfig, x: &[f32]) -> Vec<f32> {
        let d = cfg.hidden;
        let t = x.len() / d;
        let h = rms_norm(x, Some(&self.conv_pre_norm), d, cfg.eps);
        let h = self.conv_start.apply(&h, d);
        let glu: Vec<f32> = h
            .chunks_exact(2 * d)
            .flat_map(|r| (0..d).map(move |c| r[c] * sigmoid(r[d + c])))
            .collect();
        let kw = cfg.conv_kernel;
        let mut conv = vec![0f32; t * d];
        for ti in 0..t {
            for c in 0..d {
                conv[ti * d + c] = (0..kw)
                    .filter_map(|j| (ti + j).checked_sub(kw - 1).map(|src| (j, src)))
                    .map(|(j, src)| self.conv_depthwise[c * kw + j] * glu[src * d + c])
                    .sum();
            }
        }
        let mut h = rms_norm(&conv, Some(&self.conv_norm), d, cfg.eps);
        h.iter_mut().for_each(|v| *v = silu(*v));
        self.conv_end.apply(&h, d)
    }
}
