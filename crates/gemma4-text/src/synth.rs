//! Synthetic Gemma models with random weights, written as GGUF: tiny ones for tests, and
//! full-size ones (real shapes, a Q4_K_M-like dtype mix) for benchmarks. llama.cpp loads them
//! too, so they double as parity fixtures.

use std::io::Write;

use wgemma_gguf::{Array, GgmlType, GgufWriter, TensorSpec, Value, WriteError, quantize};

/// The shape and dtypes of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub sliding_window: usize,
    pub context_length: usize,
    /// How the matrices are quantized.
    pub mix: DtypeMix,
    /// Every n-th layer is global (the rest slide).
    pub global_every: usize,
    pub final_softcap: Option<f32>,
    pub seed: u64,
}

/// The dtypes of a synthetic model's matrices (norms are always F32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DtypeMix {
    /// Every matrix in one dtype.
    Uniform(GgmlType),
    /// llama.cpp's Q4_K_M: Q4_K, with Q6_K for the embedding and for V and FFN-down in the
    /// layers llama.cpp gives more bits; rows that are not whole 256-blocks fall back to Q5_0
    /// (for Q4_K) and Q8_0 (for Q6_K), as llama-quantize does.
    Q4KM,
    /// A different dtype for neighbouring projections (Q/K/V, gate/up), so no two of them can
    /// share a weight: exercises the paths real mixes take.
    Varied,
}

impl DtypeMix {
    /// The dtype of matrix `role` (attn_v, ffn_down, token_embd, ...) of layer `il` of
    /// `n_layer`, whose rows hold `cols` values.
    pub fn dtype(self, role: &str, il: usize, n_layer: usize, cols: u64) -> GgmlType {
        match self {
            DtypeMix::Uniform(t) => t,
            DtypeMix::Varied => {
                let want = match role {
                    "attn_q" | "ffn_gate" => GgmlType::Q8_0,
                    "attn_k" | "ffn_up" => GgmlType::Q5_0,
                    "attn_v" => GgmlType::Q4_0,
                    "ffn_down" => GgmlType::Q6K,
                    "attn_output" => GgmlType::Q4K,
                    _ => GgmlType::F16,
                };
                if cols.is_multiple_of(want.block_size() as u64) {
                    want
                } else {
                    GgmlType::Q8_0
                }
            }
            DtypeMix::Q4KM => {
                let eighth = n_layer / 8;
                let more_bits = il < eighth || il >= 7 * n_layer / 8 || (il - eighth) % 3 == 2;
                let want = match role {
                    "token_embd" => GgmlType::Q6K,
                    "attn_v" | "ffn_down" if more_bits => GgmlType::Q6K,
                    _ => GgmlType::Q4K,
                };
                match want {
                    _ if cols.is_multiple_of(256) => want,
                    GgmlType::Q6K => GgmlType::Q8_0,
                    _ => GgmlType::Q5_0,
                }
            }
        }
    }
}

impl SynthSpec {
    /// A Gemma 3 small enough for CPU-reference tests: 4 layers (every 3rd global), 4 heads
    /// over 2 KV heads, vocabulary 512.
    pub fn tiny_gemma3(dtype: GgmlType) -> Self {
        Self {
            arch: "gemma3",
            n_layer: 4,
            n_embd: 256,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 64,
            n_ff: 512,
            n_vocab: 512,
            sliding_window: 6,
            context_length: 256,
            mix: DtypeMix::Uniform(dtype),
            global_every: 3,
            final_softcap: None,
            seed: 1,
        }
    }

    /// Gemma 3 270M's exact shapes and Q4_K_M dtype layout, with random weights: the same
    /// bytes per token and the same kernels as the real file, for benchmarks on machines that
    /// cannot download it.
    pub fn gemma3_270m() -> Self {
        Self {
            arch: "gemma3",
            n_layer: 18,
            n_embd: 640,
            n_head: 4,
            n_kv_head: 1,
            head_dim: 256,
            n_ff: 2048,
            n_vocab: 262_144,
            sliding_window: 512,
            context_length: 32_768,
            mix: DtypeMix::Q4KM,
            global_every: 6,
            final_softcap: None,
            seed: 1,
        }
    }
}

/// A xorshift generator: reproducible across platforms, no dependency.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn fill(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + scale * self.uniform()).collect()
    }
}

/// Vocabulary of a synthetic model: control tokens, Gemma's turn markers, all 256 byte
/// tokens, then pieces of lowercase letters (with and without the word-start mark).
fn vocabulary(n_vocab: usize) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens: Vec<String> = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<start_of_turn>",
        "<end_of_turn>",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut types = vec![3; tokens.len()];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut pieces = vec!["▁".to_string()];
    pieces.extend(('a'..='z').map(String::from));
    for a in 'a'..='z' {
        for b in 'a'..='z' {
            pieces.push(format!("{a}{b}"));
            pieces.push(format!("▁{a}{b}"));
        }
    }
    // Full-size vocabularies run past the letter pieces: fill with distinct placeholders.
    let mut extra = 0usize;
    while tokens.len() < n_vocab {
        let piece = if tokens.len() - 262 < pieces.len() {
            pieces[tokens.len() - 262].clone()
        } else {
            extra += 1;
            format!("<synth{extra}>")
        };
        tokens.push(piece);
        types.push(1);
    }
    tokens.truncate(n_vocab);
    types.truncate(n_vocab);
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    (tokens, scores, types)
}

/// Writes the model as GGUF into `out`, generating each tensor as it is written.
pub fn write_synthetic<W: Write>(spec: &SynthSpec, out: W) -> Result<W, WriteError> {
    let a = spec.arch;
    let k = |s: &str| format!("{a}.{s}");
    let (tokens, scores, types) = vocabulary(spec.n_vocab);
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!("synthetic {a}")),
        ),
        (k("context_length"), Value::U32(spec.context_length as u32)),
        (k("embedding_length"), Value::U32(spec.n_embd as u32)),
        (k("block_count"), Value::U32(spec.n_layer as u32)),
        (k("feed_forward_length"), Value::U32(spec.n_ff as u32)),
        (k("attention.head_count"), Value::U32(spec.n_head as u32)),
        (
            k("attention.head_count_kv"),
            Value::U32(spec.n_kv_head as u32),
        ),
        (k("attention.key_length"), Value::U32(spec.head_dim as u32)),
        (
            k("attention.value_length"),
            Value::U32(spec.head_dim as u32),
        ),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (
            k("attention.sliding_window"),
            Value::U32(spec.sliding_window as u32),
        ),
        (
            k("attention.sliding_window_pattern"),
            Value::U32(spec.global_every as u32),
        ),
        (k("rope.freq_base"), Value::F32(1_000_000.0)),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(scores)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(3)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)),
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)),
    ];
    if let Some(c) = spec.final_softcap {
        meta.push((k("final_logit_softcapping"), Value::F32(c)));
    }
    let (d, hd, ff, v) = (
        spec.n_embd as u64,
        spec.head_dim as u64,
        spec.n_ff as u64,
        spec.n_vocab as u64,
    );
    let (q_rows, kv_rows) = (spec.n_head as u64 * hd, spec.n_kv_head as u64 * hd);
    // (name, dtype, dims, scale, offset): norms sit around their Gemma 3 values (the +1 is
    // folded in), matrices are scaled so activations neither vanish nor explode.
    let nl = spec.n_layer;
    let mut plan: Vec<(String, GgmlType, Vec<u64>, f32, f32)> = vec![
        (
            "token_embd.weight".into(),
            spec.mix.dtype("token_embd", 0, nl, d),
            vec![d, v],
            1.0,
            0.0,
        ),
        (
            "output_norm.weight".into(),
            GgmlType::F32,
            vec![d],
            0.5,
            1.0,
        ),
    ];
    let ms = |cols: u64| 1.5 / (cols as f32).sqrt();
    for il in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let dt = |role: &str, cols: u64| spec.mix.dtype(role, il, nl, cols);
        plan.extend([
            (n("attn_norm"), GgmlType::F32, vec![d], 0.5, 1.0),
            (n("attn_q"), dt("attn_q", d), vec![d, q_rows], ms(d), 0.0),
            (n("attn_k"), dt("attn_k", d), vec![d, kv_rows], ms(d), 0.0),
            (n("attn_v"), dt("attn_v", d), vec![d, kv_rows], ms(d), 0.0),
            (n("attn_q_norm"), GgmlType::F32, vec![hd], 0.5, 1.0),
            (n("attn_k_norm"), GgmlType::F32, vec![hd], 0.5, 1.0),
            (
                n("attn_output"),
                dt("attn_output", q_rows),
                vec![q_rows, d],
                ms(q_rows),
                0.0,
            ),
            (n("post_attention_norm"), GgmlType::F32, vec![d], 0.5, 1.0),
            (n("ffn_norm"), GgmlType::F32, vec![d], 0.5, 1.0),
            (n("ffn_gate"), dt("ffn_gate", d), vec![d, ff], ms(d), 0.0),
            (n("ffn_up"), dt("ffn_up", d), vec![d, ff], ms(d), 0.0),
            (n("ffn_down"), dt("ffn_down", ff), vec![ff, d], ms(ff), 0.0),
            (n("post_ffw_norm"), GgmlType::F32, vec![d], 0.5, 1.0),
        ]);
    }
    let specs = plan
        .iter()
        .map(|(name, dt, dims, _, _)| TensorSpec::new(name, *dt, dims))
        .collect();
    let mut w = GgufWriter::new(out, &meta, specs, 32)?;
    let mut rng = Rng(spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    for (name, dt, dims, scale, offset) in &plan {
        let values = rng.fill(dims.iter().product::<u64>() as usize, *scale, *offset);
        let bytes = quantize(*dt, &values).map_err(|e| WriteError::Tensor {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        w.write_tensor(&bytes)?;
    }
    w.finish()
}

/// The model as GGUF bytes in memory.
pub fn synthetic_bytes(spec: &SynthSpec) -> Result<Vec<u8>, WriteError> {
    write_synthetic(spec, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_mix_reproduces_the_real_270m_layout() {
        // The layout llama-quantize gave the published Gemma 3 270M Q4_K_M file.
        let more_bits = [0, 1, 4, 7, 10, 13, 15, 16, 17];
        for il in 0..18 {
            let v = DtypeMix::Q4KM.dtype("attn_v", il, 18, 640);
            let down = DtypeMix::Q4KM.dtype("ffn_down", il, 18, 2048);
            if more_bits.contains(&il) {
                assert_eq!((v, down), (GgmlType::Q8_0, GgmlType::Q6K), "layer {il}");
            } else {
                assert_eq!((v, down), (GgmlType::Q5_0, GgmlType::Q4K), "layer {il}");
            }
            assert_eq!(DtypeMix::Q4KM.dtype("attn_q", il, 18, 640), GgmlType::Q5_0);
            assert_eq!(
                DtypeMix::Q4KM.dtype("attn_output", il, 18, 1024),
                GgmlType::Q4K
            );
        }
        assert_eq!(
            DtypeMix::Q4KM.dtype("token_embd", 0, 18, 640),
            GgmlType::Q8_0
        );
    }
}
