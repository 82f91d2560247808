//! DiffusionGemma's canvas logits against transformers on a tiny random model
//! (`xtask/scripts/diffusion_gemma_fixtures.py` wrote the GGUF and the goldens): a prompt
//! shorter than the sliding window and one longer, each without self-conditioning (a block's
//! first step) and with it (a later step).

use std::sync::Arc;

use wgemma_diffusion::{CpuDiffusion, DiffusionConfig, DiffusionConfigError};
use wgemma_gguf::{BytesSource, Gguf, TensorSpec, Value, write_gguf};

mod common;

use common::{GGUF, GOLDEN, golden_f32, ids, max_abs_diff};

/// transformers' own f32 and f64 differ by about 1e-4 on this model; each classic mistake
/// (no `window - 1` clip, swapped layer scales, canvas input not normed, canvas positions from
/// 0, raw logits as self-conditioning) moves logits by far more.
const TOLERANCE: f32 = 2e-3;

struct Case {
    name: String,
    prompt: Vec<u32>,
    canvas: Vec<u32>,
    logits: Vec<f32>,
    sc_in: Vec<f32>,
    logits_sc: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let g: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let file = |k: &str| golden_f32(c["files"][k].as_str().unwrap());
            Case {
                name: c["name"].as_str().unwrap().to_string(),
                prompt: ids(&c["prompt"]),
                canvas: ids(&c["canvas"]),
                logits: file("logits"),
                sc_in: file("sc_in"),
                logits_sc: file("logits_sc"),
            }
        })
        .collect()
}

fn cpu_model() -> CpuDiffusion {
    let g = Gguf::parse(GGUF).unwrap();
    let cfg = DiffusionConfig::from_gguf(&g).unwrap();
    CpuDiffusion::load(&g, &cfg, Arc::new(BytesSource::new(GGUF.to_vec()))).unwrap()
}

#[test]
fn the_config_reads_the_diffusion_keys() {
    let cfg = DiffusionConfig::from_gguf(&Gguf::parse(GGUF).unwrap()).unwrap();
    assert_eq!(cfg.canvas_length, 16);
    assert_eq!(cfg.sampler.max_steps, 12);
    assert_eq!(
        cfg.text.final_softcap,
        Some(30.0),
        "absent from the file: 30"
    );
    assert_eq!(cfg.text.sliding_window, 8);
}

#[test]
fn cpu_canvas_logits_match_transformers() {
    let model = cpu_model();
    let cases = cases();
    assert!(cases.iter().any(|c| c.prompt.len() < 8) && cases.iter().any(|c| c.prompt.len() > 8));
    for c in &cases {
        let got = model.canvas_logits(&c.prompt, &c.canvas, None).unwrap();
        let d = max_abs_diff(&got, &c.logits);
        eprintln!("{}: first step max diff {d}", c.name);
        assert!(d < TOLERANCE, "{}: first step, max |diff| {d}", c.name);
        let got = model
            .canvas_logits(&c.prompt, &c.canvas, Some(&c.sc_in))
            .unwrap();
        let d = max_abs_diff(&got, &c.logits_sc);
        assert!(
            d < TOLERANCE,
            "{}: self-conditioned step, max |diff| {d}",
            c.name
        );
        // Self-conditioning changes the logits, so the test above checks it.
        assert!(max_abs_diff(&c.logits, &c.logits_sc) > 0.1);
    }
}

#[test]
fn bad_inputs_are_errors() {
    let model = cpu_model();
    assert!(model.canvas_logits(&[2, 9999], &[5; 16], None).is_err());
    assert!(model.canvas_logits(&[2], &[], None).is_err());
    assert!(
        model
            .canvas_logits(&[2], &[5; 16], Some(&[0.0; 7]))
            .is_err()
    );
}

/// The fixture rewritten with its metadata changed by `edit` and the tensors `keep` keeps.
fn rewritten_with(
    edit: impl FnOnce(&mut Vec<(String, Value)>),
    keep: impl Fn(&str) -> bool,
) -> Vec<u8> {
    let g = Gguf::parse(GGUF).unwrap();
    let mut meta = g.metadata.entries().to_vec();
    edit(&mut meta);
    let tensors: Vec<(TensorSpec, Vec<u8>)> = g
        .tensors()
        .iter()
        .filter(|t| keep(&t.name))
        .map(|t| {
            let r = g.tensor_range(t);
            let spec = TensorSpec::new(t.name.clone(), t.dtype, &t.dims);
            (spec, GGUF[r.start as usize..r.end as usize].to_vec())
        })
        .collect();
    write_gguf(&meta, &tensors, 32).unwrap()
}

fn rewritten(edit: impl FnOnce(&mut Vec<(String, Value)>)) -> Gguf {
    Gguf::parse(&rewritten_with(edit, |_| true)).unwrap()
}

#[test]
fn bad_diffusion_files_are_typed_errors() {
    let set = |key: &'static str, v: Value| {
        move |m: &mut Vec<(String, Value)>| {
            m.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
        }
    };
    let no_canvas = rewritten(|m| m.retain(|(k, _)| k != "diffusion.canvas_length"));
    let e = DiffusionConfig::from_gguf(&no_canvas).unwrap_err();
    assert!(matches!(e, DiffusionConfigError::Metadata(_)), "{e}");
    assert!(e.to_string().contains("diffusion.canvas_length"), "{e}");
    let zero = rewritten(set("diffusion.canvas_length", Value::U32(0)));
    assert!(matches!(
        DiffusionConfig::from_gguf(&zero),
        Err(DiffusionConfigError::Invalid(_))
    ));
    let steps = rewritten(set("diffusion.eb_max_steps", Value::U32(0)));
    assert!(DiffusionConfig::from_gguf(&steps).is_err());
    // A Gemma 4 text model is not a diffusion model.
    let text_model = include_bytes!("../../gemma4-text/tests/fixtures/gemma4_tiny_moe.gguf");
    let e = DiffusionConfig::from_gguf(&Gguf::parse(text_model).unwrap()).unwrap_err();
    assert!(
        matches!(e, DiffusionConfigError::NotDiffusion("gemma4")),
        "{e}"
    );
    // Without the self-conditioning block the model cannot load.
    let cfg = DiffusionConfig::from_gguf(&Gguf::parse(GGUF).unwrap()).unwrap();
    let bytes = rewritten_with(|_| {}, |name| !name.starts_with("self_cond_gate"));
    let cut = Gguf::parse(&bytes).unwrap();
    assert!(CpuDiffusion::load(&cut, &cfg, Arc::new(BytesSource::new(bytes.clone()))).is_err());
}
