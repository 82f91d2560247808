//! wgemma: Gemma inference on the GPU through wgpu, natively and in the browser.
//!
//! This crate is the thin layer users depend on: where a model comes from ([`ModelSource`]),
//! what a file holds ([`ModelInfo`]), and the asynchronous session API.

mod info;
#[cfg(not(target_arch = "wasm32"))]
pub mod pull;
mod source;

pub use info::ModelInfo;
pub use source::{ModelSource, SourceError};
pub use wgemma_gguf as gguf;
