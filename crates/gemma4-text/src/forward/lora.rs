//! Adapters on the GPU. [`GpuModel::prepare_adapter`] checks an adapter against the model; a
//! session joins the adapters it applies ([`crate::GpuSession::set_adapters`]) into one term
//! per product, which joins the product through the graph's one projection hook
//! (`Node::Linear`'s `lora`).
//!
//! Joined, every adapter on one product costs the same: one `x A^T` product of all their A
//! rows (one segment per projection stacked in the weight, e.g. q, k and v) and B's rows
//! folded into the product's own rows ([`wgemma_kernels::ops::LoraDelta`]), each adapter's
//! scale in its B. So a session's joined buffers are its own: changing a scale joins again.

use std::collections::BTreeMap;
use std::sync::Arc;

use wgemma_gguf::GgmlType;
use wgemma_kernels::graph::LoraTerm;
use wgemma_kernels::ops::LoraSegments;
use wgemma_kernels::{GpuContext, GpuError, GpuWeight, View};

use super::model::{GateUp, GpuModel};
use super::session::ForwardError;
use crate::config::TextConfig;
use crate::lora::{LoraAdapter, LoraError, LoraPair, Proj};

/// An adapter checked against one model ([`GpuModel::prepare_adapter`]), for its sessions to
/// apply with a scale ([`crate::GpuSession::set_adapters`]).
pub struct PreparedLora {
    pairs: BTreeMap<(usize, Proj), LoraPair>,
    /// The model it was checked against: its context and shapes.
    ctx: Arc<GpuContext>,
    cfg: TextConfig,
}

impl PreparedLora {
    /// Whether it was prepared for `model` (its pairs fit that model's projections, and its
    /// sessions' buffers live on that model's device).
    pub fn fits(&self, model: &GpuModel) -> bool {
        Arc::ptr_eq(&self.ctx, &model.ctx) && self.cfg == model.cfg
    }
}

/// A product of a layer that adapters change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Site {
    /// Part `i` of the q/k/v projections ([`super::model::Layer::qkv`]).
    Qkv(usize),
    O,
    /// Gate and up rows interleaved in one weight.
    GateUp,
    Gate,
    Up,
    Down,
}

/// The projections a site's weight holds: by ranges of its rows (each projection's first
/// row), or gate/up pairs.
struct SiteLayout {
    site: Site,
    rows: u32,
    cols: usize,
    projs: Vec<(Proj, u32)>,
    pairs: bool,
}

impl SiteLayout {
    fn of(site: Site, w: &GpuWeight, projs: Vec<(Proj, u32)>) -> Self {
        Self {
            site,
            rows: w.rows as u32,
            cols: w.cols as usize,
            projs,
            pairs: false,
        }
    }

    fn segments(&self) -> LoraSegments {
        if self.pairs {
            return LoraSegments::Pairs;
        }
        let start = |i: usize| self.projs.get(i).map_or(u32::MAX, |p| p.1);
        LoraSegments::Ranges([start(1), start(2)])
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

    /// Checks that each of `adapter`'s pairs fits the projection it changes, leaving out those
    /// that change nothing ([`LoraAdapter::applies`]).
    pub fn prepare_adapter(
        &self,
        adapter: &LoraAdapter,
    ) -> Result<Arc<PreparedLora>, ForwardError> {
        adapter.check(&self.cfg)?;
        let mut pairs = BTreeMap::new();
        let mut unused = 0;
        for (&(il, proj), pair) in &adapter.pairs {
            if !LoraAdapter::applies(&self.cfg, il, proj) {
                unused += 1;
                continue;
            }
            if !self.has_projection(il, proj) {
                return Err(LoraError::Shape {
                    name: format!("blk.{il}.attn_v"),
                    proj,
                    layer: il,
                    got: (pair.rows, pair.cols),
                    want: (0, 0),
                }
                .into());
            }
            pairs.insert((il, proj), pair.clone());
        }
        if unused > 0 {
            tracing::info!(
                unused,
                "LoRA pairs on K/V of shared-KV layers have no effect"
            );
        }
        Ok(Arc::new(PreparedLora {
            pairs,
            ctx: self.ctx.clone(),
            cfg: self.cfg.clone(),
        }))
    }

    /// Layer `il`'s products that adapters can change, and the projections each holds.
    fn sites(&self, il: usize) -> Vec<SiteLayout> {
        let l = &self.layers[il];
        let lc = &self.cfg.layers[il];
        let q_rows = (self.cfg.n_head * lc.head_dim) as u32;
        let kv_rows = (lc.n_kv_head * lc.head_dim) as u32;
        let columns = [(Proj::Q, 0), (Proj::K, q_rows), (Proj::V, q_rows + kv_rows)];
        let mut sites: Vec<SiteLayout> = l
            .qkv
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let rows = p.w.rows as u32;
                let within = columns
                    .iter()
                    .filter(|&&(_, col)| (p.offset..p.offset + rows).contains(&col))
                    .map(|&(proj, col)| (proj, col - p.offset))
                    .collect();
                SiteLayout::of(Site::Qkv(i), &p.w, within)
            })
            .collect();
        sites.push(SiteLayout::of(Site::O, &l.o, vec![(Proj::O, 0)]));
        match &l.gate_up {
            GateUp::Interleaved(w) => sites.push(SiteLayout {
                pairs: true,
                ..SiteLayout::of(Site::GateUp, w, vec![(Proj::Gate, 0), (Proj::Up, 0)])
            }),
            GateUp::Separate { gate, up } => {
                sites.push(SiteLayout::of(Site::Gate, gate, vec![(Proj::Gate, 0)]));
                sites.push(SiteLayout::of(Site::Up, up, vec![(Proj::Up, 0)]));
            }
        }
        sites.push(SiteLayout::of(Site::Down, &l.down, vec![(Proj::Down, 0)]));
        sites
    }
}

/// One product's adapters joined: A's rows by segment, B's by the product's rows.
struct JoinedTerm {
    a: GpuWeight,
    b: View,
    rank: u32,
    segments: LoraSegments,
}

/// The adapters a session applies, joined per product.
pub(crate) struct JoinedLora {
    terms: BTreeMap<(usize, Site), JoinedTerm>,
    /// The most `x A^T` values of a token (segments times rank) of any product.
    pub(crate) t_floats: u32,
    /// The most rows of an interleaved gate/up product with adapters.
    pub(crate) gated_rows: u32,
    bytes: u64,
}

impl JoinedLora {
    /// `adapters` (each prepared for `model`, with the user's scale; none of scale 0) joined
    /// per product; `None` when they change nothing.
    pub(crate) fn join(
        model: &GpuModel,
        adapters: &[(Arc<PreparedLora>, f32)],
    ) -> Result<Option<Self>, GpuError> {
        let mut joined = Self {
            terms: BTreeMap::new(),
            t_floats: 0,
            gated_rows: 0,
            bytes: 0,
        };
        for il in 0..model.layers.len() {
            for site in model.sites(il) {
                let pairs: Vec<Vec<(&LoraPair, f32)>> = site
                    .projs
                    .iter()
                    .map(|&(proj, _)| {
                        adapters
                            .iter()
                            .filter_map(|(a, s)| a.pairs.get(&(il, proj)).map(|p| (p, p.scale * s)))
                            .collect()
                    })
                    .collect();
                let rank = pairs
                    .iter()
                    .map(|seg| seg.iter().map(|(p, _)| p.rank).sum::<usize>())
                    .max()
                    .unwrap_or(0);
                if rank == 0 {
                    continue;
                }
                let term = join_site(&model.ctx, il, &site, &pairs, rank)?;
                joined.t_floats = joined.t_floats.max(site.projs.len() as u32 * term.rank);
                if site.pairs {
                    joined.gated_rows = joined.gated_rows.max(site.rows);
                }
                joined.bytes += term.a.gpu_bytes() + term.b.size;
                joined.terms.insert((il, site.site), term);
            }
        }
        Ok((!joined.terms.is_empty()).then_some(joined))
    }

    /// The joined term of layer `il`'s product `site`, if adapters change it.
    pub(crate) fn term(&self, il: usize, site: Site) -> Option<LoraTerm<'_>> {
        let t = self.terms.get(&(il, site))?;
        Some(LoraTerm {
            a: &t.a,
            b: &t.b,
            rank: t.rank,
            segments: t.segments,
        })
    }

    /// GPU bytes of the joined A and B.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// One site's pairs (per segment, each with its whole scale) as one term of `rank` values a
/// segment: segment s's A rows from row `s * rank` (zero past its own ranks), and each of the
/// weight's rows its segment's B row, scaled.
fn join_site(
    ctx: &GpuContext,
    il: usize,
    site: &SiteLayout,
    pairs: &[Vec<(&LoraPair, f32)>],
    rank: usize,
) -> Result<JoinedTerm, GpuError> {
    let segments = site.segments();
    let (n, cols) = (site.rows, site.cols);
    let mut a = vec![0f32; pairs.len() * rank * cols];
    let mut b = vec![0f32; n as usize * rank];
    for (s, seg) in pairs.iter().enumerate() {
        let (first, count, step) = segments.rows(s as u32, n);
        let mut at = 0;
        for &(p, scale) in seg {
            if p.rows != count as usize || p.cols != cols {
                return Err(GpuError::Shape(format!(
                    "LoRA pair of layer {il} ({:?}): {} x {} against {count} x {cols}",
                    site.site, p.rows, p.cols
                )));
            }
            a[(s * rank + at) * cols..][..p.rank * cols].copy_from_slice(&p.a);
            for j in 0..count as usize {
                let row = (first + j as u32 * step) as usize;
                let dst = &mut b[row * rank + at..][..p.rank];
                for (d, v) in dst.iter_mut().zip(&p.b[j * p.rank..][..p.rank]) {
                    *d = v * scale;
                }
            }
            at += p.rank;
        }
    }
    let rows = (pairs.len() * rank) as u64;
    let w = GpuWeight::allocate(ctx, "lora a", GgmlType::F32, cols as u64, rows, None)?;
    w.write_tile(ctx, 0, bytemuck::cast_slice(&a))?;
    Ok(JoinedTerm {
        a: w,
        b: View::of(&ctx.storage_init("lora b", bytemuck::cast_slice(&b))),
        rank: rank as u32,
        segments,
    })
}
