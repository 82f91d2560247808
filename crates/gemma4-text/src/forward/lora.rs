//! Adapters on the GPU: each pair's A as an f32 weight and B as an f32 buffer of the model's
//! context, joined to a session's products through the graph's one projection hook
//! (`Node::Linear`'s adapters).

use std::collections::BTreeMap;
use std::sync::Arc;

use wgemma_gguf::GgmlType;
use wgemma_kernels::graph::{LoraTarget, LoraTerm};
use wgemma_kernels::{GpuContext, GpuError, GpuWeight, View};

use super::model::GpuModel;
use super::session::ForwardError;
use crate::config::TextConfig;
use crate::lora::{LoraAdapter, LoraError, Proj};

/// One pair on the GPU.
pub(crate) struct GpuPair {
    a: GpuWeight,
    b: View,
    rank: u32,
    rows: u32,
    scale: f32,
}

/// An adapter uploaded for one model ([`GpuModel::upload_adapter`]); a session applies it with
/// a scale ([`crate::GpuSession::set_adapters`]).
pub struct GpuLora {
    pairs: BTreeMap<(usize, Proj), GpuPair>,
    /// The model it was uploaded for: its context and shapes.
    ctx: Arc<GpuContext>,
    cfg: TextConfig,
}

impl GpuLora {
    /// Whether it was uploaded for `model` (its buffers live on that model's device, its
    /// pairs fit that model's projections).
    pub fn fits(&self, model: &GpuModel) -> bool {
        Arc::ptr_eq(&self.ctx, &model.ctx) && self.cfg == model.cfg
    }

    /// The largest rank of its pairs.
    pub(crate) fn max_rank(&self) -> u32 {
        self.pairs.values().map(|p| p.rank).max().unwrap_or(0)
    }

    /// The widest output of its gate/up pairs.
    pub(crate) fn max_gated_rows(&self) -> u32 {
        self.pairs
            .iter()
            .filter(|((_, p), _)| matches!(p, Proj::Gate | Proj::Up))
            .map(|(_, pair)| pair.rows)
            .max()
            .unwrap_or(0)
    }

    /// The term of layer `il`'s projection `proj` at `target`, scaled by `s`.
    pub(crate) fn term(
        &self,
        il: usize,
        proj: Proj,
        target: LoraTarget,
        s: f32,
    ) -> Option<LoraTerm<'_>> {
        let p = self.pairs.get(&(il, proj))?;
        Some(LoraTerm {
            a: &p.a,
            b: &p.b,
            rank: p.rank,
            rows: p.rows,
            scale: p.scale * s,
            target,
        })
    }
}

impl GpuModel {
    /// Whether layer `il` has projection `proj` of its own, for an adapter to change: layers
    /// that read another layer's KV cache have no K and V, and some layers' V is their K.
    pub fn has_projection(&self, il: usize, proj: Proj) -> bool {
        let Some(l) = self.layers.get(il) else {
            return false;
        };
        match proj {
            Proj::K | Proj::V if !self.cfg.layers[il].owns_kv(il) => false,
            Proj::V => !l.k_is_v,
            _ => true,
        }
    }

    /// Uploads `adapter`'s pairs after checking that each fits the projection it changes
    /// (leaving out those that change nothing, [`LoraAdapter::applies`]).
    pub fn upload_adapter(&self, adapter: &LoraAdapter) -> Result<Arc<GpuLora>, ForwardError> {
        adapter.check(&self.cfg)?;
        let ctx = &self.ctx;
        let mut pairs = BTreeMap::new();
        let mut unused = 0;
        for (&(il, proj), pair) in &adapter.pairs {
            if !LoraAdapter::applies(&self.cfg, il, proj) {
                unused += 1;
                continue;
            }
            if !self.has_projection(il, proj) {
                let (rows, cols) = (pair.rows, pair.cols);
                return Err(LoraError::Shape {
                    name: format!("blk.{il}.attn_v"),
                    proj,
                    layer: il,
                    got: (rows, cols),
                    want: (0, 0),
                }
                .into());
            }
            let upload =
                |what: &str, v: &[f32]| View::of(&ctx.storage_init(what, bytemuck::cast_slice(v)));
            pairs.insert(
                (il, proj),
                GpuPair {
                    a: f32_weight(ctx, &pair.a, pair.rank, pair.cols)?,
                    b: upload("lora b", &pair.b),
                    rank: pair.rank as u32,
                    rows: pair.rows as u32,
                    scale: pair.scale,
                },
            );
        }
        if unused > 0 {
            tracing::info!(
                unused,
                "LoRA pairs on K/V of shared-KV layers have no effect"
            );
        }
        Ok(Arc::new(GpuLora {
            pairs,
            ctx: self.ctx.clone(),
            cfg: self.cfg.clone(),
        }))
    }
}

/// A pair's A, `rank` rows of `cols` f32 values, as a weight: one tile (an adapter's A is far
/// under any binding limit), padded as weights are.
fn f32_weight(
    ctx: &GpuContext,
    a: &[f32],
    rank: usize,
    cols: usize,
) -> Result<GpuWeight, GpuError> {
    let w = GpuWeight::allocate(ctx, "lora a", GgmlType::F32, cols as u64, rank as u64, None)?;
    w.write_tile(ctx, 0, bytemuck::cast_slice(a))?;
    Ok(w)
}
