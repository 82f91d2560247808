//! The tower's tensors by name, generic over what holds a matrix and a vector (GGUF tensor
//! infos, f32 arrays for the CPU reference, GPU buffers), and the clamped linears' ranges
//! from either store: per-tensor scalars (llama.cpp) or `v.clamp_data` (Ollama).

use wgemma_gguf::{Gguf, TensorInfo};

use crate::config::{ClampStore, LAYER_LINEARS, VisionConfig, VisionConfigError};
use crate::preprocess::{PATCH, Patches};

/// A clamped linear's ranges: `clamp(W clamp(x, input), output)` (transformers'
/// `Gemma4ClippableLinear`). Unclamped linears have infinite ranges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clamp {
    pub input: [f32; 2],
    pub output: [f32; 2],
}

impl Clamp {
    pub const NONE: Self = Self {
        input: [f32::NEG_INFINITY, f32::INFINITY],
        output: [f32::NEG_INFINITY, f32::INFINITY],
    };

    /// `[min, max]` when it changes some finite value.
    pub fn bites(range: [f32; 2]) -> Option<[f32; 2]> {
        (range[0] > f32::MIN || range[1] < f32::MAX).then_some(range)
    }
}

/// A linear of the tower with its clamp ranges.
#[derive(Clone, Debug)]
pub struct Linear<M> {
    pub w: M,
    pub clamp: Clamp,
}

/// One encoder layer.
#[derive(Clone, Debug)]
pub struct Layer<M, V> {
    pub ln1: V,
    pub ln2: V,
    pub attn_post_norm: V,
    pub ffn_post_norm: V,
    pub q_norm: V,
    pub k_norm: V,
    pub q: Linear<M>,
    pub k: Linear<M>,
    pub v: Linear<M>,
    pub o: Linear<M>,
    pub gate: Linear<M>,
    pub up: Linear<M>,
    pub down: Linear<M>,
    /// The layer's output scale (`v.blk.N.out_scale.weight`), 1 without one.
    pub out_scale: f32,
}

/// How the patch embedding's columns are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchOrder {
    /// (channel, row, column): llama.cpp's convolution weight `[16, 16, 3, D]`.
    ChannelFirst,
    /// (row, column, channel): transformers' linear over a patch, stored `[768, D]`.
    ChannelLast,
}

impl PatchOrder {
    /// The tower's input rows: each patch of `p` as `2 x - 1` (transformers' `2 (x - 0.5)`)
    /// with its values in this order.
    pub fn input(self, p: &Patches) -> Vec<f32> {
        let side = PATCH as usize;
        let n = Patches::PATCH_VALUES;
        let mut out = Vec::with_capacity(p.pixels.len());
        for patch in p.pixels.chunks(n) {
            match self {
                Self::ChannelLast => out.extend(patch.iter().map(|v| 2.0 * v - 1.0)),
                Self::ChannelFirst => {
                    for c in 0..3 {
                        out.extend((0..side * side).map(|i| 2.0 * patch[i * 3 + c] - 1.0));
                    }
                }
            }
        }
        out
    }
}

/// The tower's weights.
#[derive(Clone, Debug)]
pub struct Tower<M, V> {
    /// `[D, 768]` in `patch_order`.
    pub patch_embd: M,
    pub patch_order: PatchOrder,
    /// `[2, P, D]`: the column table, then the row table.
    pub positions: V,
    pub layers: Vec<Layer<M, V>>,
    /// `(bias, scale)`: `(x - bias) * scale` after pooling.
    pub standardize: Option<(V, V)>,
    /// `[text width, D]`.
    pub projection: M,
}

/// The tensors [`Tower::resolve`] found, the patch embedding seen as `[768, D]` rows.
pub struct TowerTensors<'g> {
    pub tower: Tower<&'g TensorInfo, &'g TensorInfo>,
    /// The patch embedding as a matrix of `D` rows of 768 (the file's tensor reshaped).
    pub patch_embd: TensorInfo,
    /// Tensors holding clamp ranges, read by [`Clamps::assemble`].
    pub clamps: ClampTensors<'g>,
    /// The output-scale tensors (one value each) per layer.
    pub out_scales: Vec<Option<&'g TensorInfo>>,
}

/// Where the clamp ranges are.
pub enum ClampTensors<'g> {
    None,
    /// Per layer, per linear, `[input_min, input_max, output_min, output_max]`.
    Scalars(Vec<[[&'g TensorInfo; 4]; 7]>),
    Packed(&'g TensorInfo),
}

impl<'g> ClampTensors<'g> {
    /// Every tensor to read, in order.
    pub fn tensors(&self) -> Vec<&'g TensorInfo> {
        match self {
            Self::None => Vec::new(),
            Self::Scalars(layers) => layers.iter().flatten().flatten().copied().collect(),
            Self::Packed(t) => vec![t],
        }
    }

    /// The ranges of every layer's linears from the values of [`Self::tensors`].
    pub fn assemble(
        &self,
        n_layer: usize,
        values: &[Vec<f32>],
    ) -> Result<Vec<[Clamp; 7]>, VisionConfigError> {
        let flat: Vec<f32> = match self {
            Self::None => return Ok(vec![[Clamp::NONE; 7]; n_layer]),
            Self::Scalars(_) => values
                .iter()
                .map(|v| match v[..] {
                    [x] => Ok(x),
                    _ => Err(VisionConfigError::Shape(format!(
                        "a clamp range has {} values, not 1",
                        v.len()
                    ))),
                })
                .collect::<Result<_, _>>()?,
            Self::Packed(_) => values.concat(),
        };
        if flat.len() < n_layer * 28 {
            return Err(VisionConfigError::Shape(format!(
                "{} clamp values for {n_layer} layers",
                flat.len()
            )));
        }
        let clamp = |c: &[f32]| Clamp {
            input: [c[0], c[1]],
            output: [c[2], c[3]],
        };
        let out = flat
            .chunks(28)
            .take(n_layer)
            .map(|l| std::array::from_fn(|i| clamp(&l[i * 4..i * 4 + 4])))
            .collect::<Vec<[Clamp; 7]>>();
        if let Some(bad) = out
            .iter()
            .flatten()
            .find(|c| !(c.input[0] <= c.input[1] && c.output[0] <= c.output[1]))
        {
            return Err(VisionConfigError::Shape(format!(
                "a clamp range is empty: {bad:?}"
            )));
        }
        Ok(out)
    }
}

impl<'g> TowerTensors<'g> {
    /// The tower's tensors in `g` (whose shape `cfg` read).
    pub fn resolve(g: &'g Gguf, cfg: &VisionConfig) -> Result<Self, VisionConfigError> {
        let get = |name: String| {
            g.tensor(&name)
                .ok_or(VisionConfigError::MissingTensor(name))
        };
        let (d, values) = (cfg.n_embd as u64, u64::from(PATCH * PATCH * 3));
        let embd = get("v.patch_embd.weight".into())?;
        let patch_order = match embd.dims[..] {
            [16, 16, 3, n] if n == d => PatchOrder::ChannelFirst,
            [v, n] if v == values && n == d => PatchOrder::ChannelLast,
            _ => {
                return Err(VisionConfigError::Shape(format!(
                    "v.patch_embd.weight is {:?}, not [16, 16, 3, {d}] or [{values}, {d}]",
                    embd.dims
                )));
            }
        };
        let mut patch_embd = embd.clone();
        patch_embd.dims = vec![values, d];
        let mut layers = Vec::with_capacity(cfg.n_layer);
        let mut scalars = Vec::new();
        let mut out_scales = Vec::new();
        for il in 0..cfg.n_layer {
            let t = |s: &str| get(format!("v.blk.{il}.{s}.weight"));
            let lin = |s: &str| -> Result<Linear<&TensorInfo>, VisionConfigError> {
                Ok(Linear {
                    w: t(s)?,
                    clamp: Clamp::NONE,
                })
            };
            if cfg.clamps == ClampStore::Scalars {
                let mut per = Vec::with_capacity(7);
                for name in LAYER_LINEARS {
                    let r = |s: &str| get(format!("v.blk.{il}.{name}.{s}"));
                    per.push([
                        r("input_min")?,
                        r("input_max")?,
                        r("output_min")?,
                        r("output_max")?,
                    ]);
                }
                scalars.push(<[_; 7]>::try_from(per).map_err(|_| {
                    VisionConfigError::Shape("seven clamped linears a layer".into())
                })?);
            }
            out_scales.push(g.tensor(&format!("v.blk.{il}.out_scale.weight")));
            layers.push(Layer {
                ln1: t("ln1")?,
                ln2: t("ln2")?,
                attn_post_norm: t("attn_post_norm")?,
                ffn_post_norm: t("ffn_post_norm")?,
                q_norm: t("attn_q_norm")?,
                k_norm: t("attn_k_norm")?,
                q: lin("attn_q")?,
                k: lin("attn_k")?,
                v: lin("attn_v")?,
                o: lin("attn_out")?,
                gate: lin("ffn_gate")?,
                up: lin("ffn_up")?,
                down: lin("ffn_down")?,
                out_scale: 1.0,
            });
        }
        let clamps = match cfg.clamps {
            ClampStore::None => ClampTensors::None,
            ClampStore::Scalars => ClampTensors::Scalars(scalars),
            ClampStore::Packed => ClampTensors::Packed(get("v.clamp_data".into())?),
        };
        let standardize = if cfg.standardize {
            Some((get("v.std_bias".into())?, get("v.std_scale".into())?))
        } else {
            None
        };
        let tower = Tower {
            patch_embd: embd,
            patch_order,
            positions: get("v.position_embd.weight".into())?,
            layers,
            standardize,
            projection: get("mm.input_projection.weight".into())?,
        };
        let tensors = Self {
            tower,
            patch_embd,
            clamps,
            out_scales,
        };
        tensors.check(cfg)?;
        Ok(tensors)
    }

    /// Every matrix and vector has the shape the config implies.
    fn check(&self, cfg: &VisionConfig) -> Result<(), VisionConfigError> {
        let (d, ff, dh) = (cfg.n_embd as u64, cfg.n_ff as u64, cfg.head_dim as u64);
        let want = |t: &TensorInfo, dims: &[u64]| {
            if t.dims == dims {
                Ok(())
            } else {
                Err(VisionConfigError::Shape(format!(
                    "{} is {:?}, not {dims:?}",
                    t.name, t.dims
                )))
            }
        };
        for l in &self.tower.layers {
            for v in [&l.ln1, &l.ln2, &l.attn_post_norm, &l.ffn_post_norm] {
                want(v, &[d])?;
            }
            want(l.q_norm, &[dh])?;
            want(l.k_norm, &[dh])?;
            for m in [&l.q, &l.k, &l.v, &l.o] {
                want(m.w, &[d, d])?;
            }
            want(l.gate.w, &[d, ff])?;
            want(l.up.w, &[d, ff])?;
            want(l.down.w, &[ff, d])?;
        }
        if let Some((b, s)) = &self.tower.standardize {
            want(b, &[d])?;
            want(s, &[d])?;
        }
        for t in self.out_scales.iter().flatten() {
            want(t, &[1])?;
        }
        want(self.tower.projection, &[d, cfg.projection_dim as u64])
    }
}

impl<M, V> Tower<M, V> {
    /// Sets the clamps and output scales read from the file.
    pub fn set_ranges(&mut self, clamps: &[[Clamp; 7]], out_scales: &[f32]) {
        for ((l, c), &s) in self.layers.iter_mut().zip(clamps).zip(out_scales) {
            for (lin, c) in [
                &mut l.q,
                &mut l.k,
                &mut l.v,
                &mut l.o,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ]
            .into_iter()
            .zip(c)
            {
                lin.clamp = *c;
            }
            l.out_scale = s;
        }
    }
}
