//! What a model's files recommend to whoever runs it: sampling settings (llama.cpp's
//! `general.sampling.*` keys in the GGUF, or the parameters layer of an Ollama model), and
//! whether it is meant for chat (a chat template in the GGUF or in the Ollama manifest).

use wgemma_gguf::Metadata;
use wgemma_text::SamplingParams;

/// Sampling settings a model file recommends; each that is present overrides a default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingHints {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub penalty_last_n: Option<usize>,
}

impl SamplingHints {
    /// llama.cpp's keys (`general.sampling.temp`, `.top_k`, `.top_p`, `.min_p`,
    /// `.penalty_repeat`, `.penalty_last_n`). A key of the wrong type is ignored with a
    /// warning: a hint is no reason to refuse a model.
    pub fn from_metadata(meta: &Metadata) -> Self {
        let float = |key: &str| match meta.opt_f32(key) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(key, "ignoring a sampling hint: {e}");
                None
            }
        };
        let count = |key: &str| match meta.opt_u64(key) {
            Ok(v) => v.and_then(|v| usize::try_from(v).ok()),
            Err(e) => {
                tracing::warn!(key, "ignoring a sampling hint: {e}");
                None
            }
        };
        Self {
            temperature: float("general.sampling.temp"),
            top_k: count("general.sampling.top_k"),
            top_p: float("general.sampling.top_p"),
            min_p: float("general.sampling.min_p"),
            repeat_penalty: float("general.sampling.penalty_repeat"),
            penalty_last_n: count("general.sampling.penalty_last_n"),
        }
    }

    /// An Ollama model's parameters layer: `{"temperature": 1, "top_k": 64, "top_p": 0.95,
    /// "stop": [...]}` (Ollama's option names; others are ignored).
    pub fn from_ollama_params(json: &serde_json::Value) -> Self {
        let float = |key: &str| json.get(key)?.as_f64().map(|v| v as f32);
        let count = |key: &str| usize::try_from(json.get(key)?.as_u64()?).ok();
        Self {
            temperature: float("temperature"),
            top_k: count("top_k"),
            top_p: float("top_p"),
            min_p: float("min_p"),
            repeat_penalty: float("repeat_penalty"),
            penalty_last_n: count("repeat_last_n"),
        }
    }

    /// Each setting of `self`, else of `other`.
    pub fn or(self, other: Self) -> Self {
        Self {
            temperature: self.temperature.or(other.temperature),
            top_k: self.top_k.or(other.top_k),
            top_p: self.top_p.or(other.top_p),
            min_p: self.min_p.or(other.min_p),
            repeat_penalty: self.repeat_penalty.or(other.repeat_penalty),
            penalty_last_n: self.penalty_last_n.or(other.penalty_last_n),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `base` with the hinted settings in place. Hints this runtime cannot honour (a top-k
    /// above what the GPU keeps, a temperature that is not a number) are dropped with a
    /// warning, so a file's odd recommendation never stops a run.
    pub fn apply(&self, base: SamplingParams) -> SamplingParams {
        let mut p = base.clone();
        let mut set = |f: &dyn Fn(&mut SamplingParams)| {
            let before = p.clone();
            f(&mut p);
            if let Err(e) = p.validate() {
                tracing::warn!("ignoring the model's recommended {e}");
                p = before;
            }
        };
        if let Some(v) = self.temperature {
            set(&|p| p.temperature = v);
        }
        if let Some(v) = self.top_k {
            set(&|p| p.top_k = v);
        }
        if let Some(v) = self.top_p {
            set(&|p| p.top_p = v);
        }
        if let Some(v) = self.min_p {
            set(&|p| p.min_p = v);
        }
        if let Some(v) = self.repeat_penalty {
            set(&|p| p.repeat_penalty = v);
        }
        if let Some(v) = self.penalty_last_n {
            set(&|p| p.penalty_last_n = v);
        }
        p
    }
}

/// Whether a GGUF carries a chat template (`tokenizer.chat_template`): instruction-tuned
/// models do; a pretrained model usually has none, and continues text rather than answering.
pub fn has_chat_template(meta: &Metadata) -> bool {
    meta.opt_str("tokenizer.chat_template")
        .ok()
        .flatten()
        .is_some_and(|t| !t.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgemma_gguf::Value;

    fn meta(entries: &[(&str, Value)]) -> Metadata {
        Metadata::from_entries(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn hints_come_from_llama_cpp_keys_and_ollama_params() {
        let m = meta(&[
            ("general.sampling.temp", Value::F32(0.7)),
            ("general.sampling.top_k", Value::U32(40)),
            ("general.sampling.penalty_repeat", Value::F32(1.1)),
            ("general.sampling.top_p", Value::String("high".into())),
        ]);
        let h = SamplingHints::from_metadata(&m);
        assert_eq!(h.temperature, Some(0.7));
        assert_eq!(h.top_k, Some(40));
        assert_eq!(h.repeat_penalty, Some(1.1));
        assert_eq!(h.top_p, None, "a hint of the wrong type is ignored");
        let o = SamplingHints::from_ollama_params(&serde_json::json!({
            "temperature": 1, "top_k": 64, "top_p": 0.95, "stop": ["<end_of_turn>"]
        }));
        assert_eq!(
            (o.temperature, o.top_k, o.top_p),
            (Some(1.0), Some(64), Some(0.95))
        );
        let both = h.clone().or(o);
        assert_eq!((both.temperature, both.top_p), (Some(0.7), Some(0.95)));
    }

    #[test]
    fn hints_apply_over_a_base_and_bad_ones_are_dropped() {
        let h = SamplingHints {
            temperature: Some(0.5),
            top_k: Some(100),
            top_p: Some(f32::NAN),
            ..SamplingHints::default()
        };
        let p = h.apply(SamplingParams::gemma(1));
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.top_k, 64, "top-k 100 cannot be honoured; the base stays");
        assert_eq!(p.top_p, 0.95);
        assert!(p.validate().is_ok());
    }

    #[test]
    fn a_chat_template_is_a_non_empty_string() {
        assert!(!has_chat_template(&meta(&[])));
        let t = |s: &str| meta(&[("tokenizer.chat_template", Value::String(s.into()))]);
        assert!(!has_chat_template(&t("  ")));
        assert!(has_chat_template(&t("{{ bos_token }}")));
    }
}
