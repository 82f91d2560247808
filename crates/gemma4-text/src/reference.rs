//! The f32 CPU reference forward: the oracle the GPU forward is tested against. Every weight
//! is dequantized to f32 once; each token is processed on its own, in plain loops built from
//! the kernel crate's CPU references.

use std::sync::Arc;

use wgemma_gguf::{Gguf, ReadError, TensorInfo, TensorSource, read_row_f32, read_tensor_f32};
use wgemma_kernels::cpu;

use crate::config::TextConfig;
use crate::lora::{LoraAdapter, LoraError, Proj};
use crate::tensors::{ExpertGateUp, Model, ModelTensors, MoeLayer, ple_table};

/// A row-major f32 matrix (`rows` outputs of `cols` inputs).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl Matrix {
    /// `W x`, split over the machine's threads by rows.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let chunk = self.rows.div_ceil(threads).max(1);
        let mut y = vec![0.0; self.rows];
        std::thread::scope(|s| {
            for (i, out) in y.chunks_mut(chunk).enumerate() {
                let rows = &self.data[i * chunk * self.cols..][..out.len() * self.cols];
                s.spawn(move || {
                    out.copy_from_slice(&cpu::matmul(rows, out.len(), self.cols, x, 1))
                });
            }
        });
        y
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..][..self.cols]
    }
}

/// The model with f32 weights.
pub struct CpuModel {
    pub cfg: TextConfig,
    w: Model<Matrix, Vec<f32>>,
    /// The per-layer token table, read a row per token (it is too large to hold as f32).
    ple_table: Option<PleTable>,
    /// LoRA adapters applied to the projections, each with its scale.
    adapters: Vec<(LoraAdapter, f32)>,
}

struct PleTable {
    header: Gguf,
    info: TensorInfo,
    source: Arc<dyn TensorSource>,
}

/// One position's input to [`CpuModel::forward_inputs`].
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A token id: its embedding row times `sqrt(n_embd)`.
    Token(u32),
    /// A soft token (an encoder's output row, `n_embd` values), taken as it is; per-layer
    /// embeddings read the padding token's row there.
    Embedding(&'a [f32]),
}

/// Layer queries, and keys and values, of one row ([`CpuModel::layer_qkv`]).
pub struct LayerQkv {
    /// `n_head * head_dim`
    pub q: Vec<f32>,
    /// `n_kv_head * head_dim` each; absent on layers that read another layer's cache.
    pub kv: Option<(Vec<f32>, Vec<f32>)>,
}

/// Which of DiffusionGemma's two passes a layer runs in: they share the weights but not the
/// layers' output scales. Other models have one scale, which both roles read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRole {
    /// The causal pass over the prompt (and the text models' only pass).
    Encoder,
    /// DiffusionGemma's bidirectional pass over the canvas.
    Denoiser,
}

/// KV caches and position of a CPU forward.
pub struct CpuState {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pub pos: usize,
}

impl CpuModel {
    /// Dequantizes every tensor of the model but the per-layer token table.
    pub fn load(g: &Gguf, cfg: &TextConfig, src: Arc<dyn TensorSource>) -> Result<Self, ReadError> {
        let tensors = ModelTensors::resolve(g, cfg)?;
        let w = tensors.try_map(
            |t: &&TensorInfo| {
                Ok::<_, ReadError>(Matrix {
                    data: read_tensor_f32(g, &*src, t)?,
                    rows: t.n_rows() as usize,
                    cols: t.row_len() as usize,
                })
            },
            |t: &&TensorInfo| read_tensor_f32(g, &*src, t),
        )?;
        let ple_table = ple_table(g, cfg)?.map(|info| PleTable {
            header: g.clone(),
            info: info.clone(),
            source: src.clone(),
        });
        Ok(Self {
            cfg: cfg.clone(),
            w,
            ple_table,
            adapters: Vec::new(),
        })
    }

    /// Applies `adapters` (each with its scale) to the projections from now on.
    pub fn set_adapters(&mut self, adapters: Vec<(LoraAdapter, f32)>) -> Result<(), LoraError> {
        for (a, _) in &adapters {
            a.check(&self.cfg)?;
        }
        self.adapters = adapters;
        Ok(())
    }

    /// Layer `il`'s projection `proj` of `x`: `x W^T`, plus each adapter's delta.
    fn project(&self, il: usize, proj: Proj, w: &Matrix, x: &[f32]) -> Vec<f32> {
        let mut y = w.apply(x);
        for (a, s) in &self.adapters {
            if let Some(pair) = a.pairs.get(&(il, proj)) {
                y.iter_mut()
                    .zip(pair.delta(x, *s))
                    .for_each(|(v, d)| *v += d);
            }
        }
        y
    }

    /// Every layer's per-layer input for `token` (Gemma 4 E2B/E4B): `n_layer * n_ple` values,
    /// from the token's row of the table and a projection of its embedding `x0`.
    fn per_layer_inputs(&self, token: u32, x0: &[f32]) -> Result<Option<Vec<f32>>, ReadError> {
        let (Some(table), Some(ple)) = (self.ple_table.as_ref(), self.w.ple.as_ref()) else {
            return Ok(None);
        };
        let c = &self.cfg;
        let n = c.n_ple;
        let row = read_row_f32(&table.header, &*table.source, &table.info, u64::from(token))?;
        let inv_sqrt_d = 1.0 / (c.n_embd as f32).sqrt();
        let proj: Vec<f32> = ple.proj.apply(x0).iter().map(|v| v * inv_sqrt_d).collect();
        let proj = cpu::rms_norm(&proj, n, Some(&ple.proj_norm), c.eps);
        let tok_scale = (n as f32).sqrt();
        Ok(Some(
            proj.iter()
                .zip(&row)
                .map(|(p, t)| (p + t * tok_scale) * std::f32::consts::FRAC_1_SQRT_2)
                .collect(),
        ))
    }

    /// The experts' normed, weighted sum for the residual `r` (router, top-k, experts).
    fn experts(&self, m: &MoeLayer<Matrix, Vec<f32>>, r: &[f32]) -> Vec<f32> {
        let c = &self.cfg;
        let Some(mc) = c.moe else {
            return vec![0.0; c.n_embd];
        };
        let d = c.n_embd;
        let inv_sqrt_d = 1.0 / (d as f32).sqrt();
        let scale: Vec<f32> = m.router_scale.iter().map(|s| s * inv_sqrt_d).collect();
        let logits = m.router.apply(&cpu::rms_norm(r, d, Some(&scale), c.eps));
        let e_in = cpu::rms_norm(r, d, Some(&m.pre_norm), c.eps);
        let ff = mc.n_ff;
        let rows = |w: &Matrix, first: usize, n: usize| Matrix {
            data: w.data[first * w.cols..(first + n) * w.cols].to_vec(),
            rows: n,
            cols: w.cols,
        };
        let mut out = vec![0.0f32; d];
        for (e, weight) in cpu::route(&logits, mc.n_used) {
            let e = e as usize;
            let (gate, up) = match &m.gate_up {
                ExpertGateUp::Fused(w) => (rows(w, e * 2 * ff, ff), rows(w, e * 2 * ff + ff, ff)),
                ExpertGateUp::Split { gate, up } => (rows(gate, e * ff, ff), rows(up, e * ff, ff)),
            };
            let act = cpu::geglu(&gate.apply(&e_in), &up.apply(&e_in));
            let y = rows(&m.down, e * d, d).apply(&act);
            let s = weight * m.down_scale.as_ref().map_or(1.0, |ds| ds[e]);
            out.iter_mut().zip(&y).for_each(|(o, v)| *o += s * v);
        }
        cpu::rms_norm(&out, d, Some(&m.post_norm_experts), c.eps)
    }

    pub fn new_state(&self) -> CpuState {
        let n = self.cfg.n_layer;
        CpuState {
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            pos: 0,
        }
    }

    /// Runs `tokens` through the model, appending to `state`'s cache; returns the logits
    /// after each token.
    pub fn forward(
        &self,
        state: &mut CpuState,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, ReadError> {
        tokens
            .iter()
            .map(|&t| self.step(state, Input::Token(t), &mut |_, _| {}))
            .collect()
    }

    /// The input row of `token`: its embedding times `sqrt(n_embd)`.
    pub fn embed(&self, token: u32) -> Vec<f32> {
        let row = self.w.token_embd.row(token as usize);
        row.iter().map(|v| v * self.cfg.embed_scale).collect()
    }

    /// [`CpuModel::forward`] over token ids and soft tokens.
    pub fn forward_inputs(
        &self,
        state: &mut CpuState,
        inputs: &[Input<'_>],
    ) -> Result<Vec<Vec<f32>>, ReadError> {
        inputs
            .iter()
            .map(|&i| self.step(state, i, &mut |_, _| {}))
            .collect()
    }

    /// [`CpuModel::forward_inputs`], handing `trace` each position's values by the names of
    /// the GPU decoder's graph ([`crate::GpuSession::trace`]): `inp_embd`, and per layer
    /// `blk.N.attn_out` (the attention's output product, before its post-norm),
    /// `blk.N.ffn_inp` (the stream after the attention block), `blk.N.ffn_out` (the
    /// feed-forward output, experts mixed in, before its post-norm) and `blk.N.out` (the
    /// layer's output); then `result_norm` and `result_output` (the logits).
    pub fn forward_traced(
        &self,
        state: &mut CpuState,
        inputs: &[Input<'_>],
        trace: &mut dyn FnMut(&str, &[f32]),
    ) -> Result<Vec<Vec<f32>>, ReadError> {
        inputs.iter().map(|&i| self.step(state, i, trace)).collect()
    }

    fn step(
        &self,
        st: &mut CpuState,
        input: Input<'_>,
        trace: &mut dyn FnMut(&str, &[f32]),
    ) -> Result<Vec<f32>, ReadError> {
        let c = &self.cfg;
        let pos = st.pos;
        let (mut x, ple_token) = match input {
            Input::Token(token) => (self.embed(token), token),
            Input::Embedding(row) => (row.to_vec(), c.pad_id),
        };
        trace("inp_embd", &x);
        let ple = self.per_layer_inputs(ple_token, &x)?;
        for (il, lc) in c.layers.iter().enumerate() {
            let hd = lc.head_dim;
            let LayerQkv { q, kv } = self.layer_qkv(il, &x, pos);
            if let Some((k, v)) = kv {
                st.k[il].extend_from_slice(&k);
                st.v[il].extend_from_slice(&v);
            }
            let src = lc.kv_source;
            let window = if lc.sliding { c.sliding_window } else { 0 };
            let attn = cpu::attention(&cpu::CausalAttention {
                q: &q,
                k_cache: &st.k[src],
                v_cache: &st.v[src],
                positions: &[pos as u32],
                n_head: c.n_head,
                n_kv_head: lc.n_kv_head,
                head_dim: hd,
                window,
                scale: c.attn_scale,
                softcap: 0.0,
            });
            let ple_l = ple.as_ref().map(|p| &p[il * c.n_ple..(il + 1) * c.n_ple]);
            self.layer_rest(il, &mut x, &attn, ple_l, trace);
            let s = self.layer_scale(il, LayerRole::Encoder);
            x.iter_mut().for_each(|v| *v *= s);
            trace(&format!("blk.{il}.out"), &x);
        }
        st.pos += 1;
        Ok(self.output(&x, trace))
    }

    /// Layer `il`'s queries for the stream row `x` at `pos` (normed and roped), and its keys
    /// and values where the layer computes its own.
    pub fn layer_qkv(&self, il: usize, x: &[f32], pos: usize) -> LayerQkv {
        let c = &self.cfg;
        let eps = c.eps;
        let (lw, lc) = (&self.w.layers[il], &c.layers[il]);
        let hd = lc.head_dim;
        let h = cpu::rms_norm(x, c.n_embd, Some(&lw.attn_norm), eps);
        let mut q = cpu::rms_norm(
            &self.project(il, Proj::Q, &lw.q, &h),
            hd,
            Some(&lw.q_norm),
            eps,
        );
        let ff = if lc.rope_freq_factors {
            self.w.rope_freqs.as_deref()
        } else {
            None
        };
        let rope = |v: &mut [f32], heads: usize| {
            cpu::rope_neox(
                v,
                &cpu::NeoxRope {
                    heads,
                    head_dim: hd,
                    n_rot: lc.n_rot,
                    positions: &[pos as u32],
                    base: lc.rope_base,
                    freq_scale: lc.rope_freq_scale,
                    freq_factors: ff,
                },
            );
        };
        rope(&mut q, c.n_head);
        let kv = match (&lw.k, &lw.k_norm) {
            (Some(wk), Some(k_norm)) => {
                let k_raw = self.project(il, Proj::K, wk, &h);
                let v_raw =
                    lw.v.as_ref()
                        .map_or_else(|| k_raw.clone(), |wv| self.project(il, Proj::V, wv, &h));
                let mut k = cpu::rms_norm(&k_raw, hd, Some(k_norm), eps);
                rope(&mut k, lc.n_kv_head);
                let v = if c.v_norm {
                    cpu::rms_norm(&v_raw, hd, None, eps)
                } else {
                    v_raw
                };
                Some((k, v))
            }
            _ => None,
        };
        LayerQkv { q, kv }
    }

    /// The rest of layer `il` for the stream row `x`, given its attention's output `attn`:
    /// the output product and residual, the feed-forward block (with its experts), and the
    /// per-layer input (`ple`, this layer's slice) where the model has them. The layer's
    /// output scale is left to the caller ([`CpuModel::layer_scale`]).
    pub fn layer_rest(
        &self,
        il: usize,
        x: &mut [f32],
        attn: &[f32],
        ple: Option<&[f32]>,
        trace: &mut dyn FnMut(&str, &[f32]),
    ) {
        let c = &self.cfg;
        let eps = c.eps;
        let lw = &self.w.layers[il];
        let o = self.project(il, Proj::O, &lw.o, attn);
        trace(&format!("blk.{il}.attn_out"), &o);
        let o = cpu::rms_norm(&o, c.n_embd, Some(&lw.post_attn_norm), eps);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        trace(&format!("blk.{il}.ffn_inp"), x);
        let f = cpu::rms_norm(x, c.n_embd, Some(&lw.ffn_norm), eps);
        let gate = self.project(il, Proj::Gate, &lw.gate, &f);
        let act = cpu::geglu(&gate, &self.project(il, Proj::Up, &lw.up, &f));
        let mut ffn = self.project(il, Proj::Down, &lw.down, &act);
        if let Some(m) = &lw.moe {
            // The dense branch and the experts, each normed, then summed.
            let dense = cpu::rms_norm(&ffn, c.n_embd, Some(&m.post_norm_dense), eps);
            let experts = self.experts(m, x);
            ffn = dense.iter().zip(&experts).map(|(a, b)| a + b).collect();
        }
        trace(&format!("blk.{il}.ffn_out"), &ffn);
        let down = cpu::rms_norm(&ffn, c.n_embd, Some(&lw.post_ffw_norm), eps);
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        if let (Some(p), Some(ple_l)) = (&lw.ple, ple) {
            let g = cpu::geglu(&p.inp_gate.apply(x), ple_l);
            let inj = cpu::rms_norm(&p.proj.apply(&g), c.n_embd, Some(&p.post_norm), eps);
            x.iter_mut().zip(&inj).for_each(|(a, b)| *a += b);
        }
    }

    /// Layer `il`'s output scale in `role` (1 where the model has none).
    pub fn layer_scale(&self, il: usize, role: LayerRole) -> f32 {
        let lw = &self.w.layers[il];
        let scale = match role {
            LayerRole::Encoder => lw.enc_out_scale.as_ref().or(lw.out_scale.as_ref()),
            LayerRole::Denoiser => lw.out_scale.as_ref(),
        };
        scale.map_or(1.0, |s| s[0])
    }

    /// The logits of the stream row `x`: the final norm, the output product, the soft cap.
    pub fn output(&self, x: &[f32], trace: &mut dyn FnMut(&str, &[f32])) -> Vec<f32> {
        let c = &self.cfg;
        let out = cpu::rms_norm(x, c.n_embd, Some(&self.w.output_norm), c.eps);
        trace("result_norm", &out);
        let mut logits = self.w.output_matrix().apply(&out);
        if let Some(cap) = c.final_softcap {
            logits.iter_mut().for_each(|v| *v = cpu::softcap(*v, cap));
        }
        trace("result_output", &logits);
        logits
    }

    /// The token embedding table (`n_vocab` rows of `n_embd`), unscaled.
    pub fn token_embd(&self) -> &Matrix {
        &self.w.token_embd
    }
}
