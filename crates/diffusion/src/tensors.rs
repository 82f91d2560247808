//! The tensors DiffusionGemma adds to Gemma 4's: the self-conditioning block. (The encoder's
//! layer scales, `blk.N.enc_layer_output_scale`, are read with the text layers.)

use wgemma_gguf::{Gguf, TensorError, TensorInfo};

use crate::config::DiffusionConfig;

/// The self-conditioning block: `M` a matrix, `V` a vector.
///
/// `sc = down(gelu_tanh(gate(n)) * up(n))` with `n = norm(softmax(z) E sqrt(d)) * pre_norm`,
/// where `z` are the previous step's logits over its temperature and `E` the embedding table;
/// the canvas input is `norm(embed(canvas) sqrt(d) + sc)` without a weight.
#[derive(Clone, Debug)]
pub struct SelfCond<M, V> {
    pub pre_norm: V,
    /// `n_ff` rows of `n_embd`.
    pub gate: M,
    pub up: M,
    /// `n_embd` rows of `n_ff`.
    pub down: M,
}

impl<'a> SelfCond<&'a TensorInfo, &'a TensorInfo> {
    /// The block's tensors, shapes checked. The pre-norm is `self_cond_pre_norm` (llama.cpp's
    /// converter) or `self_cond_norm` (an earlier name of it).
    pub fn resolve(g: &'a Gguf, cfg: &DiffusionConfig) -> Result<Self, TensorError> {
        let d = cfg.text.n_embd as u64;
        let ff = g.require_tensor("self_cond_gate.weight")?.n_rows();
        let shaped = |name: &str, dims: &[u64]| -> Result<&'a TensorInfo, TensorError> {
            let t = g.require_tensor(name)?;
            t.expect_dims(dims)?;
            Ok(t)
        };
        let pre_norm = match g.tensor("self_cond_pre_norm.weight") {
            Some(_) => shaped("self_cond_pre_norm.weight", &[d])?,
            None => shaped("self_cond_norm.weight", &[d])?,
        };
        Ok(Self {
            pre_norm,
            gate: shaped("self_cond_gate.weight", &[d, ff])?,
            up: shaped("self_cond_up.weight", &[d, ff])?,
            down: shaped("self_cond_down.weight", &[ff, d])?,
        })
    }
}
