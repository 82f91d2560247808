//! Which GGUF tensors make up the model, with their shapes checked against the config. The
//! CPU reference and the GPU forward both load through [`ModelTensors::resolve`] and map the
//! tensor infos to their own weight types.

use wgemma_gguf::{Gguf, TensorError, TensorInfo};

use crate::config::TextConfig;

/// One decoder layer's tensors. `M` is a matrix, `V` a vector (norm weights).
#[derive(Clone, Debug)]
pub struct Layer<M, V> {
    pub attn_norm: V,
    pub q: M,
    /// Absent on shared-KV layers.
    pub k: Option<M>,
    /// Absent on shared-KV layers and on Gemma 4 layers whose V is their K.
    pub v: Option<M>,
    pub q_norm: V,
    pub k_norm: Option<V>,
    pub o: M,
    pub post_attn_norm: V,
    pub ffn_norm: V,
    pub gate: M,
    pub up: M,
    pub down: M,
    pub post_ffw_norm: V,
    /// Gemma 4's per-layer output multiplier (DiffusionGemma: the denoiser's).
    pub out_scale: Option<V>,
    /// DiffusionGemma's per-layer output multiplier of the encoder (the prompt's pass).
    pub enc_out_scale: Option<V>,
    /// Per-layer embedding injection (Gemma 4 E2B/E4B).
    pub ple: Option<PleLayer<M, V>>,
    /// The experts running beside the dense feed-forward (Gemma 4 26B-A4B).
    pub moe: Option<MoeLayer<M, V>>,
}

/// A layer's per-layer-embedding tensors: `x += norm(proj(gelu(inp_gate x) * ple)) * post_norm`.
#[derive(Clone, Debug)]
pub struct PleLayer<M, V> {
    /// `n_ple` rows of `n_embd`.
    pub inp_gate: M,
    /// `n_embd` rows of `n_ple`.
    pub proj: M,
    pub post_norm: V,
}

/// A layer's mixture of experts.
#[derive(Clone, Debug)]
pub struct MoeLayer<M, V> {
    /// `n_expert` rows of `n_embd`.
    pub router: M,
    /// Multiplies the router's normed input.
    pub router_scale: V,
    pub pre_norm: V,
    /// Norm of the dense branch's output.
    pub post_norm_dense: V,
    /// Norm of the experts' weighted sum.
    pub post_norm_experts: V,
    /// Per expert: `2 * n_ff` rows (gate then up), experts stacked; or gate and up apart.
    pub gate_up: ExpertGateUp<M>,
    /// Per expert `n_embd` rows of `n_ff`, experts stacked.
    pub down: M,
    /// Multiplier of each expert's output.
    pub down_scale: Option<V>,
}

/// How a file stores the experts' gate and up projections.
#[derive(Clone, Debug)]
pub enum ExpertGateUp<M> {
    /// llama.cpp: one tensor, per expert the gate rows then the up rows.
    Fused(M),
    /// Ollama: two tensors.
    Split { gate: M, up: M },
}

/// All the model's tensors.
#[derive(Clone, Debug)]
pub struct Model<M, V> {
    /// The token embedding, also the output projection unless `output` is given.
    pub token_embd: M,
    pub output: Option<M>,
    pub output_norm: V,
    /// Frequency divisors of the global layers' RoPE (Gemma 4).
    pub rope_freqs: Option<V>,
    /// Projection of the token embedding into all layers' per-layer inputs, and its norm.
    pub ple: Option<PleModel<M, V>>,
    pub layers: Vec<Layer<M, V>>,
}

/// The model-level per-layer-embedding tensors (the token table itself is read by rows, never
/// as a whole: see [`ModelTensors::ple_table`]).
#[derive(Clone, Debug)]
pub struct PleModel<M, V> {
    /// `n_ple * n_layer` rows of `n_embd`.
    pub proj: M,
    pub proj_norm: V,
}

/// The tensor infos of a model, checked.
pub type ModelTensors<'a> = Model<&'a TensorInfo, &'a TensorInfo>;

/// The per-layer token table: `n_vocab` rows of `n_ple * n_layer`, read a row at a time.
pub fn ple_table<'a>(g: &'a Gguf, cfg: &TextConfig) -> Result<Option<&'a TensorInfo>, TensorError> {
    if cfg.n_ple == 0 {
        return Ok(None);
    }
    let t = g.require_tensor("per_layer_token_embd.weight")?;
    t.expect_dims(&[(cfg.n_ple * cfg.n_layer) as u64, cfg.n_vocab as u64])?;
    Ok(Some(t))
}

impl<'a> ModelTensors<'a> {
    /// Looks up every tensor the config calls for and checks its shape.
    pub fn resolve(g: &'a Gguf, cfg: &TextConfig) -> Result<Self, TensorError> {
        let d = cfg.n_embd as u64;
        let get = |name: &str| g.require_tensor(name);
        let opt = |name: &str| g.tensor(name);
        let vector = |name: &str, n: u64| -> Result<&'a TensorInfo, TensorError> {
            let t = get(name)?;
            t.expect_dims(&[n])?;
            Ok(t)
        };
        let matrix = |name: &str, cols: u64, rows: u64| -> Result<&'a TensorInfo, TensorError> {
            let t = get(name)?;
            t.expect_dims(&[cols, rows])?;
            Ok(t)
        };
        let token_embd = matrix("token_embd.weight", d, cfg.n_vocab as u64)?;
        let shaped = |name: &str, dims: &[u64]| -> Result<&'a TensorInfo, TensorError> {
            let t = get(name)?;
            t.expect_dims(dims)?;
            Ok(t)
        };
        let n_ple = cfg.n_ple as u64;
        let ple = if n_ple > 0 {
            Some(PleModel {
                proj: matrix("per_layer_model_proj.weight", d, n_ple * cfg.n_layer as u64)?,
                proj_norm: vector("per_layer_proj_norm.weight", n_ple)?,
            })
        } else {
            None
        };
        let output = match opt("output.weight") {
            Some(_) => Some(matrix("output.weight", d, cfg.n_vocab as u64)?),
            None => None,
        };
        let output_norm = vector("output_norm.weight", d)?;
        let rope_freqs = match cfg.layers.iter().find(|l| l.rope_freq_factors) {
            Some(l) => Some(vector("rope_freqs.weight", (l.n_rot / 2) as u64)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for (il, lc) in cfg.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let hd = lc.head_dim as u64;
            let q_rows = cfg.n_head as u64 * hd;
            let kv_rows = lc.n_kv_head as u64 * hd;
            let ff = lc.n_ff as u64;
            let owns = lc.owns_kv(il);
            let k = owns.then(|| matrix(&n("attn_k"), d, kv_rows)).transpose()?;
            let v = match (owns, opt(&n("attn_v"))) {
                (true, Some(_)) => Some(matrix(&n("attn_v"), d, kv_rows)?),
                _ => None,
            };
            let scalar = |s: &str| match opt(&n(s)) {
                Some(_) => vector(&n(s), 1).map(Some),
                None => Ok(None),
            };
            let out_scale = scalar("layer_output_scale")?;
            let enc_out_scale = scalar("enc_layer_output_scale")?;
            let ple = if n_ple > 0 {
                Some(PleLayer {
                    inp_gate: matrix(&n("inp_gate"), d, n_ple)?,
                    proj: matrix(&n("proj"), n_ple, d)?,
                    post_norm: vector(&n("post_norm"), d)?,
                })
            } else {
                None
            };
            let t = |s: &str| format!("blk.{il}.{s}");
            let moe = match (cfg.moe, opt(&n("ffn_gate_inp"))) {
                (Some(mc), Some(_)) => {
                    let (e, fe) = (mc.n_expert as u64, mc.n_ff as u64);
                    let gate_up = match opt(&n("ffn_gate_up_exps")) {
                        Some(_) => {
                            ExpertGateUp::Fused(shaped(&n("ffn_gate_up_exps"), &[d, 2 * fe, e])?)
                        }
                        None => ExpertGateUp::Split {
                            gate: shaped(&n("ffn_gate_exps"), &[d, fe, e])?,
                            up: shaped(&n("ffn_up_exps"), &[d, fe, e])?,
                        },
                    };
                    // Ollama's older blobs name the per-expert scale after the router.
                    let down_scale = match opt(&t("ffn_down_exps.scale"))
                        .or(opt(&t("ffn_gate_inp.per_expert_scale")))
                    {
                        Some(s) => Some(shaped(&s.name, &[e])?),
                        None => None,
                    };
                    Some(MoeLayer {
                        router: matrix(&n("ffn_gate_inp"), d, e)?,
                        router_scale: shaped(&t("ffn_gate_inp.scale"), &[d])?,
                        pre_norm: vector(&n("pre_ffw_norm_2"), d)?,
                        post_norm_dense: vector(&n("post_ffw_norm_1"), d)?,
                        post_norm_experts: vector(&n("post_ffw_norm_2"), d)?,
                        gate_up,
                        down: shaped(&n("ffn_down_exps"), &[fe, d, e])?,
                        down_scale,
                    })
                }
                _ => None,
            };
            layers.push(Layer {
                attn_norm: vector(&n("attn_norm"), d)?,
                q: matrix(&n("attn_q"), d, q_rows)?,
                k,
                v,
                q_norm: vector(&n("attn_q_norm"), hd)?,
                k_norm: owns.then(|| vector(&n("attn_k_norm"), hd)).transpose()?,
                o: matrix(&n("attn_output"), q_rows, d)?,
                post_attn_norm: vector(&n("post_attention_norm"), d)?,
                ffn_norm: vector(&n("ffn_norm"), d)?,
                gate: matrix(&n("ffn_gate"), d, ff)?,
                up: matrix(&n("ffn_up"), d, ff)?,
                down: matrix(&n("ffn_down"), ff, d)?,
                post_ffw_norm: vector(&n("post_ffw_norm"), d)?,
                out_scale,
                enc_out_scale,
                ple,
                moe,
            });
        }
        Ok(Model {
            token_embd,
            output,
            output_norm,
            rope_freqs,
            ple,
            layers,
        })
    }
}

impl<M, V> Layer<M, V> {
    /// Converts every tensor with `fm` (matrices) and `fv` (vectors).
    pub fn try_map<M2, V2, E>(
        &self,
        fm: &mut impl FnMut(&M) -> Result<M2, E>,
        fv: &mut impl FnMut(&V) -> Result<V2, E>,
    ) -> Result<Layer<M2, V2>, E> {
        Ok(Layer {
            attn_norm: fv(&self.attn_norm)?,
            q: fm(&self.q)?,
            k: self.k.as_ref().map(&mut *fm).transpose()?,
            v: self.v.as_ref().map(&mut *fm).transpose()?,
            q_norm: fv(&self.q_norm)?,
            k_norm: self.k_norm.as_ref().map(&mut *fv).transpose()?,
            o: fm(&self.o)?,
            post_attn_norm: fv(&self.post_attn_norm)?,
            ffn_norm: fv(&self.ffn_norm)?,
            gate: fm(&self.gate)?,
            up: fm(&self.up)?,
            down: fm(&self.down)?,
            post_ffw_norm: fv(&self.post_ffw_norm)?,
            out_scale: self.out_scale.as_ref().map(&mut *fv).transpose()?,
            enc_out_scale: self.enc_out_scale.as_ref().map(&mut *fv).transpose()?,
            ple: match &self.ple {
                Some(p) => Some(PleLayer {
                    inp_gate: fm(&p.inp_gate)?,
                    proj: fm(&p.proj)?,
                    post_norm: fv(&p.post_norm)?,
                }),
                None => None,
            },
            moe: match &self.moe {
                Some(m) => Some(MoeLayer {
                    router: fm(&m.router)?,
                    router_scale: fv(&m.router_scale)?,
                    pre_norm: fv(&m.pre_norm)?,
                    post_norm_dense: fv(&m.post_norm_dense)?,
                    post_norm_experts: fv(&m.post_norm_experts)?,
                    gate_up: match &m.gate_up {
                        ExpertGateUp::Fused(w) => ExpertGateUp::Fused(fm(w)?),
                        ExpertGateUp::Split { gate, up } => ExpertGateUp::Split {
                            gate: fm(gate)?,
                            up: fm(up)?,
                        },
                    },
                    down: fm(&m.down)?,
                    down_scale: m.down_scale.as_ref().map(&mut *fv).transpose()?,
                }),
                None => None,
            },
        })
    }
}

impl<M, V> Model<M, V> {
    /// Converts every tensor with `fm` (matrices) and `fv` (vectors).
    pub fn try_map<M2, V2, E>(
        &self,
        mut fm: impl FnMut(&M) -> Result<M2, E>,
        mut fv: impl FnMut(&V) -> Result<V2, E>,
    ) -> Result<Model<M2, V2>, E> {
        Ok(Model {
            token_embd: fm(&self.token_embd)?,
            output: self.output.as_ref().map(&mut fm).transpose()?,
            output_norm: fv(&self.output_norm)?,
            rope_freqs: self.rope_freqs.as_ref().map(&mut fv).transpose()?,
            ple: match &self.ple {
                Some(p) => Some(PleModel {
                    proj: fm(&p.proj)?,
                    proj_norm: fv(&p.proj_norm)?,
                }),
                None => None,
            },
            layers: self
                .layers
                .iter()
                .map(|l| l.try_map(&mut fm, &mut fv))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The output projection: `output` when the model has one, else the tied embedding.
    pub fn output_matrix(&self) -> &M {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}
