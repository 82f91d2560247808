//! The Gemma text decoder: configuration from GGUF metadata, tokenizer and chat template, an
//! f32 CPU reference forward, and the GPU forward (batched prefill, one-token decode, KV cache
//! on the GPU) with sampling.

pub mod chat;
pub mod config;
pub mod forward;
pub mod lora;
pub mod plans;
pub mod reference;
pub mod sampling;
pub mod synth;
pub mod tensors;
pub mod tokenizer;

pub use config::{Arch, ConfigError, LayerConfig, TextConfig};
pub use forward::{
    BatchDecoder, BatchRow, CanvasBuffers, CanvasWork, ExpertPlacement, ForwardError, Fusions,
    GpuModel, GpuSession, KvPool, LoadError, LoadOptions, LoadProgress, MAX_TOP_LOGPROBS, PleRows,
    PrefillWatch, PreparedLora, SessionOptions, SoftTokens, TokenLogprobs, Traced, WeightBytes,
};
pub use reference::{CpuModel, Input, LayerQkv, LayerRole, Matrix};
pub use sampling::{SamplingError, SamplingParams};
