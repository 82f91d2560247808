//! Model configuration from GGUF metadata, for the `gemma3` and `gemma4` architectures, with
//! everything per layer resolved up front (layer type, head size, KV heads, RoPE, KV sharing)
//! so the forwards never consult metadata.

use wgemma_gguf::{Gguf, Metadata, MetadataError, Value};

/// The text architectures this crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gemma3,
    Gemma4,
    /// DiffusionGemma: Gemma 4 26B-A4B layers run as a causal encoder over the prompt and a
    /// bidirectional denoiser over a canvas (the `wgemma-diffusion` crate drives it).
    DiffusionGemma,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
            Arch::DiffusionGemma => "diffusion-gemma",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "architecture {} is not supported (gemma3, gemma4 and diffusion-gemma are)",
        wgemma_gguf::Quoted(.0)
    )]
    Unsupported(String),
    #[error("the file has no general.architecture")]
    NoArchitecture,
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("{0}")]
    Invalid(String),
}

/// Everything one layer's forward needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    /// Sliding-window (local) attention, as opposed to global.
    pub sliding: bool,
    pub head_dim: usize,
    pub n_kv_head: usize,
    /// Width of the feed-forward hidden layer.
    pub n_ff: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    pub rope_base: f32,
    pub rope_freq_scale: f32,
    /// Whether `rope_freqs` divides this layer's frequencies (Gemma 4 global layers).
    pub rope_freq_factors: bool,
    /// The layer whose KV cache this layer reads: itself, or (Gemma 4 shared-KV layers) the
    /// last earlier layer of the same type that has its own cache.
    pub kv_source: usize,
}

impl LayerConfig {
    /// Whether this layer computes and stores its own K and V.
    pub fn owns_kv(&self, index: usize) -> bool {
        self.kv_source == index
    }
}

/// The model's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_vocab: usize,
    /// The padding token: what per-layer embeddings read at soft-token positions.
    pub pad_id: u32,
    pub context_length: usize,
    pub eps: f32,
    /// Keys a sliding layer sees, the current one included.
    pub sliding_window: usize,
    /// Multiplier of q·k (Gemma 3: 1/sqrt(head_dim); Gemma 4: 1).
    pub attn_scale: f32,
    /// Multiplier of the token embeddings (sqrt(n_embd)).
    pub embed_scale: f32,
    /// `c * tanh(logits / c)` on the output when set.
    pub final_softcap: Option<f32>,
    /// Gemma 4 normalises V (without a weight).
    pub v_norm: bool,
    /// Per-layer embedding width (Gemma 4 E2B/E4B); 0 when absent.
    pub n_ple: usize,
    /// The mixture of experts of Gemma 4 26B-A4B, on the layers that have a router.
    pub moe: Option<MoeConfig>,
    pub layers: Vec<LayerConfig>,
}

/// Mixture-of-experts sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_expert: usize,
    /// Experts each token uses.
    pub n_used: usize,
    /// Hidden width of one expert's feed-forward.
    pub n_ff: usize,
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

impl TextConfig {
    /// Whether an image's tokens see each other (the later ones too): Gemma 4 26B and 31B on
    /// sliding layers, DiffusionGemma everywhere ([`TextConfig::images_seen_whole`];
    /// `use_bidirectional_attention = "vision"` in transformers). E2B and E4B, the models with
    /// per-layer embeddings, attend causally; no GGUF key says which, so this follows the model
    /// family as llama.cpp does.
    pub fn bidirectional_images(&self) -> bool {
        match self.arch {
            Arch::Gemma4 => self.n_ple == 0,
            Arch::DiffusionGemma => true,
            Arch::Gemma3 => false,
        }
    }

    /// Whether an image's tokens see the whole image on every layer, whatever the window:
    /// DiffusionGemma, whose encoder transformers masks with the generic mask functions
    /// (causal or sliding, OR the same image). Gemma 4's own masks keep it to sliding layers
    /// and the window (AND(window, OR(causal, same image))).
    pub fn images_seen_whole(&self) -> bool {
        self.arch == Arch::DiffusionGemma
    }
}

impl TextConfig {
    /// Reads the configuration of a `gemma3`, `gemma4` or `diffusion-gemma` GGUF.
    pub fn from_gguf(g: &Gguf) -> Result<Self, ConfigError> {
        let arch_name = g.architecture().ok_or(ConfigError::NoArchitecture)?;
        let arch = match arch_name {
            "gemma3" => Arch::Gemma3,
            "gemma4" => Arch::Gemma4,
            "diffusion-gemma" => Arch::DiffusionGemma,
            other => return Err(ConfigError::Unsupported(other.to_string())),
        };
        let m = &g.metadata;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_layer = m.get_u32(&key("block_count"))? as usize;
        let n_embd = m.get_u32(&key("embedding_length"))? as usize;
        let n_head = m.get_u32(&key("attention.head_count"))? as usize;
        if n_layer == 0 || n_embd == 0 || n_head == 0 || n_layer > 1024 {
            return Err(invalid(format!(
                "{n_layer} layers, width {n_embd}, {n_head} heads"
            )));
        }
        let context_length = m.opt_u32(&key("context_length"))?.unwrap_or(8192) as usize;
        let eps = m
            .opt_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-6);
        let n_kv = m
            .get_u32_per_layer(&key("attention.head_count_kv"), n_layer)
            .or_else(|e| match e {
                MetadataError::Missing(_) => Ok(vec![n_head as u32; n_layer]),
                e => Err(e),
            })?;
        let n_ff = m.get_u32_per_layer(&key("feed_forward_length"), n_layer)?;
        let head_dim = m
            .opt_u32(&key("attention.key_length"))?
            .map_or(n_embd / n_head, |v| v as usize);
        let sliding_window = m.opt_u32(&key("attention.sliding_window"))?.unwrap_or(0) as usize;
        // DiffusionGemma's converter leaves the soft cap out: transformers keeps it as a class
        // constant (30), and llama.cpp defaults to it.
        let default_softcap = (arch == Arch::DiffusionGemma).then_some(30.0);
        let final_softcap = m
            .opt_f32(&key("final_logit_softcapping"))?
            .or(default_softcap)
            .filter(|&c| c > 0.0);
        let rope_base = m
            .opt_f32(&key("rope.freq_base"))?
            .or(m.opt_f32(&key("rope.global.freq_base"))?)
            .unwrap_or(10_000.0);
        let rope_base_swa = m
            .opt_f32(&key("rope.freq_base_swa"))?
            .or(m.opt_f32(&key("rope.local.freq_base"))?)
            .unwrap_or(10_000.0);
        let sliding = sliding_pattern(g, arch, n_layer, sliding_window)?;
        let pad_id = m.opt_u32("tokenizer.ggml.padding_token_id")?.unwrap_or(0);
        let n_vocab = g
            .tensor("token_embd.weight")
            .map(|t| t.n_rows() as usize)
            .ok_or_else(|| invalid("token_embd.weight is missing"))?;

        let moe = moe_config(m, &key)?;
        let common = LayerCommon {
            sliding: &sliding,
            n_kv: &n_kv,
            n_ff: &n_ff,
            head_dim,
            rope_base,
            rope_base_swa,
        };
        let (attn_scale, v_norm, n_ple, layers) = match arch {
            Arch::Gemma3 => {
                // llama.cpp: the 62-layer 27B scales by hidden/heads, the others by head_dim.
                let scale_dim = if n_layer == 62 {
                    n_embd / n_head
                } else {
                    head_dim
                };
                let layers = gemma3_layers(m, &key, &common)?;
                (1.0 / (scale_dim as f32).sqrt(), false, 0, layers)
            }
            Arch::Gemma4 | Arch::DiffusionGemma => {
                let n_ple = m
                    .opt_u32(&key("embedding_length_per_layer_input"))?
                    .unwrap_or(0) as usize;
                (1.0, true, n_ple, gemma4_layers(g, &key, &common)?)
            }
        };
        check_layers(&layers, n_head)?;
        Ok(Self {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_vocab,
            pad_id,
            context_length,
            eps,
            sliding_window,
            attn_scale,
            embed_scale: (n_embd as f32).sqrt(),
            final_softcap,
            v_norm,
            n_ple,
            moe,
            layers,
        })
    }
}

/// What every layer's configuration is read from, besides the architecture's own keys.
struct LayerCommon<'a> {
    sliding: &'a [bool],
    n_kv: &'a [u32],
    n_ff: &'a [u32],
    head_dim: usize,
    rope_base: f32,
    rope_base_swa: f32,
}

/// The experts' configuration, when the model has experts.
fn moe_config(
    m: &Metadata,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<MoeConfig>, ConfigError> {
    let Some(n_expert) = m.opt_u32(&key("expert_count"))?.filter(|&n| n > 0) else {
        return Ok(None);
    };
    let n_used = m.get_u32(&key("expert_used_count"))? as usize;
    let n_ff = m.get_u32(&key("expert_feed_forward_length"))? as usize;
    if n_used == 0 || n_used > n_expert as usize || n_used > 64 || n_ff == 0 {
        return Err(invalid(format!(
            "{n_used} of {n_expert} experts of width {n_ff}"
        )));
    }
    Ok(Some(MoeConfig {
        n_expert: n_expert as usize,
        n_used,
        n_ff,
    }))
}

/// Gemma 3's layers: linear rope scaling on the global layers.
fn gemma3_layers(
    m: &Metadata,
    key: &dyn Fn(&str) -> String,
    c: &LayerCommon<'_>,
) -> Result<Vec<LayerConfig>, ConfigError> {
    let factor = m
        .opt_f32(&key("rope.scaling.factor"))?
        .or(m.opt_f32(&key("rope.scale_linear"))?)
        .filter(|&f| f > 0.0)
        .unwrap_or(1.0);
    let n_rot = m
        .opt_u32(&key("rope.dimension_count"))?
        .map_or(c.head_dim, |v| v as usize);
    Ok(c.sliding
        .iter()
        .enumerate()
        .map(|(il, &swa)| LayerConfig {
            sliding: swa,
            head_dim: c.head_dim,
            n_kv_head: c.n_kv[il] as usize,
            n_ff: c.n_ff[il] as usize,
            n_rot,
            rope_base: if swa { c.rope_base_swa } else { c.rope_base },
            rope_freq_scale: if swa { 1.0 } else { 1.0 / factor },
            rope_freq_factors: false,
            kv_source: il,
        })
        .collect())
}

/// Gemma 4's layers: their own head size and rope on sliding layers, proportional rope
/// (`rope_freqs`) on global ones, and the last layers reading earlier layers' KV caches.
fn gemma4_layers(
    g: &Gguf,
    key: &dyn Fn(&str) -> String,
    c: &LayerCommon<'_>,
) -> Result<Vec<LayerConfig>, ConfigError> {
    let m = &g.metadata;
    let n_layer = c.sliding.len();
    let head_dim_swa = m.get_u32(&key("attention.key_length_swa"))? as usize;
    let n_rot_full = m
        .opt_u32(&key("rope.dimension_count"))?
        .map_or(c.head_dim, |v| v as usize);
    let n_rot_swa = m
        .opt_u32(&key("rope.dimension_count_swa"))?
        .map_or(n_rot_full, |v| v as usize);
    let shared = m.opt_u32(&key("attention.shared_kv_layers"))?.unwrap_or(0) as usize;
    if shared >= n_layer {
        return Err(invalid(format!("{shared} shared KV layers of {n_layer}")));
    }
    let first_shared = n_layer - shared;
    let sliding = c.sliding;
    sliding
        .iter()
        .enumerate()
        .map(|(il, &swa)| {
            // Shared layers read the cache of the last non-shared layer of their type.
            let kv_source = if il < first_shared {
                il
            } else {
                (0..first_shared)
                    .rev()
                    .find(|&j| sliding[j] == swa)
                    .ok_or_else(|| {
                        invalid(format!(
                            "shared layer {il} has no earlier layer of its type"
                        ))
                    })?
            };
            Ok(LayerConfig {
                sliding: swa,
                head_dim: if swa { head_dim_swa } else { c.head_dim },
                n_kv_head: c.n_kv[il] as usize,
                n_ff: c.n_ff[il] as usize,
                n_rot: if swa { n_rot_swa } else { n_rot_full },
                rope_base: if swa { c.rope_base_swa } else { c.rope_base },
                rope_freq_scale: 1.0,
                rope_freq_factors: !swa && g.tensor("rope_freqs.weight").is_some(),
                kv_source,
            })
        })
        .collect()
}

/// Errors unless every layer's heads, head size and rotation fit together.
fn check_layers(layers: &[LayerConfig], n_head: usize) -> Result<(), ConfigError> {
    for (il, l) in layers.iter().enumerate() {
        if l.n_kv_head == 0
            || !n_head.is_multiple_of(l.n_kv_head)
            || l.head_dim == 0
            || l.n_rot > l.head_dim
        {
            return Err(invalid(format!(
                "layer {il}: {n_head} heads over {} KV heads, head_dim {}, n_rot {}",
                l.n_kv_head, l.head_dim, l.n_rot
            )));
        }
    }
    Ok(())
}

/// Which layers use sliding-window attention: an explicit per-layer array, or a period n
/// (every n-th layer global; llama.cpp's default for Gemma 3 is 6).
fn sliding_pattern(
    g: &Gguf,
    arch: Arch,
    n_layer: usize,
    window: usize,
) -> Result<Vec<bool>, ConfigError> {
    let key = format!("{}.attention.sliding_window_pattern", arch.name());
    match g.metadata.get(&key) {
        Some(Value::Array(a)) => {
            let flags = a
                .integers()
                .ok_or_else(|| invalid(format!("{key} is an array of {}", a.element_type())))?;
            if flags.len() != n_layer {
                return Err(invalid(format!(
                    "{key} has {} entries for {n_layer} layers",
                    flags.len()
                )));
            }
            Ok(flags.into_iter().map(|f| f != 0).collect())
        }
        _ if window == 0 => Ok(vec![false; n_layer]),
        _ => {
            let period = g.metadata.opt_u32(&key)?.unwrap_or(6) as usize;
            Ok((0..n_layer)
                .map(|il| period == 0 || il % period < period - 1)
                .collect())
        }
    }
}
