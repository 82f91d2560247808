//! DiffusionGemma's denoising steps on the GPU (the prompt in the KV cache, each step over the
//! canvas only) against the CPU reference's unified pass and transformers, on the tiny random
//! model of `tests/logits.rs`.

use std::sync::Arc;

use wgemma_diffusion::{
    CpuDiffusion, DiffusionConfig, DiffusionSession, GpuDiffusion, SelfConditioning,
};
use wgemma_gguf::{BytesSource, Gguf};
use wgemma_text::LoadOptions;

mod common;

use common::{GGUF, GOLDEN, golden_f32, ids, max_abs_diff};

fn models() -> Option<(CpuDiffusion, Arc<GpuDiffusion>)> {
    let ctx = wgemma_test_support::gpu()?.clone();
    let g = Gguf::parse(GGUF).unwrap();
    let cfg = DiffusionConfig::from_gguf(&g).unwrap();
    let src = Arc::new(BytesSource::new(GGUF.to_vec()));
    let cpu = CpuDiffusion::load(&g, &cfg, src.clone()).unwrap();
    let load = GpuDiffusion::load(ctx, &g, &cfg, &*src, LoadOptions::default(), |_| {});
    Some((cpu, Arc::new(pollster::block_on(load).unwrap())))
}

/// A step's name, its self-conditioning (on the GPU and for the CPU reference), and
/// transformers' logits.
type Step<'a> = (
    &'static str,
    SelfConditioning<'a>,
    Option<&'a [f32]>,
    Vec<f32>,
);

/// Each case's prompt read once; then steps without and with self-conditioning (and the first
/// again: the canvas's keys from the step before are written over, never read) give the
/// unified pass's logits and transformers'.
#[test]
fn cached_steps_match_the_unified_pass_and_transformers() {
    let Some((cpu, gpu)) = models() else { return };
    let g: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
    for c in g["cases"].as_array().unwrap() {
        let (name, prompt, canvas) = (
            c["name"].as_str().unwrap(),
            ids(&c["prompt"]),
            ids(&c["canvas"]),
        );
        let file = |k: &str| golden_f32(c["files"][k].as_str().unwrap());
        let mut s = DiffusionSession::new(gpu.clone(), 64).unwrap();
        pollster::block_on(s.encode(&prompt)).unwrap();
        let sc_in = file("sc_in");
        let steps: [Step<'_>; 3] = [
            ("first step", SelfConditioning::None, None, file("logits")),
            (
                "self-conditioned",
                SelfConditioning::Given(&sc_in),
                Some(&sc_in),
                file("logits_sc"),
            ),
            (
                "first step again",
                SelfConditioning::None,
                None,
                file("logits"),
            ),
        ];
        for (what, sc, sc_cpu, hf) in steps {
            pollster::block_on(s.denoise(&canvas, sc)).unwrap();
            let got = pollster::block_on(s.logits()).unwrap();
            let unified = cpu.canvas_logits(&prompt, &canvas, sc_cpu).unwrap();
            let (d_cpu, d_hf) = (max_abs_diff(&got, &unified), max_abs_diff(&got, &hf));
            eprintln!(
                "{name} {what}: max |diff| {d_cpu} to the unified pass, {d_hf} to transformers"
            );
            assert!(d_cpu < 1e-3, "{name} {what}: {d_cpu} from the unified pass");
            assert!(d_hf < 2e-3, "{name} {what}: {d_hf} from transformers");
            assert_eq!(
                s.position(),
                prompt.len(),
                "a step leaves the cache's position"
            );
        }
    }
}

/// The step after one whose logits were over a temperature: `Previous` feeds them (over that
/// temperature) as transformers' sampler does.
#[test]
fn the_previous_steps_logits_condition_the_next() {
    let Some((cpu, gpu)) = models() else { return };
    let g: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
    let c = &g["cases"][1];
    let (prompt, canvas) = (ids(&c["prompt"]), ids(&c["canvas"]));
    let mut s = DiffusionSession::new(gpu, 64).unwrap();
    pollster::block_on(s.encode(&prompt)).unwrap();
    pollster::block_on(s.denoise(&canvas, SelfConditioning::None)).unwrap();
    let first = pollster::block_on(s.logits()).unwrap();
    let t = 0.7;
    let mut next = canvas.clone();
    next.rotate_left(3);
    pollster::block_on(s.denoise(&next, SelfConditioning::Previous { temperature: t })).unwrap();
    let got = pollster::block_on(s.logits()).unwrap();
    let z: Vec<f32> = first.iter().map(|v| v / t).collect();
    let want = cpu.canvas_logits(&prompt, &next, Some(&z)).unwrap();
    let d = max_abs_diff(&got, &want);
    assert!(d < 1e-3, "max |diff| {d}");
}

#[test]
fn bad_steps_are_errors_and_the_session_goes_on() {
    let Some((_, gpu)) = models() else { return };
    let mut s = DiffusionSession::new(gpu, 64).unwrap();
    pollster::block_on(s.encode(&[2, 40, 41])).unwrap();
    let canvas = vec![7u32; 16];
    for bad in [
        pollster::block_on(s.denoise(&canvas[..5], SelfConditioning::None)),
        pollster::block_on(s.denoise(&[600; 16], SelfConditioning::None)),
        pollster::block_on(s.denoise(&canvas, SelfConditioning::Given(&[0.0; 3]))),
        pollster::block_on(s.denoise(&canvas, SelfConditioning::Previous { temperature: 0.0 })),
    ] {
        assert!(bad.is_err());
    }
    pollster::block_on(s.denoise(&canvas, SelfConditioning::None)).unwrap();
    // A context without room for the canvas after the prompt.
    let mut small = DiffusionSession::new(s.model().clone(), 20).unwrap();
    pollster::block_on(small.encode(&[2; 10])).unwrap();
    assert!(pollster::block_on(small.denoise(&canvas, SelfConditioning::None)).is_err());
}

/// A synthetic DiffusionGemma with quantized weights (Q8_0, and a neighbour mix where each
/// projection has another dtype) and a quantized embedding table (whose transposed copy is
/// f16): the GPU's steps against the CPU reference of the dequantized weights, with the tiled
/// products' inputs f32 (8-bit ones move this model's routing: the CPU reference alone with
/// its experts' inputs so rounded is 0.18 off at the largest logit).
#[test]
fn quantized_synthetic_models_match_the_cpu_reference() {
    use wgemma_gguf::GgmlType;
    use wgemma_text::synth::{DtypeMix, SynthSpec, synthetic_bytes};
    let Some(ctx) = wgemma_test_support::gpu_f32_tiles() else {
        return;
    };
    for mix in [DtypeMix::Uniform(GgmlType::Q8_0), DtypeMix::Varied] {
        let spec = SynthSpec {
            mix,
            ..SynthSpec::tiny_diffusion_gemma(GgmlType::F32)
        };
        let bytes = synthetic_bytes(&spec).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        let cfg = DiffusionConfig::from_gguf(&g).unwrap();
        let src = Arc::new(BytesSource::new(bytes.clone()));
        let cpu = CpuDiffusion::load(&g, &cfg, src.clone()).unwrap();
        let load = GpuDiffusion::load(ctx.clone(), &g, &cfg, &*src, LoadOptions::default(), |_| {});
        let gpu = Arc::new(pollster::block_on(load).unwrap());
        let prompt: Vec<u32> = (0..9).map(|i| 2 + i * 37 % 500).collect();
        let canvas: Vec<u32> = (0..16).map(|i| (i * 91 + 7) % 512).collect();
        let mut s = DiffusionSession::new(gpu, 64).unwrap();
        pollster::block_on(s.encode(&prompt)).unwrap();
        pollster::block_on(s.denoise(&canvas, SelfConditioning::None)).unwrap();
        let first = pollster::block_on(s.logits()).unwrap();
        let want = cpu.canvas_logits(&prompt, &canvas, None).unwrap();
        let err = wgemma_test_support::rel_err_max(&first, &want);
        assert!(err < 2e-2, "{mix:?}: first step, relative error {err}");
        pollster::block_on(s.denoise(&canvas, SelfConditioning::Previous { temperature: 0.8 }))
            .unwrap();
        let got = pollster::block_on(s.logits()).unwrap();
        let z: Vec<f32> = first.iter().map(|v| v / 0.8).collect();
        let want = cpu.canvas_logits(&prompt, &canvas, Some(&z)).unwrap();
        let err = wgemma_test_support::rel_err_max(&got, &want);
        assert!(
            err < 2e-2,
            "{mix:?}: self-conditioned step, relative error {err}"
        );
    }
}
