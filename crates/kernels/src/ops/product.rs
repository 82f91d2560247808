//! Products of two activation tensors: batched, either operand transposed (a stride swap) or
//! shared across the batch (batch stride 0), with an optional bias. Products with a stored
//! weight are [`matmul`] and [`matvec`].

use super::layout::{count, expect_vector};
use super::*;

const PRODUCT_WGSL: &str = include_str!("../wgsl/product.wgsl");

kernel_bindings!(
    /// `product.wgsl`.
    ProductBindings { a: 0, bt: 1, y: 2, p: 3, bias: 4 }
);

/// Operands of [`product`]: `y[b, i, j] = alpha * sum_k a[b, i, k] * bt[b, j, k] + bias[j]`.
/// Each is 3-D `[batch, rows, cols]` of any layout: a plain `a @ b` passes `b` transposed.
pub struct Product<'a> {
    pub a: &'a Tensor,
    pub bt: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    pub alpha: f32,
    /// Add to what `y` holds (`y += ...`) rather than overwrite it.
    pub accumulate: bool,
}

/// The product's dispatch (16 x 16 outputs a workgroup). Shapes are checked here: a is
/// `[batch, m, k]`, bt `[batch, n, k]`, y `[batch, m, n]`.
pub fn product(ctx: &GpuContext, p: &Product<'_>, y: &Tensor) -> Result<Dispatch, GpuError> {
    for (what, t) in [("product a", p.a), ("product bt", p.bt), ("product y", y)] {
        t.expect_dtype(what, DType::F32)?;
        if t.rank() != 3 {
            return Err(shape(format!("{what}: {:?} is not 3-D", t.dims())));
        }
    }
    let [batch, m, k] = [p.a.dim(0), p.a.dim(1), p.a.dim(2)];
    let n = p.bt.dim(1);
    p.bt.expect_dims("product bt", &[batch, n, k])?;
    y.expect_dims("product y", &[batch, m, n])?;
    if p.a.shares_buffer(y) || p.bt.shares_buffer(y) {
        return Err(shape(
            "product: an operand shares the output's buffer".into(),
        ));
    }
    if let Some(b) = p.bias {
        expect_vector("product bias", b, n)?;
    }
    count("product y", y.numel())?;
    let (al, bl, yl) = (p.a.layout4(), p.bt.layout4(), y.layout4());
    let params = ProductParams {
        m,
        n,
        k,
        a0: al.strides[1],
        a1: al.strides[2],
        a2: al.strides[3],
        a_at: al.offset,
        b0: bl.strides[1],
        b1: bl.strides[2],
        b2: bl.strides[3],
        b_at: bl.offset,
        y0: yl.strides[1],
        y1: yl.strides[2],
        y2: yl.strides[3],
        y_at: yl.offset,
        bias_at: p.bias.map_or(0, Tensor::offset),
        alpha: p.alpha,
    };
    let source = ShaderSource::new("product", &[PRODUCT_WGSL])
        .flag_if(p.bias.is_some(), "BIAS")
        .flag_if(p.accumulate, "ACCUMULATE");
    ctx.dispatch(
        "product",
        ctx.pipeline(&source),
        ProductBindings {
            a: Bind::Storage(p.a.view()),
            bt: Bind::Storage(p.bt.view()),
            y: Bind::Storage(y.view()),
            p: Bind::Params(Params::of(&params)),
            bias: Bind::opt(p.bias.map(Tensor::view)),
        },
        [n.div_ceil(16), m.div_ceil(16), batch],
    )
}
