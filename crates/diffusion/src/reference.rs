//! The f32 CPU reference of DiffusionGemma's canvas logits: one "unified" pass over
//! `[prompt | canvas]` without a cache, row by row and layer by layer, built from the text
//! crate's CPU layers. Prompt rows run as the encoder (causal, the encoder's layer scales),
//! canvas rows as the denoiser (the keys of [`crate::mask::key_range`], the denoiser's layer
//! scales); this equals transformers' two passes (encoder into a cache, then the denoiser
//! reading it).

use std::sync::Arc;

use wgemma_gguf::{Gguf, ReadError, TensorInfo, TensorSource, read_tensor_f32};
use wgemma_kernels::cpu;
use wgemma_text::{CpuModel, Input, LayerQkv, LayerRole, Matrix};

use crate::config::DiffusionConfig;
use crate::mask::key_range_with_images;
use crate::tensors::SelfCond;

#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{0}")]
    Input(String),
}

/// The model with f32 weights.
pub struct CpuDiffusion {
    pub cfg: DiffusionConfig,
    text: CpuModel,
    sc: SelfCond<Matrix, Vec<f32>>,
}

impl CpuDiffusion {
    /// Dequantizes every tensor.
    pub fn load(
        g: &Gguf,
        cfg: &DiffusionConfig,
        src: Arc<dyn TensorSource>,
    ) -> Result<Self, ReadError> {
        let text = CpuModel::load(g, &cfg.text, src.clone())?;
        let t = SelfCond::resolve(g, cfg)?;
        let matrix = |t: &TensorInfo| -> Result<Matrix, ReadError> {
            Ok(Matrix {
                data: read_tensor_f32(g, &*src, t)?,
                rows: t.n_rows() as usize,
                cols: t.row_len() as usize,
            })
        };
        let sc = SelfCond {
            pre_norm: read_tensor_f32(g, &*src, t.pre_norm)?,
            gate: matrix(t.gate)?,
            up: matrix(t.up)?,
            down: matrix(t.down)?,
        };
        Ok(Self {
            cfg: cfg.clone(),
            text,
            sc,
        })
    }

    fn check(
        &self,
        prompt: &[Input<'_>],
        canvas: &[u32],
        sc: Option<&[f32]>,
    ) -> Result<(), ReferenceError> {
        let (vocab, width) = (self.cfg.text.n_vocab, self.cfg.text.n_embd);
        let ids = prompt.iter().filter_map(|i| match i {
            Input::Token(t) => Some(t),
            Input::Embedding(_) => None,
        });
        if let Some(&t) = ids.chain(canvas).find(|&&t| t as usize >= vocab) {
            return Err(ReferenceError::Input(format!(
                "token {t} of a {vocab}-token vocabulary"
            )));
        }
        let row = |i: &Input<'_>| matches!(i, Input::Embedding(r) if r.len() != width);
        if prompt.iter().any(row) {
            return Err(ReferenceError::Input(format!(
                "a soft token that is not {width} values"
            )));
        }
        if canvas.is_empty() {
            return Err(ReferenceError::Input("an empty canvas".into()));
        }
        match sc {
            Some(z) if z.len() != canvas.len() * vocab => Err(ReferenceError::Input(format!(
                "{} self-conditioning logits for {} canvas rows of {vocab}",
                z.len(),
                canvas.len()
            ))),
            _ => Ok(()),
        }
    }

    /// The self-conditioning signal of one canvas row from that row's previous logits `z`
    /// (already over the previous step's temperature).
    fn self_conditioning(&self, z: &[f32]) -> Vec<f32> {
        let c = &self.cfg.text;
        let p = cpu::softmax(z, z.len(), 1.0);
        let e = self.text.token_embd();
        let mut soft = vec![0.0f64; c.n_embd];
        for (v, &pv) in p.iter().enumerate() {
            let row = &e.data[v * e.cols..][..e.cols];
            soft.iter_mut()
                .zip(row)
                .for_each(|(s, &x)| *s += f64::from(pv) * f64::from(x));
        }
        let soft: Vec<f32> = soft.iter().map(|&s| s as f32 * c.embed_scale).collect();
        let n = cpu::rms_norm(&soft, c.n_embd, Some(&self.sc.pre_norm), c.eps);
        let act = cpu::geglu(&self.sc.gate.apply(&n), &self.sc.up.apply(&n));
        self.sc.down.apply(&act)
    }

    /// The canvas rows' input: `norm(embed(token) sqrt(d) + sc)`, with `sc` from the previous
    /// step's logits `sc_logits` (`[canvas, vocab]`), or zero on a block's first step.
    pub fn canvas_input(&self, canvas: &[u32], sc_logits: Option<&[f32]>) -> Vec<Vec<f32>> {
        let c = &self.cfg.text;
        canvas
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let mut x = self.text.embed(t);
                if let Some(z) = sc_logits {
                    let sc = self.self_conditioning(&z[i * c.n_vocab..(i + 1) * c.n_vocab]);
                    x.iter_mut().zip(&sc).for_each(|(a, b)| *a += b);
                }
                cpu::rms_norm(&x, c.n_embd, None, c.eps)
            })
            .collect()
    }

    /// The canvas logits (`[canvas, vocab]`, row-major) of one denoising step: the prompt as
    /// the encoder reads it, the canvas (with the previous step's logits over its temperature
    /// as `sc_logits`, or none on a block's first step) as the denoiser refines it.
    pub fn canvas_logits(
        &self,
        prompt: &[u32],
        canvas: &[u32],
        sc_logits: Option<&[f32]>,
    ) -> Result<Vec<f32>, ReferenceError> {
        let inputs: Vec<Input<'_>> = prompt.iter().map(|&t| Input::Token(t)).collect();
        self.canvas_logits_with(&inputs, &[], canvas, sc_logits)
    }

    /// [`CpuDiffusion::canvas_logits`] after a prompt of token ids and soft tokens (images'
    /// rows from their tower), `images` each image's first position and length in it: an
    /// image's tokens see the whole image ([`key_range_with_images`]).
    pub fn canvas_logits_with(
        &self,
        prompt: &[Input<'_>],
        images: &[(usize, usize)],
        canvas: &[u32],
        sc_logits: Option<&[f32]>,
    ) -> Result<Vec<f32>, ReferenceError> {
        self.check(prompt, canvas, sc_logits)?;
        let c = &self.cfg.text;
        let (p, n) = (prompt.len(), prompt.len() + canvas.len());
        let mut rows: Vec<Vec<f32>> = prompt
            .iter()
            .map(|i| match *i {
                Input::Token(t) => self.text.embed(t),
                Input::Embedding(r) => r.to_vec(),
            })
            .collect();
        rows.extend(self.canvas_input(canvas, sc_logits));
        for (il, lc) in c.layers.iter().enumerate() {
            let kvw = lc.n_kv_head * lc.head_dim;
            let (mut qs, mut ks, mut vs) = (Vec::with_capacity(n), Vec::new(), Vec::new());
            for (pos, x) in rows.iter().enumerate() {
                let LayerQkv { q, kv } = self.text.layer_qkv(il, x, pos);
                let (k, v) = kv.ok_or_else(|| {
                    ReferenceError::Input(format!("layer {il} reads another layer's cache"))
                })?;
                qs.push(q);
                ks.extend(k);
                vs.extend(v);
            }
            for (row, (x, q)) in rows.iter_mut().zip(&qs).enumerate() {
                let (lo, hi) = key_range_with_images(
                    row,
                    p,
                    canvas.len(),
                    lc.sliding,
                    c.sliding_window,
                    images,
                );
                let attn = cpu::attention(&cpu::CausalAttention {
                    q,
                    k_cache: &ks[lo * kvw..(hi + 1) * kvw],
                    v_cache: &vs[lo * kvw..(hi + 1) * kvw],
                    positions: &[(hi - lo) as u32],
                    n_head: c.n_head,
                    n_kv_head: lc.n_kv_head,
                    head_dim: lc.head_dim,
                    window: 0,
                    scale: c.attn_scale,
                    softcap: 0.0,
                });
                self.text.layer_rest(il, x, &attn, None, &mut |_, _| {});
                let role = if row < p {
                    LayerRole::Encoder
                } else {
                    LayerRole::Denoiser
                };
                let s = self.text.layer_scale(il, role);
                x.iter_mut().for_each(|v| *v *= s);
            }
        }
        Ok(rows[p..]
            .iter()
            .flat_map(|x| self.text.output(x, &mut |_, _| {}))
            .collect())
    }
}
