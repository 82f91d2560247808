//! The audio tower's shape and weights from a llama.cpp projector file (`mmproj` GGUF,
//! `clip.audio.projector_type = gemma4a`): the keys and tensor names of reference/multimodal.md
//! §2, clamps as per-tensor scalars (`<linear>.input_min` …; absent ones do not clamp), the
//! per-dimension query scale stored with softplus applied.

use wgemma_gguf::{Gguf, MetadataError, ReadError, TensorInfo, TensorSource, read_tensor_f32};

use crate::reference::{
    AudioConfig, AudioWeights, ClampedLinear, ConformerLayer, FeedForward, subsampled,
};

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
    /// The audio tower `g` holds, if any (`Ok(None)` for a file without one).
    pub fn from_gguf(g: &Gguf) -> Result<Option<Self>, AudioLoadError> {
        let m = &g.metadata;
        if g.architecture() != Some("clip")
            || !m.opt_bool("clip.has_audio_encoder")?.unwrap_or(false)
        {
            return Ok(None);
        }
        let kind = m.get_str("clip.audio.projector_type")?;
        if kind != "gemma4a" {
            return Err(AudioLoadError::Projector(kind.to_string()));
        }
        let size = |k: &str| -> Result<usize, AudioLoadError> {
            Ok(m.get_u64(&format!("clip.audio.{k}"))? as usize)
        };
        let dims = |name: &str| -> Result<&[u64], AudioLoadError> { Ok(&tensor(g, name)?.dims) };
        let sscp_channels = [
            channels(dims("a.conv1d.0.weight")?, 1)?,
            channels(dims("a.conv1d.1.weight")?, 0)?,
        ];
        let output_dims = match dims("a.pre_encode.out.weight")? {
            [_, n] => *n as usize,
            d => {
                return Err(AudioLoadError::Shape(format!(
                    "a.pre_encode.out.weight is {d:?}"
                )));
            }
        };
        let cfg = Self {
            n_layer: size("block_count")?,
            hidden: size("embedding_length")?,
            n_head: size("attention.head_count")?,
            ff: size("feed_forward_length")?,
            sscp_channels,
            conv_kernel: CONV_KERNEL,
            chunk: CHUNK,
            context_left: CONTEXT_LEFT,
            logit_cap: LOGIT_CAP,
            // Early conversions wrote a wrong epsilon; the architecture's is 1e-6 (as
            // llama.cpp forces).
            eps: 1e-6,
            output_dims,
            text_width: size("projection_dim")?,
        };
        if cfg.n_head == 0
            || !cfg.hidden.is_multiple_of(cfg.n_head)
            || !cfg.hidden.is_multiple_of(2)
        {
            return Err(AudioLoadError::Shape(format!(
                "width {} over {} heads",
                cfg.hidden, cfg.n_head
            )));
        }
        Ok(Some(cfg))
    }
}

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

/// Reads tensors of one file as f32, each checked against the shape the config implies.
struct Reader<'a> {
    g: &'a Gguf,
    source: &'a dyn TensorSource,
}

impl Reader<'_> {
    /// Tensor `name` with ggml dims `dims`.
    fn read(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, AudioLoadError> {
        let t = tensor(self.g, name)?;
        if t.dims.iter().map(|&d| d as usize).ne(dims.iter().copied()) {
            return Err(AudioLoadError::Shape(format!(
                "{name} is {:?}, not {dims:?}",
                t.dims
            )));
        }
        Ok(read_tensor_f32(self.g, self.source, t)?)
    }

    /// One value of a clamp scalar, or `default` without one.
    fn scalar(&self, name: &str, default: f32) -> Result<f32, AudioLoadError> {
        match self.g.tensor(name) {
            None => Ok(default),
            Some(_) => Ok(self.read(name, &[1])?[0]),
        }
    }

    /// A linear `[outputs, inputs]` with its clamp ranges.
    fn linear(
        &self,
        name: &str,
        inputs: usize,
        outputs: usize,
    ) -> Result<ClampedLinear, AudioLoadError> {
        let range = |lo: &str, hi: &str| -> Result<[f32; 2], AudioLoadError> {
            let r = [
                self.scalar(&format!("{name}.{lo}"), f32::NEG_INFINITY)?,
                self.scalar(&format!("{name}.{hi}"), f32::INFINITY)?,
            ];
            if r[0] <= r[1] {
                Ok(r)
            } else {
                Err(AudioLoadError::Shape(format!(
                    "{name}'s clamp range {r:?} is empty"
                )))
            }
        };
        Ok(ClampedLinear {
            w: self.read(&format!("{name}.weight"), &[inputs, outputs])?,
            input: range("input_min", "input_max")?,
            output: range("output_min", "output_max")?,
        })
    }

    fn feed_forward(
        &self,
        cfg: &AudioConfig,
        p: &str,
        suffix: &str,
    ) -> Result<FeedForward, AudioLoadError> {
        let d = cfg.hidden;
        Ok(FeedForward {
            pre_norm: self.read(&format!("{p}ffn_norm{suffix}.weight"), &[d])?,
            up: self.linear(&format!("{p}ffn_up{suffix}"), d, cfg.ff)?,
            down: self.linear(&format!("{p}ffn_down{suffix}"), cfg.ff, d)?,
            post_norm: self.read(&format!("{p}ffn_post_norm{suffix}.weight"), &[d])?,
        })
    }

    fn layer(&self, cfg: &AudioConfig, il: usize) -> Result<ConformerLayer, AudioLoadError> {
        let (d, dh) = (cfg.hidden, cfg.head_dim());
        let p = format!("a.blk.{il}.");
        let vector = |name: &str| self.read(&format!("{p}{name}.weight"), &[d]);
        let square = |name: &str| self.linear(&format!("{p}{name}"), d, d);
        Ok(ConformerLayer {
            ffn1: self.feed_forward(cfg, &p, "")?,
            attn_pre_norm: vector("attn_pre_norm")?,
            q: square("attn_q")?,
            k: square("attn_k")?,
            v: square("attn_v")?,
            post: square("attn_out")?,
            relative_k: self.read(&format!("{p}attn_k_rel.weight"), &[d, d])?,
            query_scale: self.read(&format!("{p}per_dim_scale.weight"), &[dh])?,
            attn_post_norm: vector("attn_post_norm")?,
            // llama.cpp's names for the light convolution's two norms: `conv_norm` before
            // the GLU, `norm_conv` after the depthwise convolution.
            conv_pre_norm: vector("conv_norm")?,
            conv_start: self.linear(&format!("{p}conv_pw1"), d, 2 * d)?,
            conv_depthwise: self.read(&format!("{p}conv_dw.weight"), &[cfg.conv_kernel, d])?,
            conv_norm: vector("norm_conv")?,
            conv_end: square("conv_pw2")?,
            ffn2: self.feed_forward(cfg, &p, "_1")?,
            out_norm: vector("ln2")?,
        })
    }
}

impl AudioWeights {
    /// The tower's weights of `g` (whose shape `cfg` read) from `source`, as f32.
    pub fn load(
        g: &Gguf,
        cfg: &AudioConfig,
        source: &dyn TensorSource,
    ) -> Result<Self, AudioLoadError> {
        let r = Reader { g, source };
        let [c0, c1] = cfg.sscp_channels;
        let freq = subsampled(subsampled(crate::mel::N_MELS));
        let layers = (0..cfg.n_layer)
            .map(|il| r.layer(cfg, il))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            conv: [
                r.read("a.conv1d.0.weight", &[3, 3, 1, c0])?,
                r.read("a.conv1d.1.weight", &[3, 3, c0, c1])?,
            ],
            conv_norm: [
                r.read("a.conv1d.0.norm.weight", &[c0])?,
                r.read("a.conv1d.1.norm.weight", &[c1])?,
            ],
            input_projection: r.read("a.input_projection.weight", &[freq * c1, cfg.hidden])?,
            layers,
            output_projection: (
                r.read("a.pre_encode.out.weight", &[cfg.hidden, cfg.output_dims])?,
                r.read("a.pre_encode.out.bias", &[cfg.output_dims])?,
            ),
            embedding_projection: r.read(
                "mm.a.input_projection.weight",
                &[cfg.output_dims, cfg.text_width],
            )?,
        })
    }
}
