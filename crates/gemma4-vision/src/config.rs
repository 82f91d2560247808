//! The vision tower's shape, read from either file that holds it: a llama.cpp `mmproj` GGUF
//! (`general.architecture = clip`, keys `clip.vision.*`, projector type `gemma4v`, clamps as
//! per-tensor scalars) or an Ollama Gemma 4 blob, which holds the tower inside the model file
//! (keys `gemma4.vision.*`, clamps packed in `v.clamp_data`). Tensor names are the same in
//! both (reference/multimodal.md, section 1).

use wgemma_gguf::{Gguf, MetadataError};

use crate::preprocess::{PATCH, POOL};

/// The 2-D rope's base (transformers' vision `rope_theta`; no file stores it).
pub const ROPE_THETA: f32 = 100.0;
/// Position axes of a patch: column, row.
pub const POSITION_AXES: usize = 2;

/// Which file layout the tower came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionLayout {
    /// A llama.cpp projector file (`--mmproj`).
    Mmproj,
    /// The vision tensors of an Ollama `gemma4` blob.
    OllamaBlob,
}

/// Where the clamped linears' ranges are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClampStore {
    /// No ranges: the linears are plain.
    None,
    /// `<weight>.input_min` etc., one F32 scalar each (llama.cpp's converter).
    Scalars,
    /// `v.clamp_data`: per layer 7 linears x (in_min, in_max, out_min, out_max), then 4 for
    /// the projection (Ollama's converter).
    Packed,
}

/// The vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub layout: VisionLayout,
    pub n_layer: usize,
    /// The tower's width.
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub eps: f32,
    /// Patches a pooled token side.
    pub pool: u32,
    /// Rows of each position table (the largest patch column or row plus one).
    pub n_positions: usize,
    /// The text model's width the soft tokens are projected to.
    pub projection_dim: usize,
    pub clamps: ClampStore,
    /// `v.std_bias` / `v.std_scale` after pooling (26B, 31B).
    pub standardize: bool,
    /// Per-layer output scales (`v.blk.N.out_scale.weight`).
    pub out_scale: bool,
}

/// Why a file's vision tower cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VisionConfigError {
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("the projector is {}, not Gemma 4's vision tower (gemma4v)", wgemma_gguf::Quoted(.0))]
    Projector(String),
    #[error("the vision tower has no tensor {0}")]
    MissingTensor(String),
    #[error("the vision tower's {what} is {got}; wgemma reads {want}")]
    Unsupported {
        what: &'static str,
        got: String,
        want: String,
    },
    #[error("the vision tower's shape does not hold together: {0}")]
    Shape(String),
}

/// Tensors whose presence and shapes say the rest.
const POSITIONS: &str = "v.position_embd.weight";
const PACKED_CLAMPS: &str = "v.clamp_data";
/// The linears of a layer, in `v.clamp_data`'s order.
pub const LAYER_LINEARS: [&str; 7] = [
    "attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down",
];

impl VisionConfig {
    /// The vision tower `g` holds, if any: `Ok(None)` for a file without one (a text-only
    /// model, an audio-only projector).
    pub fn from_gguf(g: &Gguf) -> Result<Option<Self>, VisionConfigError> {
        let m = &g.metadata;
        let (layout, prefix, projection_dim) = match g.architecture() {
            Some("clip") => {
                if !m.opt_bool("clip.has_vision_encoder")?.unwrap_or(false) {
                    return Ok(None);
                }
                let kind = m.get_str("clip.vision.projector_type")?;
                if kind != "gemma4v" {
                    return Err(VisionConfigError::Projector(kind.to_string()));
                }
                let dim = m.get_u64("clip.vision.projection_dim")?;
                (VisionLayout::Mmproj, "clip.vision", dim)
            }
            Some("gemma4") if m.contains("gemma4.vision.block_count") => {
                let dim = m.get_u64("gemma4.embedding_length")?;
                (VisionLayout::OllamaBlob, "gemma4.vision", dim)
            }
            _ => return Ok(None),
        };
        let key = |k: &str| format!("{prefix}.{k}");
        let size =
            |k: &str| -> Result<usize, VisionConfigError> { Ok(m.get_u64(&key(k))? as usize) };
        let (n_layer, n_embd, n_ff, n_head) = (
            size("block_count")?,
            size("embedding_length")?,
            size("feed_forward_length")?,
            size("attention.head_count")?,
        );
        let patch = m.opt_u32(&key("patch_size"))?.unwrap_or(PATCH);
        if patch != PATCH {
            return Err(VisionConfigError::Unsupported {
                what: "patch size",
                got: patch.to_string(),
                want: PATCH.to_string(),
            });
        }
        let pool = m.opt_u32(&key("projector.scale_factor"))?.unwrap_or(POOL);
        if pool != POOL {
            return Err(VisionConfigError::Unsupported {
                what: "pooling",
                got: pool.to_string(),
                want: POOL.to_string(),
            });
        }
        let eps = m
            .opt_f32(&key("attention.layer_norm_epsilon"))?
            .unwrap_or(1e-6);
        let positions = g
            .tensor(POSITIONS)
            .ok_or_else(|| VisionConfigError::MissingTensor(POSITIONS.into()))?;
        let n_positions = match positions.dims[..] {
            [d, p, 2] if d as usize == n_embd => p as usize,
            _ => {
                return Err(VisionConfigError::Shape(format!(
                    "{POSITIONS} is {:?}, not [{n_embd}, P, 2]",
                    positions.dims
                )));
            }
        };
        let clamps = if g.tensor(PACKED_CLAMPS).is_some() {
            ClampStore::Packed
        } else if g.tensor("v.blk.0.attn_q.input_min").is_some() {
            ClampStore::Scalars
        } else {
            ClampStore::None
        };
        let config = Self {
            layout,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            head_dim: n_embd.checked_div(n_head).unwrap_or(0),
            eps,
            pool,
            n_positions,
            projection_dim: projection_dim as usize,
            clamps,
            standardize: g.tensor("v.std_bias").is_some(),
            out_scale: g.tensor("v.blk.0.out_scale.weight").is_some(),
        };
        config.check(g)?;
        Ok(Some(config))
    }

    /// The shape's own rules (heads that split the width into halves of pairs for the 2-D
    /// rope), every layer's tensors, and the packed clamps' length.
    fn check(&self, g: &Gguf) -> Result<(), VisionConfigError> {
        if self.n_layer == 0
            || self.n_head == 0
            || !self.n_embd.is_multiple_of(self.n_head)
            || !self.head_dim.is_multiple_of(4)
            || self.projection_dim == 0
            || self.n_ff == 0
        {
            return Err(VisionConfigError::Shape(format!(
                "{} layers, width {}, {} heads, feed-forward {}, projection {}",
                self.n_layer, self.n_embd, self.n_head, self.n_ff, self.projection_dim
            )));
        }
        let mut names = vec![
            "v.patch_embd.weight".to_string(),
            "mm.input_projection.weight".to_string(),
        ];
        for il in 0..self.n_layer {
            for t in LAYER_LINEARS
                .iter()
                .chain(&["ln1", "ln2", "attn_post_norm", "ffn_post_norm"])
                .chain(&["attn_q_norm", "attn_k_norm"])
            {
                names.push(format!("v.blk.{il}.{t}.weight"));
            }
        }
        if let Some(name) = names.iter().find(|n| g.tensor(n).is_none()) {
            return Err(VisionConfigError::MissingTensor(name.clone()));
        }
        if self.clamps == ClampStore::Packed {
            let want = (self.n_layer as u64 * LAYER_LINEARS.len() as u64 + 1) * 4;
            let got = g.tensor(PACKED_CLAMPS).map_or(0, |t| t.n_elements());
            if got != want {
                return Err(VisionConfigError::Shape(format!(
                    "{PACKED_CLAMPS} has {got} values, not {want}"
                )));
            }
        }
        Ok(())
    }
}
