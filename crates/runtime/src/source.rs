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
    /// An Ollama model's default options (a JSON file), when its manifest has them.
    pub params: Option<PathBuf>,
    /// Whether an Ollama manifest gives the model a chat template (the GGUF may lack one).
    pub chat_template: bool,
    /// That template's file (Ollama's Go template text).
    pub template: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}: no such file, and not a model in the Ollama store")]
    NotFound(String),
    #[error(transparent)]
    Ollama(#[from] OllamaError),
    #[error("{path}: {reason}")]
    Open { path: String, reason: String },
    #[error("{0}: is a directory, not a GGUF file")]
    Directory(String),
    #[error("{0}: is not a regular file (a FIFO, socket or device), not a GGUF file")]
    NotRegularFile(String),
}

impl ModelSource {
    /// The sampling settings an Ollama manifest's parameters recommend (none for a plain
    /// GGUF path, whose own recommendations are in its metadata). An unreadable parameters
    /// file is ignored with a warning: it only holds defaults.
    pub fn sampling_hints(&self) -> crate::SamplingHints {
        let Some(path) = &self.params else {
            return crate::SamplingHints::default();
        };
        // Ollama writes a few hundred bytes; anything far larger is not a parameters file.
        let read = std::fs::metadata(path)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                if m.len() > 1 << 20 {
                    Err(format!("{} bytes", m.len()))
                } else {
                    std::fs::read(path).map_err(|e| e.to_string())
                }
            })
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        match read {
            Ok(json) => crate::SamplingHints::from_ollama_params(&json),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring the model's parameters: {e}");
                crate::SamplingHints::default()
            }
        }
    }

    /// Resolves `spec`: an existing file path wins; otherwise a name like `gemma3:270m` is
    /// looked up in the Ollama store. A path that exists but is not a regular file (and is not
    /// also a name in the store) is an error saying what it is.
    pub fn resolve(spec: &str) -> Result<Self, SourceError> {
        let path = PathBuf::from(spec);
        // The path's metadata, never an open: opening a FIFO would wait for a writer.
        let kind = match std::fs::metadata(&path) {
            Ok(meta) => Some(meta.file_type()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) if !OllamaName::looks_like_name(spec) => {
                return Err(SourceError::Open {
                    path: spec.to_string(),
                    reason: e.to_string(),
                });
            }
            Err(_) => None,
        };
        if kind.is_some_and(|k| k.is_file()) {
            return Ok(Self {
                model: path,
                projector: None,
                label: spec.to_string(),
                params: None,
                chat_template: false,
                template: None,
            });
        }
        if OllamaName::looks_like_name(spec) {
            match ollama::resolve(spec) {
                Ok(m) => {
                    return Ok(Self {
                        model: m.model,
                        projector: m.projector,
                        label: m.name.to_string(),
                        params: m.params,
                        chat_template: m.template.is_some(),
                        template: m.template,
                    });
                }
                // Not in the store, but something by that name is here: say what it is.
                Err(_) if kind.is_some() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(match kind {
            Some(k) if k.is_dir() => SourceError::Directory(spec.to_string()),
            Some(_) => SourceError::NotRegularFile(spec.to_string()),
            None => SourceError::NotFound(spec.to_string()),
        })
    }
}
