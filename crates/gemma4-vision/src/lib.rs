//! Gemma 4 vision: image decoding and resizing to the model's patch grid ([`preprocess`]), and
//! the tower's shape from an `mmproj` GGUF (llama.cpp) or the vision tensors of an Ollama blob
//! ([`config`]). The ViT tower run through `wgemma-kernels` and the projection of its output
//! into the soft tokens that fill a prompt's image placeholders are not written yet.
//!
//! transformers' Gemma 4 is the reference throughout (`../shared/reference/multimodal.md`).

pub mod config;
pub mod preprocess;

pub use config::{ClampStore, VisionConfig, VisionConfigError, VisionLayout};

pub use preprocess::{
    DEFAULT_TOKEN_BUDGET, ImageError, PATCH, POOL, Patches, TOKEN_BUDGETS, decode, patches,
    resized_size,
};
