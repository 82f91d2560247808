//! The tower against transformers on tiny random Gemma 4 models
//! (`xtask/scripts/gemma4_vision_golden.py`, the command in each golden): the CPU reference
//! and the GPU tower, every recorded stage (patch embedding, layer 0, encoder output, pooled,
//! soft tokens), for an image that needs no resize and for one transformers scaled up (its
//! resized pixels from the preprocessing golden, so the tower alone is compared), on both
//! variants: clamped linears (E2B-like) and standardisation (26B-like).

use std::path::{Path, PathBuf};

use wgemma_gguf::{BytesSource, Gguf};
use wgemma_vision::{CpuTower, Patches, Trace, VisionConfig, VisionTower, decode, patches};

const VARIANTS: [&str; 2] = ["e2b", "moe"];
/// transformers computes in f32 with other summation orders.
const TOLERANCE: f32 = 2e-3;

fn dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests")).to_path_buf()
}

fn npy(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir().join("golden").join(name)).unwrap();
    npyz::NpyFile::new(&bytes[..])
        .unwrap()
        .into_vec::<f32>()
        .unwrap()
}

struct Fixture {
    g: Gguf,
    bytes: Vec<u8>,
    cfg: VisionConfig,
}

fn mmproj(variant: &str) -> Fixture {
    let path = dir().join(format!("fixtures/gemma4_tiny_vision_{variant}_mmproj.gguf"));
    let bytes = std::fs::read(path).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = VisionConfig::from_gguf(&g).unwrap().unwrap();
    Fixture { g, bytes, cfg }
}

/// The images of the goldens as the tower takes them: (golden name, patches).
fn images() -> Vec<(&'static str, Patches)> {
    let read = |path: PathBuf| decode(&std::fs::read(path).unwrap()).unwrap();
    vec![
        (
            "exact_480x336",
            patches(&read(dir().join("fixtures/exact_480x336.png")), 70).unwrap(),
        ),
        (
            "up_97x61",
            patches(&read(dir().join("golden/up_97x61_70.png")), 70).unwrap(),
        ),
    ]
}

fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn check_trace(what: &str, variant: &str, image: &str, t: &Trace) {
    let stages = [
        ("patch_embed", &t.patch_embed),
        ("layer0", &t.layers[0]),
        ("encoder", t.layers.last().unwrap()),
        ("pooled", &t.pooled),
        ("soft_tokens", &t.soft_tokens),
    ];
    for (stage, got) in stages {
        let want = npy(&format!("vision_{variant}_{image}_{stage}.npy"));
        let diff = max_abs_diff(got, &want);
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        eprintln!(
            "{what} {variant} {image} {stage}: max |diff| {diff:.2e} (values up to {scale:.2})"
        );
        assert!(
            diff <= TOLERANCE * scale.max(1.0),
            "{what} {variant} {image} {stage}: max |diff| {diff} over {TOLERANCE} x {scale}"
        );
    }
}

#[test]
fn cpu_reference_matches_transformers() {
    for variant in VARIANTS {
        let f = mmproj(variant);
        let tower = CpuTower::load(&f.g, &f.cfg, &BytesSource::new(f.bytes.clone())).unwrap();
        for (image, p) in images() {
            check_trace("cpu", variant, image, &tower.trace(&p).unwrap());
        }
    }
}

#[test]
fn gpu_tower_matches_transformers() {
    let Some(ctx) = wgemma_test_support::gpu() else {
        return;
    };
    for variant in VARIANTS {
        let f = mmproj(variant);
        let src = BytesSource::new(f.bytes.clone());
        let tower = pollster::block_on(VisionTower::load(
            ctx.clone(),
            &f.g,
            &f.cfg,
            &src,
            |_, _| {},
        ))
        .unwrap();
        for (image, p) in images() {
            let trace = pollster::block_on(tower.trace(&p)).unwrap();
            check_trace("gpu", variant, image, &trace);
            let soft = pollster::block_on(tower.encode_to_vec(&p)).unwrap();
            assert_eq!(soft, trace.soft_tokens, "encode and trace agree");
        }
    }
}

/// The same tower inside an Ollama-style blob (keys under `gemma4.vision.*`, clamps packed in
/// `v.clamp_data`) gives the same soft tokens as from the mmproj file, on the CPU and the GPU.
#[test]
fn both_layouts_give_the_same_soft_tokens() {
    for variant in VARIANTS {
        let f = mmproj(variant);
        let text = std::fs::read(dir().join(format!("fixtures/gemma4_tiny_vision_{variant}.gguf")));
        let blob = wgemma_test_support::ollama_vision_blob(&text.unwrap(), &f.bytes);
        let g = Gguf::parse(&blob).unwrap();
        let cfg = VisionConfig::from_gguf(&g).unwrap().unwrap();
        assert_eq!(cfg.layout, wgemma_vision::VisionLayout::OllamaBlob);
        assert_eq!(cfg.clamps, wgemma_vision::ClampStore::Packed);
        let (_, p) = images().remove(0);
        let cpu = |g: &Gguf, cfg: &VisionConfig, bytes: &[u8]| {
            let tower = CpuTower::load(g, cfg, &BytesSource::new(bytes.to_vec())).unwrap();
            tower.encode(&p).unwrap()
        };
        let want = cpu(&f.g, &f.cfg, &f.bytes);
        assert_eq!(cpu(&g, &cfg, &blob), want, "{variant}: CPU, blob vs mmproj");
        let Some(ctx) = wgemma_test_support::gpu() else {
            continue;
        };
        let src = BytesSource::new(blob.clone());
        let tower =
            pollster::block_on(VisionTower::load(ctx.clone(), &g, &cfg, &src, |_, _| {})).unwrap();
        let got = pollster::block_on(tower.encode_to_vec(&p)).unwrap();
        // Products and attention on tensor cores take f16 operands: held to the goldens'
        // tolerance there, to f32 round-off elsewhere.
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let tol = if ctx.features.coop_matmul {
            TOLERANCE * scale
        } else {
            1e-4
        };
        let diff = max_abs_diff(&got, &want);
        assert!(diff < tol, "{variant}: GPU from the blob: {diff} >= {tol}");
    }
}
