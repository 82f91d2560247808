//! Pointwise operations over tensors of any layout: activations, clamps and scales, and
//! broadcasting binary operations.

use super::layout::{Input, count};
use super::*;

const ACT_WGSL: &str = include_str!("../wgsl/act.wgsl");
const LAYOUT_WGSL: &str = include_str!("../wgsl/layout.wgsl");
const POINTWISE_WGSL: &str = include_str!("../wgsl/pointwise.wgsl");

kernel_bindings!(
    /// `pointwise.wgsl`.
    PointwiseBindings { a: 0, b: 1, y: 2, p: 3 }
);

/// A function of one value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// The value itself (a copy into another layout: permute, concat, pad).
    Identity,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// GELU with erf.
    GeluErf,
    /// `x * sigmoid(1.702 x)`.
    QuickGelu,
    /// `x * sigmoid(x)`.
    Silu,
    Relu,
    Sigmoid,
    /// `clamp(x, min, max)`.
    Clamp {
        min: f32,
        max: f32,
    },
    /// `x * s`.
    Scale(f32),
    /// `x * scale + shift`.
    Affine {
        scale: f32,
        shift: f32,
    },
}

impl Activation {
    /// The kernel flag and the two scalars it reads: the one place these become WGSL.
    fn flag_and_scalars(self) -> (Option<&'static str>, f32, f32) {
        match self {
            Self::Identity => (None, 0.0, 0.0),
            Self::GeluTanh => (Some("GELU_TANH"), 0.0, 0.0),
            Self::GeluErf => (Some("GELU_ERF"), 0.0, 0.0),
            Self::QuickGelu => (Some("QUICK_GELU"), 0.0, 0.0),
            Self::Silu => (Some("SILU"), 0.0, 0.0),
            Self::Relu => (Some("RELU"), 0.0, 0.0),
            Self::Sigmoid => (Some("SIGMOID"), 0.0, 0.0),
            Self::Clamp { min, max } => (Some("CLAMP"), min, max),
            Self::Scale(s) => (Some("SCALE"), s, 0.0),
            Self::Affine { scale, shift } => (Some("AFFINE"), scale, shift),
        }
    }
}

/// A function of two values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    /// `act(a) * b`: a gated linear unit's gate `a` (GLU: sigmoid; GeGLU: gelu).
    Gated(Activation),
}

impl Binary {
    fn flag(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Sub => "SUB",
            Self::Mul => "MUL",
            Self::Gated(_) => "GATED",
        }
    }
}

/// `y = act(a)`, elementwise: `a` has y's shape or broadcasts to it.
pub fn unary(
    ctx: &GpuContext,
    act: Activation,
    a: &Tensor,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    pointwise(ctx, PointwiseOp::Unary(act), a, None, y)
}

/// `y = a (op) b`, elementwise: each operand has y's shape or broadcasts to it.
pub fn binary(
    ctx: &GpuContext,
    op: Binary,
    a: &Tensor,
    b: &Tensor,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    pointwise(ctx, PointwiseOp::Binary(op), a, Some(b), y)
}

enum PointwiseOp {
    Unary(Activation),
    Binary(Binary),
}

fn pointwise(
    ctx: &GpuContext,
    op: PointwiseOp,
    a: &Tensor,
    b: Option<&Tensor>,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    y.expect_dtype("pointwise y", DType::F32)?;
    let n = count("pointwise y", y.numel())?;
    let a = a.broadcast(y.dims())?;
    let b = b.map(|b| b.broadcast(y.dims())).transpose()?;
    let ai = Input::of("pointwise a", &a, y)?;
    let bi = b
        .as_ref()
        .map(|b| Input::of("pointwise b", b, y))
        .transpose()?;
    let (act, binary) = match op {
        PointwiseOp::Unary(act) => (act, None),
        PointwiseOp::Binary(Binary::Gated(act)) => (act, Some(Binary::Gated(act))),
        PointwiseOp::Binary(op) => (Activation::Identity, Some(op)),
    };
    let (act_flag, lo, hi) = act.flag_and_scalars();
    let mut source = ShaderSource::new(
        "pointwise",
        &[ACTIVATIONS_WGSL, ACT_WGSL, LAYOUT_WGSL, POINTWISE_WGSL],
    )
    .flag_if(ai.in_output(), "A_IN_Y");
    if let Some(f) = act_flag {
        source = source.flag(f);
    }
    if let Some(op) = binary {
        source = source.flag("BINARY").flag(op.flag());
    }
    if bi.as_ref().is_some_and(Input::in_output) {
        source = source.flag("B_IN_Y");
    }
    let (yl, al) = (y.layout4(), ai.layout(y));
    let bl = bi.as_ref().map_or(al, |b| b.layout(y));
    let params = PointwiseParams {
        n,
        d0: yl.dims[0],
        d1: yl.dims[1],
        d2: yl.dims[2],
        d3: yl.dims[3],
        y0: yl.strides[0],
        y1: yl.strides[1],
        y2: yl.strides[2],
        y3: yl.strides[3],
        y_at: yl.offset,
        a0: al.strides[0],
        a1: al.strides[1],
        a2: al.strides[2],
        a3: al.strides[3],
        a_at: al.offset,
        b0: bl.strides[0],
        b1: bl.strides[1],
        b2: bl.strides[2],
        b3: bl.strides[3],
        b_at: bl.offset,
        lo,
        hi,
    };
    let binds = PointwiseBindings {
        a: ai.bind(),
        b: bi.as_ref().map_or(Bind::Skip, Input::bind),
        y: Bind::Storage(y.view()),
        p: Bind::Params(Params::of(&params)),
    };
    ctx.dispatch(
        "pointwise",
        ctx.pipeline(&source),
        binds,
        grid(ctx, n.div_ceil(256), 1),
    )
}
