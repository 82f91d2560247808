//! The f32 CPU reference forward of the tower and its embedder: the oracle the GPU tower is
//! tested against, written as transformers' `Gemma4VisionModel` + `Gemma4MultimodalEmbedder`
//! read, from the kernel crate's CPU references.

use wgemma_gguf::{Gguf, TensorInfo, TensorSource, read_tensor_f32};
use wgemma_kernels::cpu::{self, AttendRef, RopeRef};
use wgemma_kernels::ops::{RopePairs, Window2d};

use crate::config::{POSITION_AXES, ROPE_THETA, VisionConfig};
use crate::preprocess::{POOL, Patches};
use crate::tensors::{Clamp, Layer, Linear, Tower, TowerTensors};
use crate::{VisionError, check_positions};

/// The tower with f32 weights.
pub struct CpuTower {
    pub cfg: VisionConfig,
    w: Tower<Vec<f32>, Vec<f32>>,
}

/// The tower's values on one image, each row-major `[rows, width]`.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The patch embedding plus the position tables, `[patches, D]`.
    pub patch_embed: Vec<f32>,
    /// Each layer's output, `[patches, D]`.
    pub layers: Vec<Vec<f32>>,
    /// Pooled, times `sqrt(D)`, standardised where the tower does: `[tokens, D]`.
    pub pooled: Vec<f32>,
    /// The embedder's output: `[tokens, text width]`.
    pub soft_tokens: Vec<f32>,
}

impl CpuTower {
    /// Dequantizes the tower's tensors of `g` (read from `source`) to f32.
    pub fn load(
        g: &Gguf,
        cfg: &VisionConfig,
        source: &dyn TensorSource,
    ) -> Result<Self, VisionError> {
        let t = TowerTensors::resolve(g, cfg)?;
        let read = |t: &TensorInfo| read_tensor_f32(g, source, t);
        let clamp_values = t
            .clamps
            .tensors()
            .into_iter()
            .map(read)
            .collect::<Result<Vec<_>, _>>()?;
        let clamps = t.clamps.assemble(cfg.n_layer, &clamp_values)?;
        let out_scales = t
            .out_scales
            .iter()
            .map(|s| s.map_or(Ok(1.0), |s| Ok::<_, VisionError>(read(s)?[0])))
            .collect::<Result<Vec<_>, _>>()?;
        let mut w = Tower {
            patch_embd: read(&t.patch_embd)?,
            patch_order: t.tower.patch_order,
            positions: read(t.tower.positions)?,
            layers: Vec::with_capacity(cfg.n_layer),
            standardize: match t.tower.standardize {
                Some((b, s)) => Some((read(b)?, read(s)?)),
                None => None,
            },
            projection: read(t.tower.projection)?,
        };
        for l in &t.tower.layers {
            let lin = |x: &Linear<&TensorInfo>| -> Result<Linear<Vec<f32>>, VisionError> {
                Ok(Linear {
                    w: read(x.w)?,
                    clamp: Clamp::NONE,
                })
            };
            w.layers.push(Layer {
                ln1: read(l.ln1)?,
                ln2: read(l.ln2)?,
                attn_post_norm: read(l.attn_post_norm)?,
                ffn_post_norm: read(l.ffn_post_norm)?,
                q_norm: read(l.q_norm)?,
                k_norm: read(l.k_norm)?,
                q: lin(&l.q)?,
                k: lin(&l.k)?,
                v: lin(&l.v)?,
                o: lin(&l.o)?,
                gate: lin(&l.gate)?,
                up: lin(&l.up)?,
                down: lin(&l.down)?,
                out_scale: 1.0,
            });
        }
        w.set_ranges(&clamps, &out_scales);
        Ok(Self {
            cfg: cfg.clone(),
            w,
        })
    }

    /// The soft tokens of one image, `[tokens, text width]`.
    pub fn encode(&self, p: &Patches) -> Result<Vec<f32>, VisionError> {
        Ok(self.trace(p)?.soft_tokens)
    }

    /// The tower's forward on one image with its intermediate values.
    pub fn trace(&self, p: &Patches) -> Result<Trace, VisionError> {
        let cfg = &self.cfg;
        check_positions(cfg, p)?;
        let (n, d) = ((p.rows * p.cols) as usize, cfg.n_embd);
        let input = self.w.patch_order.input(p);
        let mut x = cpu::matmul(&self.w.patch_embd, d, Patches::PATCH_VALUES, &input, n);
        let (cols_table, rows_table) = self.w.positions.split_at(cfg.n_positions * d);
        let mut positions = Vec::with_capacity(n * POSITION_AXES);
        for (i, row) in x.chunks_mut(d).enumerate() {
            let (c, r) = p.position(i as u32);
            positions.extend([c, r]);
            let (px, py) = (
                &cols_table[c as usize * d..][..d],
                &rows_table[r as usize * d..][..d],
            );
            for ((v, a), b) in row.iter_mut().zip(px).zip(py) {
                *v += a + b;
            }
        }
        let mut trace = Trace {
            patch_embed: x.clone(),
            ..Trace::default()
        };
        for l in &self.w.layers {
            x = self.layer(l, &x, &positions);
            trace.layers.push(x.clone());
        }
        let grid = [p.rows as usize, p.cols as usize, d];
        let window = Window2d {
            kernel: [POOL; 2],
            stride: [POOL; 2],
            pad: [0; 2],
        };
        let root = (d as f32).sqrt();
        let mut pooled: Vec<f32> = cpu::avg_pool2d(&x, grid, window)
            .into_iter()
            .map(|v| v * root)
            .collect();
        if let Some((bias, scale)) = &self.w.standardize {
            for row in pooled.chunks_mut(d) {
                for ((v, b), s) in row.iter_mut().zip(bias).zip(scale) {
                    *v = (*v - b) * s;
                }
            }
        }
        let normed = cpu::rms_norm(&pooled, d, None, cfg.eps);
        let tokens = pooled.len() / d;
        trace.soft_tokens = cpu::matmul(&self.w.projection, cfg.projection_dim, d, &normed, tokens);
        trace.pooled = pooled;
        Ok(trace)
    }

    /// One encoder layer: sandwich-normed attention and gated MLP, each added to the stream.
    fn layer(&self, l: &Layer<Vec<f32>, Vec<f32>>, x: &[f32], positions: &[u32]) -> Vec<f32> {
        let cfg = &self.cfg;
        let (d, dh, heads) = (cfg.n_embd, cfg.head_dim, cfg.n_head);
        let norm = |v: &[f32], w: Option<&[f32]>, dim: usize| cpu::rms_norm(v, dim, w, cfg.eps);
        let h = norm(x, Some(&l.ln1), d);
        let mut q = norm(&linear(&l.q, &h, d), Some(&l.q_norm), dh);
        let mut k = norm(&linear(&l.k, &h, d), Some(&l.k_norm), dh);
        let v = norm(&linear(&l.v, &h, d), None, dh);
        let rope = RopeRef {
            heads,
            head_dim: dh,
            positions,
            axes: POSITION_AXES,
            n_rot: dh / POSITION_AXES,
            pairs: RopePairs::Neox,
            base: ROPE_THETA,
            freq_scale: 1.0,
            freq_factors: None,
        };
        cpu::rope_axes(&mut q, &rope);
        cpu::rope_axes(&mut k, &rope);
        let attended = cpu::attend(
            &AttendRef {
                q: &q,
                k: &k,
                v: &v,
                heads,
                kv_heads: heads,
                d: dh,
                q_pos0: 0,
                scale: 1.0,
                softcap: 0.0,
                relative: None,
            },
            |_, _| true,
        );
        let attn = norm(&linear(&l.o, &attended, d), Some(&l.attn_post_norm), d);
        let mid: Vec<f32> = x.iter().zip(&attn).map(|(a, b)| a + b).collect();
        let h = norm(&mid, Some(&l.ln2), d);
        let (gate, up) = (linear(&l.gate, &h, d), linear(&l.up, &h, d));
        let act = cpu::geglu(&gate, &up);
        let ffn = norm(&linear(&l.down, &act, cfg.n_ff), Some(&l.ffn_post_norm), d);
        mid.iter()
            .zip(&ffn)
            .map(|(a, b)| (a + b) * l.out_scale)
            .collect()
    }
}

/// `clamp(W clamp(x))` over the rows of `x` (`cols` values each).
fn linear(l: &Linear<Vec<f32>>, x: &[f32], cols: usize) -> Vec<f32> {
    let clamp = |v: &[f32], [lo, hi]: [f32; 2]| -> Vec<f32> {
        v.iter().map(|&a| a.clamp(lo, hi)).collect()
    };
    let rows = l.w.len() / cols;
    let y = cpu::matmul(&l.w, rows, cols, &clamp(x, l.clamp.input), x.len() / cols);
    clamp(&y, l.clamp.output)
}
