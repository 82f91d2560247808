//! The KV cache: for each layer that owns one, a K and a V buffer of `capacity` rows of the
//! layer's KV heads; layers that share (Gemma 4's last layers) read their source's
//! (`LayerConfig::kv_source`). Rows past the session's position are stale and never read
//! before they are written again, so rewinding is forgetting positions. A session's cache is
//! its own buffers, or one slot of a [`KvPool`]'s.

use wgemma_kernels::{Dispatch, GpuContext, GpuError, View, ops};

use super::ForwardError;
use super::batch::PoolSlot;
use crate::config::TextConfig;

pub(super) struct KvCache {
    layers: Vec<Option<(View, View)>>,
    capacity: usize,
    /// The pool slot the views lie in (given back when the cache is dropped).
    slot: Option<PoolSlot>,
}

impl KvCache {
    pub(super) fn new(ctx: &GpuContext, cfg: &TextConfig, capacity: usize) -> Self {
        let buf = |label: &str, floats: u64| View::of(&ctx.storage(label, floats * 4));
        let layers = cfg
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| {
                l.owns_kv(il).then(|| {
                    let n = capacity as u64 * (l.n_kv_head * l.head_dim) as u64;
                    (buf("k_cache", n), buf("v_cache", n))
                })
            })
            .collect();
        Self {
            layers,
            capacity,
            slot: None,
        }
    }

    /// A cache of at most `context` rows in `slot` of its pool.
    pub(super) fn in_slot(slot: PoolSlot, context: usize) -> Result<Self, ForwardError> {
        let rows = slot.pool().slot_rows();
        let capacity = context.clamp(1, rows);
        let layers = slot
            .pool()
            .layers()
            .iter()
            .map(|pair| {
                let Some((k, v)) = pair else { return Ok(None) };
                // Each slot takes the same share of every layer's buffer.
                let bytes = k.size / slot.pool().slots() as u64;
                let per_row = bytes / rows as u64;
                let at = bytes * slot.index() as u64;
                let len = per_row * capacity as u64;
                Ok(Some((k.slice(at, len)?, v.slice(at, len)?)))
            })
            .collect::<Result<_, GpuError>>()?;
        Ok(Self {
            layers,
            capacity,
            slot: Some(slot),
        })
    }

    /// The whole of a pool's buffers: the cache a [`super::BatchDecoder`]'s steps bind.
    pub(super) fn whole_pool(layers: &[Option<(View, View)>], rows: usize) -> Self {
        Self {
            layers: layers.to_vec(),
            capacity: rows,
            slot: None,
        }
    }

    /// Positions it holds.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The pool slot it lies in.
    pub(super) fn slot(&self) -> Option<&PoolSlot> {
        self.slot.as_ref()
    }

    /// The K and V buffers layer `il` writes (`None`: it reads another layer's).
    pub(super) fn written_by(&self, il: usize) -> Option<(&View, &View)> {
        self.layers
            .get(il)
            .and_then(Option::as_ref)
            .map(|(k, v)| (k, v))
    }

    /// The K and V buffers layer `il` reads.
    pub(super) fn read_by(&self, cfg: &TextConfig, il: usize) -> Result<(&View, &View), GpuError> {
        let source = cfg.layers[il].kv_source;
        self.written_by(source).ok_or_else(|| {
            GpuError::Shape(format!("layer {il} reads layer {source}'s missing cache"))
        })
    }

    /// The dispatches that copy the first `rows` positions of every layer's keys and values
    /// from `from` (another slot of the same pool) into this cache.
    pub(super) fn copy_rows_from(
        &self,
        ctx: &GpuContext,
        from: &KvCache,
        rows: usize,
    ) -> Result<Vec<Dispatch>, GpuError> {
        let mut out = Vec::new();
        if rows == 0 {
            return Ok(out);
        }
        for (mine, theirs) in self.layers.iter().zip(&from.layers) {
            let (Some((k, v)), Some((fk, fv))) = (mine, theirs) else {
                continue;
            };
            let bytes = k.size / self.capacity as u64 * rows as u64;
            for (to, src) in [(k, fk), (v, fv)] {
                out.push(ops::copy_within(
                    ctx,
                    &src.slice(0, bytes)?,
                    &to.slice(0, bytes)?,
                )?);
            }
        }
        Ok(out)
    }

    /// Bytes of GPU memory the cache holds.
    pub(super) fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| k.size + v.size)
            .sum()
    }
}
