//! wgemma: Gemma inference on the GPU through wgpu, natively and in the browser.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wgemma::Error> {
//! use futures::StreamExt;
//! use wgemma::{GenerateRequest, LoadOptions, Model, Prompt, SessionOptions};
//!
//! let model = Model::load_file("gemma-3-270m-q4_k_m.gguf", LoadOptions::default()).await?;
//! let mut session = model.session(SessionOptions::default())?;
//! let mut stream = Box::pin(session.generate(GenerateRequest::new(Prompt::Text("Hello".into()))));
//! while let Some(event) = stream.next().await {
//!     println!("{:?}", event?);
//! }
//! # Ok(()) }
//! ```

mod audio;
mod batch;
mod clock;
mod diffusion;
mod error;
mod image;
mod info;
mod json;
mod media;
mod model;
#[cfg(not(target_arch = "wasm32"))]
pub mod pull;
pub mod recommend;
mod repeat;
mod session;
mod source;
#[cfg(target_arch = "wasm32")]
mod web;

pub use audio::AudioInput;
pub use batch::{Batch, SlotEvent};
#[cfg(not(target_arch = "wasm32"))]
pub use clock::fresh_seed;
pub use diffusion::{DiffusionChat, DiffusionGenerate, DiffusionModel, is_diffusion};
pub use error::Error;
pub use image::{ImageData, ImageInput};
pub use info::ModelInfo;
pub use json::session_options_from_json;
pub use model::{Adapter, LoadOptions, Model};
pub use recommend::SamplingHints;
pub use session::{
    CancelHandle, Event, GenerateRequest, MediaInput, Prompt, Session, StepProfile, StopReason,
    Timings,
};
pub use source::{ModelSource, SourceError};
pub use wgemma_diffusion::EntropyBound;
pub use wgemma_gguf as gguf;
pub use wgemma_kernels::{ContextOptions, GpuContext};
pub use wgemma_text::ExpertPlacement;
pub use wgemma_text::chat::{AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, Message, Role};
/// Soft tokens an image becomes at most unless a request says otherwise.
pub const DEFAULT_IMAGE_TOKENS: u32 = wgemma_vision::DEFAULT_TOKEN_BUDGET;
pub use wgemma_text::tokenizer::{MarkedText, Tokenizer};
pub use wgemma_text::{
    LoadProgress, MAX_TOP_LOGPROBS, SamplingParams, SessionOptions, TokenLogprobs,
};
