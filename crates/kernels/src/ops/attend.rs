//! Attention over key and value tensors (with or without a cache) under a mask mode: causal
//! with an optional window, full, DiffusionGemma's canvas, bidirectional spans (images), and
//! local (the audio conformer's chunked attention), with an optional relative-position term
//! and logit softcap. Grouped-query heads everywhere.

use super::*;

const ATTEND_MASK_WGSL: &str = include_str!("../wgsl/attend_mask.wgsl");
const ATTEND_WGSL: &str = include_str!("../wgsl/attend.wgsl");
const ATTEND_TILED_WGSL: &str = include_str!("../wgsl/attend_tiled.wgsl");
const ATTEND_COOP_WGSL: &str = include_str!("../wgsl/attend_coop.wgsl");

/// The largest head dimension the tiled kernel holds in registers.
pub const TILED_MAX_HEAD_DIM: u32 = 128;
/// Queries from which [`attend`] takes the tiled kernel (where it can).
pub const TILED_MIN_QUERIES: u32 = 32;
/// Queries a workgroup of the tiled kernel takes.
const TILED_BLOCK: u32 = 64;
/// The largest head dimension the cooperative-matrix kernel takes.
pub const COOP_MAX_HEAD_DIM: u32 = 80;

/// Query rows a workgroup of `attend_coop.wgsl` takes: eight subgroups of 16 (half with
/// `WGEMMA_ATTEND_BLOCK64`, its flag `BLOCK_64`).
const COOP_BLOCK: u32 = 128;

/// Workgroup memory of `attend_coop.wgsl` for heads of dimension `d` (at most
/// [`COOP_MAX_HEAD_DIM`]): two buffers of f16 key and value tiles (32 keys), each subgroup's
/// f32 scores and f16 weights, with their padded pitches.
fn coop_bytes(d: u32) -> u32 {
    let (dp, sp) = if d > 64 { (80, 32) } else { (64, 36) };
    4 * 32 * (dp + 8) * 2 + 8 * 16 * sp * 4 + 8 * 16 * 40 * 2
}

/// Switches of `attend_coop.wgsl`'s forms not yet timed on a GPU (see the kernel), each
/// setting one of its override constants: whole tiles unmasked, no loads into registers ahead,
/// scores read twice rather than held, the next tile's scores made before this tile's weights.
const COOP_EXPERIMENTS: [(&str, &str, f64); 4] = [
    ("WGEMMA_ATTEND_WHOLE_TILES", "WHOLE_TILES", 1.0),
    ("WGEMMA_ATTEND_NO_PREFETCH", "PREFETCH_TILES", 0.0),
    ("WGEMMA_ATTEND_TWO_PASS", "TWO_PASS_SCORES", 1.0),
    ("WGEMMA_ATTEND_K_AHEAD", "K_AHEAD", 1.0),
];

/// `attend_coop.wgsl` for heads of dimension `d` (the mask's flag still to add).
fn coop_source(d: u32) -> ShaderSource {
    ShaderSource::new("attend_coop", &[ATTEND_MASK_WGSL, ATTEND_COOP_WGSL])
        .flag("COOP")
        .flag_if(d > 64, "HEAD_DIM_80")
}

/// Whether rows of a head of `l` are contiguous and start on whole vec4s: 16-byte reads.
fn whole_vec4s(l: &Layout4) -> bool {
    l.strides[3] == 1
        && [l.offset, l.strides[1], l.strides[2]]
            .iter()
            .all(|x| x % 4 == 0)
}

/// Which kernel [`attend_with`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttendKernel {
    /// The tiled kernel for many queries where it can, else one workgroup per query.
    Auto,
    /// One workgroup per (query, head): keys split over its threads (few queries, long
    /// contexts, the relative-position term).
    PerQuery,
    /// One workgroup per (64 queries, head), keys through workgroup memory in tiles (many
    /// queries; head dimension up to [`TILED_MAX_HEAD_DIM`], no relative-position term).
    Tiled,
    /// On cooperative matrices: f16 products on tensor cores, f32 softmax and sums, each
    /// subgroup owning 16 query rows over every key, outputs kept in cooperative matrices
    /// (devices with `coop_matmul`; head dimension up to [`COOP_MAX_HEAD_DIM`], no
    /// relative-position term).
    Coop,
}

kernel_bindings!(
    /// `attend.wgsl`.
    AttendBindings { q: 0, k: 1, v: 2, o: 3, p: 4, span: 5, r: 6 }
);

/// Which keys a query sees. Positions: query row `i` is at `q_pos0 + i`, key `j` at `j`.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// Keys at or before the query, within `window` positions of it when given.
    Causal { window: Option<u32> },
    /// Every key.
    Full,
    /// Rows before `prefix` causal (windowed when `window` is given); rows from `prefix` on (the
    /// canvas) see every key from `prefix` on and the prefix's keys, only its last
    /// `window - 1` when `window` is given.
    Canvas { prefix: u32, window: Option<u32> },
    /// Causal (windowed when given), and bidirectional among the positions of one span: `span`
    /// holds a u32 per position, 0 outside every span, else the span's id.
    Spans {
        span: &'a Tensor,
        window: Option<u32>,
    },
    /// Keys with `-ahead <= query - key <= back`. Chunked local attention (queries in chunks,
    /// each seeing its chunk and `back` keys before it) masks the same keys when every query
    /// is limited to `back` keys back, as the audio conformer's is.
    Local { back: u32, ahead: u32 },
}

impl Mask<'_> {
    /// The flag and the (window, prefix, back, ahead) parameters: the one place a mask mode
    /// becomes WGSL.
    fn flag_and_params(&self) -> (&'static str, [u32; 4]) {
        let w = |window: &Option<u32>| window.unwrap_or(0);
        match self {
            Self::Causal { window } => ("CAUSAL", [w(window), 0, 0, 0]),
            Self::Full => ("FULL", [0; 4]),
            Self::Canvas { prefix, window } => ("CANVAS", [w(window), *prefix, 0, 0]),
            Self::Spans { window, .. } => ("SPANS", [w(window), 0, 0, 0]),
            Self::Local { back, ahead } => ("LOCAL", [0, 0, *back, *ahead]),
        }
    }
}

/// Inputs of [`attend`]. `q` is `[tq, heads, d]`, `k` and `v` `[tk, kv_heads, d]`, `out`
/// `[tq, heads, d]`, all of any layout; `relative`, `[rel_len, heads, d]`, adds `q . r[query -
/// key]` to the logit for distances below `rel_len`.
pub struct Attend<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub mask: Mask<'a>,
    /// Position of query row 0.
    pub q_pos0: u32,
    pub scale: f32,
    /// `c * tanh(logit / c)` when positive.
    pub softcap: f32,
    pub relative: Option<&'a Tensor>,
}

fn check_attend(a: &Attend<'_>, out: &Tensor) -> Result<(), GpuError> {
    // The inputs all f32, or all f16 (which only the tensor-core kernel reads).
    let inputs = if a.q.dtype() == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    for (what, t, dtype) in [
        ("q", a.q, inputs),
        ("k", a.k, inputs),
        ("v", a.v, inputs),
        ("out", out, DType::F32),
    ] {
        t.expect_dtype(what, dtype)?;
        if t.rank() != 3 {
            return Err(shape(format!("attend {what}: {:?} is not 3-D", t.dims())));
        }
    }
    let [tq, heads, d] = [a.q.dim(0), a.q.dim(1), a.q.dim(2)];
    let [tk, kv_heads] = [a.k.dim(0), a.k.dim(1)];
    a.k.expect_dims("attend k", &[tk, kv_heads, d])?;
    a.v.expect_dims("attend v", &[tk, kv_heads, d])?;
    out.expect_dims("attend out", &[tq, heads, d])?;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || d == 0 || d > MAX_HEAD_DIM {
        return Err(shape(format!(
            "attend: {heads} query heads over {kv_heads} KV heads of dimension {d} (at most {MAX_HEAD_DIM})"
        )));
    }
    if [a.q, a.k, a.v].iter().any(|t| t.shares_buffer(out)) {
        return Err(shape("attend: an input shares the output's buffer".into()));
    }
    if let Some(r) = a.relative {
        r.expect_dtype("attend relative", DType::F32)?;
        if r.rank() != 3 || r.dim(1) != heads || r.dim(2) != d {
            return Err(shape(format!(
                "attend relative: {:?}, expected [len, {heads}, {d}]",
                r.dims()
            )));
        }
    }
    if let Mask::Spans { span, .. } = a.mask {
        span.expect_dtype("attend spans", DType::U32)?;
        let positions = u64::from(a.q_pos0) + u64::from(tq);
        if span.rank() != 1
            || !span.is_contiguous()
            || u64::from(span.dim(0)) < positions.max(u64::from(tk))
        {
            return Err(shape(format!(
                "attend spans: {:?} for positions up to {}",
                span.dims(),
                positions.max(u64::from(tk))
            )));
        }
        if span.offset() != 0 {
            return Err(shape("attend spans: must start at its view".into()));
        }
    }
    Ok(())
}

/// The kernel `kernel` asks for, resolving [`AttendKernel::Auto`]: for many queries the
/// cooperative-matrix kernel where the device and the head allow, else the tiled one.
fn choose_kernel(
    ctx: &GpuContext,
    a: &Attend<'_>,
    kernel: AttendKernel,
) -> Result<AttendKernel, GpuError> {
    let d = a.q.dim(2);
    let tiles = a.relative.is_none() && d <= TILED_MAX_HEAD_DIM;
    let coop = coop_fits(ctx, d) && a.relative.is_none();
    if a.q.dtype() == DType::F16 {
        // Only the tensor-core kernel reads half floats.
        let wanted = matches!(kernel, AttendKernel::Auto | AttendKernel::Coop);
        if !(coop && wanted && a.q.dim(0) >= TILED_MIN_QUERIES) {
            return Err(shape(format!(
                "attend: f16 inputs need the cooperative-matrix kernel ({kernel:?} asked, {} queries, head dimension {d})",
                a.q.dim(0)
            )));
        }
        return Ok(AttendKernel::Coop);
    }
    match kernel {
        AttendKernel::Auto if a.q.dim(0) < TILED_MIN_QUERIES => Ok(AttendKernel::PerQuery),
        AttendKernel::Auto if coop => Ok(AttendKernel::Coop),
        AttendKernel::Auto if tiles => Ok(AttendKernel::Tiled),
        AttendKernel::Auto | AttendKernel::PerQuery => Ok(AttendKernel::PerQuery),
        AttendKernel::Tiled if tiles => Ok(AttendKernel::Tiled),
        AttendKernel::Coop if coop => Ok(AttendKernel::Coop),
        AttendKernel::Tiled => Err(shape(format!(
            "attend: the tiled kernel takes head dimensions up to {TILED_MAX_HEAD_DIM} and no relative term"
        ))),
        AttendKernel::Coop => Err(shape(format!(
            "attend: the cooperative-matrix kernel needs a device with them, head dimensions up to {COOP_MAX_HEAD_DIM} and no relative term"
        ))),
    }
}

/// Whether the cooperative-matrix kernel takes heads of dimension `d` on this device.
fn coop_fits(ctx: &GpuContext, d: u32) -> bool {
    ctx.features.coop_matmul
        && d <= COOP_MAX_HEAD_DIM
        && ctx.limits.max_compute_workgroup_storage_size >= coop_bytes(d)
}

/// The element type [`attend`] reads its inputs in best for `queries` queries over heads of
/// dimension `d` (without a relative term): f16 where the tensor-core kernel takes them (it
/// computes in f16: half the bytes, the same result), else f32.
pub fn attend_input_dtype(ctx: &GpuContext, queries: u32, d: u32) -> DType {
    if coop_fits(ctx, d) && queries >= TILED_MIN_QUERIES {
        DType::F16
    } else {
        DType::F32
    }
}

/// The attention dispatch, by the kernel that suits its size ([`AttendKernel::Auto`]).
pub fn attend(ctx: &GpuContext, a: &Attend<'_>, out: &Tensor) -> Result<Dispatch, GpuError> {
    attend_with(ctx, a, out, AttendKernel::Auto)
}

/// The attention dispatch by `kernel` (an error where the tiled kernel cannot take it).
pub fn attend_with(
    ctx: &GpuContext,
    a: &Attend<'_>,
    out: &Tensor,
    kernel: AttendKernel,
) -> Result<Dispatch, GpuError> {
    check_attend(a, out)?;
    let chosen = choose_kernel(ctx, a, kernel)?;
    let (flag, [window, prefix, back, ahead]) = a.mask.flag_and_params();
    let [ql, kl, vl, ol] = [a.q, a.k, a.v, out].map(Tensor::layout4);
    let rl = a.relative.map_or(ql, Tensor::layout4);
    let params = AttendParams {
        tq: a.q.dim(0),
        tk: a.k.dim(0),
        heads: a.q.dim(1),
        kv_heads: a.k.dim(1),
        d: a.q.dim(2),
        q_pos0: a.q_pos0,
        window,
        prefix,
        back,
        ahead,
        rel_len: a.relative.map_or(0, |r| r.dim(0)),
        scale: a.scale,
        softcap: a.softcap,
        q0: ql.strides[1],
        q1: ql.strides[2],
        q2: ql.strides[3],
        q_at: ql.offset,
        k0: kl.strides[1],
        k1: kl.strides[2],
        k2: kl.strides[3],
        k_at: kl.offset,
        v0: vl.strides[1],
        v1: vl.strides[2],
        v2: vl.strides[3],
        v_at: vl.offset,
        o0: ol.strides[1],
        o1: ol.strides[2],
        o2: ol.strides[3],
        o_at: ol.offset,
        r0: rl.strides[1],
        r1: rl.strides[2],
        r2: rl.strides[3],
        r_at: rl.offset,
    };
    let (label, source, items) = match chosen {
        AttendKernel::Coop => {
            // Four subgroups a workgroup (`WGEMMA_ATTEND_BLOCK64=1`, not yet timed): finer
            // steps of residency where registers hold one workgroup of eight but not two.
            let block64 = crate::knobs::on("WGEMMA_ATTEND_BLOCK64");
            let block = if block64 { COOP_BLOCK / 2 } else { COOP_BLOCK };
            let blocks = params.tq.div_ceil(block);
            let vec4 = params.d.is_multiple_of(4) && [kl, vl].iter().all(whole_vec4s);
            let mut source = coop_source(params.d)
                .flag_if(block64, "BLOCK_64")
                .flag_if(vec4, "KV_VEC4")
                .flag_if(a.q.dtype() == DType::F16, "QKV_F16");
            for (knob, constant, value) in COOP_EXPERIMENTS {
                if crate::knobs::on(knob) {
                    source = source.constant(constant, value);
                }
            }
            ("attend_coop", source, blocks * params.heads)
        }
        AttendKernel::Tiled => {
            let d4 = params.d.div_ceil(4);
            let source = ShaderSource::new("attend_tiled", &[ATTEND_MASK_WGSL, ATTEND_TILED_WGSL])
                .constant("D4", f64::from(d4))
                .flag_if(d4 == 16, "HEAD_DIM_64")
                .flag_if(d4 == 18, "HEAD_DIM_72");
            let blocks = params.tq.div_ceil(TILED_BLOCK);
            ("attend_tiled", source, blocks * params.heads)
        }
        AttendKernel::PerQuery | AttendKernel::Auto => {
            let source = ShaderSource::new("attend", &[REDUCE_WGSL, ATTEND_MASK_WGSL, ATTEND_WGSL]);
            ("attend", source, params.tq * params.heads)
        }
    };
    let source = source.flag(flag).flag_if(a.relative.is_some(), "RELATIVE");
    let span = match a.mask {
        Mask::Spans { span, .. } => Bind::Storage(span.view()),
        _ => Bind::Skip,
    };
    ctx.dispatch(
        label,
        ctx.pipeline(&source),
        AttendBindings {
            q: Bind::Storage(a.q.view()),
            k: Bind::Storage(a.k.view()),
            v: Bind::Storage(a.v.view()),
            o: Bind::Storage(out.view()),
            p: Bind::Params(Params::of(&params)),
            span,
            r: Bind::opt(a.relative.map(Tensor::view)),
        },
        grid(ctx, items, 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No device here has cooperative matrices (lavapipe, SwiftShader), so naga checks each
    /// variant of the cooperative-matrix kernel as a device with them would compile it.
    #[test]
    fn every_coop_variant_validates() {
        for mask in ["CAUSAL", "FULL", "CANVAS", "SPANS", "LOCAL"] {
            for d in [64, COOP_MAX_HEAD_DIM] {
                crate::shader::validate_coop(&coop_source(d).flag(mask));
                crate::shader::validate_coop(&coop_source(d).flag(mask).flag("KV_VEC4"));
                crate::shader::validate_coop(&coop_source(d).flag(mask).flag("BLOCK_64"));
                for vec4 in [false, true] {
                    let half = coop_source(d).flag(mask).flag("QKV_F16");
                    crate::shader::validate_coop(&half.clone().flag_if(vec4, "KV_VEC4"));
                    for (_, constant, value) in COOP_EXPERIMENTS {
                        let variant = half.clone().constant(constant, value);
                        crate::shader::validate_coop(&variant.flag_if(vec4, "KV_VEC4"));
                    }
                    let all = COOP_EXPERIMENTS
                        .iter()
                        .fold(half.clone(), |s, (_, c, v)| s.constant(c, *v));
                    crate::shader::validate_coop(&all.clone().flag_if(vec4, "KV_VEC4"));
                    crate::shader::validate_coop(&all.flag_if(vec4, "KV_VEC4").flag("BLOCK_64"));
                }
                assert!(coop_bytes(d) <= 48 * 1024);
            }
        }
    }
}
