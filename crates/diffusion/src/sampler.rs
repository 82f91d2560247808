//! Where the entropy-bound sampler's randomness comes from: a block's starting canvas, one
//! uniform per position and step for the draw, one token per position and step for renoising.
//! A seeded stream for generation; given streams for replaying another implementation's run
//! (transformers', llama.cpp's) step by step.

use std::collections::VecDeque;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::gpu::DiffusionError;

/// The sampler's random draws, in the order the sampler asks for them: per block, the
/// starting canvas; then per step, the uniforms, then the renoise tokens.
pub trait SamplerRng {
    /// A block's starting canvas: tokens uniform in `[0, vocab)`.
    fn canvas(&mut self, out: &mut [u32], vocab: u32) -> Result<(), DiffusionError>;
    /// A step's uniforms in `[0, 1)`, one per position.
    fn uniforms(&mut self, out: &mut [f32]) -> Result<(), DiffusionError>;
    /// A step's renoise tokens, uniform in `[0, vocab)`.
    fn renoise(&mut self, out: &mut [u32], vocab: u32) -> Result<(), DiffusionError>;
}

/// ChaCha8 from a 64-bit seed: the same seed gives the same run on every platform.
pub struct SeededRng(ChaCha8Rng);

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        Self(ChaCha8Rng::seed_from_u64(seed))
    }

    fn tokens(&mut self, out: &mut [u32], vocab: u32) {
        // The modulo's bias is below 2^-40 for any vocabulary.
        out.iter_mut()
            .for_each(|t| *t = (self.0.next_u64() % u64::from(vocab.max(1))) as u32);
    }
}

impl SamplerRng for SeededRng {
    fn canvas(&mut self, out: &mut [u32], vocab: u32) -> Result<(), DiffusionError> {
        self.tokens(out, vocab);
        Ok(())
    }

    fn uniforms(&mut self, out: &mut [f32]) -> Result<(), DiffusionError> {
        // 24 bits: every value exact in f32, and below 1.
        out.iter_mut()
            .for_each(|u| *u = (self.0.next_u32() >> 8) as f32 / (1u32 << 24) as f32);
        Ok(())
    }

    fn renoise(&mut self, out: &mut [u32], vocab: u32) -> Result<(), DiffusionError> {
        self.tokens(out, vocab);
        Ok(())
    }
}

/// Given streams, consumed row by row: canvases (one per block), uniforms and renoise tokens
/// (one row per step). Running out is an error.
#[derive(Clone, Debug, Default)]
pub struct ReplayRng {
    pub canvases: VecDeque<Vec<u32>>,
    pub uniforms: VecDeque<Vec<f32>>,
    pub renoise: VecDeque<Vec<u32>>,
}

fn next_row<T: Copy>(rows: &mut VecDeque<Vec<T>>, out: &mut [T]) -> Result<(), DiffusionError> {
    let row = rows.pop_front().ok_or(DiffusionError::StreamsExhausted)?;
    if row.len() != out.len() {
        return Err(DiffusionError::Input(format!(
            "a stream row of {} values for a canvas of {}",
            row.len(),
            out.len()
        )));
    }
    out.copy_from_slice(&row);
    Ok(())
}

impl SamplerRng for ReplayRng {
    fn canvas(&mut self, out: &mut [u32], _vocab: u32) -> Result<(), DiffusionError> {
        next_row(&mut self.canvases, out)
    }

    fn uniforms(&mut self, out: &mut [f32]) -> Result<(), DiffusionError> {
        next_row(&mut self.uniforms, out)
    }

    fn renoise(&mut self, out: &mut [u32], _vocab: u32) -> Result<(), DiffusionError> {
        next_row(&mut self.renoise, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_streams_and_values_in_range() {
        let (mut a, mut b) = (SeededRng::new(9), SeededRng::new(9));
        let (mut x, mut y) = (vec![0u32; 64], vec![0u32; 64]);
        a.canvas(&mut x, 7).unwrap();
        b.canvas(&mut y, 7).unwrap();
        assert_eq!(x, y);
        assert!(x.iter().all(|&t| t < 7) && x.iter().any(|&t| t != x[0]));
        let mut u = vec![0f32; 1000];
        a.uniforms(&mut u).unwrap();
        assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
    }

    #[test]
    fn replayed_streams_run_out_with_an_error() {
        let mut r = ReplayRng {
            uniforms: VecDeque::from([vec![0.5; 3]]),
            ..Default::default()
        };
        let mut u = vec![0f32; 3];
        r.uniforms(&mut u).unwrap();
        assert_eq!(u, [0.5; 3]);
        assert!(matches!(
            r.uniforms(&mut u),
            Err(DiffusionError::StreamsExhausted)
        ));
        assert!(r.canvas(&mut [0; 3], 10).is_err());
    }
}
