//! The tower's tensors by name, in either file layout, generic over what holds a matrix and a
//! vector (GGUF tensor infos, f32 arrays for the CPU reference, GPU buffers).
//!
//! A llama.cpp projector file and an Ollama blob give some tensors different names, and two
//! names collide with different meanings (reference/multimodal.md §2):
//!
//! | role | mmproj | Ollama blob |
//! | --- | --- | --- |
//! | subsampling projection | `a.input_projection` | `a.pre_encode.out` |
//! | output projection (+ bias) | `a.pre_encode.out` | `mm.a.fc` |
//! | attention pre-norm | `a.blk.N.attn_pre_norm` | `a.blk.N.ln1` |
//! | attention post-norm | `a.blk.N.attn_post_norm` | `a.blk.N.ln2` |
//! | block output norm | `a.blk.N.ln2` | `a.blk.N.layer_pre_norm` |
//! | relative-position projection | `a.blk.N.attn_k_rel` | `a.blk.N.linear_pos` |
//!
//! The rest is named alike. Clamp ranges are per-tensor scalars in both (`<linear>.input_min`
//! …); a linear without them does not clamp.

use wgemma_gguf::{Gguf, TensorInfo};

use crate::load::AudioLoadError;
use crate::mel::N_MELS;
use crate::reference::{AudioConfig, subsampled};

/// Which file layout the tower came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AudioLayout {
    /// A llama.cpp projector file (`--mmproj`, `clip.audio.*`).
    Mmproj,
    /// The audio tensors of an Ollama `gemma4` blob (`gemma4.audio.*`).
    OllamaBlob,
}

/// A linear layer's weight `[out, in]` with transformers' `Gemma4ClippableLinear` ranges:
/// `clamp(W clamp(x, input), output)`; infinite ranges do not clamp.
#[derive(Clone, Debug)]
pub struct ClampedLinear<M> {
    pub w: M,
    pub input: [f32; 2],
    pub output: [f32; 2],
}

/// One half-step feed-forward block.
#[derive(Clone, Debug)]
pub struct FeedForward<M, V> {
    pub pre_norm: V,
    pub up: ClampedLinear<M>,
    pub down: ClampedLinear<M>,
    pub post_norm: V,
}

/// One conformer block.
#[derive(Clone, Debug)]
pub struct ConformerLayer<M, V> {
    pub ffn1: FeedForward<M, V>,
    pub attn_pre_norm: V,
    pub q: ClampedLinear<M>,
    pub k: ClampedLinear<M>,
    pub v: ClampedLinear<M>,
    pub post: ClampedLinear<M>,
    /// `[H * dh, hidden]`: the sinusoid of a distance to its key term.
    pub relative_k: M,
    /// `softplus(per_dim_scale)`, `[dh]` (both layouts store it applied already).
    pub query_scale: V,
    pub attn_post_norm: V,
    pub conv_pre_norm: V,
    /// `[2 hidden, hidden]`: the GLU's value and gate halves.
    pub conv_start: ClampedLinear<M>,
    /// `[hidden, kernel]`: the causal depthwise convolution.
    pub conv_depthwise: V,
    pub conv_norm: V,
    pub conv_end: ClampedLinear<M>,
    pub ffn2: FeedForward<M, V>,
    pub out_norm: V,
}

/// The tower and its embedder.
#[derive(Clone, Debug)]
pub struct Tower<M, V> {
    /// `[c0, 1, 3, 3]` and `[c1, c0, 3, 3]` (PyTorch's Conv2d layout), as vectors: the
    /// convolutions are products of activations.
    pub conv: [V; 2],
    /// The LayerNorm weights after each convolution, `[c0]` and `[c1]`.
    pub conv_norm: [V; 2],
    /// `[hidden, freq * c1]` over the flattened (frequency, channel) plane, channel fastest.
    pub input_projection: M,
    pub layers: Vec<ConformerLayer<M, V>>,
    /// `[output_dims, hidden]` and its bias.
    pub output_projection: M,
    pub output_bias: V,
    /// `[text_width, output_dims]`.
    pub embedding_projection: M,
}

/// Clamp ranges a layer's linears may have, in [`ConformerLayer::linears_mut`]'s order.
pub const LAYER_LINEARS: usize = 10;

impl<M> ClampedLinear<M> {
    fn try_map<N, S, E>(
        &self,
        s: &mut S,
        m: &impl Fn(&mut S, &M) -> Result<N, E>,
    ) -> Result<ClampedLinear<N>, E> {
        Ok(ClampedLinear {
            w: m(s, &self.w)?,
            input: self.input,
            output: self.output,
        })
    }
}

/// The two functions [`Tower::try_map`] applies: one to each matrix, one to each vector.
pub struct Mappers<FM, FV> {
    pub matrix: FM,
    pub vector: FV,
}

impl<M, V> FeedForward<M, V> {
    fn try_map<N, W, S, E>(
        &self,
        s: &mut S,
        f: &Mappers<impl Fn(&mut S, &M) -> Result<N, E>, impl Fn(&mut S, &V) -> Result<W, E>>,
    ) -> Result<FeedForward<N, W>, E> {
        let v = &f.vector;
        Ok(FeedForward {
            pre_norm: v(s, &self.pre_norm)?,
            up: self.up.try_map(s, &f.matrix)?,
            down: self.down.try_map(s, &f.matrix)?,
            post_norm: v(s, &self.post_norm)?,
        })
    }
}

impl<M, V> ConformerLayer<M, V> {
    /// The clamped linears, in a fixed order.
    pub fn linears_mut(&mut self) -> [&mut ClampedLinear<M>; LAYER_LINEARS] {
        [
            &mut self.ffn1.up,
            &mut self.ffn1.down,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.post,
            &mut self.conv_start,
            &mut self.conv_end,
            &mut self.ffn2.up,
            &mut self.ffn2.down,
        ]
    }

    fn try_map<N, W, S, E>(
        &self,
        s: &mut S,
        f: &Mappers<impl Fn(&mut S, &M) -> Result<N, E>, impl Fn(&mut S, &V) -> Result<W, E>>,
    ) -> Result<ConformerLayer<N, W>, E> {
        let (m, v) = (&f.matrix, &f.vector);
        Ok(ConformerLayer {
            ffn1: self.ffn1.try_map(s, f)?,
            attn_pre_norm: v(s, &self.attn_pre_norm)?,
            q: self.q.try_map(s, m)?,
            k: self.k.try_map(s, m)?,
            v: self.v.try_map(s, m)?,
            post: self.post.try_map(s, m)?,
            relative_k: m(s, &self.relative_k)?,
            query_scale: v(s, &self.query_scale)?,
            attn_post_norm: v(s, &self.attn_post_norm)?,
            conv_pre_norm: v(s, &self.conv_pre_norm)?,
            conv_start: self.conv_start.try_map(s, m)?,
            conv_depthwise: v(s, &self.conv_depthwise)?,
            conv_norm: v(s, &self.conv_norm)?,
            conv_end: self.conv_end.try_map(s, m)?,
            ffn2: self.ffn2.try_map(s, f)?,
            out_norm: v(s, &self.out_norm)?,
        })
    }
}

impl<M, V> Tower<M, V> {
    /// The same tower with each matrix and vector converted (read to f32, uploaded), in a
    /// fixed order, threading `s` through.
    pub fn try_map<N, W, S, E>(
        &self,
        s: &mut S,
        f: &Mappers<impl Fn(&mut S, &M) -> Result<N, E>, impl Fn(&mut S, &V) -> Result<W, E>>,
    ) -> Result<Tower<N, W>, E> {
        let (m, v) = (&f.matrix, &f.vector);
        Ok(Tower {
            conv: [v(s, &self.conv[0])?, v(s, &self.conv[1])?],
            conv_norm: [v(s, &self.conv_norm[0])?, v(s, &self.conv_norm[1])?],
            input_projection: m(s, &self.input_projection)?,
            layers: self
                .layers
                .iter()
                .map(|l| l.try_map(s, f))
                .collect::<Result<_, _>>()?,
            output_projection: m(s, &self.output_projection)?,
            output_bias: v(s, &self.output_bias)?,
            embedding_projection: m(s, &self.embedding_projection)?,
        })
    }
}

/// The tower's tensors in a file, and where each linear's clamp scalars are.
pub struct TowerTensors<'g> {
    pub tower: Tower<&'g TensorInfo, &'g TensorInfo>,
    /// Per layer, per linear ([`ConformerLayer::linears_mut`]'s order): input min, input max,
    /// output min, output max, each absent where the file has none.
    pub clamps: Vec<[[Option<&'g TensorInfo>; 4]; LAYER_LINEARS]>,
}

/// The file's name for a tensor of the given role.
#[derive(Clone, Copy)]
struct Names {
    layout: AudioLayout,
}

impl Names {
    fn input_projection(&self) -> &'static str {
        match self.layout {
            AudioLayout::Mmproj => "a.input_projection",
            AudioLayout::OllamaBlob => "a.pre_encode.out",
        }
    }

    fn output_projection(&self) -> &'static str {
        match self.layout {
            AudioLayout::Mmproj => "a.pre_encode.out",
            AudioLayout::OllamaBlob => "mm.a.fc",
        }
    }

    /// A block tensor's name in the file from its llama.cpp name.
    fn block(&self, name: &'static str) -> &'static str {
        match (self.layout, name) {
            (AudioLayout::OllamaBlob, "attn_pre_norm") => "ln1",
            (AudioLayout::OllamaBlob, "attn_post_norm") => "ln2",
            (AudioLayout::OllamaBlob, "ln2") => "layer_pre_norm",
            (AudioLayout::OllamaBlob, "attn_k_rel") => "linear_pos",
            _ => name,
        }
    }
}

/// Finds tensors and checks their shapes.
struct Resolver<'g> {
    g: &'g Gguf,
    names: Names,
    clamps: Vec<[Option<&'g TensorInfo>; 4]>,
}

impl<'g> Resolver<'g> {
    /// Tensor `name` with ggml dims `dims`.
    fn get(&self, name: &str, dims: &[usize]) -> Result<&'g TensorInfo, AudioLoadError> {
        let t = self
            .g
            .tensor(name)
            .ok_or_else(|| AudioLoadError::MissingTensor(name.to_string()))?;
        if t.dims.iter().map(|&d| d as usize).ne(dims.iter().copied()) {
            return Err(AudioLoadError::Shape(format!(
                "{name} is {:?}, not {dims:?}",
                t.dims
            )));
        }
        Ok(t)
    }

    /// A linear `[outputs, inputs]`, noting where its clamp scalars are.
    fn linear(
        &mut self,
        name: &str,
        inputs: usize,
        outputs: usize,
    ) -> Result<ClampedLinear<&'g TensorInfo>, AudioLoadError> {
        let w = self.get(&format!("{name}.weight"), &[inputs, outputs])?;
        let mut scalars = [None; 4];
        for (slot, end) in
            scalars
                .iter_mut()
                .zip(["input_min", "input_max", "output_min", "output_max"])
        {
            let scalar = format!("{name}.{end}");
            if self.g.tensor(&scalar).is_some() {
                *slot = Some(self.get(&scalar, &[1])?);
            }
        }
        self.clamps.push(scalars);
        Ok(ClampedLinear {
            w,
            input: [f32::NEG_INFINITY, f32::INFINITY],
            output: [f32::NEG_INFINITY, f32::INFINITY],
        })
    }

    fn feed_forward(
        &mut self,
        cfg: &AudioConfig,
        p: &str,
        suffix: &str,
    ) -> Result<FeedForward<&'g TensorInfo, &'g TensorInfo>, AudioLoadError> {
        let d = cfg.hidden;
        Ok(FeedForward {
            pre_norm: self.get(&format!("{p}ffn_norm{suffix}.weight"), &[d])?,
            up: self.linear(&format!("{p}ffn_up{suffix}"), d, cfg.ff)?,
            down: self.linear(&format!("{p}ffn_down{suffix}"), cfg.ff, d)?,
            post_norm: self.get(&format!("{p}ffn_post_norm{suffix}.weight"), &[d])?,
        })
    }

    /// Block `il`'s tensors; the linears in [`ConformerLayer::linears_mut`]'s order.
    fn layer(
        &mut self,
        cfg: &AudioConfig,
        il: usize,
    ) -> Result<ConformerLayer<&'g TensorInfo, &'g TensorInfo>, AudioLoadError> {
        let (d, dh) = (cfg.hidden, cfg.head_dim());
        let p = format!("a.blk.{il}.");
        let names = self.names;
        let name = |role: &'static str| format!("{p}{}", names.block(role));
        let vector = |r: &Self, role: &'static str| r.get(&format!("{}.weight", name(role)), &[d]);
        let ffn1 = self.feed_forward(cfg, &p, "")?;
        let [q, k, v, post] =
            ["attn_q", "attn_k", "attn_v", "attn_out"].map(|role| self.linear(&name(role), d, d));
        let conv_start = self.linear(&name("conv_pw1"), d, 2 * d)?;
        let conv_end = self.linear(&name("conv_pw2"), d, d)?;
        let ffn2 = self.feed_forward(cfg, &p, "_1")?;
        Ok(ConformerLayer {
            ffn1,
            attn_pre_norm: vector(self, "attn_pre_norm")?,
            q: q?,
            k: k?,
            v: v?,
            post: post?,
            relative_k: self.get(&format!("{}.weight", name("attn_k_rel")), &[d, d])?,
            query_scale: self.get(&format!("{p}per_dim_scale.weight"), &[dh])?,
            attn_post_norm: vector(self, "attn_post_norm")?,
            // llama.cpp's names for the light convolution's two norms: `conv_norm` before
            // the GLU, `norm_conv` after the depthwise convolution.
            conv_pre_norm: vector(self, "conv_norm")?,
            conv_start,
            conv_depthwise: self.get(&format!("{p}conv_dw.weight"), &[cfg.conv_kernel, d])?,
            conv_norm: vector(self, "norm_conv")?,
            conv_end,
            ffn2,
            out_norm: vector(self, "ln2")?,
        })
    }
}

impl<'g> TowerTensors<'g> {
    /// The tower's tensors in `g` (whose shape `cfg` read), each checked against that shape.
    pub fn resolve(g: &'g Gguf, cfg: &AudioConfig) -> Result<Self, AudioLoadError> {
        let mut r = Resolver {
            g,
            names: Names { layout: cfg.layout },
            clamps: Vec::new(),
        };
        let [c0, c1] = cfg.sscp_channels;
        let freq = subsampled(subsampled(N_MELS));
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            layers.push(r.layer(cfg, il)?);
        }
        let (input, output) = (r.names.input_projection(), r.names.output_projection());
        let tower = Tower {
            conv: [
                r.get("a.conv1d.0.weight", &[3, 3, 1, c0])?,
                r.get("a.conv1d.1.weight", &[3, 3, c0, c1])?,
            ],
            conv_norm: [
                r.get("a.conv1d.0.norm.weight", &[c0])?,
                r.get("a.conv1d.1.norm.weight", &[c1])?,
            ],
            input_projection: r.get(&format!("{input}.weight"), &[freq * c1, cfg.hidden])?,
            layers,
            output_projection: r
                .get(&format!("{output}.weight"), &[cfg.hidden, cfg.output_dims])?,
            output_bias: r.get(&format!("{output}.bias"), &[cfg.output_dims])?,
            embedding_projection: r.get(
                "mm.a.input_projection.weight",
                &[cfg.output_dims, cfg.text_width],
            )?,
        };
        let clamps = r
            .clamps
            .chunks(LAYER_LINEARS)
            .map(|c| <[_; LAYER_LINEARS]>::try_from(c).expect("ten linears a layer"))
            .collect();
        Ok(Self { tower, clamps })
    }

    /// Every clamp scalar to read, in order.
    pub fn clamp_tensors(&self) -> Vec<&'g TensorInfo> {
        self.clamps
            .iter()
            .flatten()
            .flatten()
            .flatten()
            .copied()
            .collect()
    }

    /// The tower with the clamp ranges set from the values of [`Self::clamp_tensors`], one
    /// value each, in order.
    pub fn with_clamps(
        &self,
        values: &[Vec<f32>],
    ) -> Result<Tower<&'g TensorInfo, &'g TensorInfo>, AudioLoadError> {
        let mut tower = self.tower.clone();
        let mut values = values.iter();
        for (layer, clamps) in tower.layers.iter_mut().zip(&self.clamps) {
            for (lin, scalars) in layer.linears_mut().into_iter().zip(clamps) {
                let mut r = [
                    f32::NEG_INFINITY,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    f32::INFINITY,
                ];
                for (slot, t) in r.iter_mut().zip(scalars) {
                    let Some(t) = t else { continue };
                    *slot = match values.next().map(Vec::as_slice) {
                        Some([v]) if !v.is_nan() => *v,
                        _ => {
                            return Err(AudioLoadError::Shape(format!(
                                "{} does not hold one number",
                                t.name
                            )));
                        }
                    };
                }
                if !(r[0] <= r[1] && r[2] <= r[3]) {
                    return Err(AudioLoadError::Shape(format!(
                        "{}'s clamp ranges {r:?} are empty",
                        lin.w.name
                    )));
                }
                (lin.input, lin.output) = ([r[0], r[1]], [r[2], r[3]]);
            }
        }
        Ok(tower)
    }
}
