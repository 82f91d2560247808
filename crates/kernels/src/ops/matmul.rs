//! Products of a stored weight and many tokens: the tiled kernels (plain, cooperative-matrix, split over k).

use super::*;

kernel_bindings!(
    /// `matmul.wgsl` and `matmul_coop.wgsl` (with `matmul_io.wgsl`); `groups` for the
    /// experts' products.
    MatmulBindings { w: 0 = ["w", "w4"], x: 1, y: 2, p: 3, groups: 4, by: 5 }
);

kernel_bindings!(
    /// `matmul_parts.wgsl`.
    MatmulPartsBindings { part: 0, y: 1, p: 2 }
);

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
/// on this device ([`MatmulRouting`]).
pub fn matvec_max_tokens(ctx: &GpuContext) -> u32 {
    MatmulRouting::of(ctx).matvec_max_tokens
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

/// [`matmul`], but a few tokens of a K-quant take the few-token kernel ([`few_tokens_max`]):
/// their inputs rounded to 8-bit integers, the tokens sharing each weight load. For several
/// sequences' decode steps, whose rows are independent tokens.
pub fn matmul_few_tokens(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    if !takes_few_tokens(ctx, w, a) {
        return matmul(ctx, w, a);
    }
    check_product(w, a, a.out.is_geglu())?;
    few_token_products(ctx, w, a)
}

/// Ranges a product's inputs and outputs are clamped to: `y = clamp(W clamp(x))`, as the
/// vision tower's clamped linears compute (each bound only where given).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProductClamp {
    pub input: Option<[f32; 2]>,
    pub output: Option<[f32; 2]>,
}

/// [`matmul`] with its input and output clamped, inside the product's loads and stores: the
/// tiled kernel whatever the token count, split over k where its tiles alone would leave most
/// of the GPU idle and `a.partials` is given (the output clamp then applies to the parts'
/// sum). Plain rows, or a gate times another factor ([`MatvecOut::GeluTimes`], whose `by`
/// is read in y's layout: `by[t * y_stride + offset + r]`, `offset` the output's; never
/// split).
pub fn matmul_clamped(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
    clamp: ProductClamp,
) -> Result<Vec<Dispatch>, GpuError> {
    let gelu_times = matches!(a.out, MatvecOut::GeluTimes { .. });
    if clamp == ProductClamp::default() && !gelu_times {
        return matmul(ctx, w, a);
    }
    let parts = match a.partials {
        Some(_) if !gelu_times => matmul_parts(ctx, w.cols as u32, w.rows, a.m, false),
        _ => 1,
    };
    matmul_clamped_in_parts(ctx, w, a, clamp, parts)
}

/// [`matmul_clamped`] split over k into `parts` parts (for tests; 1: not split): the input
/// clamp applies as each part loads its inputs, the output clamp to the sum of the parts.
pub fn matmul_clamped_in_parts(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
    clamp: ProductClamp,
    parts: u32,
) -> Result<Vec<Dispatch>, GpuError> {
    let softcap = match a.out {
        MatvecOut::Rows { softcap } => softcap,
        MatvecOut::GeluTimes { .. } => 0.0,
        _ => {
            return Err(shape(format!(
                "{}: a clamped product writes plain rows or a gate, not {:?}",
                w.name, a.out
            )));
        }
    };
    let bad = |r: Option<[f32; 2]>| r.is_some_and(|[lo, hi]| lo.is_nan() || hi.is_nan() || lo > hi);
    if bad(clamp.input) || bad(clamp.output) {
        return Err(shape(format!("{}: clamp ranges {clamp:?}", w.name)));
    }
    check_product(w, a, false)?;
    if a.m == 0 {
        return Ok(Vec::new());
    }
    let steps = (w.cols as u32).div_ceil(64);
    let per = steps.div_ceil(parts.max(1)).max(1);
    if parts > 1 && steps.div_ceil(per) != parts {
        return Err(shape(format!(
            "{}: {parts} parts over {steps} steps of k",
            w.name
        )));
    }
    tiled_products(
        ctx,
        w,
        a,
        Tiled {
            per,
            parts: parts.max(1),
            softcap,
            clamp,
        },
    )
}

/// Rows of a tiled product's workgroup as the split over k counts them: 128 on cooperative
/// matrices, 64 otherwise (64 tokens either way; the integer-dot tiles of 128 rows,
/// `WGEMMA_INT8_ROWS=128`, count as two: [`TiledKernel::rows`] is what a dispatch takes).
pub(super) fn matmul_tile_rows(ctx: &GpuContext) -> u64 {
    if ctx.features.coop_matmul { 128 } else { 64 }
}

/// The tiles of a plain product on cooperative matrices (`matmul_coop.wgsl`), both 128 weight
/// rows wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopTile {
    /// 16 tokens, eight subgroups of 16 tokens x 16 rows (`SMALL_TILES`): a quarter of the
    /// input loads and products of a step, for a few tokens.
    Tokens16,
    /// 64 tokens, eight subgroups of 32 tokens x 32 rows.
    Tokens64,
    /// 128 tokens, eight subgroups of 32 x 64 (`TOKENS_128`): fewer fragment loads per
    /// product and half the weight conversions, but half the workgroups.
    Tokens128,
}

/// The fewest workgroups (tiles times parts over k) for which [`CoopTile::Tokens128`] beats
/// 64-token tiles. On the H200 it was faster at 120 (E2B's vision tower's 768-row products
/// over a 273-token image), slower at 48 and 64 (the audio tower's 1024-row products over a
/// 30 s chunk; 2048 rows over 512 tokens unsplit), level at 192 (benches/RESULTS.md).
const TOKENS_128_MIN_WORKGROUPS: u64 = 112;

/// Slots per expert on average up to which the grouped experts' products take 16-slot tiles
/// (`Tiles::for_experts`): between 8 (faster in 16-slot tiles) and 16 (faster in 64-slot
/// tiles), both measured (benches/RESULTS.md, eleventh and twenty-seventh sessions).
pub const FEW_SLOTS_PER_EXPERT: u32 = 12;

/// Slots per expert on average up to which (past [`FEW_SLOTS_PER_EXPERT`]) the grouped
/// experts' products take 32-slot tiles: a DiffusionGemma canvas's 16 were faster in them
/// than in 64-slot tiles (benches/RESULTS.md, thirty-sixth session); 32 is not measured.
pub const SOME_SLOTS_PER_EXPERT: u32 = 24;

impl CoopTile {
    /// The tile named by its tokens, `16`, `64` or `128` (`WGEMMA_COOP_TILE`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "16" => Some(Self::Tokens16),
            "64" => Some(Self::Tokens64),
            "128" => Some(Self::Tokens128),
            _ => None,
        }
    }

    /// Tokens a tile takes.
    pub fn tokens(self) -> u32 {
        match self {
            Self::Tokens16 => 16,
            Self::Tokens64 => 64,
            Self::Tokens128 => 128,
        }
    }

    /// The tile of a plain product of `rows` rows over `m` tokens in `parts` parts over k:
    /// the context's where it names one; 16 tokens for a few
    /// ([`MatmulRouting::small_tile_max_tokens`]); otherwise 128 tokens where those tiles are
    /// [`TOKENS_128_MIN_WORKGROUPS`] or more; 64 where the device lacks the workgroup
    /// memory for 128.
    pub fn of(ctx: &GpuContext, rows: u64, m: u32, parts: u32) -> Self {
        let room_for_128 = ctx.limits.max_compute_workgroup_storage_size >= COOP_MATMUL_128_BYTES;
        let tile = match ctx.coop_tile {
            Some(t) => t,
            None if m <= MatmulRouting::of(ctx).small_tile_max_tokens => Self::Tokens16,
            None => {
                let workgroups = rows.div_ceil(128) * u64::from(m.div_ceil(128)) * u64::from(parts);
                if workgroups >= TOKENS_128_MIN_WORKGROUPS {
                    Self::Tokens128
                } else {
                    Self::Tokens64
                }
            }
        };
        if tile == Self::Tokens128 && !room_for_128 {
            Self::Tokens64
        } else {
            tile
        }
    }
}

/// Tokens a tile of a plain product over `m` tokens takes where the device can run them
/// ([`CoopTile`]), for the split over k: 16 for a few tokens, else the 128-token tile, which
/// the split then gives workgroups enough.
fn split_tile_tokens(ctx: &GpuContext, m: u32) -> u32 {
    if !ctx.features.coop_matmul {
        return 64;
    }
    match ctx.coop_tile {
        Some(t) => t.tokens(),
        None if m <= MatmulRouting::of(ctx).small_tile_max_tokens => 16,
        None if ctx.limits.max_compute_workgroup_storage_size >= COOP_MATMUL_128_BYTES => 128,
        None => 64,
    }
}

/// Parts over k that [`matmul`] splits a tiled product of `rows` rows of `k` values over `m`
/// tokens into: 1 where its tiles fill the device, or where the tokens go through
/// matrix-vector products; otherwise enough parts for the routing's target of workgroups,
/// each of at least its fewest steps ([`MatmulRouting`]).
pub fn matmul_parts(ctx: &GpuContext, k: u32, rows: u64, m: u32, geglu: bool) -> u32 {
    let r = MatmulRouting::for_tokens(ctx, m);
    if geglu || m <= r.matvec_max_tokens {
        return 1;
    }
    let tiles =
        rows.div_ceil(matmul_tile_rows(ctx)) * u64::from(m.div_ceil(split_tile_tokens(ctx, m)));
    if tiles >= r.fill {
        return 1;
    }
    let steps = u64::from(k.div_ceil(64));
    let parts = r.target.div_ceil(tiles).min(steps / r.min_steps).max(1);
    // Equal parts of whole steps; the last may be shorter.
    let per = steps.div_ceil(parts);
    steps.div_ceil(per) as u32
}

/// Floats of [`MatmulArgs::partials`] that [`matmul`] needs for `w` over up to `max_m` tokens
/// (0 where it never splits).
pub fn matmul_partials_floats(ctx: &GpuContext, w: &GpuWeight, max_m: u32) -> u64 {
    // Every count of a few rows (their rule differs), then whole 128-token tiles' counts.
    let few = 1..=max_m.min(MatmulRouting::FEW_ROWS_MAX);
    let tiles = (1..=max_m.div_ceil(64)).map(|t| (64 * t).min(max_m));
    few.chain(tiles)
        .map(
            |m| match matmul_parts(ctx, w.cols as u32, w.rows, m, false) {
                1 => 0,
                parts => u64::from(parts) * u64::from(m) * w.rows,
            },
        )
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
    let k = w.cols as u32;
    if a.m == 0 {
        return Ok(Vec::new());
    }
    let (geglu, softcap) = match a.out {
        MatvecOut::Rows { softcap } => (false, softcap),
        MatvecOut::Geglu | MatvecOut::GegluInt8 => (true, 0.0),
        MatvecOut::GeluTimes { .. } => (false, 0.0),
    };
    check_product(w, a, geglu)?;
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
    if parts > 1 && (geglu || steps.div_ceil(per) != parts) {
        return Err(shape(format!(
            "{}: {parts} parts over {steps} steps of k, output {:?}",
            w.name, a.out
        )));
    }
    let clamp = ProductClamp::default();
    tiled_products(
        ctx,
        w,
        a,
        Tiled {
            per,
            parts: parts.max(1),
            softcap,
            clamp,
        },
    )
}

/// The strides and lengths of `a` for `w`, and whole gate/up pairs for a gated output.
fn check_product(w: &GpuWeight, a: &MatmulArgs<'_>, geglu: bool) -> Result<(), GpuError> {
    let (k, n) = (w.cols as u32, w.rows as u32);
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
    if a.m == 0 {
        return Ok(());
    }
    a.x.expect_len32(
        &w.name,
        u64::from(a.m - 1) * u64::from(a.x_stride) + u64::from(k),
    )?;
    a.y.expect_len32(
        &w.name,
        u64::from(a.m - 1) * u64::from(a.y_stride) + u64::from(a.y_offset + cols),
    )
}

/// How [`tiled_products`] runs: `parts` parts over k of `per` steps each, the softcap of
/// the output rows, and the clamps.
struct Tiled {
    per: u32,
    parts: u32,
    softcap: f32,
    clamp: ProductClamp,
}

/// The tiled kernel's dispatches, one per weight tile, and (split over k) the sum of the
/// parts.
fn tiled_products(
    ctx: &GpuContext,
    w: &GpuWeight,
    a: &MatmulArgs<'_>,
    t: Tiled,
) -> Result<Vec<Dispatch>, GpuError> {
    let (k, n) = (w.cols as u32, w.rows as u32);
    let (parts, softcap) = (t.parts, t.softcap);
    let geglu = a.out.is_geglu();
    let split = parts > 1;
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
    let tile = CoopTile::of(ctx, u64::from(n), a.m, parts);
    let tile_tokens = if ctx.features.coop_matmul {
        tile.tokens()
    } else {
        64
    };
    let clamped = t.clamp != ProductClamp::default();
    let by = match a.out {
        MatvecOut::GeluTimes { by, offset } if !split && offset == a.y_offset => Some(by),
        MatvecOut::GeluTimes { .. } => {
            return Err(shape(format!(
                "{}: a gate's other factor is read in the output's layout, unsplit",
                w.name
            )));
        }
        _ => None,
    };
    if let Some(by) = by {
        let last = u64::from(a.m - 1) * u64::from(a.y_stride) + u64::from(a.y_offset + n);
        by.expect_len32(&w.name, last)?;
    }
    let kernel = TiledKernel {
        gelu_times: by.is_some(),
        ..TiledKernel::of(ctx, w, geglu, Tiles::Plain(tile), clamped)
    };
    let tile_rows = kernel.rows(ctx.features.coop_matmul);
    let pipeline = tiled_pipeline(ctx, kernel)?;
    let open = [f32::NEG_INFINITY, f32::INFINITY];
    let [in_min, in_max] = t.clamp.input.unwrap_or(open);
    let [out_min, out_max] = t.clamp.output.unwrap_or(open);
    // Split, the parts are written whole and the output clamp goes to their sum.
    let [tile_out_min, tile_out_max] = if split { open } else { [out_min, out_max] };
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
                k_part: t.per * 64,
                part_stride: if split { part_floats as u32 } else { 0 },
                // Not experts: one slot per input row.
                x_group: 1,
                in_min,
                in_max,
                out_min: tile_out_min,
                out_max: tile_out_max,
                ..MatmulParams::default()
            });
            let wv = View::of(&tile.buffer);
            ctx.dispatch(
                "matmul",
                pipeline.clone(),
                MatmulBindings {
                    w: Bind::Storage(&wv),
                    x: Bind::Storage(a.x),
                    y: Bind::Storage(y),
                    p: Bind::Params(params),
                    groups: Bind::Skip,
                    by: Bind::opt(by),
                },
                [rows.div_ceil(tile_rows), a.m.div_ceil(tile_tokens), parts],
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
            out_min,
            out_max,
        });
        let source = ShaderSource::new("matmul_parts", &[ACTIVATIONS_WGSL, MATMUL_PARTS_WGSL])
            .flag_if(t.clamp.output.is_some(), "CLAMPED");
        dispatches.push(ctx.dispatch(
            "matmul_parts",
            ctx.pipeline(&source),
            MatmulPartsBindings {
                part: Bind::Storage(v),
                y: Bind::Storage(a.y),
                p: Bind::Params(params),
            },
            grid(ctx, (part_floats as u32).div_ceil(256), 1),
        )?);
    }
    Ok(dispatches)
}

/// Which tiled products a pipeline runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tiles {
    /// One weight over the tokens in order, in tiles of this shape on cooperative matrices.
    Plain(CoopTile),
    /// The grouped experts' products, 64 slots of an expert a tile.
    Experts,
    /// The same, 16 slots a tile (`SMALL_TILES`, tensor cores only).
    FewSlotExperts,
    /// The same, 32 slots a tile (`TOKENS_32`, tensor cores only).
    SomeSlotExperts,
}

impl Tiles {
    /// The grouped experts' tiles for `slots` slots over `n_expert` experts on tensor cores:
    /// 16-slot tiles when the experts average at most [`FEW_SLOTS_PER_EXPERT`] slots (a
    /// short prompt: 128 tokens give 26B-A4B's 128 experts 8 each), 32-slot ones up to
    /// [`SOME_SLOTS_PER_EXPERT`] (a DiffusionGemma canvas: 16), else 64; the context's where
    /// it names them. A tile's step costs less the fewer its slots, and most of its cost is the
    /// expert's weights; an expert's slots past a tile's spill over into another, which
    /// converts the weights again.
    pub(super) fn for_experts(ctx: &GpuContext, slots: u32, n_expert: u32) -> Self {
        if !ctx.features.coop_matmul {
            return Tiles::Experts;
        }
        let per = u64::from(slots).div_ceil(u64::from(n_expert.max(1)));
        let size = ctx
            .expert_tile
            .unwrap_or(if per <= u64::from(FEW_SLOTS_PER_EXPERT) {
                16
            } else if per <= u64::from(SOME_SLOTS_PER_EXPERT) {
                32
            } else {
                64
            });
        match size {
            16 => Tiles::FewSlotExperts,
            32 => Tiles::SomeSlotExperts,
            _ => Tiles::Experts,
        }
    }

    /// Tokens (slots) a tile takes.
    pub(super) fn tokens(self) -> u32 {
        match self {
            Tiles::FewSlotExperts => 16,
            Tiles::SomeSlotExperts => 32,
            Tiles::Plain(t) => t.tokens(),
            Tiles::Experts => 64,
        }
    }
}

/// What a tiled product's pipeline is built for.
#[derive(Clone, Copy)]
pub(super) struct TiledKernel {
    pub dtype: GgmlType,
    /// Rows of whole 32-value units: F16 and F32 weights are then read 16 bytes at a time.
    pub whole_units: bool,
    pub geglu: bool,
    pub tiles: Tiles,
    pub clamped: bool,
    /// Steps of 128 values of k for the experts' 16- and 32-slot tiles (`STEP_128`;
    /// [`crate::ContextOptions::coop_step`]).
    pub step_128: bool,
    /// The output is a gate times another buffer ([`MatvecOut::GeluTimes`]).
    pub gelu_times: bool,
    /// Without cooperative matrices, K-quant rows through integer dot products on inputs
    /// rounded to 8-bit integers ([`tiles_round_inputs`]).
    pub int8: bool,
    /// Those in tiles of 128 rows rather than 64 (`ROWS_128`).
    pub int8_rows_128: bool,
}

impl TiledKernel {
    /// The kernel for `w`'s rows on `ctx`.
    pub(super) fn of(
        ctx: &GpuContext,
        w: &GpuWeight,
        geglu: bool,
        tiles: Tiles,
        clamped: bool,
    ) -> Self {
        Self {
            dtype: w.dtype,
            whole_units: w.cols.is_multiple_of(32),
            geglu,
            tiles,
            clamped,
            step_128: ctx.coop_step == 128,
            gelu_times: false,
            int8: tiles_round_inputs(ctx, w.dtype),
            int8_rows_128: ctx.int8_tile_rows == 128,
        }
    }

    /// Weight rows a workgroup takes.
    pub(super) fn rows(self, coop: bool) -> u32 {
        if coop || (self.int8 && self.int8_rows_128) {
            128
        } else {
            64
        }
    }
}

/// Whether the tiled products of `dtype` rows round their inputs to 8-bit integers per 32
/// values (`matmul_int8.wgsl`, as [`crate::cpu::round_to_int8`] does): Q4_K, Q6_K and Q8_0 on
/// devices without cooperative matrices, where integer dot products do four multiplies for
/// one f32 FMA's issue ([`crate::ContextOptions::allow_int8_tiles`], and
/// [`crate::ContextOptions::allow_int8_activations`], which keeps every activation f32 when
/// off).
pub fn tiles_round_inputs(ctx: &GpuContext, dtype: GgmlType) -> bool {
    !ctx.features.coop_matmul
        && ctx.features.subgroup_matrix == 0
        && ctx.features.int8_activations
        && ctx.features.int8_tiles
        && matches!(dtype, GgmlType::Q4K | GgmlType::Q6K | GgmlType::Q8_0)
}

/// The tiled product's pipeline: tensor cores where the device has them, otherwise f32 FMAs
/// ([`matmul_tile_rows`]).
pub(super) fn tiled_pipeline(ctx: &GpuContext, kernel: TiledKernel) -> Result<Pipeline, GpuError> {
    let source = tiled_source(&ctx.features, kernel)?;
    Ok(ctx.pipeline(&source))
}

/// The tiled product's source for a device with `features`: on cooperative matrices where it
/// has them, else on a browser's subgroup matrices where it has those.
fn tiled_source(features: &GpuFeatures, kernel: TiledKernel) -> Result<ShaderSource, GpuError> {
    let coop = features.coop_matmul;
    let sgmat = !coop && features.subgroup_matrix > 0;
    let TiledKernel {
        dtype,
        whole_units,
        geglu,
        tiles,
        clamped,
        step_128,
        gelu_times,
        int8,
        int8_rows_128,
    } = kernel;
    // The experts' products are never split over k, whose parts are counted in 64s.
    let few_slots = matches!(tiles, Tiles::FewSlotExperts | Tiles::SomeSlotExperts);
    // The kernels on f32 inputs stage them and the weights alike (matmul_stage.wgsl).
    let (name, wgsl, stage) = if coop {
        ("matmul_coop", MATMUL_COOP_WGSL, "")
    } else if sgmat {
        ("matmul_sgmat", MATMUL_SGMAT_WGSL, MATMUL_STAGE_WGSL)
    } else if int8 {
        ("matmul_int8", MATMUL_INT8_WGSL, "")
    } else {
        ("matmul", MATMUL_WGSL, MATMUL_STAGE_WGSL)
    };
    let wgsl = [
        ACTIVATIONS_WGSL,
        BYTES_WGSL,
        DTYPES_WGSL,
        MATMUL_IO_WGSL,
        stage,
        wgsl,
    ];
    Ok(ShaderSource::new(name, &wgsl)
        .flag_if(coop, "COOP")
        .flag_if(
            coop && tiles == Tiles::Plain(CoopTile::Tokens128),
            "TOKENS_128",
        )
        .flag(dtype_flag(dtype)?)
        .flag_if(
            (coop || sgmat) && whole_units && dtype == GgmlType::F16,
            "F16_QUADS",
        )
        .flag_if(
            (coop || sgmat) && whole_units && dtype == GgmlType::F32,
            "F32_QUADS",
        )
        .flag_if(geglu, "GEGLU_OUT")
        .flag_if(!matches!(tiles, Tiles::Plain(_)), "EXPERTS")
        .flag_if(
            coop && matches!(
                tiles,
                Tiles::FewSlotExperts | Tiles::Plain(CoopTile::Tokens16)
            ),
            "SMALL_TILES",
        )
        .flag_if(coop && tiles == Tiles::SomeSlotExperts, "TOKENS_32")
        .flag_if(coop && few_slots && step_128, "STEP_128")
        .flag_if(clamped, "CLAMPED")
        .flag_if(gelu_times, "GELU_TIMES")
        .flag_if(int8 && int8_rows_128, "ROWS_128")
        .flag_if(sgmat, "SGMAT")
        .flag_if(sgmat && features.subgroup_matrix == 16, "SGMAT16")
        .flag_if(sgmat && features.subgroup_min_size == 16, "SG16")
        .flag_if(sgmat && features.subgroup_min_size == 32, "SG32"))
}

/// Whether every tile of `w` holds whole gate/up row pairs.
pub(super) fn whole_pairs(w: &GpuWeight) -> bool {
    w.rows.is_multiple_of(2)
        && w.tiles
            .iter()
            .all(|t| t.first_row % 2 == 0 && t.rows % 2 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cooperative-matrix product's variants as a device with them compiles them (no
    /// device here has them).
    #[test]
    fn coop_variants_validate() {
        for (dtype, geglu, tiles, clamped) in [
            (GgmlType::F16, false, Tiles::Plain(CoopTile::Tokens64), true),
            (GgmlType::Q4K, true, Tiles::Plain(CoopTile::Tokens64), false),
            (
                GgmlType::Q6K,
                true,
                Tiles::Plain(CoopTile::Tokens128),
                false,
            ),
            (
                GgmlType::F16,
                false,
                Tiles::Plain(CoopTile::Tokens128),
                true,
            ),
            (
                GgmlType::Bf16,
                false,
                Tiles::Plain(CoopTile::Tokens128),
                false,
            ),
            (GgmlType::Q8_0, false, Tiles::FewSlotExperts, false),
            (
                GgmlType::F32,
                false,
                Tiles::Plain(CoopTile::Tokens64),
                false,
            ),
            (GgmlType::F32, false, Tiles::SomeSlotExperts, false),
            (GgmlType::Q4K, true, Tiles::SomeSlotExperts, false),
            (GgmlType::Q4K, false, Tiles::SomeSlotExperts, false),
            (
                GgmlType::Q4K,
                false,
                Tiles::Plain(CoopTile::Tokens16),
                false,
            ),
            (GgmlType::Q4K, true, Tiles::Plain(CoopTile::Tokens16), false),
        ] {
            for (whole_units, step_128) in [(true, true), (false, true), (true, false)] {
                let kernel = TiledKernel {
                    dtype,
                    whole_units,
                    geglu,
                    tiles,
                    clamped,
                    step_128,
                    gelu_times: clamped,
                    int8: false,
                    int8_rows_128: false,
                };
                let features = GpuFeatures {
                    coop_matmul: true,
                    ..Default::default()
                };
                crate::shader::validate_coop(&tiled_source(&features, kernel).unwrap());
            }
        }
    }
}
