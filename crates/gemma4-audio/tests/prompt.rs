//! The audio's soft tokens in a prompt, all on the CPU references: the tower's soft tokens for
//! `a16k.wav` take the place of the 33 `<|audio|>` placeholders of the golden prompt in the
//! tiny model's f32 text reference (causal, per-layer embeddings of the padding token there),
//! and the teacher-forced predictions and logits agree with transformers'
//! (`xtask/scripts/gemma4_audio_golden.py`).

mod common;

use std::sync::Arc;

use wgemma_audio::reference::{AudioConfig, AudioWeights};
use wgemma_gguf::{Gguf, MmapSource, TensorSource};
use wgemma_text::{CpuModel, Input, TextConfig};

fn parse(path: &std::path::Path) -> (Gguf, Arc<MmapSource>) {
    let src = Arc::new(MmapSource::open(path).unwrap());
    let g = Gguf::parse(src.bytes(0, TensorSource::len(&*src)).unwrap()).unwrap();
    (g, src)
}

fn numbers(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn audio_soft_tokens_in_a_prompt_predict_what_transformers_predicts() {
    let golden: serde_json::Value =
        serde_json::from_slice(&common::fixture("../golden/audio_e2b.json")).unwrap();
    let (g, src) = parse(&common::fixture_path("gemma4_tiny_audio_mmproj.gguf"));
    let cfg = AudioConfig::from_gguf(&g).unwrap().unwrap();
    let tower = AudioWeights::load(&g, &cfg, &*src).unwrap();
    let chunk = &wgemma_audio::mel_chunks_from_bytes(&common::fixture("a16k.wav")).unwrap()[0];
    let soft = tower
        .forward(&cfg, &chunk.features, &chunk.mask)
        .soft_tokens;

    let (g, src) = parse(&common::fixture_path("gemma4_tiny_audio.gguf"));
    let text_cfg = TextConfig::from_gguf(&g).unwrap();
    let model = CpuModel::load(&g, &text_cfg, src).unwrap();
    let prompt: Vec<u32> = numbers(&golden["prompt"])
        .iter()
        .map(|&t| t as u32)
        .collect();
    let span = numbers(&golden["audio_positions"]);
    let (start, end) = (span[0] as usize, span[1] as usize);
    let d = cfg.text_width;
    assert_eq!(
        (end - start) * d,
        soft.len(),
        "one soft token per placeholder"
    );
    let inputs: Vec<Input<'_>> = prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| match i {
            i if (start..end).contains(&i) => Input::Embedding(&soft[(i - start) * d..][..d]),
            _ => Input::Token(t),
        })
        .collect();
    let logits = model
        .forward_inputs(&mut model.new_state(), &inputs)
        .unwrap();

    let tf = &golden["teacher_forced"];
    let (want, margin) = (numbers(&tf["argmax"]), numbers(&tf["margin"]));
    let mut checked = 0;
    for (i, row) in logits.iter().enumerate() {
        let top = row
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (j, &v)| if v > b.1 { (j, v) } else { b });
        if margin[i] >= 0.05 {
            checked += 1;
            assert_eq!(top.0 as f64, want[i], "position {i} (margin {})", margin[i]);
        }
    }
    assert!(checked > 70, "{checked} confident positions");
    for (at, row) in tf["rows"].as_object().unwrap() {
        let want: Vec<f32> = numbers(row).iter().map(|&v| v as f32).collect();
        let got = &logits[at.parse::<usize>().unwrap()];
        let err = common::max_abs_diff(got, &want);
        eprintln!("logits at {at}: max difference {err:.2e}");
        assert!(err < 1e-3, "logits at {at}: {err}");
    }
}
