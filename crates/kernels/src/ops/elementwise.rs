//! Elementwise operations over a buffer.

use super::*;

kernel_bindings!(
    /// `elementwise.wgsl`.
    ElementwiseBindings { a: 0, b: 1, y: 2, p: 3 }
);

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
    let binds = ElementwiseBindings {
        a: Bind::opt(a),
        b: Bind::opt(b),
        y: Bind::Storage(y),
        p: Bind::Params(Params::of(&params)),
    };
    ctx.dispatch(
        flag_label(flag),
        ctx.pipeline(&source),
        binds,
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

kernel_bindings!(
    /// `copy_within.wgsl`.
    CopyWithinBindings { buf: 0, p: 1 }
);

const COPY_WITHIN_WGSL: &str = include_str!("../wgsl/copy_within.wgsl");

/// Copies `from` onto `to`, two spans of one buffer of the same size that do not overlap, in
/// a kernel (WebGPU copies no buffer onto itself): the rows of a KV cache from one pool slot
/// to another. Both start and end on 16-byte boundaries.
pub fn copy_within(ctx: &GpuContext, from: &View, to: &View) -> Result<Dispatch, GpuError> {
    let bad = |why: &str| {
        Err(shape(format!(
            "copy_within: {why} ({} bytes at {} onto {} bytes at {})",
            from.size, from.offset, to.size, to.offset
        )))
    };
    if from.buffer != to.buffer {
        return bad("the spans lie in different buffers");
    }
    if from.size != to.size || from.size == 0 {
        return bad("the spans differ in size or are empty");
    }
    if [from.offset, to.offset, from.size]
        .iter()
        .any(|v| v % 16 != 0)
    {
        return bad("a span is not 16-byte aligned");
    }
    if from.offset < to.offset + to.size && to.offset < from.offset + from.size {
        return bad("the spans overlap");
    }
    // Bound from the buffer's start (always aligned for a binding) to the later span's end.
    let end = (from.offset + from.size).max(to.offset + to.size);
    let units = |bytes: u64| u32::try_from(bytes / 16);
    let (Ok(f), Ok(t), Ok(n)) = (units(from.offset), units(to.offset), units(from.size)) else {
        return bad("the spans lie too far into the buffer");
    };
    let whole = View {
        buffer: from.buffer.clone(),
        offset: 0,
        size: end,
    };
    ctx.dispatch(
        "copy_within",
        ctx.pipeline(&ShaderSource::new("copy_within", &[COPY_WITHIN_WGSL])),
        CopyWithinBindings {
            buf: Bind::Storage(&whole),
            p: Bind::Params(Params::of(&CopyWithinParams { src: f, dst: t, n })),
        },
        grid(ctx, n.div_ceil(256), 1),
    )
}
