//! Mixture-of-experts routing, grouping and the routed expert products.

use super::*;

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

kernel_bindings!(
    /// `moe.wgsl` with GROUP.
    MoeGroupBindings { sel: 0, groups: 1, p: 3 }
);

kernel_bindings!(
    /// `moe.wgsl` with ROUTE (the logits and scales at `route.wgsl`'s numbers).
    MoeRouteBindings {
        sel: 1,
        weight: 2,
        p: 3,
        route_logits: 18,
        route_scale: 19,
    }
);

kernel_bindings!(
    /// `moe.wgsl` with MIX.
    MoeMixBindings {
        y: 0,
        weight: 1,
        out: 2,
        p: 3,
        dense: 4,
        dense_post: 5,
        experts_post: 6,
    }
);

/// Storage buffers a routed expert product (normed input, gated output) binds: counted in its
/// WGSL.
pub(super) fn routed_expert_buffers() -> u32 {
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

/// The input and output of the experts' products: slot s reads row `s / slots.x_group` of
/// `x` and writes its row of `y` (`y_stride` apart).
#[derive(Clone, Copy)]
pub struct ExpertIo<'a> {
    pub x: &'a View,
    pub y: &'a View,
    pub y_stride: u32,
    pub slots: &'a ExpertSlots<'a>,
}

/// Products of the experts chosen per slot: slot s multiplies expert `sel[s]` (its
/// `rows_per_expert` rows of the stacked `w`) by input row `s / x_group` of `x`, into row s of
/// `y` (`y_stride` apart). With [`MatvecOut::Geglu`] each expert's rows are gate/up pairs.
/// With `norm`, each input row is normalised first, in every workgroup (rows that fit,
/// [`matvec_input_fits`]). With `route`, the slots' experts are routed here and written to
/// `sel` rather than read from it (a token's `x_group` slots; [`expert_route_fits`]).
pub fn expert_matvec(
    ctx: &GpuContext,
    w: &GpuWeight,
    io: &ExpertIo<'_>,
    norm: Option<&InputNorm<'_>>,
    route: Option<&ExpertRoute<'_>>,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let ExpertIo {
        x,
        y,
        y_stride,
        slots,
    } = *io;
    check_expert_io(w, io, out)?;
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
pub fn expert_matvec_mixed(
    ctx: &GpuContext,
    w: &GpuWeight,
    io: &ExpertIo<'_>,
    weight: &View,
    k: u32,
) -> Result<Vec<Dispatch>, GpuError> {
    let ExpertIo {
        x,
        y,
        y_stride,
        slots,
    } = *io;
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
fn check_expert_io(w: &GpuWeight, io: &ExpertIo<'_>, out: MatvecOut<'_>) -> Result<(), GpuError> {
    let ExpertIo {
        x,
        y,
        y_stride,
        slots,
    } = *io;
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
        MoeGroupBindings {
            sel: Bind::Storage(slots.sel),
            groups: Bind::Storage(groups.groups),
            p: Bind::Params(Params::of(&MoeParams {
                n_expert: n,
                k: slots.slots,
                ..MoeParams::default()
            })),
        },
        [1, 1, 1],
    )
}

/// [`expert_matvec`] for many tokens on the tiled kernel: each expert's weights are read once
/// per 64 of the slots routed to it ([`moe_group`] has grouped them), where one product per
/// slot reads them once per slot. Rows out or gate/up pairs ([`MatvecOut::Geglu`]) only.
pub fn expert_matmul(
    ctx: &GpuContext,
    w: &GpuWeight,
    io: &ExpertIo<'_>,
    groups: &ExpertGroups<'_>,
    out: MatvecOut<'_>,
) -> Result<Vec<Dispatch>, GpuError> {
    let ExpertIo {
        x,
        y,
        y_stride,
        slots,
    } = *io;
    check_expert_io(w, io, out)?;
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
    let tiles = Tiles::for_experts(ctx, slots.slots, n);
    let kernel = TiledKernel::of(ctx, w, geglu, tiles, false);
    let tile_rows = kernel.rows(ctx.features.coop_matmul);
    let pipeline = tiled_pipeline(ctx, kernel)?;
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
                // The whole row, in whole steps of every tile (the 32-slot tile's are 128
                // values).
                k_part: k.div_ceil(128) * 128,
                part_stride: 0,
                first_expert: (tile.first_row / u64::from(per)) as u32,
                n_expert: n,
                x_group: slots.x_group,
                slots: slots.slots,
                ..MatmulParams::default()
            });
            let wv = View::of(&tile.buffer);
            ctx.dispatch(
                "expert_matmul",
                pipeline.clone(),
                MatmulBindings {
                    w: Bind::Storage(&wv),
                    x: Bind::Storage(x),
                    y: Bind::Storage(y),
                    p: Bind::Params(params),
                    groups: Bind::Storage(groups.groups),
                    by: Bind::Skip,
                },
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
pub fn moe_route(
    ctx: &GpuContext,
    route: &ExpertRoute<'_>,
    sel: &View,
    tokens: u32,
    k: u32,
) -> Result<Dispatch, GpuError> {
    let ExpertRoute {
        logits,
        weight,
        expert_scale,
        n_expert,
    } = *route;
    route.check(tokens, k)?;
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
        MoeRouteBindings {
            sel: Bind::Storage(sel),
            weight: Bind::Storage(weight),
            p: Bind::Params(params),
            route_logits: Bind::Storage(logits),
            // Without a scale the shader reads none; the binding still needs a buffer.
            route_scale: Bind::Storage(expert_scale.unwrap_or(logits)),
        },
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
        MoeMixBindings {
            y: Bind::Storage(experts),
            weight: Bind::opt(weight),
            out: Bind::Storage(out),
            p: Bind::Params(Params::of(&MoeParams {
                k,
                dim,
                eps,
                ..MoeParams::default()
            })),
            dense: Bind::Storage(dense),
            dense_post: Bind::Storage(dense_post),
            experts_post: Bind::Storage(experts_post),
        },
        [tokens, 1, 1],
    )
}
