//! The KV store and attention over the cache: batched (prefill), and split over key chunks then combined (decode).

use super::*;

kernel_bindings!(
    /// `kv_store.wgsl`.
    KvStoreBindings {
        src: 0,
        cache: 1,
        positions: 2,
        p: 3,
    }
);

kernel_bindings!(
    /// `attention.wgsl`.
    AttentionBindings {
        q: 0,
        kc: 1,
        vc: 2,
        positions: 3,
        out: 4,
        p: 5,
        last_key: 6,
        first_key: 7,
    }
);

kernel_bindings!(
    /// `attention_parts.wgsl`.
    AttentionPartsBindings {
        part: 0,
        out: 1,
        p: 2,
    }
);

kernel_bindings!(
    /// `attn_split.wgsl` (`q_norm`, `k_norm`, `ff` with HEAD_POST).
    AttnSplitBindings {
        q: 0,
        kc: 1,
        vc: 2,
        positions: 3,
        part: 4,
        p: 5,
        q_norm: 6,
        k_norm: 7,
        ff: 8,
    }
);

kernel_bindings!(
    /// `attn_combine.wgsl` (the caches with KV_STORE).
    AttnCombineBindings {
        part: 0,
        positions: 1,
        out: 2,
        p: 3,
        kc: 4,
        vc: 5,
    }
);

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
        KvStoreBindings {
            src: Bind::Storage(src),
            cache: Bind::Storage(cache),
            positions: Bind::Storage(positions),
            p: Bind::Params(params),
        },
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
    /// Per token, the last key position it sees when that lies past its own (a u32 each): an
    /// image's tokens see the rest of their image on Gemma 4 26B/31B's sliding layers. Those
    /// keys must be in the cache already (the whole image in this step or before).
    pub last_key: Option<&'a View>,
    /// Per token, the first key position it sees, in place of the window's reach (a u32
    /// each): a DiffusionGemma canvas row sees the same stretch of the prompt as every other
    /// canvas row. Prefill attention only.
    pub first_key: Option<&'a View>,
    /// Cache rows per sequence when the cache holds several (a batch of sequences' decode
    /// steps): a token at cache row `p` sees only the keys of rows `p - p % slot_rows ..`.
    /// 0: one sequence.
    pub slot_rows: u32,
}

/// Which kernel [`attention_with`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Tensor cores where [`coop_attention_takes`] the shape, else f32 FMAs.
    Auto,
    /// `attention.wgsl`: f32 FMAs, a workgroup's rows up to eight (query head, token) pairs
    /// of one KV head.
    Fma,
    /// `attention_coop.wgsl`: f16 products on cooperative matrices, blocks of 64 rows (32 for
    /// head dimensions past 256); an error where the device lacks them or the head dimension
    /// is not a whole number of 64s up to 512.
    Coop,
}

/// Causal attention over the KV cache (with `last_key`, also ahead within spans), the kernel
/// chosen by shape ([`AttentionKernel::Auto`]).
pub fn attention(ctx: &GpuContext, a: &AttentionArgs<'_>) -> Result<Dispatch, GpuError> {
    attention_with(ctx, a, AttentionKernel::Auto)
}

/// [`attention`] on the given kernel.
pub fn attention_with(
    ctx: &GpuContext,
    a: &AttentionArgs<'_>,
    kernel: AttentionKernel,
) -> Result<Dispatch, GpuError> {
    let params = attention_params(a)?;
    match kernel {
        AttentionKernel::Auto if ctx.coop_attention && coop_attention_takes(ctx, a) => {
            coop_dispatch(ctx, a, params)
        }
        AttentionKernel::Coop if coop_attention_fits(ctx, a.head_dim) => {
            coop_dispatch(ctx, a, params)
        }
        AttentionKernel::Coop => Err(shape(format!(
            "attention on cooperative matrices: head dim {} on a device {} them",
            a.head_dim,
            if ctx.features.coop_matmul {
                "with"
            } else {
                "without"
            }
        ))),
        AttentionKernel::Auto | AttentionKernel::Fma => fma_dispatch(ctx, a, params),
    }
}

fn fma_dispatch(
    ctx: &GpuContext,
    a: &AttentionArgs<'_>,
    params: Params,
) -> Result<Dispatch, GpuError> {
    let g = a.n_head / a.n_kv_head;
    let rows = attention_rows(ctx, g, a.tokens);
    let source = ShaderSource::new(
        "attention",
        &[ACTIVATIONS_WGSL, ATTENTION_KEYS_WGSL, ATTENTION_WGSL],
    )
    .constant("G", f64::from(g))
    .constant("R", f64::from(rows))
    .flag_if(a.last_key.is_some(), "SPANS")
    .flag_if(a.first_key.is_some(), "FIRST_KEYS");
    ctx.dispatch(
        "attention",
        ctx.pipeline(&source),
        attention_bindings(a, params),
        [a.n_kv_head, a.tokens.div_ceil(rows), 1],
    )
}

/// Rows (token, query head) a workgroup of `attention_coop.wgsl` takes for `head_dim`.
fn coop_block_rows(head_dim: u32) -> u32 {
    if head_dim > 256 { 32 } else { 64 }
}

/// Whether the device and head dimension suit `attention_coop.wgsl`.
fn coop_attention_fits(ctx: &GpuContext, head_dim: u32) -> bool {
    ctx.features.coop_matmul && head_dim.is_multiple_of(64) && head_dim <= 512
}

/// Whether [`attention`] takes the cooperative-matrix kernel for `a`: head dimensions of 128
/// and more (Gemma's 256 and 512, where the f32 kernel's few rows per workgroup read each
/// key and value many times over) with at least one full block of rows.
pub fn coop_attention_takes(ctx: &GpuContext, a: &AttentionArgs<'_>) -> bool {
    coop_attention_fits(ctx, a.head_dim)
        && a.head_dim >= 128
        && a.tokens * (a.n_head / a.n_kv_head.max(1)) >= coop_block_rows(a.head_dim)
}

fn coop_dispatch(
    ctx: &GpuContext,
    a: &AttentionArgs<'_>,
    params: Params,
) -> Result<Dispatch, GpuError> {
    ctx.dispatch(
        "attention_coop",
        ctx.pipeline(&coop_source(CoopVariant::of(a, false))),
        attention_bindings(a, params),
        coop_grid(a, 1),
    )
}

/// Workgroups of `attention_coop.wgsl` for `a` in `parts` parts over the keys.
fn coop_grid(a: &AttentionArgs<'_>, parts: u32) -> [u32; 3] {
    let g = a.n_head / a.n_kv_head;
    [
        a.n_kv_head,
        (a.tokens * g).div_ceil(coop_block_rows(a.head_dim)),
        parts,
    ]
}

/// Workgroups the cooperative-matrix attention wants before it splits over the keys: two
/// for each of the H200's 132 multiprocessors.
const ATTENTION_PARTS_FILL: u32 = 264;

/// The most parts [`attention_in_parts`] splits the keys into.
pub const MAX_ATTENTION_PARTS: u32 = 4;

/// Floats of scratch [`attention_in_parts`] needs for `tokens` tokens: each part's output and
/// its rows' largest scores and sums.
pub fn attention_parts_floats(tokens: u32, n_head: u32, head_dim: u32) -> u64 {
    u64::from(MAX_ATTENTION_PARTS) * u64::from(tokens) * u64::from(n_head) * u64::from(head_dim + 2)
}

/// Parts over the keys for `a` on cooperative matrices: enough for [`ATTENTION_PARTS_FILL`]
/// workgroups, at most [`MAX_ATTENTION_PARTS`] (the context's where it names them).
fn attention_parts(ctx: &GpuContext, a: &AttentionArgs<'_>) -> u32 {
    let [heads, blocks, _] = coop_grid(a, 1);
    let want = ATTENTION_PARTS_FILL.div_ceil((heads * blocks).max(1));
    ctx.attention_parts
        .unwrap_or(want)
        .clamp(1, MAX_ATTENTION_PARTS)
}

/// [`attention`], split over the keys into parts whose outputs a second dispatch combines
/// where the cooperative-matrix kernel's blocks alone would leave most of the GPU idle (a
/// DiffusionGemma canvas) and `scratch` holds [`attention_parts_floats`].
pub fn attention_in_parts(
    ctx: &GpuContext,
    a: &AttentionArgs<'_>,
    scratch: &View,
) -> Result<Vec<Dispatch>, GpuError> {
    // Checked first: the parts divide by the KV heads.
    let params = attention_params(a)?;
    let parts = attention_parts(ctx, a);
    let fits = scratch.len32() >= attention_parts_floats(a.tokens, a.n_head, a.head_dim);
    if !(ctx.coop_attention && coop_attention_takes(ctx, a)) || parts == 1 || !fits {
        return Ok(vec![attention(ctx, a)?]);
    }
    let split = ctx.dispatch(
        "attention_coop",
        ctx.pipeline(&coop_source(CoopVariant::of(a, true))),
        AttentionBindings {
            out: Bind::Storage(scratch),
            ..attention_bindings(a, params)
        },
        coop_grid(a, parts),
    )?;
    let combine = attention_parts_combine(
        ctx,
        scratch,
        a.out,
        AttentionPartsParams {
            rows: a.tokens * a.n_head,
            head_dim: a.head_dim,
            parts,
        },
    )?;
    Ok(vec![split, combine])
}

/// `attention_parts.wgsl`: the rows of `out` from the parts in `scratch` (each part's `rows`
/// x `head_dim` outputs, then per part and row its largest score and sum).
pub fn attention_parts_combine(
    ctx: &GpuContext,
    scratch: &View,
    out: &View,
    shape: AttentionPartsParams,
) -> Result<Dispatch, GpuError> {
    let outputs = u64::from(shape.rows) * u64::from(shape.head_dim);
    scratch.expect_len32(
        "attention parts",
        u64::from(shape.parts) * (outputs + 2 * u64::from(shape.rows)),
    )?;
    out.expect_len32("attention out", outputs)?;
    ctx.dispatch(
        "attention_parts",
        ctx.pipeline(&ShaderSource::new(
            "attention_parts",
            &[ATTENTION_PARTS_WGSL],
        )),
        AttentionPartsBindings {
            part: Bind::Storage(scratch),
            out: Bind::Storage(out),
            p: Bind::Params(Params::of(&shape)),
        },
        grid(ctx, (outputs as u32).div_ceil(256), 1),
    )
}

/// What an `attention_coop.wgsl` pipeline is built for.
struct CoopVariant {
    head_dim: u32,
    /// Query heads per KV head.
    group: u32,
    spans: bool,
    first_keys: bool,
    /// Split over the keys (`PARTS`).
    parts: bool,
}

impl CoopVariant {
    fn of(a: &AttentionArgs<'_>, parts: bool) -> Self {
        Self {
            head_dim: a.head_dim,
            group: a.n_head / a.n_kv_head,
            spans: a.last_key.is_some(),
            first_keys: a.first_key.is_some(),
            parts,
        }
    }
}

fn coop_source(v: CoopVariant) -> ShaderSource {
    ShaderSource::new(
        "attention_coop",
        &[ACTIVATIONS_WGSL, ATTENTION_KEYS_WGSL, ATTENTION_COOP_WGSL],
    )
    .flag("COOP")
    .flag_if(coop_block_rows(v.head_dim) == 32, "HEAD_DIM_512")
    .constant("G", f64::from(v.group))
    .constant("DCH", f64::from(v.head_dim / 64))
    .flag_if(v.spans, "SPANS")
    .flag_if(v.first_keys, "FIRST_KEYS")
    .flag_if(v.parts, "PARTS")
}

fn attention_bindings<'a>(a: &AttentionArgs<'a>, params: Params) -> AttentionBindings<'a> {
    AttentionBindings {
        q: Bind::Storage(a.q),
        kc: Bind::Storage(a.k_cache),
        vc: Bind::Storage(a.v_cache),
        positions: Bind::Storage(a.positions),
        out: Bind::Storage(a.out),
        p: Bind::Params(params),
        last_key: Bind::opt(a.last_key),
        first_key: Bind::opt(a.first_key),
    }
}

/// `a` checked against its buffers, as the kernels' parameters.
fn attention_params(a: &AttentionArgs<'_>) -> Result<Params, GpuError> {
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
    for (what, keys) in [("last", a.last_key), ("first", a.first_key)] {
        if let Some(k) = keys {
            k.expect_len32(&format!("attention {what} keys"), u64::from(a.tokens))?;
        }
    }
    let row = u64::from(a.n_kv_head) * u64::from(a.head_dim);
    let capacity = a.k_cache.len32() / row;
    if capacity == 0 || a.v_cache.len32() / row != capacity {
        return Err(shape(
            "attention: K and V caches differ or are empty".into(),
        ));
    }
    Ok(Params::of(&AttentionParams {
        n_head: a.n_head,
        n_kv_head: a.n_kv_head,
        head_dim: a.head_dim,
        m: a.tokens,
        window: a.window,
        scale: a.scale,
        softcap: a.softcap,
        capacity: capacity as u32,
        q_stride: a.q_stride,
        slot_rows: a.slot_rows,
    }))
}

/// Tokens a workgroup of [`attention`] takes with `g` query heads per KV head: as many as
/// fill its eight heads (each key and value then read once for all of them), no more than
/// there are tokens; [`crate::ContextOptions::attention_rows`] where set.
fn attention_rows(ctx: &GpuContext, g: u32, tokens: u32) -> u32 {
    let fill = ctx.attention_rows.unwrap_or(MAX_QUERY_GROUP / g);
    let most = (MAX_QUERY_GROUP / g).min(fill).max(1);
    // A power of two no larger than the tokens: fewer pipeline variants, none idle.
    let mut r = 1;
    while r * 2 <= most && r * 2 <= tokens {
        r *= 2;
    }
    r
}

/// Keys per workgroup of the split decode attention.
pub const ATTN_CHUNK: u32 = 64;

/// The two dispatches of decode attention: per-chunk partial results, then their merge.
pub struct DecodeAttention {
    pub split: Dispatch,
    pub combine: Dispatch,
}

impl DecodeAttention {
    /// Floats of scratch the partial results need for one token over `capacity` keys (for
    /// `tokens` tokens of a cache of several sequences, pass each sequence's slot: its rows
    /// and the token count, [`DecodeAttention::scratch_floats_for`]).
    pub fn scratch_floats(n_head: u32, head_dim: u32, capacity: u32) -> u64 {
        Self::scratch_floats_for(n_head, head_dim, capacity, 1)
    }

    /// Floats of scratch the partial results of `tokens` tokens need, each seeing at most
    /// `keys` keys.
    pub fn scratch_floats_for(n_head: u32, head_dim: u32, keys: u32, tokens: u32) -> u64 {
        // Per token, head and chunk, the chunk's output, then its max and sum in a vec4; then
        // room for each token's K and V on their way to the cache (at most one pair per query
        // head).
        let chunks = u64::from(tokens) * u64::from(n_head) * u64::from(keys.div_ceil(ATTN_CHUNK));
        chunks * u64::from(head_dim + 4)
            + 2 * u64::from(tokens) * u64::from(n_head) * u64::from(head_dim)
    }
}

/// Attention of one token's queries (at `positions[0]`) over the cache, split over chunks of
/// keys. `q` starts `q_offset` floats into `a.q`; `a.tokens` must be 1, or the tokens of
/// several sequences' decode steps (`a.slot_rows` > 0).
///
/// With `post`, the split kernel also does [`head_post`]'s work for the tokens, one dispatch
/// fewer: `a.q` is then the raw projection `post.qkv` (left as it is), and where `post.kv` is
/// given its caches must be `a`'s (the merge stores the tokens' K and V there for later
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
#[derive(Clone, Copy)]
pub struct AttentionMerge<'a> {
    pub(super) attention: &'a AttentionArgs<'a>,
    pub(super) scratch: &'a View,
    /// The split left the token's K and V in the scratch for the merge to store.
    pub(super) store_kv: bool,
    pub(super) capacity: u32,
    /// Chunks of keys per query head the scratch has room for.
    pub(super) max_chunks: u32,
}

impl AttentionMerge<'_> {
    /// The same merge leaving the caches alone: for a second product that merges the same
    /// chunks after one that stored the token's K and V.
    pub fn without_kv_store(&self) -> Self {
        Self {
            store_kv: false,
            ..*self
        }
    }
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
    let rows_ok = a.tokens == 1 || a.slot_rows > 0;
    if !rows_ok
        || a.first_key.is_some()
        || post.is_some_and(|h| h.slot_rows != a.slot_rows)
        || a.head_dim > MAX_HEAD_DIM
        || !a.head_dim.is_multiple_of(4)
        || a.n_kv_head == 0
        || !a.n_head.is_multiple_of(a.n_kv_head)
    {
        return Err(shape(format!(
            "attention_decode: {} tokens, {} heads over {} KV heads of dim {}, {} rows a slot",
            a.tokens, a.n_head, a.n_kv_head, a.head_dim, a.slot_rows
        )));
    }
    let heads = u64::from(a.n_head * a.head_dim);
    a.q.expect_len32(
        "attention q",
        u64::from(q_offset) + u64::from(a.tokens - 1) * u64::from(a.q_stride) + heads,
    )?;
    a.out
        .expect_len32("attention out", u64::from(a.tokens) * heads)?;
    a.positions
        .expect_len32("attention positions", u64::from(a.tokens))?;
    let row = u64::from(a.n_kv_head * a.head_dim);
    let capacity = (a.k_cache.len32() / row) as u32;
    if capacity == 0 || a.v_cache.len32() / row != u64::from(capacity) {
        return Err(shape(
            "attention: K and V caches differ or are empty".into(),
        ));
    }
    // A token sees at most its own slot's keys.
    let keys = if a.slot_rows > 0 {
        a.slot_rows.min(capacity)
    } else {
        capacity
    };
    scratch.expect_len32(
        "attention scratch",
        DecodeAttention::scratch_floats_for(a.n_head, a.head_dim, keys, a.tokens),
    )?;
    let max_chunks = keys.div_ceil(ATTN_CHUNK);
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
        q_stride: a.q_stride,
        slot_rows: a.slot_rows,
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
            ATTN_MERGE_WGSL,
            ATTN_SPLIT_WGSL,
        ]
    } else {
        &[
            ACTIVATIONS_WGSL,
            REDUCE_WGSL,
            ATTN_MERGE_WGSL,
            ATTN_SPLIT_WGSL,
        ]
    };
    let mut source = ShaderSource::new("attn_split", parts).constant("HD", f64::from(a.head_dim));
    let mut binds = AttnSplitBindings {
        q: Bind::Storage(a.q),
        kc: Bind::Storage(a.k_cache),
        vc: Bind::Storage(a.v_cache),
        positions: Bind::Storage(a.positions),
        part: Bind::Storage(scratch),
        p: Bind::Params(params),
        q_norm: Bind::Skip,
        k_norm: Bind::Skip,
        ff: Bind::Skip,
    };
    if let Some(h) = post {
        check_fused_heads(a, q_offset, h)?;
        let kv = h.kv.as_ref();
        source = source
            .flag("HEAD_POST")
            .flag_if(kv.is_some(), "KV_NEW")
            .flag_if(kv.is_some_and(|kv| kv.k_is_v), "K_IS_V")
            .flag_if(kv.is_some_and(|kv| kv.v_norm), "V_NORM")
            .flag_if(h.freq_factors.is_some(), "FREQ_FACTORS");
        binds.q_norm = Bind::Storage(h.q_norm);
        binds.k_norm = Bind::Storage(kv.map_or(h.q_norm, |kv| kv.k_norm));
        binds.ff = Bind::opt(h.freq_factors);
    }
    let split = ctx.dispatch(
        "attn_split",
        ctx.pipeline(&source),
        binds,
        [a.n_head, chunks, a.tokens],
    )?;
    let merge = AttentionMerge {
        attention: a,
        scratch,
        store_kv: post.is_some_and(|h| h.kv.is_some()),
        capacity,
        max_chunks,
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
        max_chunks: merge.max_chunks,
        capacity: merge.capacity,
        slot_rows: a.slot_rows,
    });
    let kv = |v| {
        if merge.store_kv {
            Bind::Storage(v)
        } else {
            Bind::Skip
        }
    };
    let binds = AttnCombineBindings {
        part: Bind::Storage(merge.scratch),
        positions: Bind::Storage(a.positions),
        out: Bind::Storage(a.out),
        p: Bind::Params(params),
        kc: kv(a.k_cache),
        vc: kv(a.v_cache),
    };
    ctx.dispatch(
        "attn_combine",
        ctx.pipeline(
            &ShaderSource::new(
                "attn_combine",
                &[REDUCE_WGSL, ATTN_MERGE_WGSL, ATTN_COMBINE_WGSL],
            )
            .flag_if(merge.store_kv, "KV_STORE"),
        ),
        binds,
        [a.n_head, a.tokens, 1],
    )
}

/// [`attention_combine`] and the one-token product of its output in one dispatch per weight
/// tile: each workgroup merges the partial results into its own memory (a few reads from
/// cache; a dispatch of its own costs a whole GPU round trip), and the first stores the
/// token's K and V. `w` takes the heads' output (`n_head * head_dim` values), which must fit
/// in a workgroup's memory ([`matvec_input_fits`]); `a.out` is not written.
pub fn matvec_after_attention<'a>(
    ctx: &GpuContext,
    w: &GpuWeight,
    merge: &AttentionMerge<'a>,
    y: &'a View,
    out_offset: u32,
    out: impl Into<Epilogue<'a>>,
) -> Result<Vec<Dispatch>, GpuError> {
    let job = MatvecJob {
        merge: Some(merge),
        ..MatvecJob::one_token(w, merge.scratch, y, out_offset, out.into())?
    };
    matvec_dispatches(ctx, w, &job)
}

/// That the head work fused into [`attention_decode`] is [`head_post`]'s for its tokens and
/// heads, on the projection `a` reads (token rows as far apart).
fn check_fused_heads(
    a: &AttentionArgs<'_>,
    q_offset: u32,
    h: &HeadPostArgs<'_>,
) -> Result<(), GpuError> {
    check_head_post(h)?;
    let kv_heads = h.kv.as_ref().map_or(a.n_kv_head, |kv| kv.n_kv);
    if h.tokens != a.tokens
        || (a.tokens > 1 && h.stride != a.q_stride)
        || h.n_head != a.n_head
        || h.head_dim != a.head_dim
        || kv_heads != a.n_kv_head
    {
        return Err(shape(format!(
            "attention_decode: head work for {} tokens {} apart, {} heads ({kv_heads} KV) of dim {}",
            h.tokens, h.stride, h.n_head, h.head_dim
        )));
    }
    a.q.expect_len32(
        "attention qkv",
        u64::from(q_offset)
            + u64::from(a.tokens.max(1) - 1) * u64::from(a.q_stride)
            + u64::from(head_post_width(h)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cooperative-matrix attention's variants as a device with them compiles them.
    #[test]
    fn coop_attention_variants_validate() {
        for (head_dim, group, spans, first_keys, parts) in [
            (256, 2, false, false, true),
            (512, 8, false, true, true),
            (128, 4, true, false, false),
            (64, 1, true, true, false),
        ] {
            crate::shader::validate_coop(&coop_source(CoopVariant {
                head_dim,
                group,
                spans,
                first_keys,
                parts,
            }));
        }
    }
}
