//! Gathering embedding rows by token id.

use super::*;

kernel_bindings!(
    /// `embed.wgsl` (the table read through `bytes.wgsl`).
    EmbedBindings { w: 0 = ["w", "w4"], ids: 1, out: 2, p: 3 }
);

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
                EmbedBindings {
                    w: Bind::Storage(&wv),
                    ids: Bind::Storage(ids),
                    out: Bind::Storage(out),
                    p: Bind::Params(params),
                },
                grid(ctx, m, units.div_ceil(64)),
            )
        })
        .collect()
}
