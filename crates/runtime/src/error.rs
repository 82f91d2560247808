//! The one error type of the public API.

/// Everything that can go wrong loading a model or generating with it. The session stays
/// usable after any error but [`Error::Gpu`] with a lost device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    #[error("reading the model: {0}")]
    Read(#[from] wgemma_gguf::SourceError),
    #[error("the model file is not valid GGUF: {0}")]
    Gguf(#[from] wgemma_gguf::GgufError),
    #[error("model configuration: {0}")]
    Config(#[from] wgemma_text::ConfigError),
    #[error("loading weights: {0}")]
    Load(#[from] wgemma_text::LoadError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] wgemma_text::tokenizer::TokenizerError),
    #[error("chat: {0}")]
    Chat(#[from] wgemma_text::chat::ChatError),
    #[error(transparent)]
    Forward(#[from] wgemma_text::ForwardError),
    #[error(transparent)]
    Gpu(#[from] wgemma_kernels::GpuError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("bad request: {0}")]
    Request(String),
    #[error("sampling: {0}")]
    Sampling(#[from] wgemma_text::SamplingError),

    #[error("the session is busy with another generation")]
    Busy,
    #[error("LoRA adapter: {0}")]
    Adapter(#[from] wgemma_text::lora::LoraError),
    #[error("image: {0}")]
    Image(#[from] wgemma_vision::ImageError),
    #[error("vision tower: {0}")]
    Vision(#[from] wgemma_vision::VisionError),
    #[error(
        "the model has no vision tower for images (its projector file adds one: `--mmproj`, or `mmproj` in the browser)"
    )]
    NoVision,
    #[error("audio: {0}")]
    Audio(#[from] wgemma_audio::AudioError),
    #[error("audio tower: {0}")]
    AudioTower(#[from] wgemma_audio::TowerError),
    #[error(
        "the model has no audio tower (its projector file adds one: `--mmproj`, or `mmproj` in the browser)"
    )]
    NoAudio,
    #[error("the projector file holds neither a vision nor an audio tower")]
    NoTower,
    #[error(
        "this is a DiffusionGemma model (text diffusion): load it with DiffusionModel (`wgemma run` does)"
    )]
    DiffusionModel,
    #[error("text diffusion: {0}")]
    Diffusion(#[from] wgemma_diffusion::DiffusionError),
    #[error("text diffusion model: {0}")]
    DiffusionConfig(#[from] wgemma_diffusion::DiffusionConfigError),
}

impl From<wgemma_vision::VisionConfigError> for Error {
    fn from(e: wgemma_vision::VisionConfigError) -> Self {
        Error::Vision(e.into())
    }
}

impl From<wgemma_audio::AudioLoadError> for Error {
    fn from(e: wgemma_audio::AudioLoadError) -> Self {
        Error::AudioTower(e.into())
    }
}

impl Error {
    /// A short machine-readable code (what the JS API puts in its error objects).
    pub fn code(&self) -> &'static str {
        use wgemma_text::ForwardError as F;
        match self {
            // Reading the header can fail at the source, which says nothing about the file.
            Error::Source(_) | Error::Read(_) | Error::Gguf(wgemma_gguf::GgufError::Source(_)) => {
                "source"
            }
            Error::Gguf(_) => "bad_gguf",
            Error::Config(_) | Error::DiffusionModel | Error::DiffusionConfig(_) => {
                "unsupported_model"
            }
            Error::Diffusion(wgemma_diffusion::DiffusionError::ContextOverflow { .. }) => {
                "context_overflow"
            }
            Error::Diffusion(_) => "forward",
            Error::Load(_) => "load",
            Error::Tokenizer(_) => "tokenizer",
            Error::Chat(_) => "chat",
            Error::Forward(F::ContextOverflow { .. }) => "context_overflow",
            Error::Forward(F::NonFiniteLogits) => "bad_model",
            Error::Forward(F::BadToken { .. }) => "bad_token",
            Error::Forward(F::Gpu(_)) | Error::Gpu(_) => "gpu",
            Error::Adapter(_) | Error::Forward(F::Lora(_)) => "adapter",
            Error::Forward(_) => "forward",
            Error::EmptyPrompt => "empty_prompt",
            Error::Request(_) | Error::Sampling(_) => "bad_request",
            Error::Busy => "busy",
            Error::Image(_) => "bad_image",
            Error::Vision(_) => "vision",
            Error::NoVision => "no_vision",
            Error::Audio(_) => "bad_audio",
            Error::AudioTower(_) => "audio",
            Error::NoAudio => "no_audio",
            Error::NoTower => "no_tower",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgemma_gguf::{GgufError, SourceError};

    #[test]
    fn a_failed_read_is_a_source_error_even_inside_the_header() {
        let read = || SourceError::Other("HTTP 503".into());
        assert_eq!(Error::Read(read()).code(), "source");
        assert_eq!(Error::Gguf(GgufError::Source(read())).code(), "source");
        assert_eq!(
            Error::Gguf(GgufError::BadMagic(*b"<!do")).code(),
            "bad_gguf"
        );
    }
}
