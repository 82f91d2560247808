//! Typed dispatchers: each binds exactly the buffers its kernel needs, checks shapes, and
//! returns prepared [`Dispatch`]es to record as often as needed.

use crate::context::{GpuContext, GpuError, Pipeline};
use crate::gpu::{Bind, Dispatch, View};
use crate::params::*;
use crate::shader::{BYTES_WGSL, DTYPES_WGSL, ShaderSource};
use crate::weights::{GpuWeight, dtype_flag};
use std::sync::OnceLock;
use wgemma_gguf::GgmlType;

const ACTIVATIONS_WGSL: &str = include_str!("wgsl/activations.wgsl");
const MATVEC_WGSL: &str = include_str!("wgsl/matvec.wgsl");
const MATMUL_IO_WGSL: &str = include_str!("wgsl/matmul_io.wgsl");
const MATMUL_WGSL: &str = include_str!("wgsl/matmul.wgsl");
const MATMUL_COOP_WGSL: &str = include_str!("wgsl/matmul_coop.wgsl");
const MATMUL_PARTS_WGSL: &str = include_str!("wgsl/matmul_parts.wgsl");
const REDUCE_WGSL: &str = include_str!("wgsl/reduce.wgsl");
const NORM_WGSL: &str = include_str!("wgsl/norm.wgsl");
const ROPE_WGSL: &str = include_str!("wgsl/rope.wgsl");
const ROPE_MATH_WGSL: &str = include_str!("wgsl/rope_math.wgsl");
const KV_STORE_WGSL: &str = include_str!("wgsl/kv_store.wgsl");
const ATTENTION_WGSL: &str = include_str!("wgsl/attention.wgsl");
const ELEMENTWISE_WGSL: &str = include_str!("wgsl/elementwise.wgsl");
const EMBED_WGSL: &str = include_str!("wgsl/embed.wgsl");
const ARGMAX_WGSL: &str = include_str!("wgsl/argmax.wgsl");
const TOPK_WGSL: &str = include_str!("wgsl/topk.wgsl");
const PENALTY_WGSL: &str = include_str!("wgsl/penalty.wgsl");
const HEAD_POST_WGSL: &str = include_str!("wgsl/head_post.wgsl");
const HEAD_MATH_WGSL: &str = include_str!("wgsl/head_math.wgsl");
const ATTN_SPLIT_WGSL: &str = include_str!("wgsl/attn_split.wgsl");
const ATTN_COMBINE_WGSL: &str = include_str!("wgsl/attn_combine.wgsl");
const ATTN_MERGE_WGSL: &str = include_str!("wgsl/attn_merge.wgsl");
const SAMPLE_WGSL: &str = include_str!("wgsl/sample.wgsl");
const MOE_WGSL: &str = include_str!("wgsl/moe.wgsl");
const ROUTE_WGSL: &str = include_str!("wgsl/route.wgsl");

/// Token counts up to this use the matrix-vector kernel on a GPU; more use the tiled matmul.
pub const MATVEC_MAX_TOKENS: u32 = 4;
/// Workgroup memory of `matmul_coop.wgsl`: f16 tiles of 64 tokens' inputs and 128 rows'
/// weights (rows padded to 72 halves) and one 16 x 16 f32 stage per subgroup.
pub const COOP_MATMUL_BYTES: u32 = (64 + 128) * 72 * 2 + 8 * 256 * 4;
/// The largest head dimension the attention kernel handles.
pub const MAX_HEAD_DIM: u32 = 512;
/// Most query heads per KV head that batched attention takes (Gemma has 2 to 8).
pub const MAX_QUERY_GROUP: u32 = 8;
/// Values per workgroup in the first stage of argmax.
pub const ARGMAX_CHUNK: u32 = 1024;
/// Values per workgroup in the first stage of top-k.
pub const TOPK_CHUNK: u32 = 4096;
/// The largest k top-k supports.
pub const TOPK_MAX: u32 = 64;

fn shape(msg: String) -> GpuError {
    GpuError::Shape(msg)
}

/// A grid of `groups` workgroups, folded into y when x would exceed the per-dimension limit.
pub fn grid(ctx: &GpuContext, groups: u32, z: u32) -> [u32; 3] {
    let max = ctx.limits.max_compute_workgroups_per_dimension.max(1);
    if groups <= max {
        [groups, 1, z]
    } else {
        [max, groups.div_ceil(max), z]
    }
}

/// Arguments of [`matmul`]: `y[t, r] = sum_k W[r, k] x[t, k]` for tokens t < `m`.
pub struct MatmulArgs<'a> {
    pub x: &'a View,
    pub y: &'a View,
    pub m: u32,
    /// Elements between consecutive tokens of x (>= W's columns, a multiple of 4).
    pub x_stride: u32,
    /// Elements between consecutive tokens of y (>= `y_offset` + the output's columns).
    pub y_stride: u32,
    /// What the rows become: themselves (with an optional softcap) or, for gate/up rows
    /// interleaved, the gated activation (half as many columns).
    pub out: MatvecOut<'a>,
    /// Column of y where row 0 of W (or pair 0) lands (weights side by side in one output).
    pub y_offset: u32,
    /// Room for the partial sums of a tiled product split over k ([`matmul_partials_floats`]
    /// floats); `None`: never split.
    pub partials: Option<&'a View>,
}

/// The most tokens [`matmul`] takes through the matrix-vector kernel (one token a grid row)
/// on this device: [`MATVEC_MAX_TOKENS`] on a GPU, every count on a CPU adapter. lavapipe
/// compiles the tiled kernel's loads lane by lane, each a store to the stack and a vector
/// reload: on 2 cores of an AMD EPYC, scoring 38 positions of the real Gemma 3 270M took
/// 132 s tiled and 26.6 s as matrix-vector products, a 64-token prefill 3.4 -> 4.0 tok/s.
pub fn matvec_max_tokens(ctx: &GpuContext) -> u32 {
    if ctx.info.device_type == wgpu::DeviceType::Cpu {
        u32::MAX
    } else {
        MATVEC_MAX_TOKENS
    }
}

/// Weight times activations, one dispatch per weight tile (matrix-vector for few tokens,
/// [`matvec_max_tokens`], tiled matrix-matrix for many), split over k where its tiles alone
/// would leave most of the GPU idle and `a.partials` is given ([`matmul_parts`]).
pub fn matmul(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let parts = match a.partials {
        _ if a.m <= matvec_max_tokens(ctx) => 0,
        Some(_) => matmul_parts(ctx, w.cols as u32, w.rows, a.m, a.out.is_geglu()),
        None => 1,
    };
    matmul_in_parts(ctx, w, a, parts)
}

/// Rows of a tiled product's workgroup: 128 on cooperative matrices, 64 otherwise (64 tokens
/// either way).
fn matmul_tile_rows(ctx: &GpuContext) -> u64 {
    if ctx.features.coop_matmul { 128 } else { 64 }
}

/// Parts over k that [`matmul`] splits a tiled product of `rows` rows of `k` values over `m`
/// tokens into: 1 where its tiles fill the GPU (256 workgroups or more), or where the tokens
/// go through matrix-vector products ([`matvec_max_tokens`]). Otherwise enough parts for
/// about 512 workgroups, each of at least 8 steps of 64 values. In a 512-token prefill on the H100,
/// E2B ran its 96-tile products (the attention output, the FFN's down) at half the rate of
/// its 768-tile ones and its 16-tile ones (V, the per-layer gate) at a tenth; split, E4B's
/// time to first token went from 120 to 105 ms (E2B's, whose products are smaller, moved
/// less than run-to-run noise). 256 or 1024 workgroups, or parts of 4 steps, measured no
/// better.
pub fn matmul_parts(ctx: &GpuContext, k: u32, rows: u64, m: u32, geglu: bool) -> u32 {
    if geglu || m <= matvec_max_tokens(ctx) {
        return 1;
    }
    let tiles = rows.div_ceil(matmul_tile_rows(ctx)) * u64::from(m.div_ceil(64));
    if tiles >= 256 {
        return 1;
    }
    let steps = u64::from(k.div_ceil(64));
    let parts = 512u64.div_ceil(tiles).min(steps / 8).max(1);
    // Equal parts of whole steps; the last may be shorter.
    let per = steps.div_ceil(parts);
    steps.div_ceil(per) as u32
}

/// Floats of [`MatmulArgs::partials`] that [`matmul`] needs for `w` over up to `max_m` tokens
/// (0 where it never splits).
pub fn matmul_partials_floats(ctx: &GpuContext, w: &GpuWeight, max_m: u32) -> u64 {
    (1..=max_m.div_ceil(64))
        .map(|t| {
            let m = (64 * t).min(max_m);
            match matmul_parts(ctx, w.cols as u32, w.rows, m, false) {
                1 => 0,
                parts => u64::from(parts) * u64::from(m) * w.rows,
            }
        })
        .max()
        .unwrap_or(0)
}

/// [`matmul`] split over k into `parts` parts (for tests; 1: not split; 0: matrix-vector
/// products whatever the token count): each part's sums go to `a.partials`, and one more
/// dispatch adds them up into y. Up to [`MATVEC_MAX_TOKENS`] tokens are matrix-vector
/// products on every device.
pub fn matmul_in_parts(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
    parts: u32,
) -> Result<Vec<Dispatch>, GpuError> {
    let (k, n) = (w.cols as u32, w.rows as u32);
    if a.m == 0 {
        return Ok(Vec::new());
    }
    let (geglu, softcap) = match a.out {
        MatvecOut::Rows { softcap } => (false, softcap),
        MatvecOut::Geglu | MatvecOut::GegluInt8 => (true, 0.0),
        MatvecOut::GeluTimes { .. } => (false, 0.0),
    };
    let cols = if geglu { n / 2 } else { n };
    if a.x_stride < k || !a.x_stride.is_multiple_of(4) || a.y_stride < a.y_offset + cols {
        return Err(shape(format!(
            "{}: strides x {} / y {} (from column {}) for a {n}x{k} weight",
            w.name, a.x_stride, a.y_stride, a.y_offset
        )));
    }
    if geglu && !whole_pairs(w) {
        return Err(shape(format!(
            "{}: a gated output needs whole gate/up row pairs per tile",
            w.name
        )));
    }
    a.x.expect_len32(
        &w.name,
        u64::from(a.m - 1) * u64::from(a.x_stride) + u64::from(k),
    )?;
    a.y.expect_len32(
        &w.name,
        u64::from(a.m - 1) * u64::from(a.y_stride) + u64::from(a.y_offset + cols),
    )?;
    if parts == 0
        || a.m <= MATVEC_MAX_TOKENS
        || matches!(a.out, MatvecOut::GeluTimes { .. } | MatvecOut::GegluInt8)
    {
        let job = MatvecJob {
            m: a.m,
            x_stride: a.x_stride,
            y_stride: a.y_stride,
            out_offset: a.y_offset,
            ..MatvecJob::new(a.x, a.y, a.out)
        };
        return matvec_dispatches(ctx, w, &job);
    }
    let steps = k.div_ceil(64);
    let per = steps.div_ceil(parts.max(1)).max(1);
    let split = parts > 1;
    if split && (geglu || steps.div_ceil(per) != parts) {
        return Err(shape(format!(
            "{}: {parts} parts over {steps} steps of k, output {:?}",
            w.name, a.out
        )));
    }
    let part_floats = u64::from(a.m) * u64::from(n);
    let partials = match a.partials {
        Some(v) if split => {
            v.expect_len32(&w.name, u64::from(parts) * part_floats)?;
            Some(v)
        }
        None if split => {
            return Err(shape(format!(
                "{}: split over k without room for the parts",
                w.name
            )));
        }
        _ => None,
    };
    let tile_rows = matmul_tile_rows(ctx) as u32;
    let pipeline = tiled_pipeline(ctx, w.dtype, geglu, Tiles::Plain)?;
    // Split, the tiles write their rows of each part plainly: [part][token][row].
    let (y, y_stride, y_offset, tile_softcap) = match partials {
        Some(v) => (v, n, 0, 0.0),
        None => (a.y, a.y_stride, a.y_offset, softcap),
    };
    let mut dispatches = w
        .tiles
        .iter()
        .map(|tile| {
            let rows = tile.rows as u32;
            let params = Params::of(&MatmulParams {
                k,
                n: rows,
                row_bytes: w.row_bytes as u32,
                out_offset: y_offset + (tile.first_row / if geglu { 2 } else { 1 }) as u32,
                m: a.m,
                x_stride: a.x_stride,
                y_stride,
                softcap: tile_softcap,
                k_part: per * 64,
                part_stride: if split { part_floats as u32 } else { 0 },
                // Not experts: one slot per input row.
                x_group: 1,
                ..MatmulParams::default()
            });
            let wv = View::of(&tile.buffer);
            ctx.dispatch(
                "matmul",
                pipeline.clone(),
                &[
                    Bind::Storage(&wv),
                    Bind::Storage(a.x),
                    Bind::Storage(y),
                    Bind::Params(params),
                ],
                [rows.div_ceil(tile_rows), a.m.div_ceil(64), parts.max(1)],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(v) = partials {
        let params = Params::of(&MatmulPartsParams {
            m: a.m,
            n,
            parts,
            part_stride: part_floats as u32,
            y_stride: a.y_stride,
            out_offset: a.y_offset,
            softcap,
        });
        let source = ShaderSource::new("matmul_parts", &[ACTIVATIONS_WGSL, MATMUL_PARTS_WGSL]);
        dispatches.push(ctx.dispatch(
            "matmul_parts",
            ctx.pipeline(&source),
            &[Bind::Storage(v), Bind::Storage(a.y), Bind::Params(params)],
            grid(ctx, (part_floats as u32).div_ceil(256), 1),
        )?);
    }
    Ok(dispatches)
}

/// Which tiled products a pipeline runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tiles {
    /// One weight over the tokens in order.
    Plain,
    /// The grouped experts' products, 64 slots of an expert a tile.
    Experts,
    /// The same, 16 slots a tile (`SMALL_TILES`, tensor cores only).
    FewSlotExperts,
}

impl Tiles {
    /// The grouped experts' tiles for `slots` slots over `n_expert` experts: 16-slot tiles on
    /// tensor cores when the experts average at most 16 slots (a short prompt: 128 tokens
    /// give 26B-A4B's 128 experts 8 each). A tile's step costs about the same however many of
    /// its tokens are real, and most of its cost is the expert's weights, which a small tile
    /// reads once per 16 slots rather than once per 64.
    fn for_experts(ctx: &GpuContext, slots: u32, n_expert: u32) -> Self {
        if ctx.features.coop_matmul && u64::from(slots) <= 16 * u64::from(n_expert) {
            Tiles::FewSlotExperts
        } else {
            Tiles::Experts
        }
    }

    /// Tokens (slots) a tile takes.
    fn tokens(self) -> u32 {
        match self {
            Tiles::FewSlotExperts => 16,
            Tiles::Plain | Tiles::Experts => 64,
        }
    }
}

/// The tiled product's pipeline for weights of `dtype`: tensor cores where the device has them,
/// otherwise f32 FMAs ([`matmul_tile_rows`]).
fn tiled_pipeline(
    ctx: &GpuContext,
    dtype: GgmlType,
    geglu: bool,
    tiles: Tiles,
) -> Result<Pipeline, GpuError> {
    let (name, kernel) = if ctx.features.coop_matmul {
        ("matmul_coop", MATMUL_COOP_WGSL)
    } else {
        ("matmul", MATMUL_WGSL)
    };
    let wgsl = [
        ACTIVATIONS_WGSL,
        BYTES_WGSL,
        DTYPES_WGSL,
        MATMUL_IO_WGSL,
        kernel,
    ];
    let source = ShaderSource::new(name, &wgsl)
        .flag_if(ctx.features.coop_matmul, "COOP")
        .flag(dtype_flag(dtype)?)
        .flag_if(geglu, "GEGLU_OUT")
        .flag_if(tiles != Tiles::Plain, "EXPERTS")
        .flag_if(tiles == Tiles::FewSlotExperts, "SMALL_TILES");
    Ok(ctx.pipeline(&source))
}

/// Whether every tile of `w` holds whole gate/up row pairs.
fn whole_pairs(w: &GpuWeight) -> bool {
    w.rows.is_multiple_of(2)
        && w.tiles
            .iter()
            .all(|t| t.first_row % 2 == 0 && t.rows % 2 == 0)
}

/// Longest row the norm kernels take: each of a workgroup's 256 threads holds 24 values in
/// registers (Gemma's widest residual stream is 5376).
pub const MAX_NORM_DIM: u32 = 256 * 24;

fn check_norm_dim(dim: u32) -> Result<(), GpuError> {
    if dim == 0 || dim > MAX_NORM_DIM {
        return Err(shape(format!(
            "norm over rows of {dim} (1..={MAX_NORM_DIM})"
        )));
    }
    Ok(())
}

/// How [`rms_norm`] writes its result.
pub enum NormOut<'a> {
    /// `y = norm(x) * w`
    To(&'a View),
    /// `x = norm(x) * w`
    InPlace,
    /// `res += norm(x) * w` (a post-norm and the residual add in one pass)
    AddTo(&'a View),
}

/// RMS normalisation over `rows` rows of `dim` values (`x_stride` apart), with an optional
/// per-element weight.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    ctx: &GpuContext,
    x: &View,
    out: NormOut<'_>,
    weight: Option<&View>,
    rows: u32,
    dim: u32,
    x_stride: u32,
    eps: f32,
) -> Result<Dispatch, GpuError> {
    check_norm_dim(dim)?;
    x.expect_len32(
        "rms_norm x",
        u64::from(rows.max(1) - 1) * u64::from(x_stride) + u64::from(dim),
    )?;
    if let Some(w) = weight {
        w.expect_len32("rms_norm weight", u64::from(dim))?;
    }
    let (inplace, residual, y) = match &out {
        NormOut::To(y) => (false, false, Some(*y)),
        NormOut::InPlace => (true, false, None),
        NormOut::AddTo(y) => (false, true, Some(*y)),
    };
    if let Some(y) = y {
        y.expect_len32("rms_norm out", u64::from(rows) * u64::from(dim))?;
    }
    let source = ShaderSource::new("rms_norm", &[REDUCE_WGSL, NORM_WGSL])
        .flag_if(inplace, "INPLACE")
        .flag_if(residual, "RESIDUAL")
        .flag_if(weight.is_some(), "WEIGHT");
    let params = Params::of(&NormParams {
        dim,
        rows,
        eps,
        x_stride,
        scale: 1.0,
    });
    let mut binds = vec![Bind::Storage(x)];
    if let Some(y) = y {
        binds.push(Bind::Storage(y));
    }
    binds.push(Bind::Params(params));
    if let Some(w) = weight {
        binds.push(Bind::Storage(w));
    }
    // The shader numbers bindings 0 (x), 1 (y), 2 (params), 3 (weight); in-place has no 1.
    let binds = renumber(binds, inplace);
    ctx.dispatch(
        "rms_norm",
        ctx.pipeline(&source),
        &binds,
        grid(ctx, rows, 1),
    )
}

/// Inserts a gap where an optional binding is absent, so positions match binding numbers.
fn renumber(binds: Vec<Bind<'_>>, gap_at_1: bool) -> Vec<Bind<'_>> {
    if !gap_at_1 {
        return binds;
    }
    let mut it = binds.into_iter();
    let mut out = vec![it.next().expect("x is always bound"), Bind::Skip];
    out.extend(it);
    out
}

/// Arguments of [`rope`].
pub struct RopeArgs<'a> {
    /// `[tokens, heads, head_dim]`, rotated in place.
    pub x: &'a View,
    /// One position per token.
    pub positions: &'a View,
    pub tokens: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// Rotated dimensions (pairs `i`, `i + n_rot/2`); the rest pass through.
    pub n_rot: u32,
    pub base: f32,
    pub freq_scale: f32,
    /// Per-pair frequency divisors (`rope_freqs`), `n_rot / 2` values.
    pub freq_factors: Option<&'a View>,
}

/// NeoX rotary position embedding.
pub fn rope(ctx: &GpuContext, a: &RopeArgs<'_>) -> Result<Dispatch, GpuError> {
    if a.n_rot > a.head_dim || !a.n_rot.is_multiple_of(2) {
        return Err(shape(format!(
            "rope: n_rot {} for head_dim {}",
            a.n_rot, a.head_dim
        )));
    }
    let rows = a.tokens * a.heads;
    a.x.expect_len32("rope x", u64::from(rows) * u64::from(a.head_dim))?;
    a.positions
        .expect_len32("rope positions", u64::from(a.tokens))?;
    if let Some(ff) = a.freq_factors {
        ff.expect_len32("rope freq factors", u64::from(a.n_rot / 2))?;
    }
    let source = ShaderSource::new("rope", &[ROPE_MATH_WGSL, ROPE_WGSL])
        .flag_if(a.freq_factors.is_some(), "FREQ_FACTORS");
    let params = Params::of(&RopeParams {
        heads: a.heads,
        head_dim: a.head_dim,
        n_rot: a.n_rot,
        rows,
        base: a.base,
        freq_scale: a.freq_scale,
    });
    let mut binds = vec![
        Bind::Storage(a.x),
        Bind::Storage(a.positions),
        Bind::Params(params),
    ];
    if let Some(ff) = a.freq_factors {
        binds.push(Bind::Storage(ff));
    }
    ctx.dispatch("rope", ctx.pipeline(&source), &binds, grid(ctx, rows, 1))
}

/// Writes `m` rows of `row` values (`src_stride` apart) into `cache` at the rows given by
/// `positions` (positions at or past `capacity` are dropped).
pub fn kv_store(
    ctx: &GpuContext,
    src: &View,
    cache: &View,
    positions: &View,
    row: u32,
    m: u32,
    src_stride: u32,
) -> Result<Dispatch, GpuError> {
    src.expect_len32(
        "kv_store src",
        u64::from(m.max(1) - 1) * u64::from(src_stride) + u64::from(row),
    )?;
    positions.expect_len32("kv_store positions", u64::from(m))?;
    let capacity = (cache.len32() / u64::from(row.max(1))) as u32;
    let params = Params::of(&KvStoreParams {
        row,
        m,
        src_stride,
        capacity,
    });
    let source = ShaderSource::new("kv_store", &[KV_STORE_WGSL]);
    ctx.dispatch(
        "kv_store",
        ctx.pipeline(&source),
        &[
            Bind::Storage(src),
            Bind::Storage(cache),
            Bind::Storage(positions),
            Bind::Params(params),
        ],
        [row.div_ceil(256), m, 1],
    )
}

/// Arguments of [`attention`].
pub struct AttentionArgs<'a> {
    /// `[tokens, n_head, head_dim]`
    pub q: &'a View,
    /// `[capacity, n_kv_head, head_dim]`
    pub k_cache: &'a View,
    pub v_cache: &'a View,
    pub positions: &'a View,
    /// `[tokens, n_head, head_dim]`
    pub out: &'a View,
    pub tokens: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    /// Keys visible to a query: the last `window` positions (0: all).
    pub window: u32,
    /// Multiplier of q·k.
    pub scale: f32,
    /// Softcap of the scores when > 0.
    pub softcap: f32,
    /// Floats between consecutive tokens' queries (`n_head * head_dim` when packed).
    pub q_stride: u32,
}

/// Causal attention over the KV cache.
pub fn attention(ctx: &GpuContext, a: &AttentionArgs<'_>) -> Result<Dispatch, GpuError> {
    if a.head_dim > MAX_HEAD_DIM
        || !a.head_dim.is_multiple_of(4)
        || a.n_kv_head == 0
        || !a.n_head.is_multiple_of(a.n_kv_head)
        || a.n_head / a.n_kv_head > MAX_QUERY_GROUP
    {
        return Err(shape(format!(
            "attention: {} heads over {} KV heads of dim {} (max dim {MAX_HEAD_DIM}, max \
             {MAX_QUERY_GROUP} heads per KV head)",
            a.n_head, a.n_kv_head, a.head_dim
        )));
    }
    let q_len = u64::from(a.tokens) * u64::from(a.n_head) * u64::from(a.head_dim);
    if a.q_stride < a.n_head * a.head_dim || !a.q_stride.is_multiple_of(4) {
        return Err(shape(format!(
            "attention: q stride {} (at least {}, a multiple of 4)",
            a.q_stride,
            a.n_head * a.head_dim
        )));
    }
    a.q.expect_len32(
        "attention q",
        u64::from(a.tokens.max(1) - 1) * u64::from(a.q_stride) + u64::from(a.n_head * a.head_dim),
    )?;
    a.out.expect_len32("attention out", q_len)?;
    a.positions
        .expect_len32("attention positions", u64::from(a.tokens))?;
    let row = u64::from(a.n_kv_head) * u64::from(a.head_dim);
    let capacity = a.k_cache.len32() / row;
    if capacity == 0 || a.v_cache.len32() / row != capacity {
        return Err(shape(
            "attention: K and V caches differ or are empty".into(),
        ));
    }
    let params = Params::of(&AttentionParams {
        n_head: a.n_head,
        n_kv_head: a.n_kv_head,
        head_dim: a.head_dim,
        m: a.tokens,
        window: a.window,
        scale: a.scale,
        softcap: a.softcap,
        capacity: capacity as u32,
        q_stride: a.q_stride,
    });
    let source = ShaderSource::new("attention", &[ACTIVATIONS_WGSL, ATTENTION_WGSL])
        .constant("G", f64::from(a.n_head / a.n_kv_head));
    ctx.dispatch(
        "attention",
        ctx.pipeline(&source),
        &[
            Bind::Storage(a.q),
            Bind::Storage(a.k_cache),
            Bind::Storage(a.v_cache),
            Bind::Storage(a.positions),
            Bind::Storage(a.out),
            Bind::Params(params),
        ],
        [a.n_kv_head, a.tokens, 1],
    )
}

/// Elementwise operations of [`elementwise`].
pub enum Elementwise<'a> {
    /// `y[r, c] = gelu_tanh(gate[r * gate_stride + c]) * up[r * up_stride + c]` (interleaved
    /// gate/up rows take the gated output of [`matmul`] instead).
    Geglu {
        gate: &'a View,
        up: &'a View,
        cols: u32,
        gate_stride: u32,
        up_stride: u32,
        /// Floats into `up` where row 0 starts.
        up_offset: u32,
    },
    /// `y += a`
    Add(&'a View),
    /// `y *= s`
    Scale(f32),
    /// `y = c * tanh(y / c)`
    Softcap(f32),
}

/// An elementwise operation over the first `n` values of `y`.
pub fn elementwise(
    ctx: &GpuContext,
    op: Elementwise<'_>,
    y: &View,
    n: u32,
) -> Result<Dispatch, GpuError> {
    y.expect_len32("elementwise y", u64::from(n))?;
    let (flag, a, b, params) = match op {
        Elementwise::Geglu {
            gate,
            up,
            cols,
            gate_stride,
            up_stride,
            up_offset,
        } => {
            if cols == 0 || !n.is_multiple_of(cols) {
                return Err(shape(format!("geglu: {n} values in rows of {cols}")));
            }
            let rows = u64::from(n / cols);
            gate.expect_len32(
                "geglu gate",
                (rows - 1) * u64::from(gate_stride) + u64::from(cols),
            )?;
            up.expect_len32(
                "geglu up",
                u64::from(up_offset) + (rows - 1) * u64::from(up_stride) + u64::from(cols),
            )?;
            let p = ElementwiseParams {
                n,
                cols,
                a_stride: gate_stride,
                b_stride: up_stride,
                s: 0.0,
                b_offset: up_offset,
            };
            ("GEGLU", Some(gate), Some(up), p)
        }
        Elementwise::Add(a) => {
            a.expect_len32("add a", u64::from(n))?;
            ("ADD", Some(a), None, ElementwiseParams::over(n, 0.0))
        }
        Elementwise::Scale(s) => ("SCALE", None, None, ElementwiseParams::over(n, s)),
        Elementwise::Softcap(c) => ("SOFTCAP", None, None, ElementwiseParams::over(n, c)),
    };
    let source = ShaderSource::new("elementwise", &[ACTIVATIONS_WGSL, ELEMENTWISE_WGSL]).flag(flag);
    let binds = [
        a.map_or(Bind::Skip, Bind::Storage),
        b.map_or(Bind::Skip, Bind::Storage),
        Bind::Storage(y),
        Bind::Params(Params::of(&params)),
    ];
    ctx.dispatch(
        flag_label(flag),
        ctx.pipeline(&source),
        &binds,
        grid(ctx, n.div_ceil(256), 1),
    )
}

fn flag_label(flag: &str) -> &'static str {
    match flag {
        "GEGLU" => "geglu",
        "ADD" => "add",
        "SCALE" => "scale",
        _ => "softcap",
    }
}

/// How [`embed`] writes the rows it gathers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedOut {
    /// `out[t, :] = row * scale`
    Write,
    /// `out[t, :] += row * scale`
    Add,
}

/// `out[t, :] = table[ids[t], :] * scale` (or added to `out`) for `m` tokens, one dispatch per
/// table tile.
pub fn embed(
    ctx: &GpuContext,
    table: &GpuWeight,
    ids: &View,
    out: &View,
    m: u32,
    scale: f32,
    how: EmbedOut,
) -> Result<Vec<Dispatch>, GpuError> {
    let flag = dtype_flag(table.dtype)?;
    ids.expect_len32("embed ids", u64::from(m))?;
    out.expect_len32("embed out", u64::from(m) * table.cols)?;
    let source = ShaderSource::new("embed", &[BYTES_WGSL, DTYPES_WGSL, EMBED_WGSL])
        .flag(flag)
        .flag_if(how == EmbedOut::Add, "ADD");
    let pipeline = ctx.pipeline(&source);
    let units = (table.cols as u32).div_ceil(32);
    table
        .tiles
        .iter()
        .map(|tile| {
            let params = Params::of(&EmbedParams {
                k: table.cols as u32,
                row_bytes: table.row_bytes as u32,
                first_row: tile.first_row as u32,
                rows: tile.rows as u32,
                m,
                scale,
            });
            let wv = View::of(&tile.buffer);
            ctx.dispatch(
                "embed",
                pipeline.clone(),
                &[
                    Bind::Storage(&wv),
                    Bind::Storage(ids),
                    Bind::Storage(out),
                    Bind::Params(params),
                ],
                grid(ctx, m, units.div_ceil(64)),
            )
        })
        .collect()
}

/// Gumbel-max sampling parameters: the argmax then samples softmax(logits / temperature).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gumbel {
    pub seed: u32,
    pub step: u32,
    pub temperature: f32,
}

/// The two dispatches of an argmax over `n` values; `result` receives (index, value bits).
pub struct Argmax {
    pub partial: Dispatch,
    pub finish: Dispatch,
}

impl Argmax {
    /// Scratch words the first stage needs for `n` values.
    pub fn scratch_words(n: u32) -> u64 {
        2 * u64::from(n.div_ceil(ARGMAX_CHUNK))
    }

    /// Changes the Gumbel step (and seed/temperature) without rebuilding: for decode loops.
    pub fn set_gumbel(&self, ctx: &GpuContext, n: u32, g: Gumbel) {
        let params = argmax_params(n, Some(g));
        self.partial.update_params(ctx, &params);
    }
}

fn argmax_params(n: u32, g: Option<Gumbel>) -> Params {
    let g = g.unwrap_or(Gumbel {
        seed: 0,
        step: 0,
        temperature: 1.0,
    });
    Params::of(&ArgmaxParams {
        n,
        parts: n.div_ceil(ARGMAX_CHUNK),
        seed: g.seed,
        step: g.step,
        inv_temp: 1.0 / g.temperature.max(1e-6),
    })
}

/// Index of the largest of the first `n` values of `x` (or a Gumbel-max sample).
pub fn argmax(
    ctx: &GpuContext,
    x: &View,
    n: u32,
    scratch: &View,
    result: &View,
    gumbel: Option<Gumbel>,
) -> Result<Argmax, GpuError> {
    x.expect_len32("argmax x", u64::from(n))?;
    scratch.expect_len32("argmax scratch", Argmax::scratch_words(n))?;
    result.expect_len32("argmax result", 2)?;
    let params = argmax_params(n, gumbel);
    let partial = ctx.dispatch(
        "argmax",
        ctx.pipeline(
            &ShaderSource::new("argmax", &[ARGMAX_WGSL])
                .flag("PARTIAL")
                .flag_if(gumbel.is_some(), "GUMBEL"),
        ),
        &[
            Bind::Storage(x),
            Bind::Storage(scratch),
            Bind::Params(params.clone()),
        ],
        [n.div_ceil(ARGMAX_CHUNK), 1, 1],
    )?;
    let finish = ctx.dispatch(
        "argmax_final",
        ctx.pipeline(&ShaderSource::new("argmax", &[ARGMAX_WGSL])),
        &[
            Bind::Storage(result),
            Bind::Storage(scratch),
            Bind::Params(params),
        ],
        [1, 1, 1],
    )?;
    Ok(Argmax { partial, finish })
}

/// The two dispatches of a top-k; `out` receives k (index, value bits) pairs, best first.
pub struct TopK {
    pub partial: Dispatch,
    pub finish: Dispatch,
}

impl TopK {
    /// Scratch words the first stage needs.
    pub fn scratch_words(n: u32, k: u32) -> u64 {
        2 * u64::from(n.div_ceil(TOPK_CHUNK)) * u64::from(k)
    }
}

/// The `k` largest of the first `n` values of `x`, sorted.
pub fn top_k(
    ctx: &GpuContext,
    x: &View,
    n: u32,
    k: u32,
    scratch: &View,
    out: &View,
) -> Result<TopK, GpuError> {
    if k == 0 || k > TOPK_MAX {
        return Err(shape(format!("top_k: k = {k} (1..={TOPK_MAX})")));
    }
    x.expect_len32("top_k x", u64::from(n))?;
    scratch.expect_len32("top_k scratch", TopK::scratch_words(n, k))?;
    out.expect_len32("top_k out", 2 * u64::from(k))?;
    let parts = n.div_ceil(TOPK_CHUNK);
    if parts * k > 16 * 256 {
        return Err(shape(format!(
            "top_k: {n} values give too many candidates for k = {k}"
        )));
    }
    let partial = ctx.dispatch(
        "top_k",
        ctx.pipeline(&ShaderSource::new("top_k", &[TOPK_WGSL]).flag("PARTIAL")),
        &[
            Bind::Storage(x),
            Bind::Storage(scratch),
            Bind::Params(Params::of(&TopKParams { n, k })),
        ],
        [parts, 1, 1],
    )?;
    let finish = ctx.dispatch(
        "top_k_final",
        ctx.pipeline(&ShaderSource::new("top_k", &[TOPK_WGSL])),
        &[
            Bind::Storage(scratch),
            Bind::Storage(out),
            Bind::Params(Params::of(&TopKParams { n: parts * k, k })),
        ],
        [1, 1, 1],
    )?;
    Ok(TopK { partial, finish })
}

/// Penalty settings of [`penalties`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PenaltyParams {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
}

/// Applies repetition/frequency/presence penalties to the logits of the `count` tokens listed in
/// `tokens` as (id, occurrences) pairs.
pub fn penalties(
    ctx: &GpuContext,
    tokens: &View,
    count: u32,
    logits: &View,
    vocab: u32,
    p: PenaltyParams,
) -> Result<Dispatch, GpuError> {
    tokens.expect_len32("penalty tokens", 2 * u64::from(count))?;
    logits.expect_len32("penalty logits", u64::from(vocab))?;
    ctx.dispatch(
        "penalties",
        ctx.pipeline(&ShaderSource::new("penalties", &[PENALTY_WGSL])),
        &[
            Bind::Storage(tokens),
            Bind::Storage(logits),
            Bind::Params(penalty_params(count, vocab, p)),
        ],
        [count.max(1).div_ceil(64), 1, 1],
    )
}

/// The parameter block of [`penalties`], for updating a prepared dispatch.
pub fn penalty_params(count: u32, vocab: u32, p: PenaltyParams) -> Params {
    Params::of(&PenaltyKernelParams {
        n: count,
        vocab,
        repeat: p.repeat,
        frequency: p.frequency,
        presence: p.presence,
    })
}

/// What [`matvec`] writes.
#[derive(Clone, Copy, Debug)]
pub enum MatvecOut<'a> {
    /// `y[out_offset + r] = W[r] . x`, with `c * tanh(y / c)` when `softcap` > 0.
    Rows { softcap: f32 },
    /// The weight holds gate and up rows interleaved (2i, 2i+1): `y[out_offset + i] =
    /// gelu_tanh(gate_i . x) * (up_i . x)`.
    Geglu,
    /// `y[out_offset + r] = gelu_tanh(W[r] . x) * by[offset + r]`: a gate whose other factor
    /// is already computed (the per-layer input). One-token products only.
    GeluTimes { by: &'a View, offset: u32 },
    /// [`MatvecOut::Geglu`] rounded to 8-bit integers per 32 values, laid out for
    /// [`matvec_int8_input`] ([`int8_vector_words`] words from y's start). One-token
    /// products whose workgroups each hold whole 32s ([`int8_activations_fit`]).
    GegluInt8,
}

impl MatvecOut<'_> {
    fn is_geglu(&self) -> bool {
        matches!(self, MatvecOut::Geglu | MatvecOut::GegluInt8)
    }
}

/// Words of a vector of `n` values rounded to 8-bit integers as [`MatvecOut::GegluInt8`]
/// writes it: n / 4 words of four integers, then per 16 values two f32 words (its 32's scale,
/// and the sum of its 16 integers times that scale).
pub fn int8_vector_words(n: u32) -> u64 {
    u64::from(n) / 4 + u64::from(n) / 8
}

/// Whether one token's gated product of `gate_up` (behind the residual step with `prologue`)
/// can write its activations rounded ([`MatvecOut::GegluInt8`]) for the `down` product to
/// read ([`matvec_int8_input`]): K-quant rows of whole 32s, and workgroups of the chosen
/// shape that each hold whole 32s of outputs in every tile.
pub fn int8_activations_fit(
    ctx: &GpuContext,
    gate_up: &GpuWeight,
    down: &GpuWeight,
    prologue: bool,
) -> bool {
    let ff = gate_up.rows / 2;
    let t = MatvecTuning::choose(
        ctx,
        gate_up.dtype,
        gate_up.cols as u32,
        gate_up.rows,
        true,
        prologue,
    );
    ctx.features.int8_activations
        && matches!(down.dtype, GgmlType::Q4K | GgmlType::Q6K)
        && down.cols == ff
        && ff.is_multiple_of(32)
        && whole_32s_per_group(gate_up, t.tpr, t.rpt)
}

/// Whether every workgroup of `w`'s gated product at `tpr` lanes and `rpt` rows a group
/// holds whole 32s of outputs (at most 128, `Q8_OUT`'s workgroup buffer), in every tile: a
/// rounded output takes one scale per 32.
fn whole_32s_per_group(w: &GpuWeight, tpr: u32, rpt: u32) -> bool {
    let per = u64::from(256 / tpr * rpt / 2);
    per.is_multiple_of(32)
        && per <= 128
        && w.tiles.iter().all(|tile| {
            (tile.first_row / 2).is_multiple_of(per) && (tile.rows / 2).is_multiple_of(per)
        })
}

/// The step between two blocks of a layer, for `rows` rows of `dim`: the residual stream
/// becomes `(res + rmsnorm(delta) * post) * scale` in place, and `out = rmsnorm(res) * weight`
/// is the next block's input.
#[allow(clippy::too_many_arguments)]
pub fn residual_norm(
    ctx: &GpuContext,
    res: &View,
    delta: &View,
    post: &View,
    weight: &View,
    out: &View,
    rows: u32,
    dim: u32,
    scale: f32,
    eps: f32,
) -> Result<Dispatch, GpuError> {
    check_norm_dim(dim)?;
    let n = u64::from(rows) * u64::from(dim);
    for (what, v, len) in [
        ("res", res, n),
        ("delta", delta, n),
        ("out", out, n),
        ("post", post, u64::from(dim)),
        ("weight", weight, u64::from(dim)),
    ] {
        v.expect_len32(&format!("residual_norm {what}"), len)?;
    }
    let source = ShaderSource::new("rms_norm", &[REDUCE_WGSL, NORM_WGSL])
        .flag("RESIDUAL_NORM")
        .flag("WEIGHT");
    let params = Params::of(&NormParams {
        dim,
        rows,
        eps,
        x_stride: dim,
        scale,
    });
    ctx.dispatch(
        "residual_norm",
        ctx.pipeline(&source),
        &[
            Bind::Storage(res),
            Bind::Storage(out),
            Bind::Params(params),
            Bind::Storage(weight),
            Bind::Storage(delta),
            Bind::Storage(post),
        ],
        grid(ctx, rows, 1),
    )
}

/// Experts chosen per slot, for [`expert_matvec`].
pub struct ExpertSlots<'a> {
    /// `slots` expert ids (the route kernel's `sel`).
    pub sel: &'a View,
    pub slots: u32,
    /// Rows of one expert in the stacked weight.
    pub rows_per_expert: u32,
    /// Slots per input row: slot s reads input row s / x_group.
    pub x_group: u32,
}

/// How a matrix-vector product spreads over a workgroup of 256 threads: `tpr` threads per
/// row group (4..=256, a power of two) and `rpt` rows per group (1, 2 or 4; at least 2 for a
/// gated output); with `prefetch`, each lane loads a step's weights while it sums the step
/// before (worth it where lanes take many steps); with `int8_input` (Q4_K and Q6_K), the
/// input is rounded to 8-bit integers per 32 values and multiplied in integer dot products,
/// as ggml's quantized dot products do. [`MatvecTuning::choose`] picks one per shape and
/// device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecTuning {
    pub tpr: u32,
    pub rpt: u32,
    pub prefetch: bool,
    pub int8_input: bool,
}

impl MatvecTuning {
    /// The tuning for `rows` rows of `k` values of `dtype`; `prologue`: every workgroup first
    /// computes the input (the residual step or the attention merge in front of the product).
    pub fn choose(
        ctx: &GpuContext,
        dtype: GgmlType,
        k: u32,
        rows: u64,
        geglu: bool,
        prologue: bool,
    ) -> Self {
        // Threads per row group: one per step of the row where possible (short rows leave no
        // lane idle, and the rows' loads all start at once). A step is the values the shader
        // takes at a time for the dtype.
        let step = match dtype {
            GgmlType::Q6K => 64,
            _ => 32,
        };
        let steps = k.div_ceil(step);
        let cpu = ctx.info.device_type == wgpu::DeviceType::Cpu;
        // A CPU adapter runs a workgroup as one thread's SIMD loop, where a group wider than a
        // subgroup only adds barriers; without subgroups every halving of a group is one.
        let max_tpr = match (cpu, ctx.features.subgroups) {
            (true, true) => ctx.features.subgroup_min_size.clamp(4, 256),
            (true, false) => 4,
            (false, _) => 256,
        };
        let mut tpr = [4u32, 8, 16, 32, 64, 128, 256]
            .into_iter()
            .find(|&t| t >= steps.min(max_tpr))
            .unwrap_or(256);
        // Rows per group: 4 shares each input load among 4 rows, but a matrix with few rows then
        // occupies few workgroups and leaves most of the GPU idle: halve it (down to a gate/up
        // pair for GEGLU_OUT), then widen the groups, until there are enough workgroups.
        // A CPU adapter (lavapipe) runs a workgroup per thread: more and smaller ones only add
        // per-workgroup overhead there.
        // 192 on a GPU: in whole decode steps on the H100 (`bench-e2e`, 128-token prompt),
        // 192 against 96: Gemma 3 270M 1,251 -> 1,289 tok/s, E4B 208-209 -> 212-213, E2B
        // unchanged; 384 was slower on all three. (A product timed alone, each matrix over
        // and over, had favoured fewer workgroups.)
        let min_workgroups: u64 = if cpu { 1 } else { 192 };
        let workgroups = |tpr: u32, rpt: u32| rows.div_ceil(u64::from(256 / tpr * rpt));
        // A matrix with rows enough to fill the GPU many times over (an output head) is
        // bandwidth-bound: there, lanes that loop over several steps of a row beat lanes that
        // start all at once. On the H100 at 262144 x 1536, 4 lanes per row took Q4_K from
        // 1297 to 1400 GiB/s (against 16) and Q6_K from 1126 to 1339; 16 took Q8_0 from 1870
        // to 1978 (against 4). Loading a step ahead then took Q4_K to 1620 GiB/s (Q6_K, holding
        // 60 bytes a row ahead, fell to 959); on E2B's small matrices, where a lane takes one
        // or two steps, it cost 4% of a decode step. Float weights keep the default (16 lanes
        // took F32 from 848 to 684). Other dtypes' lanes share a row's steps evenly: Gemma 3
        // 270M's Q8_0 head (20 steps a row) took 117 us with 16 lanes and 93 with 4.
        let wide = if matches!(dtype, GgmlType::Q4K | GgmlType::Q6K) {
            4
        } else {
            [16, 8, 4]
                .into_iter()
                .find(|t| steps.is_multiple_of(*t))
                .unwrap_or(4)
        };
        let quantized = dtype.block_size() > 1;
        // 8-bit inputs then took the K-quant heads past the conversion rate that bounded them,
        // best at 8 lanes per row: Q4_K 1,582 -> 2,103 GiB/s, Q6_K 1,580 -> 2,158.
        let int8_input = int8_input_fits(ctx, dtype, k, prologue);
        let wide = if int8_input { 8 } else { wide };
        if quantized && !cpu && workgroups(wide, 4) >= 512 && max_tpr >= wide {
            return Self {
                tpr: wide,
                rpt: 4,
                prefetch: dtype == GgmlType::Q4K,
                int8_input,
            };
        }
        let mut rpt = 4u32;
        let min_rpt = if geglu { 2 } else { 1 };
        while rpt > min_rpt && workgroups(tpr, rpt) < min_workgroups {
            rpt /= 2;
        }
        while tpr < 256 && workgroups(tpr, rpt) < min_workgroups {
            tpr *= 2;
        }
        // A prologue is paid once per workgroup, and many workgroups' worth of it costs more
        // than the product's own reads: where there would be 512 or more (the FFN's gate/up
        // behind the residual step), 16 lanes a group, each taking several steps of its rows.
        // Rows of 4096 values or more (the FFN's down product) are spread over more
        // workgroups instead, one row (or gate/up pair) a group. On the H100 (`bench-e2e`,
        // both together): E2B decode 295-297 -> 332-336 tok/s, E4B 172-174 -> 204-205.
        // (Workgroups that each took several blocks of rows, to share a prologue further,
        // measured no better.)
        if prologue && !cpu && workgroups(tpr, rpt) >= 512 {
            tpr = 16;
        } else if !prologue && !cpu && k >= 4096 {
            rpt = min_rpt;
        }
        // The other products behind a prologue with long rows (over 64 steps) and many
        // (over 1024: the attention's Q|K behind the residual step, O behind the merge), 32
        // lanes x 2 rows, each lane a few steps. On the H100 (`bench-e2e`, alternating runs):
        // 26B-A4B's Q|K (6144 rows of 88 steps) at 16 lanes x 4 rows 207.8-208.3 tok/s, at
        // 32 x 4 218.4-220.8 (64 lanes 213.7, 128 210-211), at 32 x 2 with E4B's 243.5 ->
        // 248.8-248.9 (Q|K and O at 80 and 128 steps); E2B's Q|K (48 steps) at 32 x 2 went
        // 402 -> 394, so it keeps its shape. Products of few rows (routers, per-layer gates)
        // at 32 x 2 cost 26B-A4B 232 -> 202 tok/s and E4B 243 -> 239.
        if prologue && !geglu && !cpu && steps > 64 && rows > 1024 {
            tpr = 32;
            rpt = 2;
        }
        // The gate/up product behind the residual step on 8-bit inputs, as the heads: its
        // conversions, not its reads, bounded it. On the H100 (`bench-e2e`, 128-token prompt,
        // alternating runs): E4B 211 -> 235 tok/s, E2B 325-341 -> 350-351. The other products
        // measured no better (behind the residual step or the merge: E2B 339-355, E4B 233)
        // or worse (down products, which would round their long rows in every workgroup:
        // E2B 292-303, E4B 186).
        let int8_input = prologue
            && geglu
            && !cpu
            && ctx.features.int8_activations
            && int8_input_fits(ctx, dtype, k, true);
        Self {
            tpr,
            rpt,
            prefetch: false,
            int8_input,
        }
    }

    /// The tuning for a product whose input comes rounded ([`matvec_int8_input`]): as
    /// [`MatvecTuning::choose`], but on GPUs rows of 4096 values or more take 128 lanes and 2
    /// rows a group. On the H100 (`bench-e2e`, 128-token prompt, alternating runs, against
    /// float activations): E2B 355-361 -> 377 tok/s, E4B 224-228 -> 226-231; the float
    /// input's one row of 256 lanes gave 359-370 and 216-222.
    pub fn rounded_input(ctx: &GpuContext, dtype: GgmlType, k: u32, rows: u64) -> Self {
        let t = Self::choose(ctx, dtype, k, rows, false, false);
        if ctx.info.device_type == wgpu::DeviceType::Cpu || k < 4096 {
            return t;
        }
        Self {
            tpr: 128,
            rpt: 2,
            ..t
        }
    }
}

/// Whether [`MatvecTuning::int8_input`] serves `dtype` at rows of `k`: a K-quant whose input,
/// as integers (k bytes) and per-16-value scales and sums (k / 2 bytes), fits in a
/// workgroup's memory next to its reductions.
/// With `prologue`, the float input row computed in front of the product (k * 4 bytes) is
/// held there too.
pub fn int8_input_fits(ctx: &GpuContext, dtype: GgmlType, k: u32, prologue: bool) -> bool {
    let row = if prologue { u64::from(k) * 4 } else { 0 };
    matches!(dtype, GgmlType::Q4K | GgmlType::Q6K)
        && k.is_multiple_of(32)
        && u64::from(k) * 3 / 2 + row + 5 * 1024
            <= u64::from(ctx.limits.max_compute_workgroup_storage_size)
}

/// One use of the one-token kernel: `m` tokens (or expert slots) of `x`, `x_stride` apart,
/// into `y` from column `out_offset`, `y_stride` apart.
struct MatvecJob<'a> {
    x: &'a View,
    y: &'a View,
    m: u32,
    x_stride: u32,
    y_stride: u32,
    out_offset: u32,
    out: MatvecOut<'a>,
    experts: Option<&'a ExpertSlots<'a>>,
    /// With `experts`: the slots' weights, for a product that sums each token's `x_group`
    /// slots into one row ([`expert_matvec_mixed`]).
    mixed: Option<&'a View>,
    /// With `experts`: the slots' experts routed in the product ([`ExpertRoute`]).
    route: Option<&'a ExpertRoute<'a>>,
    tuning: Option<MatvecTuning>,
    /// The residual step computed in front of the product (x is then the stream).
    residual: Option<&'a ResidualStep<'a>>,
    /// The attention merge computed in front of the product (x is then the split's scratch).
    merge: Option<&'a AttentionMerge<'a>>,
    /// The input's norm computed in front of the product.
    norm: Option<&'a InputNorm<'a>>,
    /// x is rounded to 8-bit integers ([`int8_vector_words`]).
    x_int8: bool,
}

impl<'a> MatvecJob<'a> {
    fn new(x: &'a View, y: &'a View, out: MatvecOut<'a>) -> Self {
        Self {
            x,
            y,
            m: 1,
            x_stride: 0,
            y_stride: 0,
            out_offset: 0,
            out,
            experts: None,
            mixed: None,
            route: None,
            tuning: None,
            residual: None,
            merge: None,
            norm: None,
            x_int8: false,
        }
    }

    /// One token of `w`'s rows into `y` from `out_offset`, whose length is checked.
    fn one_token(
        w: &GpuWeight,
        x: &'a View,
        y: &'a View,
        out_offset: u32,
        out: MatvecOut<'a>,
    ) -> Result<Self, GpuError> {
        let out_rows = match out {
            MatvecOut::GegluInt8 => int8_vector_words((w.rows / 2) as u32),
            _ if out.is_geglu() => w.rows / 2,
            _ => w.rows,
        };
        y.expect_len32(&w.name, u64::from(out_offset) + out_rows)?;
        Ok(Self {
            x_stride: w.cols as u32,
            out_offset,
            ..Self::new(x, y, out)
        })
    }
}

/// The one-token kernel for `w` as `job` says: one dispatch per tile.
/// The buffers a matrix-vector product binds, by what they hold. Each variant of
/// `matvec.wgsl` declares the ones its flags use; `binds` is the one place their binding
/// numbers are written.
struct MatvecBindings<'a> {
    w: &'a View,
    /// The input, or with `MERGE` the split attention's chunks.
    x: &'a View,
    y: &'a View,
    params: Params,
    /// `EXPERTS`: each slot's expert.
    sel: Option<&'a View>,
    /// `RESIDUAL`: the block's output joining the stream (an experts' dense branch with
    /// `MOE_DELTA`), its post-norm weight, the updated stream.
    delta: Option<&'a View>,
    post: Option<&'a View>,
    res_out: Option<&'a View>,
    /// `PRENORM`: the next block's norm weight and its normed input; `NORM_IN`: the input's
    /// norm weight.
    pre: Option<&'a View>,
    normed: Option<&'a View>,
    /// `GELU_TIMES`: the factor.
    times: Option<&'a View>,
    /// `MERGE`: the token's position; `KV_STORE`: the caches.
    positions: Option<&'a View>,
    k_cache: Option<&'a View>,
    v_cache: Option<&'a View>,
    /// `MOE_DELTA`: the experts' outputs and the two post-norm weights.
    experts: Option<&'a View>,
    dense_post: Option<&'a View>,
    experts_post: Option<&'a View>,
    /// The experts' weights: written by `ROUTE_IN`, read by `EXPERTS_SUM` and `MOE_WEIGHTED`.
    expert_w: Option<&'a View>,
    /// `ROUTE_IN`: the router's logits and the per-expert scale.
    route_logits: Option<&'a View>,
    route_scale: Option<&'a View>,
}

impl<'a> MatvecBindings<'a> {
    fn new(w: &'a View, x: &'a View, y: &'a View, params: Params) -> Self {
        Self {
            w,
            x,
            y,
            params,
            sel: None,
            delta: None,
            post: None,
            res_out: None,
            pre: None,
            normed: None,
            times: None,
            positions: None,
            k_cache: None,
            v_cache: None,
            experts: None,
            dense_post: None,
            experts_post: None,
            expert_w: None,
            route_logits: None,
            route_scale: None,
        }
    }

    fn binds(self) -> Vec<Bind<'a>> {
        let opt = |v: Option<&'a View>| v.map_or(Bind::Skip, Bind::Storage);
        vec![
            Bind::Storage(self.w),
            Bind::Storage(self.x),
            Bind::Storage(self.y),
            Bind::Params(self.params),
            opt(self.sel),
            opt(self.delta),
            opt(self.post),
            opt(self.pre),
            opt(self.res_out),
            opt(self.normed),
            opt(self.times),
            opt(self.positions),
            opt(self.k_cache),
            opt(self.v_cache),
            opt(self.experts),
            opt(self.expert_w),
            opt(self.dense_post),
            opt(self.experts_post),
            opt(self.route_logits),
            opt(self.route_scale),
        ]
    }
}

fn matvec_dispatches(
    ctx: &GpuContext,
    w: &GpuWeight,
    job: &MatvecJob<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let MatvecJob {
        x,
        y,
        m,
        x_stride,
        y_stride,
        out_offset,
        out,
        experts,
        mixed,
        route,
        tuning,
        residual,
        merge,
        norm,
        x_int8,
    } = *job;
    let flag = dtype_flag(w.dtype)?;
    let k = w.cols as u32;
    let geglu = out.is_geglu();
    if geglu && !whole_pairs(w) {
        return Err(shape(format!(
            "{}: a gated output needs whole gate/up row pairs per tile",
            w.name
        )));
    }
    let prologue = residual.is_some() || merge.is_some() || norm.is_some();
    let moe = residual.and_then(|r| match r.delta {
        Delta::Moe(mix) => Some(mix),
        Delta::Row(_) => None,
    });
    // Slots a product's rows take, and a row's length as the steps see it: a mixed
    // product's slots' rows end to end.
    let (row_slots, row_len) = match (mixed, experts) {
        (Some(_), Some(e)) => (e.x_group, k * e.x_group),
        _ => (1, k),
    };
    if [residual.is_some(), merge.is_some(), norm.is_some()]
        .iter()
        .filter(|&&p| p)
        .count()
        > 1
    {
        return Err(shape(format!(
            "{}: one prologue per product (residual step, attention merge or norm)",
            w.name
        )));
    }
    let MatvecTuning {
        tpr,
        rpt,
        prefetch,
        int8_input,
    } = match tuning {
        Some(t) if [4, 8, 16, 32, 64, 128, 256].contains(&t.tpr) && [1, 2, 4].contains(&t.rpt) => {
            if geglu && t.rpt < 2 {
                return Err(shape(format!(
                    "{}: a gated output needs 2 rows per group",
                    w.name
                )));
            }
            t
        }
        Some(t) => return Err(shape(format!("{}: matvec tuning {t:?}", w.name))),
        None => {
            let rows = experts.map_or(w.rows, |e| {
                u64::from(e.rows_per_expert) * u64::from(e.slots / row_slots)
            });
            if x_int8 {
                MatvecTuning::rounded_input(ctx, w.dtype, k, rows)
            } else {
                let t = MatvecTuning::choose(ctx, w.dtype, row_len, rows, geglu, prologue);
                // The experts' down products (short rows, no prologue) at 2 rows a group:
                // twice the workgroups, more loads in flight. On the H100, 26B-A4B decode
                // 194.3-195.2 -> 199.7-200.4 tok/s (three alternating runs each); 16 lanes at
                // 4 rows and 1 row a group measured between the two. Mixed, whose slots'
                // rows end to end are long enough for 1 row a group above: 2 rows a group of
                // 256 lanes took 26B-A4B decode from 199.0-199.3 to 205.6-205.8 tok/s (one
                // row a slot and the mix behind: 202.8-203.0); 64 lanes x 2 rows 204.6,
                // 128 x 1 197.8, 32 x 1 or 2 198-200, 16 lanes 191-194.
                if experts.is_some()
                    && !prologue
                    && !geglu
                    && ctx.info.device_type != wgpu::DeviceType::Cpu
                {
                    MatvecTuning {
                        rpt: if mixed.is_some() { 2 } else { t.rpt.min(2) },
                        ..t
                    }
                } else {
                    t
                }
            }
        }
    };
    // The input rounded by every workgroup, or already rounded.
    let rounds_input = int8_input && !x_int8;
    if rounds_input && !int8_input_fits(ctx, w.dtype, k, prologue) {
        return Err(shape(format!(
            "{}: 8-bit inputs are for a Q4_K or Q6_K product whose rows fit in workgroup memory",
            w.name
        )));
    }
    if x_int8
        && (prologue
            || experts.is_some()
            || m != 1
            || !matches!(w.dtype, GgmlType::Q4K | GgmlType::Q6K)
            || !k.is_multiple_of(32))
    {
        return Err(shape(format!(
            "{}: a rounded input is for one token's Q4_K or Q6_K product of rows of whole 32s",
            w.name
        )));
    }
    if x_int8 {
        x.expect_len32(&format!("{} rounded input", w.name), int8_vector_words(k))?;
    }
    // Every entry point has checked y's length against the output it names.
    let q8_out = matches!(out, MatvecOut::GegluInt8);
    if q8_out
        && (experts.is_some() || m != 1 || out_offset != 0 || !whole_32s_per_group(w, tpr, rpt))
    {
        return Err(shape(format!(
            "{}: a rounded gated output is for one token's dense product from column 0, each workgroup holding whole 32s of outputs",
            w.name
        )));
    }
    let xs_words = if x_int8 {
        k / 4
    } else if q8_out {
        (w.rows / 2) as u32 / 4
    } else {
        0
    };
    if let Some(mg) = merge {
        let a = mg.attention;
        if experts.is_some()
            || m != 1
            || k != a.n_head * a.head_dim
            || a.n_head > 64
            || !matvec_input_fits(ctx, k)
        {
            return Err(shape(format!(
                "{}: an attention merge runs in front of a one-token dense product whose input row (the {} heads' output) fits in workgroup memory",
                w.name, a.n_head
            )));
        }
    }
    let subgroups = ctx.features.subgroups;
    if let Some(r) = residual {
        if experts.is_some() || x_stride != k || !matvec_input_fits(ctx, k) {
            return Err(shape(format!(
                "{}: the residual step runs in front of a dense product whose input row fits in workgroup memory",
                w.name
            )));
        }
        let n = u64::from(m) * u64::from(k);
        let mut views = vec![
            ("stream", r.res, n),
            ("stream out", r.res_out, n),
            ("post", r.post, u64::from(k)),
        ];
        match r.delta {
            Delta::Row(delta) => views.push(("delta", delta, n)),
            Delta::Moe(mix) => {
                if m != 1 || mix.tokens != 1 || mix.dim != k || mix.eps != r.eps {
                    return Err(shape(format!(
                        "{}: an experts' output joins one token's stream of its width, with the step's eps",
                        w.name
                    )));
                }
                if !moe_delta_fits(ctx) {
                    return Err(shape(format!(
                        "{}: the device binds {} storage buffers, an experts' output in front of a product {}",
                        w.name,
                        ctx.limits.max_storage_buffers_per_shader_stage,
                        moe_delta_buffers()
                    )));
                }
                let kd = u64::from(k);
                views.extend([
                    ("dense branch", mix.dense, kd),
                    ("expert outputs", mix.experts, u64::from(mix.k) * kd),
                    ("dense post-norm", mix.dense_post, kd),
                    ("experts' post-norm", mix.experts_post, kd),
                ]);
                views.extend(
                    mix.weight
                        .map(|wv| ("expert weights", wv, u64::from(mix.k))),
                );
            }
        }
        if let Some((pre, normed)) = r.next_norm {
            views.extend([("pre", pre, u64::from(k)), ("normed", normed, n)]);
        }
        for (what, v, len) in views {
            v.expect_len32(&format!("{} residual {what}", w.name), len)?;
        }
    }
    if let Some(nm) = norm {
        if x_stride != k || !matvec_input_fits(ctx, k) {
            return Err(shape(format!(
                "{}: a norm runs in front of a product whose input rows are whole and fit in workgroup memory",
                w.name
            )));
        }
        nm.weight
            .expect_len32(&format!("{} input norm", w.name), u64::from(k))?;
    }
    if let MatvecOut::GeluTimes { by, offset } = out {
        // Behind an experts' output it would bind one storage buffer more than
        // `moe_delta_fits` counts.
        if experts.is_some() || m != 1 || moe.is_some() {
            return Err(shape(format!(
                "{}: a GELU-times output is for one token's dense product, not behind an experts' output",
                w.name
            )));
        }
        by.expect_len32(&w.name, u64::from(offset) + w.rows)?;
    }
    let mut parts = vec![ACTIVATIONS_WGSL, BYTES_WGSL, DTYPES_WGSL, MATVEC_WGSL];
    if prologue || route.is_some() {
        parts.push(REDUCE_WGSL);
    }
    if route.is_some() {
        parts.push(ROUTE_WGSL);
    }
    if merge.is_some() {
        parts.push(ATTN_MERGE_WGSL);
    }
    let mut source = ShaderSource::new("matvec", &parts)
        .flag(flag)
        .flag_if(geglu, "GEGLU_OUT")
        .flag_if(!subgroups, "NO_SUBGROUPS")
        .flag_if(experts.is_some(), "EXPERTS")
        .flag_if(mixed.is_some(), "EXPERTS_SUM")
        .flag_if(route.is_some(), "ROUTE_IN")
        .flag_if(residual.is_some(), "RESIDUAL")
        .flag_if(residual.is_some_and(|r| r.next_norm.is_some()), "PRENORM")
        .flag_if(norm.is_some(), "NORM_IN")
        .flag_if(moe.is_some(), "MOE_DELTA")
        .flag_if(moe.is_some_and(|mix| mix.weight.is_some()), "MOE_WEIGHTED")
        .flag_if(matches!(out, MatvecOut::GeluTimes { .. }), "GELU_TIMES")
        .flag_if(int8_input || x_int8, "INT8_X")
        .flag_if(x_int8, "XQ_IN")
        .flag_if(q8_out, "Q8_OUT")
        .flag_if(merge.is_some(), "MERGE")
        .flag_if(merge.is_some_and(|mg| mg.store_kv), "KV_STORE")
        .constant("TPR", f64::from(tpr))
        .constant("RPT", f64::from(rpt))
        // A mixed product's lanes step across its slots' segments, which the prefetch's
        // one-row stride does not follow.
        .constant("PREFETCH", f64::from(u8::from(prefetch && mixed.is_none())));
    if prologue {
        source = source
            .constant("XV", f64::from(k / 4))
            .constant("RV", f64::from(k.div_ceil(1024)));
    }
    if let Some(mix) = moe {
        source = source.constant("MOE_K", f64::from(mix.k));
    }
    if rounds_input {
        source = source
            .constant("XQ", f64::from(k / 4))
            .constant("XC", f64::from(k / 16));
    }
    if subgroups {
        source = source.constant("SG", f64::from(ctx.features.subgroup_min_size.clamp(4, 64)));
    }
    let pipeline = ctx.pipeline(&source);
    let softcap = match out {
        MatvecOut::Rows { softcap } => softcap,
        MatvecOut::Geglu | MatvecOut::GegluInt8 | MatvecOut::GeluTimes { .. } => 0.0,
    };
    let rows_per_group = 256 / tpr * rpt;
    w.tiles
        .iter()
        .enumerate()
        .map(|(ti, tile)| {
            let (rows, first, first_expert, experts_here, x_group) = match experts {
                // Every slot's output starts at its own row 0; the tile's experts say which
                // slots work here.
                Some(e) => {
                    let per = u64::from(e.rows_per_expert);
                    let first_expert = (tile.first_row / per) as u32;
                    (
                        e.rows_per_expert,
                        0,
                        first_expert,
                        (tile.rows / per) as u32,
                        e.x_group,
                    )
                }
                None => {
                    let first = if geglu {
                        tile.first_row / 2
                    } else {
                        tile.first_row
                    };
                    (tile.rows as u32, first as u32, 0, 0, 1)
                }
            };
            let mut params = MatvecParams {
                k,
                n: rows,
                row_bytes: w.row_bytes as u32,
                out_offset: out_offset + first,
                m,
                x_stride,
                y_stride,
                softcap,
                first_expert,
                experts_here,
                x_group,
                eps: residual.map_or(norm.map_or(0.0, |nm| nm.eps), |r| r.eps),
                scale: residual.map_or(1.0, |r| r.scale),
                times_offset: match out {
                    MatvecOut::GeluTimes { offset, .. } => offset + first,
                    _ => 0,
                },
                xs_words,
                accumulate: u32::from(mixed.is_some() && ti > 0),
                n_expert: route.map_or(0, |r| r.n_expert),
                has_scale: u32::from(route.is_some_and(|r| r.expert_scale.is_some())),
                ..MatvecParams::default()
            };
            if let Some(mg) = merge {
                let (a, capacity) = (mg.attention, mg.capacity);
                params.n_head = a.n_head;
                params.n_kv_head = a.n_kv_head;
                params.head_dim = a.head_dim;
                params.window = a.window;
                params.max_chunks = capacity.div_ceil(ATTN_CHUNK);
                params.capacity = capacity;
            }
            let wv = View::of(&tile.buffer);
            let mut b = MatvecBindings::new(&wv, x, y, Params::of(&params));
            b.sel = experts.map(|e| e.sel);
            if let Some(r) = route {
                b.route_logits = Some(r.logits);
                // Without a scale the shader reads none; the binding still needs a buffer.
                b.route_scale = Some(r.expert_scale.unwrap_or(r.logits));
                b.expert_w = Some(r.weight);
            }
            if let Some(mg) = merge {
                b.x = mg.scratch;
                b.positions = Some(mg.attention.positions);
                if mg.store_kv {
                    b.k_cache = Some(mg.attention.k_cache);
                    b.v_cache = Some(mg.attention.v_cache);
                }
            }
            if let Some(r) = residual {
                match r.delta {
                    Delta::Row(delta) => b.delta = Some(delta),
                    Delta::Moe(mix) => {
                        b.delta = Some(mix.dense);
                        b.experts = Some(mix.experts);
                        if let Some(wv) = mix.weight {
                            b.expert_w = Some(wv);
                        }
                        b.dense_post = Some(mix.dense_post);
                        b.experts_post = Some(mix.experts_post);
                    }
                }
                b.post = Some(r.post);
                b.res_out = Some(r.res_out);
                if let Some((pre, normed)) = r.next_norm {
                    b.pre = Some(pre);
                    b.normed = Some(normed);
                }
            }
            if let Some(nm) = norm {
                b.pre = Some(nm.weight);
            }
            if let Some(wv) = mixed {
                b.expert_w = Some(wv);
            }
            if let MatvecOut::GeluTimes { by, .. } = out {
                b.times = Some(by);
            }
            let binds = b.binds();
            ctx.dispatch(
                match (residual, merge, norm) {
                    (Some(_), _, _) => "residual_matvec",
                    (_, Some(_), _) => "merge_matvec",
                    (_, _, Some(_)) => "normed_matvec",
                    _ => "matvec",
                },
                pipeline.clone(),
                &binds,
                grid(ctx, rows.div_ceil(rows_per_group), m),
            )
        })
        .collect()
}

/// Whether a matrix-vector workgroup can hold an input row of `k` values in its memory, next
/// to its reductions' (at most 5 KiB without subgroups), and its threads the row's vec4s in
/// registers (k at most 8192): the condition of [`matvec_after_residual`].
pub fn matvec_input_fits(ctx: &GpuContext, k: u32) -> bool {
    k.is_multiple_of(4)
        && k <= 8192
        && u64::from(k) * 4 + 5 * 1024 <= u64::from(ctx.limits.max_compute_workgroup_storage_size)
}

/// A block's output as it joins the residual stream.
#[derive(Clone, Copy)]
pub enum Delta<'a> {
    /// The output row.
    Row(&'a View),
    /// A mixture-of-experts FFN's output, computed where it is used, as [`moe_mix`] computes
    /// it (one token); for devices that bind enough buffers ([`moe_delta_fits`]).
    Moe(MoeMix<'a>),
}

/// Storage buffers a product with a residual step whose delta is [`Delta::Moe`] binds at most
/// (weighted, with the next norm): counted in its WGSL.
fn moe_delta_buffers() -> u32 {
    static COUNT: OnceLock<u32> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let flags = ["RESIDUAL", "PRENORM", "MOE_DELTA", "MOE_WEIGHTED"];
        matvec_storage_buffers(&[REDUCE_WGSL], &flags)
    })
}

/// Storage buffers the matrix-vector variant (of Q4_K weights) with `flags` declares, with
/// the snippets `extra` besides its own.
fn matvec_storage_buffers(extra: &[&'static str], flags: &[&str]) -> u32 {
    let mut parts = vec![ACTIVATIONS_WGSL, BYTES_WGSL, DTYPES_WGSL, MATVEC_WGSL];
    parts.extend(extra);
    let source = ShaderSource::new("matvec", &parts).flag("DT_Q4_K");
    flags
        .iter()
        .fold(source, |source, f| source.flag(*f))
        .storage_bindings()
}

/// Whether the device binds enough storage buffers for a [`Delta::Moe`] residual step (12;
/// browsers commonly offer 8 or 10).
pub fn moe_delta_fits(ctx: &GpuContext) -> bool {
    ctx.limits.max_storage_buffers_per_shader_stage >= moe_delta_buffers()
}

/// The step between two blocks of a layer, for [`matvec_after_residual`]: the stream becomes
/// `res_out = (res + norm(delta) * post) * scale`; the product's input is `res_out` itself or,
/// with `next_norm`, the next block's input `norm(res_out) * pre`, also written to `normed`.
pub struct ResidualStep<'a> {
    pub res: &'a View,
    pub delta: Delta<'a>,
    pub post: &'a View,
    pub scale: f32,
    pub eps: f32,
    /// The updated stream: a buffer other than `res` (the product's workgroups all read `res`).
    pub res_out: &'a View,
    /// `(pre, normed)`.
    pub next_norm: Option<(&'a View, &'a View)>,
}

/// The residual step and the one-token product of its result in one dispatch per weight tile:
/// each workgroup computes the step into its own memory (the step's cost is a few vectors of
/// reads from cache; a dispatch of its own costs a whole GPU round trip), and the first writes
/// `res_out` (and `normed`). [`residual_norm`] (or a norm added to the stream) followed by
/// [`matvec`], with one wait fewer.
pub fn matvec_after_residual(
    ctx: &GpuContext,
    w: &GpuWeight,
    step: &ResidualStep<'_>,
    y: &View,
    out_offset: u32,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    matvec_after_residual_tuned(ctx, w, step, y, out_offset, out, None)
}

/// [`matvec_after_residual`] with a given tuning (`None`: the one [`MatvecTuning::choose`]
/// picks), for tests and kernel tuning.
pub fn matvec_after_residual_tuned(
    ctx: &GpuContext,
    w: &GpuWeight,
    step: &ResidualStep<'_>,
    y: &View,
    out_offset: u32,
    out: MatvecOut<'_>,
    tuning: Option<MatvecTuning>,
) -> Result<Vec<Dispatch>, GpuError> {
    let job = MatvecJob {
        residual: Some(step),
        tuning,
        ..MatvecJob::one_token(w, step.res, y, out_offset, out)?
    };
    matvec_dispatches(ctx, w, &job)
}

/// The decode matrix-vector product of one token: `y[out_offset + r] = W[r] . x` (or the gated
/// activation of interleaved gate/up rows), one dispatch per weight tile.
pub fn matvec(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    y: &View,
    out_offset: u32,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    x.expect_len32(&w.name, w.cols)?;
    let job = MatvecJob::one_token(w, x, y, out_offset, out)?;
    matvec_dispatches(ctx, w, &job)
}

/// The norm of a product's input, `norm(x) * weight`, for [`matvec_normed`] and
/// [`expert_matvec`].
#[derive(Clone, Copy)]
pub struct InputNorm<'a> {
    pub weight: &'a View,
    pub eps: f32,
}

/// [`rms_norm`] of one token's `x` followed by [`matvec`] of the result in one dispatch per
/// weight tile: every workgroup normalises the row into its own memory, where the two
/// dispatches would cost a wait between them. For rows that fit ([`matvec_input_fits`]).
pub fn matvec_normed(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    norm: &InputNorm<'_>,
    y: &View,
    out_offset: u32,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    x.expect_len32(&w.name, w.cols)?;
    let job = MatvecJob {
        norm: Some(norm),
        ..MatvecJob::one_token(w, x, y, out_offset, out)?
    };
    matvec_dispatches(ctx, w, &job)
}

/// [`matvec`] of an input rounded to 8-bit integers by the product before it
/// ([`MatvecOut::GegluInt8`]): every workgroup reads a quarter of the bytes of a float input,
/// and none rounds it again. For the FFN's down product, whose long input row each of its
/// many workgroups reads ([`MatvecTuning::rounded_input`] has what it measured).
pub fn matvec_int8_input(
    ctx: &GpuContext,
    w: &GpuWeight,
    xq: &View,
    y: &View,
    out_offset: u32,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let job = MatvecJob {
        x_int8: true,
        ..MatvecJob::one_token(w, xq, y, out_offset, out)?
    };
    matvec_dispatches(ctx, w, &job)
}

/// The one-token kernel over `tokens` rows of `x`, into consecutive rows of `y`, with a given
/// tuning (`None`: the one [`MatvecTuning::choose`] picks), for tests and kernel tuning.
pub fn matvec_tuned(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    y: &View,
    tokens: u32,
    out: MatvecOut<'_>,
    tuning: Option<MatvecTuning>,
) -> Result<Vec<Dispatch>, GpuError> {
    let out_rows = if out.is_geglu() { w.rows / 2 } else { w.rows };
    x.expect_len32(&w.name, w.cols * u64::from(tokens))?;
    y.expect_len32(&w.name, out_rows * u64::from(tokens))?;
    let job = MatvecJob {
        m: tokens,
        x_stride: w.cols as u32,
        y_stride: out_rows as u32,
        tuning,
        ..MatvecJob::new(x, y, out)
    };
    matvec_dispatches(ctx, w, &job)
}

/// Routing inside [`expert_matvec`]: each token's `x_group` slots are its most likely
/// experts by `logits` (`n_expert` a token), as [`moe_route`] picks and weighs them; the
/// product writes the slots' experts to `sel` and their weights to `weight`.
#[derive(Clone, Copy)]
pub struct ExpertRoute<'a> {
    pub logits: &'a View,
    pub weight: &'a View,
    pub expert_scale: Option<&'a View>,
    pub n_expert: u32,
}

impl ExpertRoute<'_> {
    /// The checks routing `tokens` tokens to `k` experts each shares with [`moe_route`]: at
    /// most 256 experts (a workgroup ranks them), and the buffers' lengths.
    fn check(&self, tokens: u32, k: u32) -> Result<(), GpuError> {
        let n = self.n_expert;
        if n == 0 || n > 256 || k == 0 || k > n {
            return Err(shape(format!("routing {k} of {n} experts (at most 256)")));
        }
        self.logits
            .expect_len32("router logits", u64::from(tokens) * u64::from(n))?;
        self.weight
            .expect_len32("expert weights", u64::from(tokens * k))?;
        if let Some(sc) = self.expert_scale {
            sc.expect_len32("expert scale", u64::from(n))?;
        }
        Ok(())
    }
}

/// `binds` with route.wgsl's bindings (18 and 19) after them.
fn route_binds<'a>(
    mut binds: Vec<Bind<'a>>,
    logits: &'a View,
    expert_scale: Option<&'a View>,
) -> Vec<Bind<'a>> {
    binds.resize_with(18, || Bind::Skip);
    // Without a scale the shader reads none; the binding still needs a buffer.
    binds.extend([
        Bind::Storage(logits),
        Bind::Storage(expert_scale.unwrap_or(logits)),
    ]);
    binds
}

/// Storage buffers a routed expert product (normed input, gated output) binds: counted in its
/// WGSL.
fn routed_expert_buffers() -> u32 {
    static COUNT: OnceLock<u32> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let flags = ["GEGLU_OUT", "EXPERTS", "ROUTE_IN", "NORM_IN"];
        matvec_storage_buffers(&[REDUCE_WGSL, ROUTE_WGSL], &flags)
    })
}

/// Whether the device can route inside an expert product whose input rows of `k` values are
/// normalised in front of it ([`ExpertRoute`]): the buffers it binds, and the route's
/// workgroup memory next to the input row.
pub fn expert_route_fits(ctx: &GpuContext, k: u32) -> bool {
    ctx.limits.max_storage_buffers_per_shader_stage >= routed_expert_buffers()
        && matvec_input_fits(ctx, k)
        && u64::from(k) * 4 + 8 * 1024 <= u64::from(ctx.limits.max_compute_workgroup_storage_size)
}

/// Products of the experts chosen per slot: slot s multiplies expert `sel[s]` (its
/// `rows_per_expert` rows of the stacked `w`) by input row `s / x_group` of `x`, into row s of
/// `y` (`y_stride` apart). With [`MatvecOut::Geglu`] each expert's rows are gate/up pairs.
/// With `norm`, each input row is normalised first, in every workgroup (rows that fit,
/// [`matvec_input_fits`]). With `route`, the slots' experts are routed here and written to
/// `sel` rather than read from it (a token's `x_group` slots; [`expert_route_fits`]).
#[allow(clippy::too_many_arguments)]
pub fn expert_matvec(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    norm: Option<&InputNorm<'_>>,
    y: &View,
    y_stride: u32,
    slots: &ExpertSlots<'_>,
    route: Option<&ExpertRoute<'_>>,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    check_expert_io(w, x, y, y_stride, slots, out)?;
    if let Some(r) = route {
        let k = slots.x_group;
        if !slots.slots.is_multiple_of(k) || !expert_route_fits(ctx, w.cols as u32) {
            return Err(shape(format!(
                "{}: routing in front of a product of {} slots, {k} a token, on a device that binds {} storage buffers and holds the row",
                w.name,
                slots.slots,
                routed_expert_buffers()
            )));
        }
        r.check(slots.slots / k, k)?;
    }
    let job = MatvecJob {
        m: slots.slots,
        x_stride: w.cols as u32,
        y_stride,
        experts: Some(slots),
        route,
        norm,
        ..MatvecJob::new(x, y, out)
    };
    matvec_dispatches(ctx, w, &job)
}

/// Slots a token may have in [`expert_matvec_mixed`] (its workgroups hold their experts and
/// weights).
pub const MIXED_SLOTS_MAX: u32 = 64;

/// The experts' products of each token's `k` slots, weighted and summed into one row per
/// token: `y[t * y_stride + r] = sum_j weight[t k + j] * (W_sel[t k + j] . x[t k + j])[r]`,
/// each slot with its input row (`slots.x_group` is 1). The mixture's sum happens in the
/// product, so its reader takes one row rather than weighing `k` (an experts' down product).
#[allow(clippy::too_many_arguments)]
pub fn expert_matvec_mixed(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    weight: &View,
    y: &View,
    y_stride: u32,
    slots: &ExpertSlots<'_>,
    k: u32,
) -> Result<Vec<Dispatch>, GpuError> {
    check_expert_tiles(w, slots)?;
    if slots.x_group != 1
        || k == 0
        || k > MIXED_SLOTS_MAX
        || slots.slots == 0
        || !slots.slots.is_multiple_of(k)
        || y_stride < slots.rows_per_expert
    {
        return Err(shape(format!(
            "{}: mixed slots are 1 to {MIXED_SLOTS_MAX} a token, each with its input row; {} slots, {k} a token, outputs {y_stride} apart",
            w.name, slots.slots
        )));
    }
    let tokens = slots.slots / k;
    slots
        .sel
        .expect_len32("expert ids", u64::from(slots.slots))?;
    weight.expect_len32("expert weights", u64::from(slots.slots))?;
    x.expect_len32(&w.name, u64::from(slots.slots) * w.cols)?;
    y.expect_len32(
        &w.name,
        u64::from(tokens - 1) * u64::from(y_stride) + u64::from(slots.rows_per_expert),
    )?;
    let grouped = ExpertSlots {
        x_group: k,
        ..*slots
    };
    let job = MatvecJob {
        m: tokens,
        x_stride: w.cols as u32 * k,
        y_stride,
        experts: Some(&grouped),
        mixed: Some(weight),
        ..MatvecJob::new(x, y, MatvecOut::Rows { softcap: 0.0 })
    };
    matvec_dispatches(ctx, w, &job)
}

/// Whether `w`'s tiles hold whole experts of `slots.rows_per_expert` rows.
fn check_expert_tiles(w: &GpuWeight, slots: &ExpertSlots<'_>) -> Result<(), GpuError> {
    let per = u64::from(slots.rows_per_expert);
    if per == 0
        || !w.rows.is_multiple_of(per)
        || w.tiles
            .iter()
            .any(|t| t.first_row % per != 0 || t.rows % per != 0)
    {
        return Err(shape(format!(
            "{}: tiles must hold whole experts of {per} rows",
            w.name
        )));
    }
    Ok(())
}

/// The checks [`expert_matvec`] and [`expert_matmul`] share: tiles of whole experts, and
/// inputs and outputs long enough for every slot.
fn check_expert_io(
    w: &GpuWeight,
    x: &View,
    y: &View,
    y_stride: u32,
    slots: &ExpertSlots<'_>,
    out: MatvecOut<'_>,
) -> Result<(), GpuError> {
    check_expert_tiles(w, slots)?;
    let per = u64::from(slots.rows_per_expert);
    let out_rows = if out.is_geglu() { per / 2 } else { per };
    if slots.slots == 0 || slots.x_group == 0 || u64::from(y_stride) < out_rows {
        return Err(shape(format!(
            "{}: {} slots, {} a row, outputs {y_stride} apart",
            w.name, slots.slots, slots.x_group
        )));
    }
    slots
        .sel
        .expect_len32("expert ids", u64::from(slots.slots))?;
    x.expect_len32(
        &w.name,
        u64::from(slots.slots.div_ceil(slots.x_group) - 1) * w.cols + w.cols,
    )?;
    y.expect_len32(
        &w.name,
        u64::from(slots.slots - 1) * u64::from(y_stride) + out_rows,
    )
}

/// Where [`moe_group`] leaves the slots grouped by expert, for [`expert_matmul`].
#[derive(Clone, Copy)]
pub struct ExpertGroups<'a> {
    /// `[slots, expert by expert | count of each expert | first entry of each]`:
    /// `slots + 2 n_expert` words.
    pub groups: &'a View,
    pub n_expert: u32,
    /// Tokens the slots come from: the most slots one expert can get, as routing gives
    /// (each token's experts distinct); the products leave an expert's slots past this
    /// many unwritten.
    pub tokens: u32,
}

/// Groups the routed slots of [`ExpertSlots::sel`] by expert into `groups.groups`, in one
/// workgroup. Within an expert the slots' order varies from run to run; the products' results
/// do not.
pub fn moe_group(
    ctx: &GpuContext,
    slots: &ExpertSlots<'_>,
    groups: &ExpertGroups<'_>,
) -> Result<Dispatch, GpuError> {
    let n = groups.n_expert;
    if n == 0 || n > 256 || slots.slots == 0 {
        return Err(shape(format!(
            "moe_group: {} slots over {n} experts (at most 256)",
            slots.slots
        )));
    }
    slots
        .sel
        .expect_len32("expert ids", u64::from(slots.slots))?;
    groups
        .groups
        .expect_len32("expert groups", 2 * u64::from(n) + u64::from(slots.slots))?;
    ctx.dispatch(
        "moe_group",
        ctx.pipeline(&ShaderSource::new("moe", &[REDUCE_WGSL, MOE_WGSL]).flag("GROUP")),
        &[
            Bind::Storage(slots.sel),
            Bind::Storage(groups.groups),
            Bind::Skip,
            Bind::Params(Params::of(&MoeParams {
                n_expert: n,
                k: slots.slots,
                ..MoeParams::default()
            })),
        ],
        [1, 1, 1],
    )
}

/// [`expert_matvec`] for many tokens on the tiled kernel: each expert's weights are read once
/// per 64 of the slots routed to it ([`moe_group`] has grouped them), where one product per
/// slot reads them once per slot. Rows out or gate/up pairs ([`MatvecOut::Geglu`]) only.
#[allow(clippy::too_many_arguments)]
pub fn expert_matmul(
    ctx: &GpuContext,
    w: &GpuWeight,
    x: &View,
    y: &View,
    y_stride: u32,
    slots: &ExpertSlots<'_>,
    groups: &ExpertGroups<'_>,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    check_expert_io(w, x, y, y_stride, slots, out)?;
    let geglu = match out {
        MatvecOut::Rows { softcap: 0.0 } => false,
        MatvecOut::Geglu => true,
        _ => {
            return Err(shape(format!(
                "{}: grouped expert products give rows or gated pairs, not {out:?}",
                w.name
            )));
        }
    };
    let per = slots.rows_per_expert;
    let n = groups.n_expert;
    if u64::from(n) * u64::from(per) != w.rows
        || !w.cols.is_multiple_of(4)
        || (geglu && (!per.is_multiple_of(2) || !whole_pairs(w)))
        || groups.tokens == 0
    {
        return Err(shape(format!(
            "{}: {n} experts of {per} rows over {} tokens for a {}x{} weight",
            w.name, groups.tokens, w.rows, w.cols
        )));
    }
    groups
        .groups
        .expect_len32("expert groups", 2 * u64::from(n) + u64::from(slots.slots))?;
    let k = w.cols as u32;
    let tile_rows = matmul_tile_rows(ctx) as u32;
    let tiles = Tiles::for_experts(ctx, slots.slots, n);
    let pipeline = tiled_pipeline(ctx, w.dtype, geglu, tiles)?;
    w.tiles
        .iter()
        .map(|tile| {
            let params = Params::of(&MatmulParams {
                k,
                n: per,
                row_bytes: w.row_bytes as u32,
                out_offset: 0,
                m: groups.tokens,
                x_stride: k,
                y_stride,
                softcap: 0.0,
                k_part: k.div_ceil(64) * 64,
                part_stride: 0,
                first_expert: (tile.first_row / u64::from(per)) as u32,
                n_expert: n,
                x_group: slots.x_group,
                slots: slots.slots,
            });
            let wv = View::of(&tile.buffer);
            ctx.dispatch(
                "expert_matmul",
                pipeline.clone(),
                &[
                    Bind::Storage(&wv),
                    Bind::Storage(x),
                    Bind::Storage(y),
                    Bind::Params(params),
                    Bind::Storage(groups.groups),
                ],
                [
                    per.div_ceil(tile_rows),
                    groups.tokens.div_ceil(tiles.tokens()),
                    (tile.rows / u64::from(per)) as u32,
                ],
            )
        })
        .collect()
}

/// Routes each of `tokens` tokens to its `k` experts: `sel` gets the expert ids and `weight`
/// their renormalised probabilities (times `expert_scale` when given).
#[allow(clippy::too_many_arguments)]
pub fn moe_route(
    ctx: &GpuContext,
    logits: &View,
    sel: &View,
    weight: &View,
    expert_scale: Option<&View>,
    tokens: u32,
    n_expert: u32,
    k: u32,
) -> Result<Dispatch, GpuError> {
    ExpertRoute {
        logits,
        weight,
        expert_scale,
        n_expert,
    }
    .check(tokens, k)?;
    sel.expect_len32("expert ids", u64::from(tokens * k))?;
    let params = Params::of(&MoeParams {
        n_expert,
        k,
        has_scale: u32::from(expert_scale.is_some()),
        ..MoeParams::default()
    });
    ctx.dispatch(
        "moe_route",
        ctx.pipeline(&ShaderSource::new("moe", &[REDUCE_WGSL, ROUTE_WGSL, MOE_WGSL]).flag("ROUTE")),
        &route_binds(
            vec![
                Bind::Skip,
                Bind::Storage(sel),
                Bind::Storage(weight),
                Bind::Params(params),
            ],
            logits,
            expert_scale,
        ),
        [tokens, 1, 1],
    )
}

/// Arguments of [`moe_mix`]: per token, the dense branch's output and its experts' outputs.
#[derive(Clone, Copy)]
pub struct MoeMix<'a> {
    /// `tokens * k` rows of `dim`: slot `t*k + j` is token t's j-th expert's output.
    pub experts: &'a View,
    /// The slots' weights (the route kernel's `weight`); `None` where `experts` holds each
    /// token's weighted sum already ([`expert_matvec_mixed`]'s output, `k` = 1).
    pub weight: Option<&'a View>,
    pub experts_post: &'a View,
    /// `tokens` rows of `dim`.
    pub dense: &'a View,
    pub dense_post: &'a View,
    pub tokens: u32,
    pub k: u32,
    pub dim: u32,
    pub eps: f32,
}

/// A mixture-of-experts layer's FFN output in one dispatch: `out[t] = norm(dense[t]) *
/// dense_post + norm(sum_j weight[t*k + j] * experts[t*k + j]) * experts_post`.
pub fn moe_mix(ctx: &GpuContext, mix: &MoeMix<'_>, out: &View) -> Result<Dispatch, GpuError> {
    let MoeMix {
        experts,
        weight,
        experts_post,
        dense,
        dense_post,
        tokens,
        k,
        dim,
        eps,
    } = *mix;
    check_norm_dim(dim)?;
    let (rows, slots) = (u64::from(tokens) * u64::from(dim), u64::from(tokens * k));
    experts.expect_len32("expert outputs", slots * u64::from(dim))?;
    match weight {
        Some(wv) => wv.expect_len32("expert weights", slots)?,
        None if k != 1 => {
            return Err(shape(format!(
                "experts' mix: {k} unweighted rows a token, where mixed outputs are one"
            )));
        }
        None => {}
    }
    dense.expect_len32("dense branch", rows)?;
    out.expect_len32("experts' mix", rows)?;
    experts_post.expect_len32("experts' post-norm", u64::from(dim))?;
    dense_post.expect_len32("dense post-norm", u64::from(dim))?;
    ctx.dispatch(
        "moe_mix",
        ctx.pipeline(
            &ShaderSource::new("moe", &[REDUCE_WGSL, MOE_WGSL])
                .flag("MIX")
                .flag_if(weight.is_some(), "WEIGHTED"),
        ),
        &[
            Bind::Storage(experts),
            weight.map_or(Bind::Skip, Bind::Storage),
            Bind::Storage(out),
            Bind::Params(Params::of(&MoeParams {
                k,
                dim,
                eps,
                ..MoeParams::default()
            })),
            Bind::Storage(dense),
            Bind::Storage(dense_post),
            Bind::Storage(experts_post),
        ],
        [tokens, 1, 1],
    )
}

/// Arguments of [`head_post`].
pub struct HeadPostArgs<'a> {
    /// Per token `[q | k | v]` (v absent when `k_is_v`), `stride` floats apart.
    pub qkv: &'a View,
    pub q_norm: &'a View,
    /// K's norm weight and the caches, for layers that own a KV cache.
    pub kv: Option<HeadPostKv<'a>>,
    pub positions: &'a View,
    pub tokens: u32,
    pub n_head: u32,
    pub head_dim: u32,
    pub stride: u32,
    pub n_rot: u32,
    pub base: f32,
    pub freq_scale: f32,
    pub freq_factors: Option<&'a View>,
    pub eps: f32,
}

/// The K/V side of [`head_post`].
pub struct HeadPostKv<'a> {
    pub k_norm: &'a View,
    pub k_cache: &'a View,
    pub v_cache: &'a View,
    pub n_kv: u32,
    /// V is the raw K projection (Gemma 4 layers without a V projection).
    pub k_is_v: bool,
    /// V gets an RMS norm without weight (Gemma 4).
    pub v_norm: bool,
}

/// The shapes [`head_post`] and the head work of [`attention_decode`] need: head dims, the
/// rows' width within their stride, and every weight's length.
fn check_head_post(a: &HeadPostArgs<'_>) -> Result<(), GpuError> {
    if a.head_dim > MAX_HEAD_DIM || a.n_rot > a.head_dim || !a.n_rot.is_multiple_of(2) {
        return Err(shape(format!(
            "head_post: head_dim {} n_rot {}",
            a.head_dim, a.n_rot
        )));
    }
    let width = head_post_width(a);
    if a.stride < width {
        return Err(shape(format!("head_post: stride {} < {width}", a.stride)));
    }
    a.qkv.expect_len32(
        "head_post qkv",
        u64::from(a.tokens.max(1) - 1) * u64::from(a.stride) + u64::from(width),
    )?;
    a.q_norm
        .expect_len32("head_post q_norm", u64::from(a.head_dim))?;
    a.positions
        .expect_len32("head_post positions", u64::from(a.tokens))?;
    if let Some(kv) = &a.kv {
        kv.k_norm
            .expect_len32("head_post k_norm", u64::from(a.head_dim))?;
    }
    if let Some(ff) = a.freq_factors {
        ff.expect_len32("head_post freq factors", u64::from(a.n_rot / 2))?;
    }
    Ok(())
}

/// Floats of one token's `[q | k | v]` row (v absent when V is K, k and v without a cache).
fn head_post_width(a: &HeadPostArgs<'_>) -> u32 {
    let kv =
        a.kv.as_ref()
            .map_or(0, |kv| kv.n_kv * if kv.k_is_v { 1 } else { 2 });
    (a.n_head + kv) * a.head_dim
}

/// Per-head Q/K(/V) norms, RoPE and the KV-cache store in one dispatch.
pub fn head_post(ctx: &GpuContext, a: &HeadPostArgs<'_>) -> Result<Dispatch, GpuError> {
    check_head_post(a)?;
    let n_kv = a.kv.as_ref().map_or(0, |kv| kv.n_kv);
    // Layers without their own cache still bind something in the K/V slots (never touched
    // with n_kv = 0): the read-only slot takes q_norm, the writable ones the context's unused
    // words.
    let (k_norm, kc, vc, capacity) = match &a.kv {
        Some(kv) => {
            let row = u64::from(kv.n_kv * a.head_dim);
            (
                kv.k_norm,
                kv.k_cache.clone(),
                kv.v_cache.clone(),
                (kv.k_cache.len32() / row) as u32,
            )
        }
        None => {
            let [k, v] = ctx.unused_storage();
            (a.q_norm, k, v, 0)
        }
    };
    let source = ShaderSource::new(
        "head_post",
        &[REDUCE_WGSL, ROPE_MATH_WGSL, HEAD_MATH_WGSL, HEAD_POST_WGSL],
    )
    .flag_if(a.freq_factors.is_some(), "FREQ_FACTORS")
    .flag_if(a.kv.as_ref().is_some_and(|kv| kv.k_is_v), "K_IS_V")
    .flag_if(a.kv.as_ref().is_some_and(|kv| kv.v_norm), "V_NORM");
    let params = Params::of(&HeadPostParams {
        n_head: a.n_head,
        n_kv,
        head_dim: a.head_dim,
        n_rot: a.n_rot,
        stride: a.stride,
        tokens: a.tokens,
        capacity,
        eps: a.eps,
        base: a.base,
        freq_scale: a.freq_scale,
    });
    let mut binds = vec![
        Bind::Storage(a.qkv),
        Bind::Storage(a.q_norm),
        Bind::Storage(k_norm),
        Bind::Storage(&kc),
        Bind::Storage(&vc),
        Bind::Storage(a.positions),
        Bind::Params(params),
    ];
    if let Some(ff) = a.freq_factors {
        binds.push(Bind::Storage(ff));
    }
    ctx.dispatch(
        "head_post",
        ctx.pipeline(&source),
        &binds,
        [a.n_head + n_kv, a.tokens, 1],
    )
}

/// Keys per workgroup of the split decode attention.
pub const ATTN_CHUNK: u32 = 64;

/// The two dispatches of decode attention: per-chunk partial results, then their merge.
pub struct DecodeAttention {
    pub split: Dispatch,
    pub combine: Dispatch,
}

impl DecodeAttention {
    /// Floats of scratch the partial results need.
    pub fn scratch_floats(n_head: u32, head_dim: u32, capacity: u32) -> u64 {
        // Per head and chunk, the chunk's output, then its max and sum in a vec4; then room
        // for the token's K and V on their way to the cache (at most one pair per query head).
        let chunks = u64::from(n_head) * u64::from(capacity.div_ceil(ATTN_CHUNK));
        chunks * u64::from(head_dim + 4) + 2 * u64::from(n_head) * u64::from(head_dim)
    }
}

/// Attention of one token's queries (at `positions[0]`) over the cache, split over chunks of
/// keys. `q` starts `q_offset` floats into `a.q`; `a.tokens` must be 1.
///
/// With `post`, the split kernel also does [`head_post`]'s work for the token, one dispatch
/// fewer: `a.q` is then the raw projection `post.qkv` (left as it is), and where `post.kv` is
/// given its caches must be `a`'s (the merge stores the token's K and V there for later
/// steps).
pub fn attention_decode(
    ctx: &GpuContext,
    a: &AttentionArgs<'_>,
    q_offset: u32,
    scratch: &View,
    post: Option<&HeadPostArgs<'_>>,
) -> Result<DecodeAttention, GpuError> {
    let (split, merge) = attention_split(ctx, a, q_offset, scratch, post)?;
    let combine = attention_combine(ctx, &merge)?;
    Ok(DecodeAttention { split, combine })
}

/// What merges a split decode attention's partial results: [`attention_combine`], or the
/// product that reads them ([`matvec_after_attention`]).
pub struct AttentionMerge<'a> {
    attention: &'a AttentionArgs<'a>,
    scratch: &'a View,
    /// The split left the token's K and V in the scratch for the merge to store.
    store_kv: bool,
    capacity: u32,
}

/// The first half of [`attention_decode`]: the chunks' partial results in `scratch`, and
/// the merge that has to follow.
pub fn attention_split<'a>(
    ctx: &GpuContext,
    a: &'a AttentionArgs<'a>,
    q_offset: u32,
    scratch: &'a View,
    post: Option<&HeadPostArgs<'_>>,
) -> Result<(Dispatch, AttentionMerge<'a>), GpuError> {
    if a.tokens != 1
        || a.head_dim > MAX_HEAD_DIM
        || !a.head_dim.is_multiple_of(4)
        || a.n_kv_head == 0
        || !a.n_head.is_multiple_of(a.n_kv_head)
    {
        return Err(shape(format!(
            "attention_decode: {} tokens, {} heads over {} KV heads of dim {}",
            a.tokens, a.n_head, a.n_kv_head, a.head_dim
        )));
    }
    a.q.expect_len32(
        "attention q",
        u64::from(q_offset) + u64::from(a.n_head * a.head_dim),
    )?;
    a.out
        .expect_len32("attention out", u64::from(a.n_head * a.head_dim))?;
    let row = u64::from(a.n_kv_head * a.head_dim);
    let capacity = (a.k_cache.len32() / row) as u32;
    if capacity == 0 || a.v_cache.len32() / row != u64::from(capacity) {
        return Err(shape(
            "attention: K and V caches differ or are empty".into(),
        ));
    }
    scratch.expect_len32(
        "attention scratch",
        DecodeAttention::scratch_floats(a.n_head, a.head_dim, capacity),
    )?;
    let max_chunks = capacity.div_ceil(ATTN_CHUNK);
    let params = Params::of(&AttnSplitParams {
        n_head: a.n_head,
        n_kv_head: a.n_kv_head,
        head_dim: a.head_dim,
        window: a.window,
        max_chunks,
        capacity,
        scale: a.scale,
        softcap: a.softcap,
        q_offset,
        n_rot: post.map_or(0, |h| h.n_rot),
        eps: post.map_or(0.0, |h| h.eps),
        base: post.map_or(0.0, |h| h.base),
        freq_scale: post.map_or(0.0, |h| h.freq_scale),
    });
    // A sliding layer never sees more than its window: no need to launch past it.
    let chunks = if a.window > 0 {
        max_chunks.min(a.window.div_ceil(ATTN_CHUNK) + 1)
    } else {
        max_chunks
    };
    let parts: &[&'static str] = if post.is_some() {
        &[
            ACTIVATIONS_WGSL,
            REDUCE_WGSL,
            ROPE_MATH_WGSL,
            HEAD_MATH_WGSL,
            ATTN_SPLIT_WGSL,
        ]
    } else {
        &[ACTIVATIONS_WGSL, REDUCE_WGSL, ATTN_SPLIT_WGSL]
    };
    let mut source = ShaderSource::new("attn_split", parts).constant("HD", f64::from(a.head_dim));
    let mut binds = vec![
        Bind::Storage(a.q),
        Bind::Storage(a.k_cache),
        Bind::Storage(a.v_cache),
        Bind::Storage(a.positions),
        Bind::Storage(scratch),
        Bind::Params(params),
    ];
    if let Some(h) = post {
        check_fused_heads(a, q_offset, h)?;
        let kv = h.kv.as_ref();
        source = source
            .flag("HEAD_POST")
            .flag_if(kv.is_some(), "KV_NEW")
            .flag_if(kv.is_some_and(|kv| kv.k_is_v), "K_IS_V")
            .flag_if(kv.is_some_and(|kv| kv.v_norm), "V_NORM")
            .flag_if(h.freq_factors.is_some(), "FREQ_FACTORS");
        binds.push(Bind::Storage(h.q_norm));
        binds.push(Bind::Storage(kv.map_or(h.q_norm, |kv| kv.k_norm)));
        if let Some(ff) = h.freq_factors {
            binds.push(Bind::Storage(ff));
        }
    }
    let split = ctx.dispatch(
        "attn_split",
        ctx.pipeline(&source),
        &binds,
        [a.n_head, chunks, 1],
    )?;
    let merge = AttentionMerge {
        attention: a,
        scratch,
        store_kv: post.is_some_and(|h| h.kv.is_some()),
        capacity,
    };
    Ok((split, merge))
}

/// The merge of [`attention_split`]'s partial results into `a.out` (and the token's K and V
/// into the caches), one workgroup per query head.
pub fn attention_combine(
    ctx: &GpuContext,
    merge: &AttentionMerge<'_>,
) -> Result<Dispatch, GpuError> {
    let a = merge.attention;
    let params = Params::of(&AttnCombineParams {
        n_head: a.n_head,
        n_kv_head: a.n_kv_head,
        head_dim: a.head_dim,
        window: a.window,
        max_chunks: merge.capacity.div_ceil(ATTN_CHUNK),
        capacity: merge.capacity,
    });
    let mut binds = vec![
        Bind::Storage(merge.scratch),
        Bind::Storage(a.positions),
        Bind::Storage(a.out),
        Bind::Params(params),
    ];
    if merge.store_kv {
        binds.extend([Bind::Storage(a.k_cache), Bind::Storage(a.v_cache)]);
    }
    ctx.dispatch(
        "attn_combine",
        ctx.pipeline(
            &ShaderSource::new(
                "attn_combine",
                &[REDUCE_WGSL, ATTN_MERGE_WGSL, ATTN_COMBINE_WGSL],
            )
            .flag_if(merge.store_kv, "KV_STORE"),
        ),
        &binds,
        [a.n_head, 1, 1],
    )
}

/// [`attention_combine`] and the one-token product of its output in one dispatch per weight
/// tile: each workgroup merges the partial results into its own memory (a few reads from
/// cache; a dispatch of its own costs a whole GPU round trip), and the first stores the
/// token's K and V. `w` takes the heads' output (`n_head * head_dim` values), which must fit
/// in a workgroup's memory ([`matvec_input_fits`]); `a.out` is not written.
pub fn matvec_after_attention(
    ctx: &GpuContext,
    w: &GpuWeight,
    merge: &AttentionMerge<'_>,
    y: &View,
    out_offset: u32,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let job = MatvecJob {
        merge: Some(merge),
        ..MatvecJob::one_token(w, merge.scratch, y, out_offset, out)?
    };
    matvec_dispatches(ctx, w, &job)
}

/// That the head work fused into [`attention_decode`] is [`head_post`]'s for its one token
/// and heads, on the projection `a` reads.
fn check_fused_heads(
    a: &AttentionArgs<'_>,
    q_offset: u32,
    h: &HeadPostArgs<'_>,
) -> Result<(), GpuError> {
    check_head_post(h)?;
    let kv_heads = h.kv.as_ref().map_or(a.n_kv_head, |kv| kv.n_kv);
    if h.tokens != 1 || h.n_head != a.n_head || h.head_dim != a.head_dim || kv_heads != a.n_kv_head
    {
        return Err(shape(format!(
            "attention_decode: head work for {} tokens, {} heads ({kv_heads} KV) of dim {}",
            h.tokens, h.n_head, h.head_dim
        )));
    }
    a.q.expect_len32(
        "attention qkv",
        u64::from(q_offset) + u64::from(head_post_width(h)),
    )
}

/// Capacity of the recent-token ring the penalties read (words: one count, then tokens).
pub const RING_CAP: u32 = 1024;

/// Settings of the GPU sampling kernels; rewritten each step (the step feeds the random
/// stream).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    pub k: u32,
    pub seed: u32,
    pub step: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub last_n: u32,
    pub penalties: PenaltyParams,
    pub vocab: u32,
}

impl SampleParams {
    pub fn params(&self) -> Params {
        Params::of(&SampleKernelParams {
            k: self.k,
            seed: self.seed,
            step: self.step,
            last_n: self.last_n.min(RING_CAP),
            temperature: self.temperature,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat: self.penalties.repeat,
            frequency: self.penalties.frequency,
            presence: self.penalties.presence,
            vocab: self.vocab,
            cap: RING_CAP,
        })
    }
}

/// Which of the sampling kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleKernel {
    /// Draw from top-k candidates into `result[0]`.
    Draw,
    /// Append `result[0]` to the ring.
    RingPush,
    /// Penalise the logits of the ring's recent tokens.
    PenaltyRing,
}

/// One of the GPU sampling kernels. `a` and `b` are, for `Draw`: the top-k output and the
/// result; for `RingPush`: the result and the ring; for `PenaltyRing`: the ring and the logits.
pub fn sample_kernel(
    ctx: &GpuContext,
    kind: SampleKernel,
    a: &View,
    b: &View,
    p: &SampleParams,
) -> Result<Dispatch, GpuError> {
    let (flag, label) = match kind {
        SampleKernel::Draw => {
            if p.k == 0 || p.k > TOPK_MAX {
                return Err(shape(format!("draw: k = {}", p.k)));
            }
            a.expect_len32("draw candidates", 2 * u64::from(p.k))?;
            ("DRAW", "sample_draw")
        }
        SampleKernel::RingPush => {
            b.expect_len32("ring", 1 + u64::from(RING_CAP))?;
            ("RING_PUSH", "ring_push")
        }
        SampleKernel::PenaltyRing => {
            a.expect_len32("ring", 1 + u64::from(RING_CAP))?;
            b.expect_len32("logits", u64::from(p.vocab))?;
            ("PENALTY_RING", "penalty_ring")
        }
    };
    ctx.dispatch(
        label,
        ctx.pipeline(&ShaderSource::new("sample", &[SAMPLE_WGSL]).flag(flag)),
        &[Bind::Storage(a), Bind::Storage(b), Bind::Params(p.params())],
        [1, 1, 1],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a device must bind for the experts' mix in front of a product and for routing
    /// inside one, as counted in the WGSL: a change here changes which devices run them.
    #[test]
    fn fused_expert_steps_bind_as_many_buffers_as_devices_are_asked_for() {
        assert_eq!(moe_delta_buffers(), 12);
        assert_eq!(routed_expert_buffers(), 8);
    }
}
