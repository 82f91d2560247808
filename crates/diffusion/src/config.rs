//! The configuration of a `diffusion-gemma` GGUF: Gemma 4's keys under `diffusion-gemma.`
//! (read by [`TextConfig`]) and the un-prefixed `diffusion.*` keys of the canvas and the
//! entropy-bound sampler.

use wgemma_gguf::{Gguf, MetadataError};
use wgemma_text::{Arch, ConfigError, TextConfig};

#[derive(Debug, thiserror::Error)]
pub enum DiffusionConfigError {
    #[error(transparent)]
    Text(#[from] ConfigError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("architecture {0} is not diffusion-gemma")]
    NotDiffusion(&'static str),
    #[error("{0}")]
    Invalid(String),
}

/// The entropy-bound sampler's settings. A model's defaults are what its file gives
/// (`diffusion.eb_*`, copied by the converter from the checkpoint's generation config), else
/// transformers' defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EntropyBound {
    /// Denoising steps per block at most.
    pub max_steps: u32,
    /// Temperature of the last step; the first step's is `t_max`, linear in between.
    pub t_min: f32,
    pub t_max: f32,
    /// Positions are accepted in ascending entropy while the entropy of those before stays
    /// within this bound.
    pub entropy_bound: f32,
    /// A block stops once its argmax canvas stayed the same this many steps...
    pub stability_threshold: u32,
    /// ...and its mean entropy is below this.
    pub confidence_threshold: f32,
}

impl EntropyBound {
    /// The temperature of step `k` (from 0) of a block: `t_max` at the first, falling
    /// linearly to `t_min + (t_max - t_min) / max_steps` at the last.
    pub fn temperature(&self, k: u32) -> f32 {
        let remaining = self.max_steps.saturating_sub(k) as f32;
        self.t_min + (self.t_max - self.t_min) * remaining / self.max_steps.max(1) as f32
    }

    /// Errors unless the settings make a sampler: at least one step, `0 < t_min <= t_max`,
    /// a finite positive bound and a finite confidence threshold.
    pub fn check(&self) -> Result<(), String> {
        let temps_ok = self.t_min > 0.0 && self.t_max >= self.t_min && self.t_max.is_finite();
        let bound_ok = self.entropy_bound.is_finite() && self.entropy_bound > 0.0;
        if self.max_steps == 0 || !temps_ok || !bound_ok || !self.confidence_threshold.is_finite() {
            return Err(format!(
                "sampler settings {self:?}: at least one step, 0 < t_min <= t_max, a positive entropy bound"
            ));
        }
        Ok(())
    }
}

impl Default for EntropyBound {
    fn default() -> Self {
        Self {
            max_steps: 48,
            t_min: 0.4,
            t_max: 0.8,
            entropy_bound: 0.1,
            stability_threshold: 1,
            confidence_threshold: 0.005,
        }
    }
}

/// Canvases longer than this are refused: a step's logits are `canvas * vocab` floats.
pub const MAX_CANVAS: usize = 4096;

/// A DiffusionGemma model's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffusionConfig {
    pub text: TextConfig,
    /// Tokens of a block, denoised together.
    pub canvas_length: usize,
    /// The sampler's defaults for this model.
    pub sampler: EntropyBound,
}

impl DiffusionConfig {
    pub fn from_gguf(g: &Gguf) -> Result<Self, DiffusionConfigError> {
        let text = TextConfig::from_gguf(g)?;
        if text.arch != Arch::DiffusionGemma {
            return Err(DiffusionConfigError::NotDiffusion(text.arch.name()));
        }
        let m = &g.metadata;
        let canvas_length = m.get_u32("diffusion.canvas_length")? as usize;
        if canvas_length == 0 || canvas_length > MAX_CANVAS {
            return Err(DiffusionConfigError::Invalid(format!(
                "diffusion.canvas_length {canvas_length} (1..={MAX_CANVAS})"
            )));
        }
        let d = EntropyBound::default();
        let sampler = EntropyBound {
            max_steps: m.opt_u32("diffusion.eb_max_steps")?.unwrap_or(d.max_steps),
            t_min: m.opt_f32("diffusion.eb_t_min")?.unwrap_or(d.t_min),
            t_max: m.opt_f32("diffusion.eb_t_max")?.unwrap_or(d.t_max),
            entropy_bound: m
                .opt_f32("diffusion.eb_entropy_bound")?
                .unwrap_or(d.entropy_bound),
            stability_threshold: m
                .opt_u32("diffusion.eb_stability_threshold")?
                .unwrap_or(d.stability_threshold),
            confidence_threshold: m
                .opt_f32("diffusion.eb_confidence_threshold")?
                .unwrap_or(d.confidence_threshold),
        };
        sampler.check().map_err(DiffusionConfigError::Invalid)?;
        if text.n_ple > 0 || text.layers.iter().enumerate().any(|(i, l)| !l.owns_kv(i)) {
            return Err(DiffusionConfigError::Invalid(
                "per-layer embeddings or shared KV layers in a DiffusionGemma model".into(),
            ));
        }
        Ok(Self {
            text,
            canvas_length,
            sampler,
        })
    }
}
