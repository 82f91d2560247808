//! Synthetic audio towers with random weights in llama.cpp's mmproj layout (F16 linears, F32
//! convolutions, norms and biases, clamp ranges as per-tensor scalars, the per-dimension query
//! scale positive as stored softplus-applied), with a real tower's shapes: for benchmarks
//! (`cargo xtask synth --preset e2b-audio-mmproj`), loadable by llama.cpp's mtmd as well as
//! by wgemma.

use wgemma_gguf::synth::{RandomTensors, fan_in_scale};
use wgemma_gguf::{GgmlType, Value, WriteError, write_gguf};

use crate::mel::N_MELS;
use crate::reference::subsampled;

/// A tower's shape.
#[derive(Clone, Copy, Debug)]
pub struct AudioSynth {
    pub n_layer: usize,
    pub hidden: usize,
    pub ff: usize,
    pub n_head: usize,
    pub sscp_channels: [usize; 2],
    pub output_dims: usize,
    /// The text model's width.
    pub text_width: usize,
    pub seed: u64,
}

impl AudioSynth {
    /// Gemma 4 E2B's audio tower (E4B's with `text_width` 2560).
    pub fn gemma4_e2b() -> Self {
        Self {
            n_layer: 12,
            hidden: 1024,
            ff: 4096,
            n_head: 8,
            sscp_channels: [128, 32],
            output_dims: 1536,
            text_width: 1536,
            seed: 1,
        }
    }

    /// A preset by name: `e2b-audio-mmproj`, `e4b-audio-mmproj`.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "e2b-audio-mmproj" => Some(Self::gemma4_e2b()),
            "e4b-audio-mmproj" => Some(Self {
                text_width: 2560,
                ..Self::gemma4_e2b()
            }),
            _ => None,
        }
    }
}

/// Adds a clamped linear `[inputs, outputs]` (ggml dims) with ranges around ±12.
fn linear(r: &mut RandomTensors, name: &str, inputs: u64, outputs: u64) {
    let scale = fan_in_scale(inputs);
    r.add(
        format!("{name}.weight"),
        &[inputs, outputs],
        GgmlType::F16,
        scale,
        0.0,
    );
    for (end, sign) in [
        ("input_min", -1.0),
        ("input_max", 1.0),
        ("output_min", -1.0),
        ("output_max", 1.0),
    ] {
        r.add(
            format!("{name}.{end}"),
            &[1],
            GgmlType::F32,
            2.0,
            sign * 12.0,
        );
    }
}

/// The tower's GGUF bytes.
pub fn mmproj_bytes(s: &AudioSynth) -> Result<Vec<u8>, WriteError> {
    let mut r = RandomTensors::new(s.seed);
    let (d, ff, dh) = (s.hidden as u64, s.ff as u64, (s.hidden / s.n_head) as u64);
    let [c0, c1] = s.sscp_channels.map(|c| c as u64);
    let f32t = GgmlType::F32;
    let freq = subsampled(subsampled(N_MELS)) as u64;
    r.add(
        "a.conv1d.0.weight".into(),
        &[3, 3, 1, c0],
        f32t,
        fan_in_scale(9),
        0.0,
    );
    r.add("a.conv1d.0.norm.weight".into(), &[c0], f32t, 0.2, 1.0);
    r.add(
        "a.conv1d.1.weight".into(),
        &[3, 3, c0, c1],
        f32t,
        fan_in_scale(9 * c0),
        0.0,
    );
    r.add("a.conv1d.1.norm.weight".into(), &[c1], f32t, 0.2, 1.0);
    let projection = fan_in_scale(freq * c1);
    r.add(
        "a.input_projection.weight".into(),
        &[freq * c1, d],
        GgmlType::F16,
        projection,
        0.0,
    );
    for il in 0..s.n_layer {
        let p = format!("a.blk.{il}.");
        for suffix in ["", "_1"] {
            for n in ["ffn_norm", "ffn_post_norm"] {
                r.add(format!("{p}{n}{suffix}.weight"), &[d], f32t, 0.2, 1.0);
            }
            linear(&mut r, &format!("{p}ffn_up{suffix}"), d, ff);
            linear(&mut r, &format!("{p}ffn_down{suffix}"), ff, d);
        }
        for n in [
            "attn_pre_norm",
            "attn_post_norm",
            "conv_norm",
            "norm_conv",
            "ln2",
        ] {
            r.add(format!("{p}{n}.weight"), &[d], f32t, 0.2, 1.0);
        }
        for n in ["attn_q", "attn_k", "attn_v", "attn_out", "conv_pw2"] {
            linear(&mut r, &format!("{p}{n}"), d, d);
        }
        linear(&mut r, &format!("{p}conv_pw1"), d, 2 * d);
        r.add(
            format!("{p}attn_k_rel.weight"),
            &[d, d],
            GgmlType::F16,
            fan_in_scale(d),
            0.0,
        );
        r.add(format!("{p}per_dim_scale.weight"), &[dh], f32t, 0.2, 0.7);
        r.add(
            format!("{p}conv_dw.weight"),
            &[5, d],
            f32t,
            fan_in_scale(5),
            0.0,
        );
    }
    let out = s.output_dims as u64;
    r.add(
        "a.pre_encode.out.weight".into(),
        &[d, out],
        GgmlType::F16,
        fan_in_scale(d),
        0.0,
    );
    r.add("a.pre_encode.out.bias".into(), &[out], f32t, 0.1, 0.0);
    let width = s.text_width as u64;
    let embed = fan_in_scale(out);
    r.add(
        "mm.a.input_projection.weight".into(),
        &[out, width],
        GgmlType::F16,
        embed,
        0.0,
    );
    let u32v = |v: usize| Value::U32(v as u32);
    let meta: Vec<(String, Value)> = [
        ("general.architecture", Value::String("clip".into())),
        ("general.type", Value::String("mmproj".into())),
        (
            "general.name",
            Value::String("synthetic Gemma 4 audio tower".into()),
        ),
        ("clip.has_vision_encoder", Value::Bool(false)),
        ("clip.has_audio_encoder", Value::Bool(true)),
        ("clip.audio.projector_type", Value::String("gemma4a".into())),
        ("clip.audio.num_mel_bins", u32v(N_MELS)),
        ("clip.audio.embedding_length", u32v(s.hidden)),
        ("clip.audio.feed_forward_length", u32v(s.ff)),
        ("clip.audio.block_count", u32v(s.n_layer)),
        ("clip.audio.attention.head_count", u32v(s.n_head)),
        ("clip.audio.attention.layer_norm_epsilon", Value::F32(1e-6)),
        ("clip.audio.projection_dim", u32v(s.text_width)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    write_gguf(&meta, &r.tensors, 32)
}
