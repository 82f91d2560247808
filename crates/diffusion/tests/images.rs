//! Images in a DiffusionGemma prompt against transformers, on a tiny random model with a vision
//! tower (`xtask/scripts/diffusion_gemma_vision_fixtures.py`): the vision fixtures' projector
//! gives the soft tokens of two images (one as it is, one as transformers scaled it up), the
//! prompt reads them in place of their placeholders (each image's tokens seeing the whole image
//! on every layer, as transformers masks DiffusionGemma's encoder), and the canvas logits
//! match transformers' with and without self-conditioning. The same prompt with the images'
//! tokens causal does not: the test sees the mask.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wgemma_diffusion::{
    CpuDiffusion, DiffusionConfig, DiffusionSession, GpuDiffusion, SelfConditioning,
};
use wgemma_gguf::{BytesSource, Gguf};
use wgemma_text::{Input, LoadOptions, SoftTokens};
use wgemma_vision::{CpuTower, Patches, VisionConfig, VisionTower, decode, patches};

mod common;

use common::{golden_f32, ids, max_abs_diff};

const GGUF: &[u8] = include_bytes!("fixtures/dg_tiny_vision.gguf");
const GOLDEN: &str = include_str!("golden/dg_tiny_vision.json");
/// transformers computes in f32 with other summation orders (the text-only cases: 3e-5).
const TOLERANCE: f32 = 2e-3;

fn vision_dir() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gemma4-vision/tests"
    ))
    .to_path_buf()
}

fn models() -> Option<(Arc<GpuDiffusion>, VisionTower)> {
    let ctx = wgemma_test_support::gpu()?.clone();
    let g = Gguf::parse(GGUF).unwrap();
    let cfg = DiffusionConfig::from_gguf(&g).unwrap();
    let src = BytesSource::new(GGUF.to_vec());
    let load = GpuDiffusion::load(ctx.clone(), &g, &cfg, &src, LoadOptions::default(), |_| {});
    let dg = pollster::block_on(load).unwrap();
    let bytes =
        std::fs::read(vision_dir().join("fixtures/gemma4_tiny_vision_moe_mmproj.gguf")).unwrap();
    let pg = Gguf::parse(&bytes).unwrap();
    let vcfg = VisionConfig::from_gguf(&pg).unwrap().unwrap();
    let src = BytesSource::new(bytes.clone());
    let tower = pollster::block_on(VisionTower::load(ctx, &pg, &vcfg, &src, |_, _| {})).unwrap();
    Some((Arc::new(dg), tower))
}

/// The golden's images as the tower takes them, each with where its placeholders start in
/// `prompt`: the first as it is, the second as transformers resized it (the vision tests'
/// golden pixels), so that the tower's input is transformers'.
fn images(g: &serde_json::Value, prompt: &[u32]) -> Vec<(usize, Patches)> {
    let image = g["tokens"]["image"].as_u64().unwrap() as u32;
    let files = ["fixtures/exact_480x336.png", "golden/up_97x61_70.png"];
    let starts: Vec<usize> = (0..prompt.len())
        .filter(|&i| prompt[i] == image && (i == 0 || prompt[i - 1] != image))
        .collect();
    assert_eq!(starts.len(), files.len(), "one placeholder run an image");
    files
        .iter()
        .zip(starts)
        .zip(g["images"].as_array().unwrap())
        .map(|((file, at), im)| {
            let rgb = decode(&std::fs::read(vision_dir().join(file)).unwrap()).unwrap();
            let p = patches(&rgb, im["budget"].as_u64().unwrap() as u32).unwrap();
            assert_eq!(
                u64::from(p.soft_tokens()),
                im["tokens"].as_u64().unwrap(),
                "{file}"
            );
            (at, p)
        })
        .collect()
}

/// The golden's images as soft tokens from `tower` over their placeholders.
fn soft_tokens(
    tower: &VisionTower,
    g: &serde_json::Value,
    prompt: &[u32],
    bidirectional: bool,
) -> Vec<SoftTokens> {
    images(g, prompt)
        .into_iter()
        .map(|(at, p)| SoftTokens {
            at,
            rows: pollster::block_on(tower.encode(&p)).unwrap().rows,
            bidirectional,
        })
        .collect()
}

#[test]
fn image_prompts_match_transformers() {
    let Some((gpu, tower)) = models() else { return };
    let g: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
    let (prompt, canvas) = (ids(&g["prompt"]), ids(&g["canvas"]));
    let file = |k: &str| golden_f32(g["files"][k].as_str().unwrap());
    let (logits, sc_in, logits_sc) = (file("logits"), file("sc_in"), file("logits_sc"));
    let window = gpu.cfg.text.sliding_window;
    assert!(
        g["images"]
            .as_array()
            .unwrap()
            .iter()
            .all(|im| im["tokens"].as_u64().unwrap() as usize > window),
        "images longer than the window: their rows see past it"
    );
    let soft = soft_tokens(&tower, &g, &prompt, true);
    let mut s = DiffusionSession::with_chunk(gpu.clone(), 256, 16, 256).unwrap();
    pollster::block_on(s.encode_with(&prompt, &soft)).unwrap();
    for (what, sc, want) in [
        ("first step", SelfConditioning::None, &logits),
        (
            "self-conditioned",
            SelfConditioning::Given(&sc_in),
            &logits_sc,
        ),
    ] {
        pollster::block_on(s.denoise(&canvas, sc)).unwrap();
        let got = pollster::block_on(s.logits()).unwrap();
        let d = max_abs_diff(&got, want);
        eprintln!("{what}: max |diff| {d} to transformers");
        assert!(d < TOLERANCE, "{what}: max |diff| {d} to transformers");
    }
    // The images' tokens read causally give other logits.
    let causal = soft_tokens(&tower, &g, &prompt, false);
    let mut s = DiffusionSession::with_chunk(gpu, 256, 16, 256).unwrap();
    pollster::block_on(s.encode_with(&prompt, &causal)).unwrap();
    pollster::block_on(s.denoise(&canvas, SelfConditioning::None)).unwrap();
    let got = pollster::block_on(s.logits()).unwrap();
    assert!(
        max_abs_diff(&got, &logits) > 0.1,
        "the images' mask matters"
    );
}

/// The f32 CPU path: the CPU tower's soft tokens and the CPU reference's unified pass with
/// them give transformers' canvas logits too.
#[test]
fn the_cpu_reference_with_images_matches_transformers() {
    let g: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
    let (prompt, canvas) = (ids(&g["prompt"]), ids(&g["canvas"]));
    let dg = Gguf::parse(GGUF).unwrap();
    let cfg = DiffusionConfig::from_gguf(&dg).unwrap();
    let cpu = CpuDiffusion::load(&dg, &cfg, Arc::new(BytesSource::new(GGUF.to_vec()))).unwrap();
    let bytes =
        std::fs::read(vision_dir().join("fixtures/gemma4_tiny_vision_moe_mmproj.gguf")).unwrap();
    let pg = Gguf::parse(&bytes).unwrap();
    let vcfg = VisionConfig::from_gguf(&pg).unwrap().unwrap();
    let tower = CpuTower::load(&pg, &vcfg, &BytesSource::new(bytes.clone())).unwrap();
    let width = cfg.text.n_embd;
    let placed: Vec<(usize, Vec<f32>)> = images(&g, &prompt)
        .into_iter()
        .map(|(at, p)| (at, tower.trace(&p).unwrap().soft_tokens))
        .collect();
    let mut inputs: Vec<Input<'_>> = prompt.iter().map(|&t| Input::Token(t)).collect();
    for (at, rows) in &placed {
        for (i, row) in rows.chunks_exact(width).enumerate() {
            inputs[at + i] = Input::Embedding(row);
        }
    }
    let spans: Vec<(usize, usize)> = placed
        .iter()
        .map(|(at, r)| (*at, r.len() / width))
        .collect();
    let got = cpu
        .canvas_logits_with(&inputs, &spans, &canvas, None)
        .unwrap();
    let d = max_abs_diff(&got, &golden_f32(g["files"]["logits"].as_str().unwrap()));
    eprintln!("CPU reference: max |diff| {d} to transformers");
    assert!(d < TOLERANCE, "max |diff| {d} to transformers");
    assert!(
        cpu.canvas_logits_with(&inputs[..3], &[], &canvas, Some(&[0.0; 3]))
            .is_err(),
        "self-conditioning logits of the wrong length"
    );
}
