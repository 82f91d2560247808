//! DiffusionGemma: Gemma 4 26B-A4B's layers run two ways with one weight set. A causal
//! encoder reads the prompt (and every finished block) into the KV cache; a bidirectional
//! denoiser refines a canvas of `canvas_length` tokens over several steps, each step fed the
//! previous one's logits through the self-conditioning block. transformers'
//! `models/diffusion_gemma` is the reference.
//!
//! - [`DiffusionConfig`]: the text configuration plus the canvas and the sampler's defaults;
//! - [`mask`]: which keys each row of the unified pass sees;
//! - [`CpuDiffusion`]: the f32 CPU reference of the canvas logits;
//! - [`GpuDiffusion`] and [`DiffusionSession`]: the model on the GPU, its prompt in the KV
//!   cache, and denoising steps over the canvas.

pub mod config;
pub mod generate;
pub mod gpu;
pub mod mask;
pub mod reference;
pub mod sampler;
pub mod session;
pub mod tensors;

pub use config::{DiffusionConfig, DiffusionConfigError, EntropyBound};
pub use generate::{BlockLoop, DiffusionEvent, DiffusionRequest, Finish, Generated, generate};
pub use gpu::{DiffusionError, GpuDiffusion};
pub use reference::CpuDiffusion;
pub use sampler::{ReplayRng, SamplerRng, SeededRng};
pub use session::{DiffusionSession, SelfConditioning, StepOutcome};
pub use tensors::SelfCond;
