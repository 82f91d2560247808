//! Convolutions and pooling: im2col (a 2-D convolution is im2col then a product with the
//! weight), the causal depthwise 1-D convolution, and 2-D average pooling.

use super::layout::{count, expect_vector};
use super::*;

const CONV_WGSL: &str = include_str!("../wgsl/conv.wgsl");

kernel_bindings!(
    /// `conv.wgsl`.
    ConvBindings { x: 0, y: 1, p: 2, wt: 3, bias: 4 }
);

/// A 2-D window: kernel size, stride and zero padding, each (rows, columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window2d {
    pub kernel: [u32; 2],
    pub stride: [u32; 2],
    pub pad: [u32; 2],
}

impl Window2d {
    /// Output size over an input of `size` (rows, columns).
    pub fn output(&self, size: [u32; 2]) -> Result<[u32; 2], GpuError> {
        let mut out = [0; 2];
        for i in 0..2 {
            let span = u64::from(size[i]) + 2 * u64::from(self.pad[i]);
            let k = u64::from(self.kernel[i]);
            if k == 0 || self.stride[i] == 0 || span < k {
                return Err(shape(format!("window {self:?} over {size:?}")));
            }
            out[i] = ((span - k) / u64::from(self.stride[i]) + 1) as u32;
        }
        Ok(out)
    }
}

/// Kernel variants of `conv.wgsl`.
#[derive(Clone, Copy)]
enum ConvKind {
    Im2col,
    Depthwise { bias: bool },
    AvgPool,
}

impl ConvKind {
    fn source(self) -> ShaderSource {
        let s = ShaderSource::new("conv", &[CONV_WGSL]);
        match self {
            Self::Im2col => s.flag("IM2COL"),
            Self::Depthwise { bias } => s.flag("DEPTHWISE").flag_if(bias, "BIAS"),
            Self::AvgPool => s.flag("AVG_POOL"),
        }
    }
}

fn expect_rank(what: &str, t: &Tensor, rank: usize) -> Result<(), GpuError> {
    t.expect_dtype(what, DType::F32)?;
    if t.rank() != rank {
        return Err(shape(format!("{what}: {:?} is not {rank}-D", t.dims())));
    }
    Ok(())
}

/// `p` with x's and y's strides over their last three dimensions and their offsets.
fn with_io(p: ConvParams, x: &Tensor, y: &Tensor) -> ConvParams {
    let (xl, yl) = (x.layout4(), y.layout4());
    ConvParams {
        x0: xl.strides[1],
        x1: xl.strides[2],
        x2: xl.strides[3],
        x_at: xl.offset,
        y0: yl.strides[1],
        y1: yl.strides[2],
        y2: yl.strides[3],
        y_at: yl.offset,
        ..p
    }
}

fn conv_dispatch(
    ctx: &GpuContext,
    kind: ConvKind,
    p: ConvParams,
    binds: ConvBindings<'_>,
) -> Result<Dispatch, GpuError> {
    ctx.dispatch(
        "conv",
        ctx.pipeline(&kind.source()),
        binds,
        grid(ctx, p.n.div_ceil(256), 1),
    )
}

/// `cols[oy * ow + ox, (c * kh + ky) * kw + kx] = x[c, oy * sh + ky - ph, ox * sw + kx - pw]`
/// (zero outside `x`, which is `[c, h, w]` of any layout); `cols` is `[oh * ow, c * kh * kw]`.
/// A product of `cols` with a `[out, c, kh, kw]` weight is the convolution, `[oh * ow, out]`.
pub fn im2col(
    ctx: &GpuContext,
    x: &Tensor,
    window: Window2d,
    cols: &Tensor,
) -> Result<Dispatch, GpuError> {
    expect_rank("im2col x", x, 3)?;
    expect_rank("im2col cols", cols, 2)?;
    let [c, h, w] = [x.dim(0), x.dim(1), x.dim(2)];
    let [oh, ow] = window.output([h, w])?;
    let [kh, kw] = window.kernel;
    let width = count("im2col", u64::from(c) * u64::from(kh) * u64::from(kw))?;
    cols.expect_dims("im2col cols", &[oh * ow, width])?;
    if x.shares_buffer(cols) {
        return Err(shape("im2col: x shares the output's buffer".into()));
    }
    let p = with_io(
        ConvParams {
            n: count("im2col cols", cols.numel())?,
            c,
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            sh: window.stride[0],
            sw: window.stride[1],
            ph: window.pad[0],
            pw: window.pad[1],
            ..ConvParams::default()
        },
        x,
        cols,
    );
    let binds = ConvBindings {
        x: Bind::Storage(x.view()),
        y: Bind::Storage(cols.view()),
        p: Bind::Params(Params::of(&p)),
        wt: Bind::Skip,
        bias: Bind::Skip,
    };
    conv_dispatch(ctx, ConvKind::Im2col, p, binds)
}

/// The causal depthwise convolution over time: `y[t, c] = sum_j w[c, j] * x[t - (k - 1) + j,
/// c] (+ bias[c])`, zero before the first step. `x` and `y` are `[t, c]` (any layout), `w`
/// `[c, k]` contiguous.
pub fn depthwise_conv1d(
    ctx: &GpuContext,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    expect_rank("depthwise x", x, 2)?;
    expect_rank("depthwise y", y, 2)?;
    expect_rank("depthwise w", w, 2)?;
    let [t, c] = [x.dim(0), x.dim(1)];
    let k = w.dim(1);
    y.expect_dims("depthwise y", &[t, c])?;
    w.expect_dims("depthwise w", &[c, k])?;
    expect_vector(
        "depthwise w",
        w,
        count("depthwise w", u64::from(c) * u64::from(k))?,
    )?;
    if let Some(b) = bias {
        expect_vector("depthwise bias", b, c)?;
    }
    if x.shares_buffer(y) {
        return Err(shape("depthwise: x shares the output's buffer".into()));
    }
    let p = with_io(
        ConvParams {
            n: count("depthwise y", y.numel())?,
            c,
            kw: k,
            w_at: w.offset(),
            bias_at: bias.map_or(0, Tensor::offset),
            ..ConvParams::default()
        },
        x,
        y,
    );
    let binds = ConvBindings {
        x: Bind::Storage(x.view()),
        y: Bind::Storage(y.view()),
        p: Bind::Params(Params::of(&p)),
        wt: Bind::Storage(w.view()),
        bias: Bind::opt(bias.map(Tensor::view)),
    };
    let kind = ConvKind::Depthwise {
        bias: bias.is_some(),
    };
    conv_dispatch(ctx, kind, p, binds)
}

/// 2-D average pooling of `x` `[h, w, c]` (channels last, any layout) into `y` `[oh, ow, c]`
/// over `window` (no padding).
pub fn avg_pool2d(
    ctx: &GpuContext,
    x: &Tensor,
    window: Window2d,
    y: &Tensor,
) -> Result<Dispatch, GpuError> {
    expect_rank("avg_pool x", x, 3)?;
    expect_rank("avg_pool y", y, 3)?;
    if window.pad != [0, 0] {
        return Err(shape("avg_pool2d: padding is not supported".into()));
    }
    let [h, w, c] = [x.dim(0), x.dim(1), x.dim(2)];
    let [oh, ow] = window.output([h, w])?;
    y.expect_dims("avg_pool y", &[oh, ow, c])?;
    if x.shares_buffer(y) {
        return Err(shape("avg_pool: x shares the output's buffer".into()));
    }
    let p = with_io(
        ConvParams {
            n: count("avg_pool y", y.numel())?,
            c,
            h,
            w,
            oh,
            ow,
            kh: window.kernel[0],
            kw: window.kernel[1],
            sh: window.stride[0],
            sw: window.stride[1],
            ..ConvParams::default()
        },
        x,
        y,
    );
    let binds = ConvBindings {
        x: Bind::Storage(x.view()),
        y: Bind::Storage(y.view()),
        p: Bind::Params(Params::of(&p)),
        wt: Bind::Skip,
        bias: Bind::Skip,
    };
    conv_dispatch(ctx, ConvKind::AvgPool, p, binds)
}
