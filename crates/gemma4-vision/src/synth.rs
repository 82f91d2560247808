//! Synthetic vision towers with random weights in llama.cpp's mmproj layout (F16 linears and
//! patch embedding, F32 norms and position tables, clamp ranges as per-tensor scalars), with a
//! real tower's shapes: for benchmarks (`cargo xtask synth --preset e2b-mmproj`), and loadable
//! by llama.cpp's mtmd as well as by wgemma.

use wgemma_gguf::synth::{RandomTensors, fan_in_scale};
use wgemma_gguf::{Array, GgmlType, Value, WriteError, write_gguf};

use crate::config::LAYER_LINEARS;

/// A tower's shape.
#[derive(Clone, Copy, Debug)]
pub struct VisionSynth {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_positions: usize,
    /// The text model's width.
    pub projection_dim: usize,
    pub seed: u64,
}

impl VisionSynth {
    /// Gemma 4 E2B's tower (and E4B's, with `projection_dim` 2560).
    pub fn gemma4_e2b() -> Self {
        Self {
            n_layer: 16,
            n_embd: 768,
            n_ff: 3072,
            n_head: 12,
            n_positions: 10240,
            projection_dim: 1536,
            seed: 1,
        }
    }

    /// A preset by name: `e2b-mmproj`, `e4b-mmproj`.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "e2b-mmproj" => Some(Self::gemma4_e2b()),
            "e4b-mmproj" => Some(Self {
                projection_dim: 2560,
                ..Self::gemma4_e2b()
            }),
            _ => None,
        }
    }
}

/// The tower's GGUF bytes.
pub fn mmproj_bytes(s: &VisionSynth) -> Result<Vec<u8>, WriteError> {
    let mut random = RandomTensors::new(s.seed);
    let mut add = |name: String, dims: &[u64], dtype: GgmlType, scale: f32, offset: f32| {
        random.add(name, dims, dtype, scale, offset);
    };
    let (d, ff) = (s.n_embd as u64, s.n_ff as u64);
    let dh = d / s.n_head as u64;
    let (f16, f32) = (GgmlType::F16, GgmlType::F32);
    let fan = fan_in_scale;
    add(
        "v.patch_embd.weight".into(),
        &[16, 16, 3, d],
        f16,
        fan(768),
        0.0,
    );
    add(
        "v.position_embd.weight".into(),
        &[d, s.n_positions as u64, 2],
        f32,
        0.5,
        0.0,
    );
    add(
        "mm.input_projection.weight".into(),
        &[d, s.projection_dim as u64],
        f16,
        fan(d),
        0.0,
    );
    for il in 0..s.n_layer {
        for n in ["ln1", "ln2", "attn_post_norm", "ffn_post_norm"] {
            add(format!("v.blk.{il}.{n}.weight"), &[d], f32, 0.2, 1.0);
        }
        for n in ["attn_q_norm", "attn_k_norm"] {
            add(format!("v.blk.{il}.{n}.weight"), &[dh], f32, 0.1, 0.5);
        }
        for n in LAYER_LINEARS {
            let dims = match n {
                "ffn_gate" | "ffn_up" => [d, ff],
                "ffn_down" => [ff, d],
                _ => [d, d],
            };
            add(
                format!("v.blk.{il}.{n}.weight"),
                &dims,
                f16,
                fan(dims[0]),
                0.0,
            );
            for (c, sign) in [("input_min", -1.0), ("input_max", 1.0)] {
                add(format!("v.blk.{il}.{n}.{c}"), &[1], f32, 2.0, sign * 12.0);
            }
            for (c, sign) in [("output_min", -1.0), ("output_max", 1.0)] {
                add(format!("v.blk.{il}.{n}.{c}"), &[1], f32, 2.0, sign * 12.0);
            }
        }
    }
    let u32v = |v: usize| Value::U32(v as u32);
    let meta: Vec<(String, Value)> = [
        ("general.architecture", Value::String("clip".into())),
        ("general.type", Value::String("mmproj".into())),
        (
            "general.name",
            Value::String("synthetic Gemma 4 vision tower".into()),
        ),
        ("clip.has_vision_encoder", Value::Bool(true)),
        (
            "clip.vision.projector_type",
            Value::String("gemma4v".into()),
        ),
        ("clip.vision.image_size", Value::U32(224)),
        ("clip.vision.patch_size", Value::U32(16)),
        ("clip.vision.embedding_length", u32v(s.n_embd)),
        ("clip.vision.feed_forward_length", u32v(s.n_ff)),
        ("clip.vision.block_count", u32v(s.n_layer)),
        ("clip.vision.attention.head_count", u32v(s.n_head)),
        ("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6)),
        ("clip.vision.projection_dim", u32v(s.projection_dim)),
        (
            "clip.vision.image_mean",
            Value::Array(Array::F32(vec![0.0; 3])),
        ),
        (
            "clip.vision.image_std",
            Value::Array(Array::F32(vec![1.0; 3])),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    write_gguf(&meta, &random.tensors, 32)
}
