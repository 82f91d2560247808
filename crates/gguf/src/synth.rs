//! Random tensors for synthetic GGUF files (benchmarks, loadable by llama.cpp too): a
//! reproducible generator and the tensors' bytes in F32 or F16.

use crate::{GgmlType, TensorSpec};

/// Tensors of uniform random values, `offset + scale * u` with `u` in (-1, 1), from one
/// reproducible stream (xorshift64*), in the order they are added.
pub struct RandomTensors {
    state: u64,
    pub tensors: Vec<(TensorSpec, Vec<u8>)>,
}

impl RandomTensors {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            tensors: Vec::new(),
        }
    }

    fn uniform(&mut self) -> f32 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let bits = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Adds tensor `name` of ggml dims `dims` in `dtype` (F16; anything else is F32).
    pub fn add(&mut self, name: String, dims: &[u64], dtype: GgmlType, scale: f32, offset: f32) {
        let n: u64 = dims.iter().product();
        let values = (0..n).map(|_| offset + scale * self.uniform());
        let (dtype, bytes): (_, Vec<u8>) = match dtype {
            GgmlType::F16 => (
                GgmlType::F16,
                values
                    .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            _ => (GgmlType::F32, values.flat_map(f32::to_le_bytes).collect()),
        };
        self.tensors
            .push((TensorSpec::new(name, dtype, dims), bytes));
    }
}

/// A product's weight scale for `fan_in` inputs: keeps activations of order one.
pub fn fan_in_scale(fan_in: u64) -> f32 {
    1.7 / (fan_in as f32).sqrt()
}
