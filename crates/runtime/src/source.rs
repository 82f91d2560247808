//! Where a model comes from: a GGUF path, or a name in Ollama's store.

use std::path::PathBuf;

use wgemma_gguf::ollama::{self, OllamaError, OllamaName};

/// A model's files on disk: the GGUF and, for llama.cpp's split layout or an Ollama manifest
/// that has one, the multimodal projector GGUF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSource {
    pub model: PathBuf,
    pub projector: Option<PathBuf>,
    /// What the user asked for (a path or an Ollama name), for messages.
    pub label: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}: no such file, and not a model in the Ollama store")]
    NotFound(String),
    #[error(transparent)]
    Ollama(#[from] OllamaError),
    #[error("{path}: {reason}")]
    Open { path: String, reason: String },
}

impl ModelSource {
    /// Resolves `spec`: an existing file path wins; otherwise a name like `gemma3:270m` is
    /// looked up in the Ollama store.
    pub fn resolve(spec: &str) -> Result<Self, SourceError> {
        let path = PathBuf::from(spec);
        if path.is_file() {
            return Ok(Self {
                model: path,
                projector: None,
                label: spec.to_string(),
            });
        }
        if OllamaName::looks_like_name(spec) {
            let m = ollama::resolve(spec)?;
            return Ok(Self {
                model: m.model,
                projector: m.projector,
                label: m.name.to_string(),
            });
        }
        Err(SourceError::NotFound(spec.to_string()))
    }
}
