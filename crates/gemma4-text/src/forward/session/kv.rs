//! The KV cache: for each layer that owns one, a K and a V buffer of `capacity` rows of the
//! layer's KV heads; layers that share (Gemma 4's last layers) read their source's
//! (`LayerConfig::kv_source`). Rows past the session's position are stale and never read
//! before they are written again, so rewinding is forgetting positions.

use wgemma_kernels::{GpuContext, GpuError, View};

use crate::config::TextConfig;

pub(super) struct KvCache {
    layers: Vec<Option<(View, View)>>,
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
        Self { layers }
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

    /// Bytes of GPU memory the cache holds.
    pub(super) fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| k.size + v.size)
            .sum()
    }
}
