//! LoRA adapters: low-rank deltas `y += s · B (A x)` on a model's projections, read from a
//! llama.cpp GGUF adapter (`general.type = adapter`, `adapter.type = lora`) or a PEFT adapter
//! (`adapter_config.json` + `adapter_model.safetensors`). A is `[rank, in]`, B `[out, rank]`
//! in both (GGUF stores the PEFT matrices unchanged). The scale of a pair is the user's scale
//! times `alpha / rank` (`alpha / sqrt(rank)` for rsLoRA; 1 where a GGUF adapter gives alpha
//! 0), as llama.cpp and PEFT apply it.

use std::collections::BTreeMap;

use serde::Deserialize;
use wgemma_gguf::{GgmlType, Gguf, TensorSource, read_tensor_f32};

use crate::config::TextConfig;

/// A projection an adapter can change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The weight's name in a GGUF model (`blk.N.<name>.weight`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// The module's path in a transformers model (`layers.N.<path>`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Proj::Q => "self_attn.q_proj",
            Proj::K => "self_attn.k_proj",
            Proj::V => "self_attn.v_proj",
            Proj::O => "self_attn.o_proj",
            Proj::Gate => "mlp.gate_proj",
            Proj::Up => "mlp.up_proj",
            Proj::Down => "mlp.down_proj",
        }
    }

    /// `(rows, cols)` of the projection's weight in layer `il`: `(out, in)`.
    pub fn shape(self, cfg: &TextConfig, il: usize) -> (usize, usize) {
        let lc = &cfg.layers[il];
        let (d, hd) = (cfg.n_embd, lc.head_dim);
        match self {
            Proj::Q => (cfg.n_head * hd, d),
            Proj::K | Proj::V => (lc.n_kv_head * hd, d),
            Proj::O => (d, cfg.n_head * hd),
            Proj::Gate | Proj::Up => (lc.n_ff, d),
            Proj::Down => (d, lc.n_ff),
        }
    }
}

/// Why an adapter cannot be read or applied.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("not a LoRA adapter: {0}")]
    NotLora(String),
    #[error("adapter tensor {name}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("adapter_config.json: {0}")]
    Config(String),
    #[error("adapter_model.safetensors: {0}")]
    Safetensors(String),
    #[error(
        "{name}: {got:?} does not fit the model's {proj:?} of layer {layer} ({want:?}): maybe the adapter is for another base model?"
    )]
    Shape {
        name: String,
        proj: Proj,
        layer: usize,
        got: (usize, usize),
        want: (usize, usize),
    },
    #[error("the adapter was uploaded for another model: upload it for this one")]
    OtherModel,
    #[error(transparent)]
    Read(#[from] wgemma_gguf::ReadError),
    #[error(transparent)]
    Metadata(#[from] wgemma_gguf::MetadataError),
}

/// One projection's low-rank pair: `a` is `[rank, cols]`, `b` `[rows, rank]`, row-major f32.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraPair {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub rank: usize,
    /// The projection's input width.
    pub cols: usize,
    /// The projection's output width.
    pub rows: usize,
    /// `alpha / rank` (or as the format says): the user's scale multiplies it.
    pub scale: f32,
}

impl LoraPair {
    /// `s · B (A x)` for one row `x` of `cols` values.
    pub fn delta(&self, x: &[f32], s: f32) -> Vec<f32> {
        let t: Vec<f32> = self
            .a
            .chunks_exact(self.cols)
            .map(|row| row.iter().zip(x).map(|(w, v)| w * v).sum())
            .collect();
        self.b
            .chunks_exact(self.rank)
            .map(|row| s * self.scale * row.iter().zip(&t).map(|(w, v)| w * v).sum::<f32>())
            .collect()
    }
}

/// An adapter in host memory: its pairs by (layer, projection).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoraAdapter {
    pub pairs: BTreeMap<(usize, Proj), LoraPair>,
}

/// The two halves of a pair as read, before they are matched.
#[derive(Default)]
struct Halves {
    a: Option<(Vec<f32>, usize, usize)>,
    b: Option<(Vec<f32>, usize, usize)>,
}

/// How a pair's scale follows from alpha and its rank.
#[derive(Clone, Copy)]
enum AlphaRule {
    /// `alpha / rank`, or 1 where alpha is 0 (llama.cpp's GGUF adapters).
    Gguf(f32),
    /// `alpha / rank`, or `alpha / sqrt(rank)` with rsLoRA (PEFT).
    Peft { alpha: f32, rs: bool },
}

impl AlphaRule {
    fn scale(self, rank: usize) -> f32 {
        let r = rank as f32;
        match self {
            AlphaRule::Gguf(0.0) => 1.0,
            AlphaRule::Gguf(a)
            | AlphaRule::Peft {
                alpha: a,
                rs: false,
            } => a / r,
            AlphaRule::Peft { alpha, rs: true } => alpha / r.sqrt(),
        }
    }
}

impl LoraAdapter {
    /// Reads a llama.cpp GGUF LoRA adapter.
    pub fn from_gguf(g: &Gguf, src: &dyn TensorSource) -> Result<Self, LoraError> {
        let m = &g.metadata;
        let kind = m.opt_str("general.type")?.unwrap_or("");
        let adapter = m.opt_str("adapter.type")?.unwrap_or("");
        if kind != "adapter" || adapter != "lora" {
            return Err(LoraError::NotLora(format!(
                "general.type is {kind:?} and adapter.type {adapter:?} (a LoRA adapter has \"adapter\" and \"lora\")"
            )));
        }
        let alpha = m.opt_f32("adapter.lora.alpha")?.unwrap_or(0.0);
        let mut halves: BTreeMap<(usize, Proj), Halves> = BTreeMap::new();
        for t in g.tensors() {
            let (layer, proj, is_a) = gguf_target(&t.name)?;
            if t.dims.len() != 2 {
                return Err(tensor_error(
                    &t.name,
                    format!("{} dimensions, not 2", t.dims.len()),
                ));
            }
            if !matches!(
                t.dtype,
                GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::Q8_0
            ) {
                return Err(tensor_error(&t.name, format!("{:?} weights", t.dtype)));
            }
            let data = read_tensor_f32(g, src, t)?;
            let half = (data, t.n_rows() as usize, t.row_len() as usize);
            let h = halves.entry((layer, proj)).or_default();
            if is_a {
                h.a = Some(half)
            } else {
                h.b = Some(half)
            }
        }
        Self::pair_up(halves, AlphaRule::Gguf(alpha), |(l, p)| {
            format!("blk.{l}.{}.weight", p.gguf_name())
        })
    }

    /// Reads a PEFT adapter from its two files' bytes.
    pub fn from_peft(config_json: &[u8], safetensors: &[u8]) -> Result<Self, LoraError> {
        let cfg: PeftConfig =
            serde_json::from_slice(config_json).map_err(|e| LoraError::Config(e.to_string()))?;
        cfg.check()?;
        let st = safetensors::SafeTensors::deserialize(safetensors)
            .map_err(|e| LoraError::Safetensors(e.to_string()))?;
        let mut halves: BTreeMap<(usize, Proj), Halves> = BTreeMap::new();
        for (name, view) in st.tensors() {
            let (layer, proj, is_a) = peft_target(&name)?;
            let shape = view.shape();
            if shape.len() != 2 {
                return Err(tensor_error(&name, format!("shape {shape:?}, not 2-D")));
            }
            let data = floats(&name, view.dtype(), view.data())?;
            let h = halves.entry((layer, proj)).or_default();
            let half = Some((data, shape[0], shape[1]));
            if is_a { h.a = half } else { h.b = half }
        }
        let rule = AlphaRule::Peft {
            alpha: cfg.lora_alpha,
            rs: cfg.use_rslora,
        };
        Self::pair_up(halves, rule, |(l, p)| {
            format!("layers.{l}.{}.lora_A/B", p.hf_name())
        })
    }

    /// Reads a PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_peft_dir(dir: &std::path::Path) -> Result<Self, LoraError> {
        let read = |name: &str| {
            std::fs::read(dir.join(name))
                .map_err(|e| LoraError::NotLora(format!("{}: {e}", dir.join(name).display())))
        };
        Self::from_peft(
            &read("adapter_config.json")?,
            &read("adapter_model.safetensors")?,
        )
    }

    fn pair_up(
        halves: BTreeMap<(usize, Proj), Halves>,
        rule: AlphaRule,
        name: impl Fn((usize, Proj)) -> String,
    ) -> Result<Self, LoraError> {
        let mut pairs = BTreeMap::new();
        for (key, h) in halves {
            let (Some((a, rank, cols)), Some((b, rows, rank_b))) = (h.a, h.b) else {
                return Err(tensor_error(&name(key), "one of A and B is missing".into()));
            };
            if rank != rank_b || rank == 0 {
                return Err(tensor_error(
                    &name(key),
                    format!("A has rank {rank}, B {rank_b} (A must be [rank, in], B [out, rank])"),
                ));
            }
            let scale = rule.scale(rank);
            pairs.insert(
                key,
                LoraPair {
                    a,
                    b,
                    rank,
                    cols,
                    rows,
                    scale,
                },
            );
        }
        if pairs.is_empty() {
            return Err(LoraError::NotLora("no LoRA tensors".into()));
        }
        Ok(Self { pairs })
    }

    /// Checks that every pair fits the model's projection it changes, its A and B holding
    /// `rank` rows and columns of it. Pairs on the K and V of
    /// a layer that reads another layer's cache fit but change nothing
    /// ([`LoraAdapter::applies`]).
    pub fn check(&self, cfg: &TextConfig) -> Result<(), LoraError> {
        for (&(layer, proj), p) in &self.pairs {
            let name = format!("blk.{layer}.{}", proj.gguf_name());
            if layer >= cfg.n_layer {
                return Err(tensor_error(
                    &name,
                    format!("the model has {} layers", cfg.n_layer),
                ));
            }
            if p.rank == 0 || p.a.len() != p.rank * p.cols || p.b.len() != p.rows * p.rank {
                return Err(tensor_error(
                    &name,
                    format!(
                        "rank {} with {} values of A and {} of B for {} x {}",
                        p.rank,
                        p.a.len(),
                        p.b.len(),
                        p.rows,
                        p.cols
                    ),
                ));
            }
            let want = proj.shape(cfg, layer);
            if (p.rows, p.cols) != want {
                return Err(LoraError::Shape {
                    name,
                    proj,
                    layer,
                    got: (p.rows, p.cols),
                    want,
                });
            }
        }
        Ok(())
    }

    /// Whether a pair on layer `layer`'s `proj` changes the model's output: not on the K or V
    /// of a layer that reads another layer's cache (Gemma 4 E2B/E4B's last layers). Those
    /// layers still hold K and V weights in transformers, so PEFT adapters trained on them
    /// carry pairs there, but transformers never runs those products.
    pub fn applies(cfg: &TextConfig, layer: usize, proj: Proj) -> bool {
        !matches!(proj, Proj::K | Proj::V)
            || cfg.layers.get(layer).is_some_and(|l| l.owns_kv(layer))
    }

    /// The pairs of layer `il`.
    pub fn layer(&self, il: usize) -> impl Iterator<Item = (Proj, &LoraPair)> {
        self.pairs
            .range((il, Proj::Q)..=(il, Proj::Down))
            .map(|(&(_, p), pair)| (p, pair))
    }
}

fn tensor_error(name: &str, reason: String) -> LoraError {
    LoraError::Tensor {
        name: name.to_string(),
        reason,
    }
}

/// `blk.N.<proj>.weight.lora_a|b` → (N, proj, is A).
fn gguf_target(name: &str) -> Result<(usize, Proj, bool), LoraError> {
    let bad = || {
        tensor_error(
            name,
            "not a blk.N.<projection>.weight.lora_a/b tensor this model adapts".into(),
        )
    };
    let rest = name.strip_prefix("blk.").ok_or_else(bad)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(bad)?;
    let layer: usize = layer.parse().map_err(|_| bad())?;
    let (proj, half) = rest.split_once(".weight.").ok_or_else(bad)?;
    let proj = Proj::ALL
        .into_iter()
        .find(|p| p.gguf_name() == proj)
        .ok_or_else(bad)?;
    match half {
        "lora_a" => Ok((layer, proj, true)),
        "lora_b" => Ok((layer, proj, false)),
        _ => Err(bad()),
    }
}

/// `...layers.N.<module path>.lora_A|B.weight` → (N, proj, is A).
fn peft_target(name: &str) -> Result<(usize, Proj, bool), LoraError> {
    let bad = || {
        tensor_error(
            name,
            "not a layers.N.<projection>.lora_A/B.weight tensor this model adapts".into(),
        )
    };
    let (_, rest) = name.rsplit_once("layers.").ok_or_else(bad)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(bad)?;
    let layer: usize = layer.parse().map_err(|_| bad())?;
    let (module, half) = rest.rsplit_once(".lora_").ok_or_else(bad)?;
    let proj = Proj::ALL
        .into_iter()
        .find(|p| p.hf_name() == module)
        .ok_or_else(bad)?;
    match half {
        "A.weight" => Ok((layer, proj, true)),
        "B.weight" => Ok((layer, proj, false)),
        _ => Err(bad()),
    }
}

/// A safetensors tensor's values as f32.
fn floats(name: &str, dtype: safetensors::Dtype, data: &[u8]) -> Result<Vec<f32>, LoraError> {
    use safetensors::Dtype;
    let each = |n: usize| data.chunks_exact(n);
    Ok(match dtype {
        Dtype::F32 => each(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => each(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => each(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => each(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        other => {
            return Err(tensor_error(
                name,
                format!("{other:?} values (F32, F16, BF16 or F64)"),
            ));
        }
    })
}

/// The parts of `adapter_config.json` that change how the adapter applies.
#[derive(Deserialize)]
struct PeftConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f32,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    lora_bias: bool,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    target_parameters: Option<Vec<String>>,
    #[serde(default)]
    rank_pattern: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: serde_json::Map<String, serde_json::Value>,
}

impl PeftConfig {
    fn check(&self) -> Result<(), LoraError> {
        let unsupported = |what: &str| Err(LoraError::Config(format!("{what} is not supported")));
        if self.peft_type.as_deref().is_some_and(|t| t != "LORA") {
            return unsupported(&format!("peft_type {:?}", self.peft_type));
        }
        if self.use_dora {
            return unsupported("DoRA (use_dora)");
        }
        if self.fan_in_fan_out {
            return unsupported("fan_in_fan_out");
        }
        if self.lora_bias {
            return unsupported("lora_bias");
        }
        if self.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            return unsupported("modules_to_save (whole modules saved besides the adapter)");
        }
        if self
            .target_parameters
            .as_ref()
            .is_some_and(|m| !m.is_empty())
        {
            return unsupported("target_parameters");
        }
        if !self.rank_pattern.is_empty() || !self.alpha_pattern.is_empty() {
            return unsupported("a per-module rank_pattern or alpha_pattern");
        }
        if self.r == 0 {
            return Err(LoraError::Config("r is 0".into()));
        }
        Ok(())
    }
}

impl LoraAdapter {
    /// The alpha every pair's scale comes from (`scale * rank`), where they share one.
    fn shared_alpha(&self) -> Result<f32, LoraError> {
        let mut alphas = self.pairs.values().map(|p| p.scale * p.rank as f32);
        let first = alphas.next().unwrap_or(1.0);
        if alphas.any(|a| (a - first).abs() > 1e-6 * first.abs().max(1.0)) {
            return Err(LoraError::NotLora(
                "its pairs' scales come from different alphas, which one file cannot hold".into(),
            ));
        }
        Ok(first)
    }

    /// The adapter as a llama.cpp GGUF LoRA file for a base model of architecture `arch`.
    pub fn to_gguf(&self, arch: &str) -> Result<Vec<u8>, LoraError> {
        use wgemma_gguf::{TensorSpec, Value, write_gguf};
        let meta = vec![
            (
                "general.architecture".to_string(),
                Value::String(arch.into()),
            ),
            ("general.type".to_string(), Value::String("adapter".into())),
            ("adapter.type".to_string(), Value::String("lora".into())),
            (
                "adapter.lora.alpha".to_string(),
                Value::F32(self.shared_alpha()?),
            ),
        ];
        let mut tensors = Vec::new();
        for (&(layer, proj), p) in &self.pairs {
            let name = format!("blk.{layer}.{}.weight", proj.gguf_name());
            let bytes = |v: &[f32]| bytemuck::cast_slice::<f32, u8>(v).to_vec();
            let (rank, cols, rows) = (p.rank as u64, p.cols as u64, p.rows as u64);
            tensors.push((
                TensorSpec::new(format!("{name}.lora_a"), GgmlType::F32, &[cols, rank]),
                bytes(&p.a),
            ));
            tensors.push((
                TensorSpec::new(format!("{name}.lora_b"), GgmlType::F32, &[rank, rows]),
                bytes(&p.b),
            ));
        }
        write_gguf(&meta, &tensors, 32).map_err(|e| LoraError::NotLora(e.to_string()))
    }

    /// The adapter as PEFT's two files: `adapter_config.json` and
    /// `adapter_model.safetensors` (f32), for a base model `base` (its Hugging Face name).
    pub fn to_peft(&self, base: &str) -> Result<(Vec<u8>, Vec<u8>), LoraError> {
        let rank = self.pairs.values().map(|p| p.rank).max().unwrap_or(0);
        if self.pairs.values().any(|p| p.rank != rank) {
            return Err(LoraError::NotLora(
                "PEFT files hold one rank; its pairs have several".into(),
            ));
        }
        let mut modules: Vec<&str> = self.pairs.keys().map(|(_, p)| p.hf_name()).collect();
        modules.sort_unstable();
        modules.dedup();
        let short: Vec<&str> = modules
            .iter()
            .map(|m| m.rsplit('.').next().unwrap_or(m))
            .collect();
        let config = serde_json::json!({
            "peft_type": "LORA",
            "base_model_name_or_path": base,
            "r": rank,
            "lora_alpha": self.shared_alpha()?,
            "target_modules": short,
            "use_rslora": false,
            "use_dora": false,
            "fan_in_fan_out": false,
        });
        let mut tensors = Vec::new();
        for (&(layer, proj), p) in &self.pairs {
            let key = format!("base_model.model.model.layers.{layer}.{}", proj.hf_name());
            tensors.push((format!("{key}.lora_A.weight"), vec![p.rank, p.cols], &p.a));
            tensors.push((format!("{key}.lora_B.weight"), vec![p.rows, p.rank], &p.b));
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(name, shape, data)| {
                let bytes = bytemuck::cast_slice::<f32, u8>(data);
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| LoraError::Safetensors(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        let meta = Some(std::collections::HashMap::from([(
            "format".to_string(),
            "pt".to_string(),
        )]));
        let st = safetensors::serialize(views, meta)
            .map_err(|e| LoraError::Safetensors(e.to_string()))?;
        let json =
            serde_json::to_vec_pretty(&config).map_err(|e| LoraError::Config(e.to_string()))?;
        Ok((json, st))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgemma_gguf::BytesSource;

    fn sample() -> LoraAdapter {
        let mut a = LoraAdapter::default();
        let mut v = 0.25f32;
        let mut next = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    v = (v * 7.3 + 0.11).fract() - 0.5;
                    v
                })
                .collect()
        };
        for (layer, proj, rows, cols) in [
            (0, Proj::Q, 6, 5),
            (1, Proj::Down, 5, 7),
            (1, Proj::Up, 7, 5),
        ] {
            let rank = 3;
            let pair = LoraPair {
                a: next(rank * cols),
                b: next(rows * rank),
                rank,
                cols,
                rows,
                scale: 16.0 / rank as f32,
            };
            a.pairs.insert((layer, proj), pair);
        }
        a
    }

    fn from_gguf_bytes(bytes: Vec<u8>) -> Result<LoraAdapter, LoraError> {
        let g = Gguf::parse(&bytes).map_err(|e| LoraError::NotLora(e.to_string()))?;
        LoraAdapter::from_gguf(&g, &BytesSource::new(bytes))
    }

    #[test]
    fn gguf_and_peft_files_read_back_as_written() {
        let a = sample();
        assert_eq!(from_gguf_bytes(a.to_gguf("gemma4").unwrap()).unwrap(), a);
        let (json, st) = a.to_peft("tiny").unwrap();
        assert_eq!(LoraAdapter::from_peft(&json, &st).unwrap(), a);
    }

    #[test]
    fn the_scale_is_alpha_over_rank_or_its_root() {
        let a = sample();
        let (json, st) = a.to_peft("tiny").unwrap();
        let mut cfg: serde_json::Value = serde_json::from_slice(&json).unwrap();
        cfg["use_rslora"] = true.into();
        let rs = LoraAdapter::from_peft(&serde_json::to_vec(&cfg).unwrap(), &st).unwrap();
        let p = &rs.pairs[&(0, Proj::Q)];
        assert!((p.scale - 16.0 / 3f32.sqrt()).abs() < 1e-5, "{}", p.scale);
        // A GGUF adapter of alpha 0 applies its pairs unscaled, as llama.cpp does.
        assert_eq!(AlphaRule::Gguf(0.0).scale(8), 1.0);
        assert_eq!(AlphaRule::Gguf(16.0).scale(8), 2.0);
    }

    #[test]
    fn bad_adapters_are_refused_with_their_reason() {
        let a = sample();
        let (json, st) = a.to_peft("tiny").unwrap();
        let with = |k: &str, v: serde_json::Value| {
            let mut cfg: serde_json::Value = serde_json::from_slice(&json).unwrap();
            cfg[k] = v;
            LoraAdapter::from_peft(&serde_json::to_vec(&cfg).unwrap(), &st)
        };
        for (k, v, says) in [
            ("use_dora", true.into(), "DoRA"),
            ("fan_in_fan_out", true.into(), "fan_in_fan_out"),
            (
                "rank_pattern",
                serde_json::json!({"q_proj": 4}),
                "rank_pattern",
            ),
            ("peft_type", "IA3".into(), "IA3"),
            ("lora_bias", true.into(), "lora_bias"),
            (
                "modules_to_save",
                serde_json::json!(["lm_head"]),
                "modules_to_save",
            ),
        ] {
            let e = with(k, v).unwrap_err().to_string();
            assert!(e.contains(says), "{k}: {e}");
        }
        assert!(LoraAdapter::from_peft(b"{", &st).is_err());
        assert!(LoraAdapter::from_peft(&json, b"\x08\0\0\0\0\0\0\0{}").is_err());
        assert!(LoraAdapter::from_peft(&json, &st[..st.len() / 2]).is_err());
        // A pair without its B half, and a tensor of a weight no model here has.
        use wgemma_gguf::{TensorSpec, Value};
        let meta = [("general.type", "adapter"), ("adapter.type", "lora")]
            .map(|(k, v)| (k.to_string(), Value::String(v.into())));
        for (name, says) in [
            ("blk.0.attn_q.weight.lora_a", "missing"),
            ("blk.0.attn_qkv.weight.lora_a", "blk.0.attn_qkv"),
        ] {
            let t = [(TensorSpec::new(name, GgmlType::F32, &[5, 3]), vec![0u8; 60])];
            let bytes = wgemma_gguf::write_gguf(&meta, &t, 32).unwrap();
            let e = from_gguf_bytes(bytes).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        // Not an adapter at all.
        let model = wgemma_gguf::write_gguf(&[], &[], 32).unwrap();
        let e = from_gguf_bytes(model).unwrap_err().to_string();
        assert!(e.contains("general.type"), "{e}");
    }
}
