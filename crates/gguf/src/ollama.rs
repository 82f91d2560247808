//! Finding a model in Ollama's on-disk store.
//!
//! Ollama keeps `manifests/<registry>/<namespace>/<model>/<tag>` (a JSON manifest naming layers
//! by digest) and `blobs/sha256-<hex>` (the layer contents) under `$OLLAMA_MODELS` or
//! `~/.ollama/models`. The model layer is a GGUF; newer multimodal models may add a projector
//! layer.

use std::path::{Path, PathBuf};

const DEFAULT_REGISTRY: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const DEFAULT_TAG: &str = "latest";
const MODEL_MEDIA_TYPE: &str = "application/vnd.ollama.image.model";
const PROJECTOR_MEDIA_TYPE: &str = "application/vnd.ollama.image.projector";
const PARAMS_MEDIA_TYPE: &str = "application/vnd.ollama.image.params";
const TEMPLATE_MEDIA_TYPE: &str = "application/vnd.ollama.image.template";

/// A parsed model reference: `[registry/][namespace/]model[:tag]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OllamaName {
    pub registry: String,
    pub namespace: String,
    pub model: String,
    pub tag: String,
}

/// The files a manifest points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OllamaModel {
    pub name: OllamaName,
    pub manifest: PathBuf,
    /// The GGUF holding the model weights.
    pub model: PathBuf,
    /// The vision/audio projector GGUF, when the manifest has one.
    pub projector: Option<PathBuf>,
    /// The model's default options (JSON: `temperature`, `top_k`, ...), when it has some.
    pub params: Option<PathBuf>,
    /// The chat template (Go template text), when it has one: chat models do.
    pub template: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum OllamaError {
    #[error(
        "{} is not an Ollama model name ([registry/][namespace/]model[:tag])",
        crate::Quoted(.0)
    )]
    BadName(String),
    #[error("no Ollama model store found: set OLLAMA_MODELS or HOME")]
    NoStore,
    #[error("model {name} is not in the Ollama store at {store} (no manifest at {manifest})")]
    NotFound {
        name: String,
        store: PathBuf,
        manifest: PathBuf,
    },
    #[error("manifest {path} could not be read: {reason}")]
    BadManifest { path: PathBuf, reason: String },
    #[error("manifest {manifest} names blob {blob}, which is missing")]
    MissingBlob { manifest: PathBuf, blob: PathBuf },
}

impl OllamaName {
    /// Parses `gemma4:e2b`, `library/gemma4:latest`, `registry.ollama.ai/library/gemma4:e2b`...
    pub fn parse(s: &str) -> Result<Self, OllamaError> {
        let bad = || OllamaError::BadName(s.to_string());
        let (path, tag) = match s.rsplit_once(':') {
            // A ':' inside the registry part (host:port) is not a tag separator.
            Some((p, t)) if !t.contains('/') => (p, t),
            _ => (s, DEFAULT_TAG),
        };
        let parts: Vec<&str> = path.split('/').collect();
        let (registry, namespace, model) = match parts.as_slice() {
            [m] => (DEFAULT_REGISTRY, DEFAULT_NAMESPACE, *m),
            [ns, m] => (DEFAULT_REGISTRY, *ns, *m),
            [r, ns, m] => (*r, *ns, *m),
            _ => return Err(bad()),
        };
        // Only the registry may hold a ':' (host:port).
        let valid = |p: &str, extra: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c) || extra.contains(c))
        };
        if !(valid(registry, ":") && valid(namespace, "") && valid(model, "") && valid(tag, "")) {
            return Err(bad());
        }
        Ok(Self {
            registry: registry.to_string(),
            namespace: namespace.to_string(),
            model: model.to_string(),
            tag: tag.to_string(),
        })
    }

    /// Whether `s` looks like a model name rather than a file path.
    pub fn looks_like_name(s: &str) -> bool {
        !s.ends_with(".gguf")
            && !s.starts_with('.')
            && !s.starts_with('/')
            && !s.contains('\\')
            && Self::parse(s).is_ok()
    }

    fn manifest_path(&self, store: &Path) -> PathBuf {
        store
            .join("manifests")
            .join(&self.registry)
            .join(&self.namespace)
            .join(&self.model)
            .join(&self.tag)
    }
}

impl std::fmt::Display for OllamaName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}:{}",
            self.registry, self.namespace, self.model, self.tag
        )
    }
}

/// The store directory: `$OLLAMA_MODELS`, else `~/.ollama/models`.
pub fn default_store() -> Result<PathBuf, OllamaError> {
    if let Some(dir) = std::env::var_os("OLLAMA_MODELS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .ok_or(OllamaError::NoStore)?;
    Ok(PathBuf::from(home).join(".ollama").join("models"))
}

/// Resolves `name` in the store at `store` to its blob paths.
pub fn resolve_in(store: &Path, name: &str) -> Result<OllamaModel, OllamaError> {
    let parsed = OllamaName::parse(name)?;
    let manifest = parsed.manifest_path(store);
    let text = match std::fs::read_to_string(&manifest) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(OllamaError::NotFound {
                name: parsed.to_string(),
                store: store.to_path_buf(),
                manifest,
            });
        }
        Err(e) => {
            return Err(OllamaError::BadManifest {
                path: manifest,
                reason: e.to_string(),
            });
        }
    };
    let bad = |reason: String| OllamaError::BadManifest {
        path: manifest.clone(),
        reason,
    };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let layers = json
        .get("layers")
        .and_then(|l| l.as_array())
        .ok_or_else(|| bad("no \"layers\" array".into()))?;
    let blob_of = |media: &str| -> Result<Option<PathBuf>, OllamaError> {
        let Some(layer) = layers
            .iter()
            .find(|l| l.get("mediaType").and_then(|m| m.as_str()) == Some(media))
        else {
            return Ok(None);
        };
        let digest = layer
            .get("digest")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad(format!("{media} layer has no digest")))?;
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
            .ok_or_else(|| bad(format!("digest {digest:?} is not sha256:<64 hex>")))?;
        let blob = store.join("blobs").join(format!("sha256-{hex}"));
        if !blob.is_file() {
            return Err(OllamaError::MissingBlob {
                manifest: manifest.clone(),
                blob,
            });
        }
        Ok(Some(blob))
    };
    let model = blob_of(MODEL_MEDIA_TYPE)?
        .ok_or_else(|| bad(format!("no layer of media type {MODEL_MEDIA_TYPE}")))?;
    let projector = blob_of(PROJECTOR_MEDIA_TYPE)?;
    Ok(OllamaModel {
        name: parsed,
        manifest: manifest.clone(),
        model,
        projector,
        params: blob_of(PARAMS_MEDIA_TYPE)?,
        template: blob_of(TEMPLATE_MEDIA_TYPE)?,
    })
}

/// Resolves `name` in the default store.
pub fn resolve(name: &str) -> Result<OllamaModel, OllamaError> {
    resolve_in(&default_store()?, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_defaults() {
        let n = OllamaName::parse("gemma4:e2b").unwrap();
        assert_eq!(
            (
                n.registry.as_str(),
                n.namespace.as_str(),
                n.model.as_str(),
                n.tag.as_str()
            ),
            ("registry.ollama.ai", "library", "gemma4", "e2b")
        );
        let n = OllamaName::parse("gemma3").unwrap();
        assert_eq!(n.tag, "latest");
        let n = OllamaName::parse("library/gemma4:latest").unwrap();
        assert_eq!(
            (n.namespace.as_str(), n.model.as_str()),
            ("library", "gemma4")
        );
        let n = OllamaName::parse("example.com:5000/me/model:q4").unwrap();
        assert_eq!(
            (
                n.registry.as_str(),
                n.namespace.as_str(),
                n.model.as_str(),
                n.tag.as_str()
            ),
            ("example.com:5000", "me", "model", "q4")
        );
        for bad in ["", "a/b/c/d", "../x", "a//b", "m:t:u", "x y"] {
            assert!(
                OllamaName::parse(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
        assert!(OllamaName::looks_like_name("gemma3:270m"));
        assert!(!OllamaName::looks_like_name("model.gguf"));
        assert!(!OllamaName::looks_like_name("/tmp/x"));
    }
}
