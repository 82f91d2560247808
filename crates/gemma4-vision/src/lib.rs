//! Gemma 4 vision: image decoding and resizing to the model's patch grid ([`preprocess`]), the
//! tower's shape and tensors from an `mmproj` GGUF (llama.cpp) or the vision tensors of an
//! Ollama blob ([`config`], [`tensors`]), the tower on the GPU ([`VisionTower`]: patches in,
//! soft tokens for the text model's image placeholders out) and its f32 CPU reference
//! ([`CpuTower`]).
//!
//! transformers' Gemma 4 is the reference throughout (`../shared/reference/multimodal.md`):
//! where llama.cpp and Ollama differ from it (the MLP's activation: transformers' tanh GELU,
//! their quick GELU; the embedder's RMSNorm before the projection), wgemma follows
//! transformers.

pub mod config;
pub mod preprocess;
pub mod reference;
pub mod synth;
pub mod tensors;
pub mod tower;

pub use config::{ClampStore, VisionConfig, VisionConfigError, VisionLayout};
pub use reference::{CpuTower, Trace};
pub use tower::{Encoded, VisionTower};

pub use preprocess::{
    DEFAULT_TOKEN_BUDGET, ImageError, PATCH, POOL, Patches, TOKEN_BUDGETS, decode, patches,
    resized_size,
};

/// Why the tower cannot encode an image or be loaded.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error(transparent)]
    Config(#[from] VisionConfigError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("reading the vision tower: {0}")]
    Read(#[from] wgemma_gguf::ReadError),
    #[error("loading the vision tower: {0}")]
    Store(#[from] wgemma_kernels::store::StoreError),
    #[error(transparent)]
    Gpu(#[from] wgemma_kernels::GpuError),
    #[error("the image is {cols} x {rows} patches; the tower's position tables hold {max} a side")]
    TooLarge { rows: u32, cols: u32, max: usize },
    #[error("the image has no patches, or sides that are not multiples of {POOL} patches")]
    BadGrid,
}

/// Errors unless `p`'s patch grid is one the tower's position tables and pooling take.
pub(crate) fn check_positions(cfg: &VisionConfig, p: &Patches) -> Result<(), VisionError> {
    if p.rows == 0 || p.cols == 0 || !p.rows.is_multiple_of(POOL) || !p.cols.is_multiple_of(POOL) {
        return Err(VisionError::BadGrid);
    }
    if p.rows as usize > cfg.n_positions || p.cols as usize > cfg.n_positions {
        return Err(VisionError::TooLarge {
            rows: p.rows,
            cols: p.cols,
            max: cfg.n_positions,
        });
    }
    if p.pixels.len() != (p.rows * p.cols) as usize * Patches::PATCH_VALUES {
        return Err(VisionError::BadGrid);
    }
    Ok(())
}
