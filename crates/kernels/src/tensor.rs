//! Activation tensors: an element type, a shape and strides (in elements) over a storage
//! buffer range. Views of a tensor (permute, transpose, narrow, broadcast, reshape) change
//! only the shape, strides and offset; the general ops read and write any such layout, so a
//! transposed operand, a slice of a wider row or a broadcast bias costs no copy.
//!
//! Every constructor checks that the largest element it can address lies inside the buffer
//! range, so a kernel given a tensor never reads or writes outside it.

use crate::context::GpuError;
use crate::gpu::View;

/// The most dimensions a tensor has (kernels see every tensor as 4-D, leading sizes 1).
pub const MAX_RANK: usize = 4;

/// The element type of an activation tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    U32,
    /// Half floats (devices with `shader-f16`): what the tensor-core attention reads.
    F16,
}

impl DType {
    /// Bytes an element takes.
    pub fn bytes(self) -> u64 {
        match self {
            Self::F32 | Self::U32 => 4,
            Self::F16 => 2,
        }
    }
}

/// A tensor over a region of a storage buffer.
#[derive(Clone, Debug)]
pub struct Tensor {
    view: View,
    dtype: DType,
    rank: usize,
    dims: [u32; MAX_RANK],
    strides: [u32; MAX_RANK],
    offset: u32,
}

/// A tensor's layout as the kernels read it: four sizes and strides (leading sizes 1, their
/// strides 0) and the offset of element 0, all in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout4 {
    pub dims: [u32; MAX_RANK],
    pub strides: [u32; MAX_RANK],
    pub offset: u32,
}

fn shape_error(msg: String) -> GpuError {
    GpuError::Shape(msg)
}

/// Row-major strides of `dims`.
fn contiguous_strides(dims: &[u32]) -> Result<Vec<u32>, GpuError> {
    let mut strides = vec![0u32; dims.len()];
    let mut step = 1u64;
    for (s, &d) in strides.iter_mut().zip(dims).rev() {
        *s = u32::try_from(step)
            .map_err(|_| shape_error(format!("tensor {dims:?}: over 2^32 elements")))?;
        step *= u64::from(d.max(1));
    }
    Ok(strides)
}

impl Tensor {
    /// A row-major f32 tensor of `dims` at the start of `view`.
    pub fn new(view: &View, dims: &[u32]) -> Result<Self, GpuError> {
        Self::of(view, DType::F32, dims)
    }

    /// A row-major tensor of `dtype` and `dims` at the start of `view`.
    pub fn of(view: &View, dtype: DType, dims: &[u32]) -> Result<Self, GpuError> {
        let strides = contiguous_strides(dims)?;
        Self::strided(view, dtype, dims, &strides, 0)
    }

    /// A tensor of `dims` with `strides` (elements), element 0 at `offset` elements into
    /// `view`.
    pub fn strided(
        view: &View,
        dtype: DType,
        dims: &[u32],
        strides: &[u32],
        offset: u32,
    ) -> Result<Self, GpuError> {
        if dims.is_empty() || dims.len() > MAX_RANK || strides.len() != dims.len() {
            return Err(shape_error(format!(
                "tensor of dims {dims:?} and strides {strides:?}: 1 to {MAX_RANK} dimensions, one stride each"
            )));
        }
        let mut t = Self {
            view: view.clone(),
            dtype,
            rank: dims.len(),
            dims: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            offset,
        };
        t.dims[..dims.len()].copy_from_slice(dims);
        t.strides[..dims.len()].copy_from_slice(strides);
        t.check_fits()?;
        Ok(t)
    }

    /// Errors unless every addressable element lies inside the view.
    fn check_fits(&self) -> Result<(), GpuError> {
        if self.numel() == 0 {
            return Ok(());
        }
        let last: u64 = u64::from(self.offset)
            + self
                .dims()
                .iter()
                .zip(self.strides())
                .map(|(&d, &s)| u64::from(d - 1) * u64::from(s))
                .sum::<u64>();
        let held = self.view.size / self.dtype.bytes();
        if last >= held || last > u64::from(u32::MAX) {
            return Err(shape_error(format!(
                "tensor {:?} (strides {:?}, offset {}) reaches element {last}; the buffer holds {held}",
                self.dims(),
                self.strides(),
                self.offset,
            )));
        }
        Ok(())
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn dims(&self) -> &[u32] {
        &self.dims[..self.rank]
    }

    pub fn strides(&self) -> &[u32] {
        &self.strides[..self.rank]
    }

    /// Elements from the start of the view to element 0.
    pub fn offset(&self) -> u32 {
        self.offset
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn view(&self) -> &View {
        &self.view
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.dims().iter().map(|&d| u64::from(d)).product()
    }

    /// Size of dimension `dim`, counted from the front; negative counts from the back.
    pub fn dim(&self, dim: isize) -> u32 {
        let i = if dim < 0 {
            self.rank as isize + dim
        } else {
            dim
        };
        usize::try_from(i)
            .ok()
            .and_then(|i| self.dims().get(i).copied())
            .unwrap_or(1)
    }

    /// Whether the elements lie row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        contiguous_strides(self.dims()).is_ok_and(|s| {
            s.iter()
                .zip(self.strides())
                .zip(self.dims())
                .all(|((a, b), &d)| d == 1 || a == b)
        })
    }

    /// The same elements as `dims` (a contiguous tensor only).
    pub fn reshape(&self, dims: &[u32]) -> Result<Self, GpuError> {
        let n: u64 = dims.iter().map(|&d| u64::from(d)).product();
        if !self.is_contiguous() || n != self.numel() {
            return Err(shape_error(format!(
                "reshape {:?} (strides {:?}) to {dims:?}: needs a contiguous tensor of as many elements",
                self.dims(),
                self.strides()
            )));
        }
        let strides = contiguous_strides(dims)?;
        Self::strided(&self.view, self.dtype, dims, &strides, self.offset)
    }

    /// Dimensions reordered: dimension `i` of the result is `order[i]` of this one.
    pub fn permute(&self, order: &[usize]) -> Result<Self, GpuError> {
        let mut seen = [false; MAX_RANK];
        let valid = order.len() == self.rank
            && order
                .iter()
                .all(|&o| o < self.rank && !std::mem::replace(&mut seen[o], true));
        if !valid {
            return Err(shape_error(format!(
                "permute {:?} by {order:?}: not a permutation of its dimensions",
                self.dims()
            )));
        }
        let dims: Vec<u32> = order.iter().map(|&o| self.dims[o]).collect();
        let strides: Vec<u32> = order.iter().map(|&o| self.strides[o]).collect();
        Self::strided(&self.view, self.dtype, &dims, &strides, self.offset)
    }

    /// Dimensions `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self, GpuError> {
        let mut order: Vec<usize> = (0..self.rank).collect();
        if a >= self.rank || b >= self.rank {
            return Err(shape_error(format!(
                "transpose {a} and {b} of a {}-D tensor",
                self.rank
            )));
        }
        order.swap(a, b);
        self.permute(&order)
    }

    /// `len` elements of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: u32, len: u32) -> Result<Self, GpuError> {
        if dim >= self.rank || u64::from(start) + u64::from(len) > u64::from(self.dims[dim]) {
            return Err(shape_error(format!(
                "narrow dimension {dim} of {:?} to [{start}, +{len})",
                self.dims()
            )));
        }
        let mut dims = self.dims().to_vec();
        dims[dim] = len;
        let offset = u64::from(self.offset) + u64::from(start) * u64::from(self.strides[dim]);
        let offset = u32::try_from(offset)
            .map_err(|_| shape_error(format!("narrow: offset {offset} over 2^32")))?;
        Self::strided(&self.view, self.dtype, &dims, self.strides(), offset)
    }

    /// This tensor repeated to `dims` (aligned at the last dimension, as numpy broadcasts):
    /// each dimension of size 1, and each missing leading one, gets stride 0.
    pub fn broadcast(&self, dims: &[u32]) -> Result<Self, GpuError> {
        if dims.len() < self.rank || dims.len() > MAX_RANK {
            return Err(shape_error(format!(
                "broadcast {:?} to {dims:?}",
                self.dims()
            )));
        }
        let lead = dims.len() - self.rank;
        let mut strides = vec![0u32; dims.len()];
        for (i, &d) in dims.iter().enumerate().skip(lead) {
            let own = self.dims[i - lead];
            strides[i] = match own {
                _ if own == d => self.strides[i - lead],
                1 => 0,
                _ => {
                    return Err(shape_error(format!(
                        "broadcast {:?} to {dims:?}",
                        self.dims()
                    )));
                }
            };
        }
        Self::strided(&self.view, self.dtype, dims, &strides, self.offset)
    }

    /// Errors unless the shape is `dims`.
    pub fn expect_dims(&self, what: &str, dims: &[u32]) -> Result<(), GpuError> {
        if self.dims() != dims {
            return Err(shape_error(format!(
                "{what}: expected {dims:?}, got {:?}",
                self.dims()
            )));
        }
        Ok(())
    }

    /// Errors unless the element type is `dtype`.
    pub fn expect_dtype(&self, what: &str, dtype: DType) -> Result<(), GpuError> {
        if self.dtype != dtype {
            return Err(shape_error(format!(
                "{what}: expected {dtype:?} elements, got {:?}",
                self.dtype
            )));
        }
        Ok(())
    }

    /// The layout as four dimensions, the missing leading ones of size 1.
    pub fn layout4(&self) -> Layout4 {
        let lead = MAX_RANK - self.rank;
        let mut l = Layout4 {
            dims: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            offset: self.offset,
        };
        l.dims[lead..].copy_from_slice(self.dims());
        l.strides[lead..].copy_from_slice(self.strides());
        l
    }

    /// Whether `other` lives in the same buffer (WebGPU forbids binding one buffer both
    /// writable and readable in a dispatch, so the kernels read such an input through the
    /// output's binding).
    pub fn shares_buffer(&self, other: &Tensor) -> bool {
        self.view.buffer == other.view.buffer
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::{DeviceClass, GpuContext};

    fn view(floats: u64) -> View {
        let ctx = pollster::block_on(GpuContext::emulating(DeviceClass::Lavapipe)).unwrap();
        View::of(&ctx.storage("t", floats * 4))
    }

    #[test]
    fn views_change_strides_and_offsets_only() {
        let v = view(2 * 3 * 5);
        let t = Tensor::new(&v, &[2, 3, 5]).unwrap();
        assert_eq!(t.strides(), &[15, 5, 1]);
        assert!(t.is_contiguous());
        let p = t.permute(&[2, 0, 1]).unwrap();
        assert_eq!((p.dims(), p.strides()), (&[5, 2, 3][..], &[1, 15, 5][..]));
        assert!(!p.is_contiguous());
        assert!(
            p.reshape(&[30]).is_err(),
            "a permuted tensor is not reshaped in place"
        );
        let n = t.narrow(2, 1, 3).unwrap();
        assert_eq!((n.dims(), n.offset()), (&[2, 3, 3][..], 1));
        let b = Tensor::new(&v, &[5]).unwrap().broadcast(&[4, 5]).unwrap();
        assert_eq!(b.strides(), &[0, 1]);
        assert_eq!(b.layout4().dims, [1, 1, 4, 5]);
        assert!(t.transpose(0, 3).is_err());
        assert!(t.permute(&[0, 0, 1]).is_err());
        assert!(Tensor::new(&v, &[5]).unwrap().broadcast(&[4, 3]).is_err());
    }

    #[test]
    fn a_tensor_never_reaches_past_its_buffer() {
        let v = view(10);
        assert!(Tensor::new(&v, &[11]).is_err());
        assert!(Tensor::new(&v, &[2, 5]).is_ok());
        assert!(Tensor::strided(&v, DType::F32, &[2, 5], &[5, 1], 1).is_err());
        assert!(Tensor::strided(&v, DType::F32, &[5, 2], &[1, 5], 0).is_ok());
        assert!(Tensor::new(&v, &[1 << 16, 1 << 16, 2]).is_err());
        assert!(Tensor::new(&v, &[]).is_err());
        assert!(Tensor::new(&v, &[1, 1, 1, 1, 1]).is_err());
        let t = Tensor::new(&v, &[2, 5]).unwrap();
        assert!(t.narrow(1, 3, 3).is_err());
    }
}
