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
