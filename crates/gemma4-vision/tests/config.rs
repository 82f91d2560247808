//! The vision tower's shape from both files that hold it, written here with the GGUF writer in
//! each layout's names and keys; and what is refused.

use wgemma_gguf::{GgmlType, Gguf, TensorSpec, Value, write_gguf};
use wgemma_vision::config::LAYER_LINEARS;
use wgemma_vision::{ClampStore, VisionConfig, VisionConfigError, VisionLayout};

const D: u64 = 32;
const LAYERS: usize = 2;

/// Tensor specs of a 2-layer tower of width 32 (F32, zeros: only the shapes are read).
fn tower(clamps: ClampStore, extra: &[&str]) -> Vec<TensorSpec> {
    let f32 = |name: &str, dims: &[u64]| TensorSpec::new(name, GgmlType::F32, dims);
    let mut t = vec![
        f32("v.patch_embd.weight", &[16, 16, 3, D]),
        f32("v.position_embd.weight", &[D, 40, 2]),
        f32("mm.input_projection.weight", &[D, 48]),
    ];
    for il in 0..LAYERS {
        for n in ["ln1", "ln2", "attn_post_norm", "ffn_post_norm"] {
            t.push(f32(&format!("v.blk.{il}.{n}.weight"), &[D]));
        }
        for n in ["attn_q_norm", "attn_k_norm"] {
            t.push(f32(&format!("v.blk.{il}.{n}.weight"), &[16]));
        }
        for n in LAYER_LINEARS {
            t.push(f32(&format!("v.blk.{il}.{n}.weight"), &[D, D]));
            if clamps == ClampStore::Scalars {
                for c in ["input_min", "input_max", "output_min", "output_max"] {
                    t.push(f32(&format!("v.blk.{il}.{n}.{c}"), &[1]));
                }
            }
        }
    }
    if clamps == ClampStore::Packed {
        t.push(f32("v.clamp_data", &[(LAYERS as u64 * 7 + 1) * 4]));
    }
    t.extend(extra.iter().map(|n| f32(n, &[D])));
    t
}

fn file(metadata: Vec<(&str, Value)>, tensors: Vec<TensorSpec>) -> Gguf {
    let meta: Vec<(String, Value)> = metadata.into_iter().map(|(k, v)| (k.into(), v)).collect();
    let data: Vec<(TensorSpec, Vec<u8>)> = tensors
        .into_iter()
        .map(|s| {
            let n = s.n_bytes().unwrap() as usize;
            (s, vec![0u8; n])
        })
        .collect();
    Gguf::parse(&write_gguf(&meta, &data, 32).unwrap()).unwrap()
}

fn mmproj_keys(projector: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("clip".into())),
        ("clip.has_vision_encoder", Value::Bool(true)),
        (
            "clip.vision.projector_type",
            Value::String(projector.into()),
        ),
        ("clip.vision.patch_size", Value::U32(16)),
        ("clip.vision.embedding_length", Value::U32(D as u32)),
        ("clip.vision.feed_forward_length", Value::U32(64)),
        ("clip.vision.block_count", Value::U32(LAYERS as u32)),
        ("clip.vision.attention.head_count", Value::U32(2)),
        ("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-5)),
        ("clip.vision.projection_dim", Value::U32(48)),
    ]
}

fn ollama_keys() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("gemma4".into())),
        ("gemma4.embedding_length", Value::U32(48)),
        ("gemma4.vision.block_count", Value::U32(LAYERS as u32)),
        ("gemma4.vision.embedding_length", Value::U32(D as u32)),
        ("gemma4.vision.feed_forward_length", Value::U32(64)),
        ("gemma4.vision.attention.head_count", Value::U32(2)),
        ("gemma4.vision.patch_size", Value::U32(16)),
        ("gemma4.vision.num_channels", Value::U32(3)),
        ("gemma4.vision.projector.scale_factor", Value::U32(3)),
    ]
}

#[test]
fn both_layouts_give_the_same_tower() {
    let mmproj = file(mmproj_keys("gemma4v"), tower(ClampStore::Scalars, &[]));
    let c = VisionConfig::from_gguf(&mmproj).unwrap().unwrap();
    assert_eq!(c.layout, VisionLayout::Mmproj);
    assert_eq!(
        (c.n_layer, c.n_embd, c.n_ff, c.n_head, c.head_dim),
        (2, 32, 64, 2, 16)
    );
    assert_eq!((c.n_positions, c.projection_dim, c.pool), (40, 48, 3));
    assert_eq!((c.clamps, c.eps), (ClampStore::Scalars, 1e-5));
    assert!(!c.standardize && !c.out_scale);

    let extra = ["v.std_bias", "v.std_scale", "v.blk.0.out_scale.weight"];
    let blob = file(ollama_keys(), tower(ClampStore::Packed, &extra));
    let o = VisionConfig::from_gguf(&blob).unwrap().unwrap();
    assert_eq!(o.layout, VisionLayout::OllamaBlob);
    assert_eq!((o.clamps, o.eps), (ClampStore::Packed, 1e-6));
    assert!(o.standardize && o.out_scale);
    let same = VisionConfig {
        layout: c.layout,
        clamps: c.clamps,
        eps: c.eps,
        standardize: false,
        out_scale: false,
        ..o
    };
    assert_eq!(same, c);

    let plain = file(mmproj_keys("gemma4v"), tower(ClampStore::None, &[]));
    let p = VisionConfig::from_gguf(&plain).unwrap().unwrap();
    assert_eq!(p.clamps, ClampStore::None);
}

#[test]
fn files_without_a_tower_and_broken_towers() {
    // A text-only blob and an audio-only projector hold no tower.
    let text = file(
        vec![("general.architecture", Value::String("gemma4".into()))],
        vec![],
    );
    assert!(VisionConfig::from_gguf(&text).unwrap().is_none());
    let mut audio = mmproj_keys("gemma4v");
    audio[1].1 = Value::Bool(false);
    assert!(
        VisionConfig::from_gguf(&file(audio, vec![]))
            .unwrap()
            .is_none()
    );

    let err = |keys: Vec<(&'static str, Value)>, tensors: Vec<TensorSpec>| {
        VisionConfig::from_gguf(&file(keys, tensors)).unwrap_err()
    };
    let e = err(mmproj_keys("gemma3"), tower(ClampStore::None, &[]));
    assert!(matches!(e, VisionConfigError::Projector(_)), "{e}");
    let mut heads = mmproj_keys("gemma4v");
    heads[7].1 = Value::U32(3);
    let e = err(heads, tower(ClampStore::None, &[]));
    assert!(matches!(e, VisionConfigError::Shape(_)), "{e}");
    let mut patch = mmproj_keys("gemma4v");
    patch[3].1 = Value::U32(14);
    let e = err(patch, tower(ClampStore::None, &[]));
    assert!(matches!(e, VisionConfigError::Unsupported { .. }), "{e}");
    let mut missing = tower(ClampStore::None, &[]);
    missing.retain(|t| t.name != "v.blk.1.ffn_down.weight");
    let e = err(mmproj_keys("gemma4v"), missing);
    assert!(e.to_string().contains("v.blk.1.ffn_down.weight"), "{e}");
    let mut short = tower(ClampStore::Packed, &[]);
    short.last_mut().unwrap().dims = vec![7];
    let e = err(ollama_keys(), short);
    assert!(e.to_string().contains("v.clamp_data"), "{e}");
    let mut no_key = mmproj_keys("gemma4v");
    no_key.retain(|(k, _)| *k != "clip.vision.block_count");
    let e = err(no_key, tower(ClampStore::None, &[]));
    assert!(e.to_string().contains("clip.vision.block_count"), "{e}");
}
