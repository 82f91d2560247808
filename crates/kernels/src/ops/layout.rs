//! What the general ops share about binding tensors.

use super::*;

/// An input's place relative to the output it is read with: in its own binding, or in the
/// output's buffer (WebGPU refuses one buffer in a writable and a readable binding of one
/// dispatch), then read through the output's binding at `offset` elements into the output's
/// view.
pub(super) enum Input<'a> {
    Own(&'a Tensor),
    InOutput { offset: u32 },
}

impl<'a> Input<'a> {
    /// Where `x` is read from when `y` is written. Sharing y's buffer is allowed only with
    /// y's exact layout (each thread then reads the element it writes): anything else would
    /// race.
    pub(super) fn of(what: &str, x: &'a Tensor, y: &Tensor) -> Result<Self, GpuError> {
        x.expect_dtype(what, DType::F32)?;
        if !x.shares_buffer(y) {
            return Ok(Self::Own(x));
        }
        let (xl, yl) = (x.layout4(), y.layout4());
        let start = x.view().offset / 4 + u64::from(xl.offset);
        let base = y.view().offset / 4;
        let offset = start
            .checked_sub(base)
            .and_then(|o| u32::try_from(o).ok())
            .filter(|&o| o == yl.offset && xl.dims == yl.dims && xl.strides == yl.strides);
        offset.map(|offset| Self::InOutput { offset }).ok_or_else(|| {
            shape(format!(
                "{what}: shares the output's buffer with another layout (in place needs the output's own)"
            ))
        })
    }

    /// The binding (nothing when read through the output).
    pub(super) fn bind(&self) -> Bind<'a> {
        match self {
            Self::Own(t) => Bind::Storage(t.view()),
            Self::InOutput { .. } => Bind::Skip,
        }
    }

    pub(super) fn in_output(&self) -> bool {
        matches!(self, Self::InOutput { .. })
    }

    /// Strides and the offset of element 0 within the binding it is read from.
    pub(super) fn layout(&self, y: &Tensor) -> Layout4 {
        match self {
            Self::Own(t) => t.layout4(),
            Self::InOutput { offset } => Layout4 {
                offset: *offset,
                ..y.layout4()
            },
        }
    }
}

/// Errors unless `t` holds f32 values and is `n` values long and contiguous (a weight, bias or
/// table read at `t.offset() + i`).
pub(super) fn expect_vector(what: &str, t: &Tensor, n: u32) -> Result<(), GpuError> {
    t.expect_dtype(what, DType::F32)?;
    if t.numel() != u64::from(n) || !t.is_contiguous() {
        return Err(shape(format!(
            "{what}: expected {n} contiguous values, got {:?} (strides {:?})",
            t.dims(),
            t.strides()
        )));
    }
    Ok(())
}

/// A count as the u32 the kernels take.
pub(super) fn count(what: &str, n: u64) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| shape(format!("{what}: {n} elements, over 2^32")))
}
