//! Synthetic Gemma models with random weights, written as GGUF: tiny ones for tests, and
//! full-size ones (real shapes, a Q4_K_M-like dtype mix) for benchmarks. llama.cpp loads them
//! too, so they double as parity fixtures.

use std::io::Write;

use wgemma_gguf::{
    Array, GgmlType, Gguf, GgufError, GgufWriter, RangeSource, SourceError, TensorSpec, Value,
    WriteError, quantize,
};

/// The shape and dtypes of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// Head size (of the sliding layers, for Gemma 4).
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
    /// What Gemma 4 adds; `None` for Gemma 3.
    pub gemma4: Option<Gemma4Extras>,
    pub seed: u64,
}

/// The Gemma 4 features of a synthetic model.
#[derive(Clone, Debug)]
pub struct Gemma4Extras {
    /// Head size of the global layers.
    pub head_dim_global: usize,
    /// KV heads of the global layers.
    pub n_kv_head_global: usize,
    /// Global layers take V from K (no V projection).
    pub k_eq_v: bool,
    /// Per-layer embedding width (0: none).
    pub n_ple: usize,
    /// The last layers that reuse an earlier layer's KV cache.
    pub shared_kv_layers: usize,
    /// The shared-KV layers have a feed-forward twice as wide.
    pub double_wide_shared: bool,
    /// Experts beside the dense feed-forward on every layer.
    pub moe: Option<SynthMoe>,
    /// DiffusionGemma (architecture `diffusion-gemma`): the canvas length; the encoder's
    /// layer scales and the self-conditioning block join the tensors.
    pub diffusion: Option<usize>,
}

/// A synthetic mixture of experts.
#[derive(Clone, Copy, Debug)]
pub struct SynthMoe {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff: usize,
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
    /// The presets by name (`cargo xtask synth --preset`): tiny-gemma3, tiny-gemma4 (whose
    /// weights take `dtype`), gemma3-270m, e2b, e4b, 26b-a4b (Gemma 4's shapes), tiny-dg
    /// (likewise `dtype`) and dg-26b-a4b (DiffusionGemma's).
    pub fn preset(name: &str, dtype: GgmlType) -> Option<Self> {
        Some(match name {
            "tiny-gemma3" => Self::tiny_gemma3(dtype),
            "tiny-gemma4" => Self::tiny_gemma4(dtype),
            "gemma3-270m" => Self::gemma3_270m(),
            "e2b" => Self::gemma4_e2b(),
            "e4b" => Self::gemma4_e4b(),
            "26b-a4b" => Self::gemma4_26b_a4b(),
            "tiny-dg" => Self::tiny_diffusion_gemma(dtype),
            "dg-26b-a4b" => Self::diffusion_gemma_26b_a4b(),
            _ => return None,
        })
    }

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
            gemma4: None,
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
            gemma4: None,
            seed: 1,
        }
    }
}

impl SynthSpec {
    /// A Gemma 4 with every text feature small enough for tests: per-layer embeddings, two
    /// shared-KV layers with a double-wide feed-forward, global layers with their own head size.
    pub fn tiny_gemma4(dtype: GgmlType) -> Self {
        Self {
            arch: "gemma4",
            n_layer: 7,
            n_embd: 128,
            n_head: 4,
            n_kv_head: 1,
            head_dim: 32,
            n_ff: 128,
            n_vocab: 512,
            sliding_window: 6,
            context_length: 256,
            mix: DtypeMix::Uniform(dtype),
            global_every: 3,
            final_softcap: Some(30.0),
            gemma4: Some(Gemma4Extras {
                head_dim_global: 64,
                n_kv_head_global: 1,
                k_eq_v: false,
                n_ple: 32,
                shared_kv_layers: 2,
                double_wide_shared: true,
                moe: None,
                diffusion: None,
            }),
            seed: 1,
        }
    }

    /// Gemma 4 E2B's shapes (35 layers, every 5th global, the last 20 sharing KV, per-layer
    /// embeddings of 256) with a Q4_K_M dtype mix.
    pub fn gemma4_e2b() -> Self {
        Self {
            arch: "gemma4",
            n_layer: 35,
            n_embd: 1536,
            n_head: 8,
            n_kv_head: 1,
            head_dim: 256,
            n_ff: 6144,
            n_vocab: 262_144,
            sliding_window: 512,
            context_length: 131_072,
            mix: DtypeMix::Q4KM,
            global_every: 5,
            final_softcap: Some(30.0),
            gemma4: Some(Gemma4Extras {
                head_dim_global: 512,
                n_kv_head_global: 1,
                k_eq_v: false,
                n_ple: 256,
                shared_kv_layers: 20,
                double_wide_shared: true,
                moe: None,
                diffusion: None,
            }),
            seed: 1,
        }
    }

    /// Gemma 4 E4B's shapes (42 layers, every 6th global, the last 18 sharing KV).
    pub fn gemma4_e4b() -> Self {
        Self {
            n_layer: 42,
            n_embd: 2560,
            n_kv_head: 2,
            n_ff: 10_240,
            global_every: 6,
            gemma4: Some(Gemma4Extras {
                head_dim_global: 512,
                n_kv_head_global: 2,
                k_eq_v: false,
                n_ple: 256,
                shared_kv_layers: 18,
                double_wide_shared: false,
                moe: None,
                diffusion: None,
            }),
            ..Self::gemma4_e2b()
        }
    }

    /// Gemma 4 26B-A4B's shapes: 30 layers, 128 experts (8 used) beside a dense feed-forward,
    /// global layers taking V from K.
    pub fn gemma4_26b_a4b() -> Self {
        Self {
            n_layer: 30,
            n_embd: 2816,
            n_head: 16,
            n_kv_head: 8,
            n_ff: 2112,
            sliding_window: 1024,
            context_length: 262_144,
            global_every: 6,
            gemma4: Some(Gemma4Extras {
                head_dim_global: 512,
                n_kv_head_global: 2,
                k_eq_v: true,
                n_ple: 0,
                shared_kv_layers: 0,
                double_wide_shared: false,
                moe: Some(SynthMoe {
                    n_expert: 128,
                    n_used: 8,
                    n_ff: 704,
                }),
                diffusion: None,
            }),
            ..Self::gemma4_e2b()
        }
    }

    /// A DiffusionGemma small enough for tests: tiny Gemma 4 layers with 4 experts (2 used),
    /// global layers taking V from K, a canvas of 16; matrices in `dtype`.
    pub fn tiny_diffusion_gemma(dtype: GgmlType) -> Self {
        let base = Self::tiny_gemma4(dtype);
        Self {
            arch: "diffusion-gemma",
            n_layer: 4,
            n_kv_head: 2,
            final_softcap: None,
            gemma4: Some(Gemma4Extras {
                head_dim_global: 64,
                n_kv_head_global: 1,
                k_eq_v: true,
                n_ple: 0,
                shared_kv_layers: 0,
                double_wide_shared: false,
                moe: Some(SynthMoe {
                    n_expert: 4,
                    n_used: 2,
                    n_ff: 64,
                }),
                diffusion: Some(16),
            }),
            ..base
        }
    }

    /// DiffusionGemma 26B-A4B's shapes: Gemma 4 26B-A4B's layers, a canvas of 256, the
    /// self-conditioning block; no soft cap key (its converter leaves it out).
    pub fn diffusion_gemma_26b_a4b() -> Self {
        let base = Self::gemma4_26b_a4b();
        let g = base.gemma4.clone().map(|g| Gemma4Extras {
            diffusion: Some(256),
            ..g
        });
        Self {
            arch: "diffusion-gemma",
            final_softcap: None,
            gemma4: g,
            ..base
        }
    }

    /// Whether layer `il` uses sliding-window attention.
    fn sliding(&self, il: usize) -> bool {
        self.global_every == 0 || il % self.global_every < self.global_every - 1
    }
}

/// A xorshift generator: reproducible across platforms, no dependency.
struct Rng(u64);

impl Rng {
    /// A generator for chunk `chunk` of tensor `tensor`: chunks are generated in parallel and
    /// each must not depend on the others.
    fn for_chunk(seed: u64, tensor: usize, chunk: u64) -> Self {
        // splitmix64 of the three, so neighbouring chunks start far apart.
        let mut z = seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add((tensor as u64) << 40)
            .wrapping_add(chunk);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

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

/// Gemma 4's image, audio and video markers.
const MULTIMODAL_MARKERS: [&str; 7] = [
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
];

/// Vocabulary of a synthetic model: control tokens, the architecture's turn markers, all 256
/// byte tokens, then pieces of lowercase letters (with and without the word-start mark).
/// Returns the tokens, scores, types and the BPE merges that build the two-letter pieces.
fn vocabulary(n_vocab: usize, arch: &str) -> (Vec<String>, Vec<f32>, Vec<i32>, Vec<String>) {
    let turns = if arch == "gemma4" {
        ["<|turn>", "<turn|>"]
    } else {
        ["<start_of_turn>", "<end_of_turn>"]
    };
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>", turns[0], turns[1]]
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
    let mut merges = Vec::new();
    for a in 'a'..='z' {
        for b in 'a'..='z' {
            pieces.push(format!("{a}{b}"));
            pieces.push(format!("▁{a}{b}"));
            merges.push(format!("{a} {b}"));
            merges.push(format!("▁ {a}{b}"));
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
    // Gemma 4's multimodal markers as control tokens at the end of a full-size vocabulary
    // (past the letter pieces), so image and audio prompts run on synthetic models.
    let markers = MULTIMODAL_MARKERS.len();
    if arch == "gemma4" && n_vocab >= 262 + pieces.len() + markers {
        for (i, m) in MULTIMODAL_MARKERS.iter().enumerate() {
            tokens[n_vocab - markers + i] = m.to_string();
            types[n_vocab - markers + i] = 3;
        }
    }
    // Keep only merges whose parts and result all made it into a small vocabulary.
    let known: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
    merges.retain(|m| {
        let (l, r) = m.split_once(' ').unwrap_or((m, ""));
        known.contains(l) && known.contains(r) && known.contains(format!("{l}{r}").as_str())
    });
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    (tokens, scores, types, merges)
}

/// How a planned tensor's values are made.
enum Fill {
    /// `offset + scale * uniform(-1, 1)`.
    Random {
        scale: f32,
        offset: f32,
    },
    Values(Vec<f32>),
}

/// One tensor of a synthetic model.
struct Planned {
    name: String,
    dtype: GgmlType,
    /// ggml order: the row length first.
    dims: Vec<u64>,
    fill: Fill,
}

fn metadata(spec: &SynthSpec) -> Vec<(String, Value)> {
    let a = spec.arch;
    let k = |s: &str| format!("{a}.{s}");
    let u = |v: usize| Value::U32(v as u32);
    // DiffusionGemma has Gemma 4's vocabulary.
    let family = if spec.gemma4.is_some() { "gemma4" } else { a };
    let (mut tokens, scores, mut types, merges) = vocabulary(spec.n_vocab, family);
    // DiffusionGemma's tokenizer has a mask token (llama.cpp's diffusion runner needs its
    // id): a control token before the multimodal markers.
    let mask = spec.gemma4.as_ref().and_then(|g| g.diffusion).map(|_| {
        let markers = if tokens.iter().any(|t| t == MULTIMODAL_MARKERS[0]) {
            MULTIMODAL_MARKERS.len()
        } else {
            0
        };
        let id = tokens.len() - 1 - markers;
        tokens[id] = "<mask>".into();
        types[id] = 3;
        id
    });
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!("synthetic {a}")),
        ),
        (k("context_length"), u(spec.context_length)),
        (k("embedding_length"), u(spec.n_embd)),
        (k("block_count"), u(spec.n_layer)),
        (k("attention.head_count"), u(spec.n_head)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (k("attention.sliding_window"), u(spec.sliding_window)),
        (k("rope.freq_base"), Value::F32(1_000_000.0)),
    ];
    match &spec.gemma4 {
        None => meta.extend([
            (k("feed_forward_length"), u(spec.n_ff)),
            (k("attention.head_count_kv"), u(spec.n_kv_head)),
            (k("attention.key_length"), u(spec.head_dim)),
            (k("attention.value_length"), u(spec.head_dim)),
            (k("attention.sliding_window_pattern"), u(spec.global_every)),
            ("tokenizer.ggml.model".into(), Value::String("llama".into())),
            ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ]),
        Some(g) => {
            let layers = 0..spec.n_layer;
            let per_layer = |f: &dyn Fn(usize) -> usize| {
                Value::Array(Array::I32(layers.clone().map(|il| f(il) as i32).collect()))
            };
            meta.extend([
                (k("feed_forward_length"), per_layer(&|il| spec.ff_width(il))),
                (
                    k("attention.head_count_kv"),
                    per_layer(&|il| {
                        if spec.sliding(il) {
                            spec.n_kv_head
                        } else {
                            g.n_kv_head_global
                        }
                    }),
                ),
                (
                    k("attention.sliding_window_pattern"),
                    Value::Array(Array::Bool(
                        layers.clone().map(|il| spec.sliding(il)).collect(),
                    )),
                ),
                (k("attention.key_length"), u(g.head_dim_global)),
                (k("attention.value_length"), u(g.head_dim_global)),
                (k("attention.key_length_swa"), u(spec.head_dim)),
                (k("attention.value_length_swa"), u(spec.head_dim)),
                (k("rope.dimension_count"), u(g.head_dim_global)),
                (k("rope.dimension_count_swa"), u(spec.head_dim)),
                (k("rope.freq_base_swa"), Value::F32(10_000.0)),
                (k("attention.shared_kv_layers"), u(g.shared_kv_layers)),
                (k("embedding_length_per_layer_input"), u(g.n_ple)),
                (
                    "tokenizer.ggml.model".into(),
                    Value::String("gemma4".into()),
                ),
                (
                    "tokenizer.ggml.merges".into(),
                    Value::Array(Array::String(merges)),
                ),
            ]);
            if let Some(m) = g.moe {
                meta.extend([
                    (k("expert_count"), u(m.n_expert)),
                    (k("expert_used_count"), u(m.n_used)),
                    (k("expert_feed_forward_length"), u(m.n_ff)),
                ]);
            }
            if let Some(canvas) = g.diffusion {
                meta.push(("diffusion.canvas_length".into(), u(canvas)));
            }
        }
    }
    meta.extend([
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
    ]);
    if let Some(id) = mask {
        meta.push(("tokenizer.ggml.mask_token_id".into(), u(id)));
    }
    if let Some(c) = spec.final_softcap {
        meta.push((k("final_logit_softcapping"), Value::F32(c)));
    }
    if spec.mix == DtypeMix::Q4KM {
        // llama.cpp's file type id of Q4_K_M, so its tools label the file as such.
        meta.push(("general.file_type".into(), Value::U32(15)));
    }
    meta
}

impl SynthSpec {
    /// Feed-forward width of layer `il`.
    fn ff_width(&self, il: usize) -> usize {
        match &self.gemma4 {
            Some(g) if g.double_wide_shared && il >= self.n_layer - g.shared_kv_layers => {
                2 * self.n_ff
            }
            _ => self.n_ff,
        }
    }

    /// DiffusionGemma's self-conditioning block: its pre-norm and gated feed-forward.
    fn self_cond_plan(&self) -> Vec<Planned> {
        let (d, ff) = (self.n_embd as u64, self.n_ff as u64);
        let matrix = |name: &str, role: &str, dims: Vec<u64>| Planned {
            dtype: self.mix.dtype(role, 0, self.n_layer, dims[0]),
            fill: Fill::Random {
                scale: 1.5 / (dims[0] as f32).sqrt(),
                offset: 0.0,
            },
            name: name.into(),
            dims,
        };
        vec![
            Planned {
                name: "self_cond_pre_norm.weight".into(),
                dtype: GgmlType::F32,
                dims: vec![d],
                fill: Fill::Random {
                    scale: 0.5,
                    offset: 1.0,
                },
            },
            matrix("self_cond_gate.weight", "ffn_gate", vec![d, ff]),
            matrix("self_cond_up.weight", "ffn_up", vec![d, ff]),
            matrix("self_cond_down.weight", "ffn_down", vec![ff, d]),
        ]
    }

    /// Every tensor in file order. Norms sit around 1 (Gemma's +1 is folded in), matrices are
    /// scaled so activations neither vanish nor explode.
    fn plan(&self) -> Vec<Planned> {
        let (d, v, nl) = (self.n_embd as u64, self.n_vocab as u64, self.n_layer);
        let ms = |cols: u64| Fill::Random {
            scale: 1.5 / (cols as f32).sqrt(),
            offset: 0.0,
        };
        let norm = || Fill::Random {
            scale: 0.5,
            offset: 1.0,
        };
        let matrix = |name: String, role: &str, il: usize, dims: Vec<u64>| Planned {
            dtype: self.mix.dtype(role, il, nl, dims[0]),
            fill: ms(dims[0]),
            name,
            dims,
        };
        let vector = |name: String, n: u64| Planned {
            name,
            dtype: GgmlType::F32,
            dims: vec![n],
            fill: norm(),
        };
        let mut plan = vec![
            Planned {
                name: "token_embd.weight".into(),
                dtype: self.mix.dtype("token_embd", 0, nl, d),
                dims: vec![d, v],
                fill: Fill::Random {
                    scale: 1.0,
                    offset: 0.0,
                },
            },
            vector("output_norm.weight".into(), d),
        ];
        let g = self.gemma4.as_ref();
        let n_ple = g.map_or(0, |g| g.n_ple) as u64;
        if let Some(g) = g {
            // Proportional RoPE: a quarter of the global head's frequencies rotate, the rest
            // are divided away.
            let half = g.head_dim_global / 2;
            plan.push(Planned {
                name: "rope_freqs.weight".into(),
                dtype: GgmlType::F32,
                dims: vec![half as u64],
                fill: Fill::Values(
                    (0..half)
                        .map(|i| if i < half / 4 { 1.0 } else { 1e30 })
                        .collect(),
                ),
            });
            if g.diffusion.is_some() {
                plan.extend(self.self_cond_plan());
            }
            if n_ple > 0 {
                let all = n_ple * nl as u64;
                plan.extend([
                    Planned {
                        name: "per_layer_token_embd.weight".into(),
                        dtype: self.mix.dtype("token_embd", 0, nl, all),
                        dims: vec![all, v],
                        fill: Fill::Random {
                            scale: 1.0,
                            offset: 0.0,
                        },
                    },
                    matrix(
                        "per_layer_model_proj.weight".into(),
                        "ple_proj",
                        0,
                        vec![d, all],
                    ),
                    vector("per_layer_proj_norm.weight".into(), n_ple),
                ]);
            }
        }
        for il in 0..nl {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let sliding = self.sliding(il);
            let (hd, n_kv) = match g {
                Some(g) if !sliding => (g.head_dim_global as u64, g.n_kv_head_global as u64),
                _ => (self.head_dim as u64, self.n_kv_head as u64),
            };
            let owns_kv = g.is_none_or(|g| il < nl - g.shared_kv_layers);
            // Global layers of K=V models have no V projection.
            let has_v = owns_kv && (sliding || !g.is_some_and(|g| g.k_eq_v));
            let (q_rows, kv_rows) = (self.n_head as u64 * hd, n_kv * hd);
            let ff = self.ff_width(il) as u64;
            plan.push(vector(n("attn_norm"), d));
            plan.push(matrix(n("attn_q"), "attn_q", il, vec![d, q_rows]));
            if owns_kv {
                plan.push(matrix(n("attn_k"), "attn_k", il, vec![d, kv_rows]));
            }
            if has_v {
                plan.push(matrix(n("attn_v"), "attn_v", il, vec![d, kv_rows]));
            }
            plan.push(vector(n("attn_q_norm"), hd));
            if owns_kv {
                plan.push(vector(n("attn_k_norm"), hd));
            }
            plan.extend([
                matrix(n("attn_output"), "attn_output", il, vec![q_rows, d]),
                vector(n("post_attention_norm"), d),
                vector(n("ffn_norm"), d),
                matrix(n("ffn_gate"), "ffn_gate", il, vec![d, ff]),
                matrix(n("ffn_up"), "ffn_up", il, vec![d, ff]),
                matrix(n("ffn_down"), "ffn_down", il, vec![ff, d]),
                vector(n("post_ffw_norm"), d),
            ]);
            let Some(g) = g else { continue };
            let scalar = |name: String| Planned {
                name,
                dtype: GgmlType::F32,
                dims: vec![1],
                fill: Fill::Random {
                    scale: 0.1,
                    offset: 0.8,
                },
            };
            plan.push(scalar(n("layer_output_scale")));
            if g.diffusion.is_some() {
                plan.push(scalar(n("enc_layer_output_scale")));
            }
            if n_ple > 0 {
                plan.extend([
                    matrix(n("inp_gate"), "ple_gate", il, vec![d, n_ple]),
                    matrix(n("proj"), "ple_out", il, vec![n_ple, d]),
                    vector(n("post_norm"), d),
                ]);
            }
            if let Some(m) = g.moe {
                let (e, fe) = (m.n_expert as u64, m.n_ff as u64);
                plan.extend([
                    Planned {
                        name: n("ffn_gate_inp"),
                        dtype: GgmlType::F32,
                        dims: vec![d, e],
                        fill: ms(d),
                    },
                    vector(format!("blk.{il}.ffn_gate_inp.scale"), d),
                    vector(n("pre_ffw_norm_2"), d),
                    vector(n("post_ffw_norm_1"), d),
                    vector(n("post_ffw_norm_2"), d),
                    matrix(n("ffn_gate_up_exps"), "ffn_gate", il, vec![d, 2 * fe, e]),
                    matrix(n("ffn_down_exps"), "ffn_down", il, vec![fe, d, e]),
                    vector(format!("blk.{il}.ffn_down_exps.scale"), e),
                ]);
            }
        }
        plan
    }
}

/// Values per generated chunk: large enough to amortise a thread, small enough that a batch
/// of chunks stays well under a gigabyte.
const CHUNK_VALUES: u64 = 1 << 22;

/// The bytes of a planned tensor, generated (and quantized) in parallel by row chunks and
/// yielded in order.
fn tensor_chunks(
    t: &Planned,
    seed: u64,
    index: usize,
) -> Result<Box<dyn Iterator<Item = Vec<u8>> + '_>, WriteError> {
    let cols = t.dims[0];
    let rows: u64 = t.dims[1..].iter().product();
    if !cols.is_multiple_of(t.dtype.block_size() as u64) {
        return Err(WriteError::Tensor {
            name: t.name.clone(),
            reason: format!(
                "row length {cols} is not a whole number of {} blocks",
                t.dtype.name()
            ),
        });
    }
    let (scale, offset) = match &t.fill {
        Fill::Values(v) => {
            let bytes = quantize(t.dtype, v).map_err(|e| WriteError::Tensor {
                name: t.name.clone(),
                reason: e.to_string(),
            })?;
            return Ok(Box::new(std::iter::once(bytes)));
        }
        Fill::Random { scale, offset } => (*scale, *offset),
    };
    let chunk_rows = (CHUNK_VALUES / cols).max(1);
    let n_chunks = rows.div_ceil(chunk_rows);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let make = move |c: u64| {
        let n = (chunk_rows.min(rows - c * chunk_rows) * cols) as usize;
        let values = Rng::for_chunk(seed, index, c).fill(n, scale, offset);
        // The block check above makes this infallible; a failure would show as a short
        // tensor, which the writer reports.
        quantize(t.dtype, &values).unwrap_or_default()
    };
    Ok(Box::new((0..n_chunks).step_by(threads as usize).flat_map(
        move |first| {
            let last = (first + threads).min(n_chunks);
            std::thread::scope(|s| {
                let handles: Vec<_> = (first..last).map(|c| s.spawn(move || make(c))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_default())
                    .collect::<Vec<_>>()
            })
        },
    )))
}

/// Tensor data alignment of the synthetic files.
const ALIGNMENT: u64 = 32;

/// The GGUF writer for `spec`'s file, its header written into `out`.
fn writer<W: Write>(
    spec: &SynthSpec,
    plan: &[Planned],
    out: W,
) -> Result<GgufWriter<W>, WriteError> {
    let specs = plan
        .iter()
        .map(|t| TensorSpec::new(&t.name, t.dtype, &t.dims))
        .collect();
    GgufWriter::new(out, &metadata(spec), specs, ALIGNMENT)
}

/// A synthetic model's header standing for its whole file, whose tensor bytes read as zeros:
/// enough to load the model without its weights ([`crate::forward::WeightBytes::Skip`]) and
/// plan its steps, without generating gigabytes.
pub struct SynthHeader {
    header: Vec<u8>,
    len: u64,
}

impl SynthHeader {
    pub fn new(spec: &SynthSpec) -> Result<Self, WriteError> {
        let w = writer(spec, &spec.plan(), Vec::new())?;
        Ok(Self {
            header: w.written().clone(),
            len: w.file_len(),
        })
    }

    /// The parsed header.
    pub fn gguf(&self) -> Result<Gguf, GgufError> {
        Gguf::parse_prefix(&self.header, self.len)
    }
}

impl RangeSource for SynthHeader {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, SourceError>> {
        let end = offset.saturating_add(len);
        let read = if end > self.len {
            Err(SourceError::OutOfRange {
                offset,
                len,
                size: self.len,
            })
        } else {
            let from = (offset as usize).min(self.header.len());
            let to = (end as usize).min(self.header.len());
            let mut bytes = self.header[from..to].to_vec();
            bytes.resize(len as usize, 0);
            Ok(bytes)
        };
        std::future::ready(read)
    }
}

/// Writes the model as GGUF into `out`, generating each tensor as it is written.
pub fn write_synthetic<W: Write>(spec: &SynthSpec, out: W) -> Result<W, WriteError> {
    let plan = spec.plan();
    let mut w = writer(spec, &plan, out)?;
    for (i, t) in plan.iter().enumerate() {
        w.write_tensor_chunks(tensor_chunks(t, spec.seed, i)?)?;
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
