//! A summary of a GGUF file: what `wgemma info` prints.

use std::collections::BTreeMap;
use std::fmt;

use wgemma_audio::{AudioConfig, AudioLayout};
use wgemma_diffusion::DiffusionConfig;
use wgemma_gguf::{GgmlType, Gguf, Value};
use wgemma_vision::{ClampStore, VisionConfig, VisionLayout};

use crate::recommend::SamplingHints;

/// What a GGUF file holds, summarised.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub architecture: Option<String>,
    pub name: Option<String>,
    pub version: u32,
    pub file_size: u64,
    pub tensor_count: usize,
    pub parameter_count: u64,
    /// Per dtype: tensor count and bytes.
    pub dtypes: BTreeMap<GgmlType, (usize, u64)>,
    /// The architecture's own scalar keys (`gemma3.block_count`, ...), in file order.
    pub hyper_parameters: Vec<(String, Value)>,
    /// The vision tower the file holds (an mmproj file's, or an Ollama blob's inside the
    /// model), or why it cannot be used; `None` without one.
    pub vision: Option<Result<VisionConfig, String>>,
    /// The audio tower the file holds, likewise.
    pub audio: Option<Result<AudioConfig, String>>,
    /// DiffusionGemma's canvas and sampler settings (a `diffusion-gemma` file), or why they
    /// cannot be used; `None` for other architectures.
    pub diffusion: Option<Result<DiffusionConfig, String>>,
    /// Whether the file carries a chat template (instruction-tuned models do).
    pub chat_template: bool,
    /// The sampling settings the file recommends (`general.sampling.*`).
    pub sampling: SamplingHints,
    header: Gguf,
}

impl ModelInfo {
    pub fn new(g: &Gguf) -> Self {
        let architecture = g.architecture().map(str::to_string);
        let mut dtypes = BTreeMap::new();
        for t in g.tensors() {
            let e = dtypes.entry(t.dtype).or_insert((0, 0));
            e.0 += 1;
            e.1 += t.n_bytes;
        }
        let prefix = architecture.as_deref().map(|a| format!("{a}."));
        let hyper_parameters = g
            .metadata
            .entries()
            .iter()
            .filter(|(k, v)| {
                prefix.as_deref().is_some_and(|p| k.starts_with(p))
                    && !matches!(v, Value::Array(a) if a.len() > 64)
            })
            .cloned()
            .collect();
        Self {
            name: g
                .metadata
                .opt_str("general.name")
                .ok()
                .flatten()
                .map(str::to_string),
            architecture,
            version: g.version,
            file_size: g.file_len,
            tensor_count: g.tensors().len(),
            parameter_count: g.parameter_count(),
            dtypes,
            hyper_parameters,
            vision: VisionConfig::from_gguf(g)
                .map_err(|e| e.to_string())
                .transpose(),
            audio: AudioConfig::from_gguf(g)
                .map_err(|e| e.to_string())
                .transpose(),
            diffusion: (g.architecture() == Some("diffusion-gemma"))
                .then(|| DiffusionConfig::from_gguf(g).map_err(|e| e.to_string())),
            chat_template: crate::recommend::has_chat_template(&g.metadata),
            sampling: SamplingHints::from_metadata(&g.metadata),
            header: g.clone(),
        }
    }

    /// The vision tower as one line: its shape, or why it cannot be used.
    pub fn vision_line(&self) -> Option<String> {
        Some(match self.vision.as_ref()? {
            Ok(v) => {
                let layout = match v.layout {
                    VisionLayout::Mmproj => "llama.cpp mmproj",
                    VisionLayout::OllamaBlob => "inside the Ollama blob",
                };
                let clamps = match v.clamps {
                    ClampStore::None => "no clamps",
                    ClampStore::Scalars => "clamps as scalars",
                    ClampStore::Packed => "clamps packed",
                };
                format!(
                    "Gemma 4, {} layers, width {}, {} heads of {}, feed-forward {}, projected to {} ({layout}, {clamps}{}{})",
                    v.n_layer,
                    v.n_embd,
                    v.n_head,
                    v.head_dim,
                    v.n_ff,
                    v.projection_dim,
                    if v.standardize { ", standardized" } else { "" },
                    if v.out_scale {
                        ", layer output scales"
                    } else {
                        ""
                    },
                )
            }
            Err(e) => format!("unusable: {e}"),
        })
    }

    /// DiffusionGemma's canvas and sampler as one line, or why they cannot be used.
    pub fn diffusion_line(&self) -> Option<String> {
        Some(match self.diffusion.as_ref()? {
            Ok(d) => {
                let s = &d.sampler;
                format!(
                    "canvas {}, up to {} steps a block, temperature {} to {}, entropy bound {}, stable for {} step(s) and mean entropy under {}",
                    d.canvas_length,
                    s.max_steps,
                    s.t_max,
                    s.t_min,
                    s.entropy_bound,
                    s.stability_threshold,
                    s.confidence_threshold
                )
            }
            Err(e) => format!("unusable: {e}"),
        })
    }

    /// The audio tower as one line: its shape, or why it cannot be used.
    pub fn audio_line(&self) -> Option<String> {
        Some(match self.audio.as_ref()? {
            Ok(a) => format!(
                "Gemma 4 conformer, {} blocks, width {}, {} heads of {}, feed-forward {}, projected to {} ({})",
                a.n_layer,
                a.hidden,
                a.n_head,
                a.head_dim(),
                a.ff,
                a.text_width,
                match a.layout {
                    AudioLayout::Mmproj => "llama.cpp mmproj",
                    AudioLayout::OllamaBlob => "inside the Ollama blob",
                },
            ),
            Err(e) => format!("unusable: {e}"),
        })
    }

    fn audio_json(&self) -> serde_json::Value {
        match &self.audio {
            None => serde_json::Value::Null,
            Some(Err(e)) => serde_json::json!({ "error": e }),
            Some(Ok(a)) => audio_json(a),
        }
    }

    fn vision_json(&self) -> serde_json::Value {
        match &self.vision {
            None => serde_json::Value::Null,
            Some(Err(e)) => serde_json::json!({ "error": e }),
            Some(Ok(v)) => vision_json(v),
        }
    }

    /// One JSON object: `architecture`, `tensor_count`, `parameter_count`, `file_size`,
    /// `metadata` (every scalar key), `dtypes`, and `tensors` (name, dtype, shape, offset).
    pub fn to_json(&self) -> serde_json::Value {
        let metadata: serde_json::Map<String, serde_json::Value> = self
            .header
            .metadata
            .entries()
            .iter()
            .filter(|(_, v)| !matches!(v, Value::Array(_)))
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect();
        let dtypes: serde_json::Map<String, serde_json::Value> = self
            .dtypes
            .iter()
            .map(|(t, (n, bytes))| {
                (
                    t.name().to_string(),
                    serde_json::json!({ "tensors": n, "bytes": bytes }),
                )
            })
            .collect();
        let tensors: Vec<serde_json::Value> = self
            .header
            .tensors()
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "dtype": t.dtype.name(),
                    "shape": t.dims,
                    "offset": self.header.data_offset + t.offset,
                    "bytes": t.n_bytes,
                })
            })
            .collect();
        serde_json::json!({
            "architecture": self.architecture,
            "name": self.name,
            "gguf_version": self.version,
            "file_size": self.file_size,
            "tensor_count": self.tensor_count,
            "parameter_count": self.parameter_count,
            "alignment": self.header.alignment,
            "data_offset": self.header.data_offset,
            "metadata": metadata,
            "dtypes": dtypes,
            "tensors": tensors,
            "vision": self.vision_json(),
            "audio": self.audio_json(),
            "diffusion": self.diffusion_json(),
            "chat_template": self.chat_template,
        })
    }

    fn diffusion_json(&self) -> serde_json::Value {
        match &self.diffusion {
            None => serde_json::Value::Null,
            Some(Err(e)) => serde_json::json!({ "error": e }),
            Some(Ok(d)) => {
                let s = &d.sampler;
                serde_json::json!({
                    "canvas_length": d.canvas_length,
                    "max_steps": s.max_steps,
                    "t_min": s.t_min,
                    "t_max": s.t_max,
                    "entropy_bound": s.entropy_bound,
                    "stability_threshold": s.stability_threshold,
                    "confidence_threshold": s.confidence_threshold,
                })
            }
        }
    }
}

/// An audio tower's shape as `wgemma info --json` prints it.
pub(crate) fn audio_json(a: &AudioConfig) -> serde_json::Value {
    serde_json::json!({
        "layout": format!("{:?}", a.layout),
        "block_count": a.n_layer,
        "embedding_length": a.hidden,
        "feed_forward_length": a.ff,
        "head_count": a.n_head,
        "subsampling_channels": a.sscp_channels,
        "output_dims": a.output_dims,
        "projection_dim": a.text_width,
    })
}

/// A vision tower's shape as `wgemma info --json` prints it.
pub(crate) fn vision_json(v: &VisionConfig) -> serde_json::Value {
    serde_json::json!({
        "layout": format!("{:?}", v.layout),
        "block_count": v.n_layer,
        "embedding_length": v.n_embd,
        "feed_forward_length": v.n_ff,
        "head_count": v.n_head,
        "head_dim": v.head_dim,
        "projection_dim": v.projection_dim,
        "positions": v.n_positions,
        "clamps": format!("{:?}", v.clamps),
        "standardize": v.standardize,
        "out_scale": v.out_scale,
    })
}

/// `temperature 1, top-k 64, top-p 0.95`: the settings a file recommends.
fn hints_line(h: &SamplingHints) -> String {
    let mut parts = Vec::new();
    let mut float = |name: &str, v: Option<f32>| {
        if let Some(v) = v {
            parts.push(format!("{name} {v}"));
        }
    };
    float("temperature", h.temperature);
    float("top-p", h.top_p);
    float("min-p", h.min_p);
    float("repeat-penalty", h.repeat_penalty);
    if let Some(k) = h.top_k {
        parts.push(format!("top-k {k}"));
    }
    if let Some(n) = h.penalty_last_n {
        parts.push(format!("penalty-last-n {n}"));
    }
    parts.join(", ")
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

impl fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "architecture     {}",
            self.architecture.as_deref().unwrap_or("(none)")
        )?;
        if let Some(name) = &self.name {
            writeln!(f, "name             {name}")?;
        }
        writeln!(f, "gguf version     {}", self.version)?;
        writeln!(
            f,
            "file size        {} ({} bytes)",
            human_bytes(self.file_size),
            self.file_size
        )?;
        writeln!(f, "tensors          {}", self.tensor_count)?;
        writeln!(
            f,
            "parameters       {} ({})",
            human_count(self.parameter_count),
            self.parameter_count
        )?;
        writeln!(f, "dtypes")?;
        for (t, (n, bytes)) in &self.dtypes {
            writeln!(
                f,
                "  {:<8} {n:>5} tensors  {:>10}",
                t.name(),
                human_bytes(*bytes)
            )?;
        }
        if let Some(line) = self.vision_line() {
            writeln!(f, "vision tower     {line}")?;
        }
        if let Some(line) = self.audio_line() {
            writeln!(f, "audio tower      {line}")?;
        }
        if let Some(line) = self.diffusion_line() {
            writeln!(f, "text diffusion   {line}")?;
        }
        let template = if self.chat_template {
            "yes"
        } else {
            "none (a pretrained model: `wgemma run` continues text)"
        };
        writeln!(f, "chat template    {template}")?;
        if !self.sampling.is_empty() {
            writeln!(f, "sampling         {}", hints_line(&self.sampling))?;
        }
        if !self.hyper_parameters.is_empty() {
            writeln!(f, "hyper-parameters")?;
            for (k, v) in &self.hyper_parameters {
                writeln!(f, "  {k:<44} {v}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgemma_gguf::write_gguf;

    /// A projector file of another kind says why its tower cannot be used, in text and JSON.
    #[test]
    fn an_unusable_tower_says_why() {
        let meta: Vec<(String, Value)> = [
            ("general.architecture", Value::String("clip".into())),
            ("clip.has_vision_encoder", Value::Bool(true)),
            ("clip.vision.projector_type", Value::String("gemma3".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let g = Gguf::parse(&write_gguf(&meta, &[], 32).unwrap()).unwrap();
        let info = ModelInfo::new(&g);
        assert!(
            info.to_string()
                .contains("vision tower     unusable: the projector is \"gemma3\"")
        );
        assert!(
            info.to_json()["vision"]["error"]
                .as_str()
                .unwrap()
                .contains("gemma4v")
        );
    }
}
