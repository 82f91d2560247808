//! The audio tower's shape from either file that holds it (a llama.cpp projector file,
//! `clip.audio.projector_type = gemma4a`, or an Ollama `gemma4` blob with `gemma4.audio.*`
//! keys; reference/multimodal.md §2), and its weights as f32 for the CPU reference.

use wgemma_gguf::{Gguf, MetadataError, ReadError, TensorInfo, TensorSource, read_tensor_f32};

use crate::reference::{AudioConfig, AudioWeights};
use crate::tensors::{AudioLayout, Mappers, TowerTensors};

/// Queries per attention block, keys back, logit cap, depthwise kernel: fixed by the
/// architecture (no file stores them; llama.cpp hard-codes them too).
const CHUNK: usize = 12;
const CONTEXT_LEFT: usize = 13;
const LOGIT_CAP: f32 = 50.0;
const CONV_KERNEL: usize = 5;

/// Why a file's audio tower cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AudioLoadError {
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("the audio projector is {}, not Gemma 4's audio tower (gemma4a)", wgemma_gguf::Quoted(.0))]
    Projector(String),
    #[error("the audio tower has no tensor {0}")]
    MissingTensor(String),
    #[error("the audio tower's shape does not hold together: {0}")]
    Shape(String),
    #[error("reading the audio tower: {0}")]
    Read(#[from] ReadError),
}

impl AudioConfig {
    /// The audio tower `g` holds, if any (`Ok(None)` for a file without one): a llama.cpp
    /// projector file (`clip.audio.*`) or an Ollama `gemma4` blob (`gemma4.audio.*`).
    pub fn from_gguf(g: &Gguf) -> Result<Option<Self>, AudioLoadError> {
        let m = &g.metadata;
        let (layout, prefix, text_width) = match g.architecture() {
            Some("clip") => {
                if !m.opt_bool("clip.has_audio_encoder")?.unwrap_or(false) {
                    return Ok(None);
                }
                let kind = m.get_str("clip.audio.projector_type")?;
                if kind != "gemma4a" {
                    return Err(AudioLoadError::Projector(kind.to_string()));
                }
                let width = m.get_u64("clip.audio.projection_dim")?;
                (AudioLayout::Mmproj, "clip.audio", width)
            }
            Some("gemma4") if m.contains("gemma4.audio.block_count") => {
                let width = m.get_u64("gemma4.embedding_length")?;
                (AudioLayout::OllamaBlob, "gemma4.audio", width)
            }
            _ => return Ok(None),
        };
        let size = |k: &str| -> Result<usize, AudioLoadError> {
            Ok(m.get_u64(&format!("{prefix}.{k}"))? as usize)
        };
        let dims = |name: &str| -> Result<&[u64], AudioLoadError> { Ok(&tensor(g, name)?.dims) };
        let sscp_channels = [
            channels(dims("a.conv1d.0.weight")?, 1)?,
            channels(dims("a.conv1d.1.weight")?, 0)?,
        ];
        let output = match layout {
            AudioLayout::Mmproj => "a.pre_encode.out.weight",
            AudioLayout::OllamaBlob => "mm.a.fc.weight",
        };
        let output_dims = match dims(output)? {
            [_, n] => *n as usize,
            d => return Err(AudioLoadError::Shape(format!("{output} is {d:?}"))),
        };
        let conv_kernel = match m.opt_u32(&format!("{prefix}.conv_kernel_size"))? {
            Some(k) => k as usize,
            None => CONV_KERNEL,
        };
        let cfg = Self {
            layout,
            n_layer: size("block_count")?,
            hidden: size("embedding_length")?,
            n_head: size("attention.head_count")?,
            ff: size("feed_forward_length")?,
            sscp_channels,
            conv_kernel,
            chunk: CHUNK,
            context_left: CONTEXT_LEFT,
            logit_cap: LOGIT_CAP,
            // Early conversions wrote a wrong epsilon; the architecture's is 1e-6 (as
            // llama.cpp forces).
            eps: 1e-6,
            output_dims,
            text_width: text_width as usize,
        };
        cfg.check()?;
        Ok(Some(cfg))
    }

    /// Sizes the forward can run with; huge ones are refused before anything is allocated.
    fn check(&self) -> Result<(), AudioLoadError> {
        let bad = |what: String| Err(AudioLoadError::Shape(what));
        if self.n_head == 0 || !self.hidden.is_multiple_of(self.n_head) {
            return bad(format!("width {} over {} heads", self.hidden, self.n_head));
        }
        if !self.hidden.is_multiple_of(4) || self.hidden > MAX_WIDTH {
            return bad(format!(
                "width {} (a multiple of 4 up to {MAX_WIDTH})",
                self.hidden
            ));
        }
        if self.head_dim() > 512
            || self.n_layer > 64
            || self.conv_kernel == 0
            || self.conv_kernel > 64
        {
            return bad(format!(
                "{} layers, heads of {}, a depthwise kernel of {}",
                self.n_layer,
                self.head_dim(),
                self.conv_kernel
            ));
        }
        for (what, n) in [
            ("feed-forward width", self.ff),
            ("output width", self.output_dims),
            ("text width", self.text_width),
        ] {
            if n == 0 || !n.is_multiple_of(4) || n > 4 * MAX_WIDTH {
                return bad(format!("{what} {n}"));
            }
        }
        Ok(())
    }
}

/// The widest conformer this reads (the released one is 1024 wide).
const MAX_WIDTH: usize = 8192;

fn tensor<'g>(g: &'g Gguf, name: &str) -> Result<&'g TensorInfo, AudioLoadError> {
    g.tensor(name)
        .ok_or_else(|| AudioLoadError::MissingTensor(name.to_string()))
}

/// A subsampling convolution's output channels, `[3, 3, cin, cout]` with `cin` checked
/// (`None`: any).
fn channels(dims: &[u64], cin: usize) -> Result<usize, AudioLoadError> {
    match dims {
        [3, 3, i, o] if cin == 0 || *i as usize == cin => Ok(*o as usize),
        d => Err(AudioLoadError::Shape(format!(
            "a subsampling convolution is {d:?}, not [3, 3, {}, C]",
            if cin == 0 {
                "C0".into()
            } else {
                cin.to_string()
            }
        ))),
    }
}

impl AudioWeights {
    /// The tower's weights of `g` (whose shape `cfg` read) from `source`, as f32.
    pub fn load(
        g: &Gguf,
        cfg: &AudioConfig,
        source: &dyn TensorSource,
    ) -> Result<Self, AudioLoadError> {
        let t = TowerTensors::resolve(g, cfg)?;
        let read = |_: &mut (), t: &&TensorInfo| read_tensor_f32(g, source, t);
        let values = t
            .clamp_tensors()
            .iter()
            .map(|c| read(&mut (), c))
            .collect::<Result<Vec<_>, _>>()?;
        let mappers = Mappers {
            matrix: read,
            vector: read,
        };
        Ok(t.with_clamps(&values)?.try_map(&mut (), &mappers)?)
    }
}
