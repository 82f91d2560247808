//! What wgemma's tests share (a dev-dependency only): the GPU context, where the real model
//! file some tests read is, random data, the error measures, and the harness that holds a GPU
//! case to its CPU reference ([`ParityCase`]).
//!
//! Under CI (`CI` set) a missing adapter or model file fails the test that asks for it;
//! elsewhere it is a skip with a message.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use wgemma_kernels::{
    ContextOptions, Dispatch, GpuContext, GpuError, Recorder, Tensor, View, cpu, reflect,
};

/// One GPU context for the whole test binary (`WGEMMA_BACKEND` / `WGEMMA_ADAPTER` and the
/// feature switches apply), or `None` where there is no adapter outside CI.
pub fn gpu() -> Option<&'static Arc<GpuContext>> {
    static CTX: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CTX.get_or_init(|| {
        match pollster::block_on(GpuContext::new(ContextOptions::default().with_env())) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI is set but no GPU adapter: {e}"
                );
                eprintln!("skipping GPU tests: {e}");
                None
            }
        }
    })
    .as_ref()
}

/// A context on [`gpu`]'s adapter whose tiled products keep their inputs f32 (no integer-dot
/// tiles, [`ContextOptions::allow_int8_tiles`]): for model tests that hold quantized weights
/// to the CPU reference at a tight tolerance, where rounding the experts' inputs to 8 bits
/// moves a tiny random model's routing (the tiles themselves meet their CPU reference in the
/// kernels' parity tests).
pub fn gpu_f32_tiles() -> Option<&'static Arc<GpuContext>> {
    static CTX: OnceLock<Option<Arc<GpuContext>>> = OnceLock::new();
    CTX.get_or_init(|| {
        let base = gpu()?;
        let options = ContextOptions {
            allow_int8_tiles: false,
            adapter_name: Some(base.info.name.clone()),
            ..ContextOptions::default().with_env()
        };
        let ctx = pollster::block_on(GpuContext::new(options));
        Some(Arc::new(
            ctx.expect("a second context on the first one's adapter"),
        ))
    })
    .as_ref()
}

/// The real Gemma 3 270M GGUF some tests read: `WGEMMA_GEMMA3_270M`, else where `wgemma
/// pull` puts it. `None` (a skip) when it is missing outside CI.
pub fn gemma3_270m() -> Option<PathBuf> {
    let path = std::env::var_os("WGEMMA_GEMMA3_270M")
        .map(PathBuf::from)
        .or_else(|| {
            wgemma_gguf::cache_dir().map(|d| d.join("models").join("gemma-3-270m-q4_k_m.gguf"))
        })?;
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {} is missing",
        path.display()
    );
    eprintln!("skipping: {} not found", path.display());
    None
}

/// A xorshift generator: the same data on every run and machine.
pub struct Rng(pub u64);

impl Rng {
    /// A value in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values in [-scale, scale), shifted off zero.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| self.uniform() * scale + scale * 0.01)
            .collect()
    }
}

/// A storage buffer holding `data`.
pub fn upload(ctx: &GpuContext, data: &[f32]) -> View {
    View::of(&ctx.storage_init("test", bytemuck::cast_slice(data)))
}

/// A storage buffer holding `data`.
pub fn upload_u32(ctx: &GpuContext, data: &[u32]) -> View {
    View::of(&ctx.storage_init("test", bytemuck::cast_slice(data)))
}

/// `n` NaNs: an output a kernel fails to write stays NaN and fails the comparison.
pub fn poisoned(ctx: &GpuContext, n: usize) -> View {
    upload(ctx, &vec![f32::NAN; n])
}

/// The f32 values of `v`.
pub fn read(ctx: &GpuContext, v: &View) -> Vec<f32> {
    pollster::block_on(ctx.read_f32(v)).expect("reading a test buffer back")
}

/// A tensor's logical elements (row-major over its shape), as the CPU references take them.
pub fn logical(ctx: &GpuContext, t: &Tensor) -> Vec<f32> {
    cpu::gather(&read(ctx, t.view()), t.dims(), t.strides(), t.offset())
}

/// Runs `dispatches` once each, after checking them against their kernels' WGSL (flags,
/// bindings by number, kind and name, parameter layout), and waits for them.
pub fn run(ctx: &GpuContext, dispatches: &[&Dispatch]) {
    static CHECKED: Mutex<Option<reflect::Reflection>> = Mutex::new(None);
    let problems = CHECKED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(Default::default)
        .check(ctx, dispatches.iter().copied());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let mut rec = Recorder::new(ctx, "test");
    for d in dispatches {
        rec.run(d);
    }
    rec.submit();
    ctx.wait().expect("GPU work failed");
}

/// Largest absolute difference between `got` and `want`, a NaN in `got` counting as infinite.
fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "output length");
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() {
                f32::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// Largest absolute difference relative to the reference's RMS.
pub fn rel_err_rms(got: &[f32], want: &[f32]) -> f32 {
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len().max(1) as f32).sqrt();
    max_abs_diff(got, want) / rms.max(1e-12)
}

/// Largest absolute difference relative to the reference's largest magnitude.
pub fn rel_err_max(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    max_abs_diff(got, want) / scale.max(1e-6)
}

/// Panics unless `got` is within `tol` of `want` ([`rel_err_rms`]).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let e = rel_err_rms(got, want);
    assert!(e <= tol, "{what}: relative error {e} > {tol}");
}

/// What a case's GPU side is: the dispatches that compute its output, and the output.
pub struct Built {
    pub dispatches: Vec<Dispatch>,
    pub output: Tensor,
}

/// One GPU-vs-CPU case of a kernel: its name, its GPU side built on a context, its CPU
/// reference and how close the GPU must come. [`check`] runs it.
pub trait ParityCase {
    fn name(&self) -> String;
    /// Uploads the inputs and builds the dispatches (outputs poisoned with NaN).
    fn build(&self, ctx: &GpuContext) -> Result<Built, GpuError>;
    /// The output's logical elements as the CPU computes them.
    fn reference(&self) -> Vec<f32>;
    /// The largest [`rel_err_rms`] allowed.
    fn tolerance(&self) -> f32;
}

/// Runs `case` on `ctx` and holds its output to the reference.
pub fn check(ctx: &GpuContext, case: &dyn ParityCase) {
    let name = case.name();
    let built = case
        .build(ctx)
        .unwrap_or_else(|e| panic!("{name}: building the dispatches: {e}"));
    run(ctx, &built.dispatches.iter().collect::<Vec<_>>());
    assert_close(
        &name,
        &logical(ctx, &built.output),
        &case.reference(),
        case.tolerance(),
    );
}

/// An Ollama-style Gemma 4 blob: the text model of `text` with the vision tower of `mmproj`
/// (llama.cpp's projector file) inside it, as Ollama's converter lays one out: the tower's
/// keys under `gemma4.vision.*`, its tensors by the same names, the per-tensor clamp scalars
/// packed into `v.clamp_data` (per layer 7 linears x (in_min, in_max, out_min, out_max), then
/// 4 for the projection, unclamped).
pub fn ollama_vision_blob(text: &[u8], mmproj: &[u8]) -> Vec<u8> {
    use wgemma_gguf::{Gguf, TensorSpec, Value, write_gguf};
    const LINEARS: [&str; 7] = [
        "attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down",
    ];
    const CLAMPS: [&str; 4] = ["input_min", "input_max", "output_min", "output_max"];
    let (tg, vg) = (Gguf::parse(text).unwrap(), Gguf::parse(mmproj).unwrap());
    let mut meta: Vec<(String, Value)> = tg.metadata.entries().to_vec();
    let keys = [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "patch_size",
        "attention.layer_norm_epsilon",
    ];
    copy_keys(&mut meta, &vg, ("clip.vision", "gemma4.vision"), &keys);
    meta.push(("gemma4.vision.projector.scale_factor".into(), Value::U32(3)));
    meta.push(("gemma4.vision.num_channels".into(), Value::U32(3)));
    let bytes = |g: &Gguf, all: &[u8], name: &str| tensor_bytes(g, all, name, name);
    let mut tensors: Vec<_> = tg
        .tensors()
        .iter()
        .map(|t| bytes(&tg, text, &t.name))
        .collect();
    let scalar = |name: &str| CLAMPS.iter().any(|c| name.ends_with(c));
    tensors.extend(
        vg.tensors()
            .iter()
            .filter(|t| !scalar(&t.name))
            .map(|t| bytes(&vg, mmproj, &t.name)),
    );
    let layers = vg.metadata.get_u64("clip.vision.block_count").unwrap();
    let mut packed = Vec::new();
    for il in 0..layers {
        for lin in LINEARS {
            for c in CLAMPS {
                packed.push(match vg.tensor(&format!("v.blk.{il}.{lin}.{c}")) {
                    Some(t) => {
                        let r = vg.tensor_range(t);
                        f32::from_le_bytes(mmproj[r.start as usize..][..4].try_into().unwrap())
                    }
                    None if c.ends_with("min") => f32::NEG_INFINITY,
                    None => f32::INFINITY,
                });
            }
        }
    }
    packed.extend([
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::INFINITY,
    ]);
    let spec = TensorSpec::new(
        "v.clamp_data",
        wgemma_gguf::GgmlType::F32,
        &[packed.len() as u64],
    );
    tensors.push((spec, bytemuck::cast_slice(&packed).to_vec()));
    write_gguf(&meta, &tensors, 32).unwrap()
}

/// Appends `from`'s keys `{prefix}.{key}` as `{to}.{key}` (a projector's keys as an Ollama
/// blob names them).
fn copy_keys(
    meta: &mut Vec<(String, wgemma_gguf::Value)>,
    from: &wgemma_gguf::Gguf,
    (prefix, to): (&str, &str),
    keys: &[&str],
) {
    for key in keys {
        let value = from
            .metadata
            .entries()
            .iter()
            .find(|(k, _)| *k == format!("{prefix}.{key}"));
        meta.push((format!("{to}.{key}"), value.unwrap().1.clone()));
    }
}

/// Tensor `name` of `g` (whose file is `all`), named `to`.
fn tensor_bytes(
    g: &wgemma_gguf::Gguf,
    all: &[u8],
    name: &str,
    to: &str,
) -> (wgemma_gguf::TensorSpec, Vec<u8>) {
    let t = g.tensor(name).unwrap();
    let r = g.tensor_range(t);
    (
        wgemma_gguf::TensorSpec::new(to, t.dtype, &t.dims),
        all[r.start as usize..r.end as usize].to_vec(),
    )
}

/// A tensor of llama.cpp's audio projector by the name Ollama's converter gives it (the
/// renames of reference/multimodal.md section 2, the inverse of Ollama's compat layer).
pub fn ollama_audio_name(name: &str) -> String {
    let renamed = [
        ("a.input_projection.", "a.pre_encode.out."),
        ("a.pre_encode.out.", "mm.a.fc."),
    ]
    .iter()
    .find_map(|(from, to)| name.strip_prefix(from).map(|rest| format!("{to}{rest}")));
    if let Some(n) = renamed {
        return n;
    }
    let Some((block, rest)) = name.strip_prefix("a.blk.").and_then(|r| r.split_once('.')) else {
        return name.to_string();
    };
    let (role, end) = rest.split_once('.').unwrap_or((rest, ""));
    let role = match role {
        "attn_pre_norm" => "ln1",
        "attn_post_norm" => "ln2",
        "ln2" => "layer_pre_norm",
        "attn_k_rel" => "linear_pos",
        r => r,
    };
    format!("a.blk.{block}.{role}.{end}")
}

/// An Ollama-style Gemma 4 blob: the text model of `text` with the audio tower of `mmproj`
/// inside it, as Ollama's converter lays one out: the tower's keys under `gemma4.audio.*`, its
/// tensors by Ollama's names ([`ollama_audio_name`]), the clamp scalars kept.
pub fn ollama_audio_blob(text: &[u8], mmproj: &[u8]) -> Vec<u8> {
    use wgemma_gguf::{Gguf, Value, write_gguf};
    let (tg, ag) = (Gguf::parse(text).unwrap(), Gguf::parse(mmproj).unwrap());
    let mut meta: Vec<(String, Value)> = tg.metadata.entries().to_vec();
    let keys = [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.layer_norm_epsilon",
    ];
    copy_keys(&mut meta, &ag, ("clip.audio", "gemma4.audio"), &keys);
    meta.push(("gemma4.audio.conv_kernel_size".into(), Value::U32(5)));
    let mut tensors: Vec<_> = tg
        .tensors()
        .iter()
        .map(|t| tensor_bytes(&tg, text, &t.name, &t.name))
        .collect();
    tensors.extend(
        ag.tensors()
            .iter()
            .filter(|t| t.name.starts_with("a.") || t.name.starts_with("mm.a."))
            .map(|t| tensor_bytes(&ag, mmproj, &t.name, &ollama_audio_name(&t.name))),
    );
    write_gguf(&meta, &tensors, 32).unwrap()
}

/// The tiny DiffusionGemma with a vision tower (`xtask/scripts/diffusion_gemma_vision_fixtures.py`),
/// its projector file (the vision fixtures' 26B-like tower) and an image that needs no resize
/// (480 x 336: 70 soft tokens at budget 70).
pub mod dg_vision {
    pub const MODEL: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../diffusion/tests/fixtures/dg_tiny_vision.gguf"
    );
    pub const MMPROJ: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gemma4-vision/tests/fixtures/gemma4_tiny_vision_moe_mmproj.gguf"
    );
    pub const IMAGE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../gemma4-vision/tests/fixtures/exact_480x336.png"
    );
}
