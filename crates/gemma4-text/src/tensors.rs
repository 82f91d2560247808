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
    /// Gemma 4's per-layer output multiplier.
    pub out_scale: Option<V>,
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
    pub layers: Vec<Layer<M, V>>,
}

/// The tensor infos of a model, checked.
pub type ModelTensors<'a> = Model<&'a TensorInfo, &'a TensorInfo>;

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
            let out_scale = match opt(&n("layer_output_scale")) {
                Some(_) => Some(vector(&n("layer_output_scale"), 1)?),
                None => None,
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
            });
        }
        Ok(Model {
            token_embd,
            output,
            output_norm,
            rope_freqs,
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
