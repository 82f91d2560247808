//! `cargo xtask browser-test`: builds the wasm package, serves the demo, and drives headless
//! Chromium (WebGPU on SwiftShader) through `web/tests/browser.mjs`: greedy tokens of a tiny
//! model must equal the native run's, a second load must come from the cache, abort and bad
//! URLs must behave, and the demo page must stream a reply (screenshot in the output folder).
//! Images: the tiny vision model with its projector must give the native soft tokens and, in
//! a two-turn chat, the native tokens; audio likewise (a WAV file's soft tokens, a chat about
//! the clip decoded by the browser into an `AudioBuffer`). Text diffusion: the tiny
//! DiffusionGemma's drafts and block for one denoising step must equal the native run's.
//! `--bench-model` also times a real model there (load, prefill, decode).

use std::path::{Path, PathBuf};
use std::process::Command;

use futures::StreamExt;
use wgemma::{
    AudioInput, DiffusionGenerate, DiffusionModel, Event, GenerateRequest, ImageInput, LoadOptions,
    Model, Session, Timings, session_options_from_json,
};
use wgemma_gguf::GgmlType;
use wgemma_kernels::{ContextOptions, GPU_DTYPES};
use wgemma_text::synth::{SynthSpec, write_synthetic};

use crate::serve::Server;
use crate::wasm::build;
use crate::{TaskError, workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// Where the screenshot, the tiny model and the results go.
    #[arg(long, default_value = "target/browser-test")]
    out: PathBuf,
    #[arg(long, default_value = "/usr/bin/chromium")]
    chromium: PathBuf,
    /// Also time this model in the browser (e.g. the real Gemma 3 270M).
    #[arg(long)]
    bench_model: Option<PathBuf>,
    /// Use the package already in web/pkg.
    #[arg(long)]
    no_build: bool,
}

/// What the tiny model is asked, natively and in the browser (the JS API's request shape).
/// Greedy; the random model's top token is always the one it just read, so a presence
/// penalty walks it down its ranking instead: every token is still an argmax, of logits that
/// must agree well past the first place.
fn request() -> serde_json::Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": "tell me a story about the sea"}],
        "maxTokens": 24,
        "presencePenalty": 1000.0,
    })
}

/// What the test types into the demo page (plain greedy chat, 16 tokens at most).
fn demo_request() -> serde_json::Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": "hello there"}],
        "maxTokens": 16,
    })
}

/// What each dtype's tiny model is asked (raw text, greedy, distinct tokens).
fn dtype_request() -> serde_json::Value {
    serde_json::json!({ "prompt": "the sea", "maxTokens": 4, "presencePenalty": 1000.0 })
}

/// The session both runs use.
fn session_options() -> serde_json::Value {
    serde_json::json!({ "context": 256 })
}

/// The native runs' GPU: without `shader-f16`, as on SwiftShader.
pub(crate) fn native_gpu() -> ContextOptions {
    ContextOptions {
        allow_f16: false,
        ..ContextOptions::default().with_env()
    }
}

/// One generation: its token ids, text and timings.
fn generate(
    session: &mut Session,
    request: &serde_json::Value,
    images: Vec<ImageInput>,
) -> Result<(Vec<u32>, String, Timings), TaskError> {
    generate_with(session, request, images, Vec::new())
}

/// [`generate`] with audio clips too.
fn generate_with(
    session: &mut Session,
    request: &serde_json::Value,
    images: Vec<ImageInput>,
    audio: Vec<AudioInput>,
) -> Result<(Vec<u32>, String, Timings), TaskError> {
    let mut req = GenerateRequest::from_json(request)?;
    req.images = images;
    req.audio = audio;
    let mut events = Box::pin(session.generate(req));
    let (mut ids, mut text, mut timings) = (Vec::new(), String::new(), Timings::default());
    while let Some(event) = pollster::block_on(events.next()) {
        match event? {
            Event::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            Event::Draft { .. } => {}
            Event::Done { timings: t, .. } => timings = t,
        }
    }
    Ok((ids, text, timings))
}

/// Token ids of the native run of each request, each in a new session.
fn native_tokens(model: &Path, requests: &[serde_json::Value]) -> Result<Vec<Vec<u32>>, TaskError> {
    let opts = LoadOptions {
        gpu: native_gpu(),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(model, opts))?;
    let mut all = Vec::new();
    for request in requests {
        let mut session = model.session(session_options_from_json(&session_options())?)?;
        all.push(generate(&mut session, request, Vec::new())?.0);
    }
    Ok(all)
}

/// The tiny DiffusionGemma of the diffusion crate's tests, and what it is asked in both runs:
/// one denoising step a block (its text is that step's argmax canvas, so no draw decides it).
const DIFFUSION_MODEL: &str = "crates/diffusion/tests/fixtures/dg_tiny.gguf";

fn diffusion_request() -> serde_json::Value {
    serde_json::json!({ "prompt": "the sea at night, and the quiet harbour under the stars", "maxTokens": 16, "seed": 5, "steps": 1 })
}

/// The tiny DiffusionGemma with a vision tower (`crates/diffusion/tests/images.rs`'s; its
/// projector is the vision fixtures' 26B-like one) and what it is asked about the vision
/// checks' picture: one user turn holding it, one denoising step a block.
const DIFFUSION_VISION_MODEL: &str = "crates/diffusion/tests/fixtures/dg_tiny_vision.gguf";
const DIFFUSION_VISION_MMPROJ: &str = "gemma4_tiny_vision_moe_mmproj.gguf";

fn diffusion_image_request() -> serde_json::Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": "What is this?", "images": 1}],
        "maxTokens": 16, "seed": 5, "steps": 1, "imageTokens": IMAGE_TOKENS,
    })
}

/// A native DiffusionGemma run: `model` (with `mmproj`'s vision tower) asked `request` with
/// `images` in a session of `context` positions: `{drafts: [text], ids, softTokens}` (the
/// first image's, or none).
fn native_diffusion(
    model: &Path,
    mmproj: Option<PathBuf>,
    request: &serde_json::Value,
    images: Vec<ImageInput>,
    context: usize,
) -> Result<serde_json::Value, TaskError> {
    let opts = LoadOptions {
        gpu: native_gpu(),
        mmproj,
        ..LoadOptions::default()
    };
    let model = pollster::block_on(DiffusionModel::load_file(model, opts))?;
    let soft = match images.first() {
        Some(image) => pollster::block_on(model.encode_image_to_vec(image))?.0,
        None => Vec::new(),
    };
    let mut req = DiffusionGenerate::from_json(request, model.config().sampler)?;
    req.images = images;
    let mut chat = model.session(context, None)?;
    let (mut drafts, mut ids) = (Vec::new(), Vec::new());
    let events: Vec<Result<Event, wgemma::Error>> =
        pollster::block_on(chat.generate(req).collect());
    for event in events {
        match event? {
            Event::Draft { text, .. } => drafts.push(text),
            Event::Token { id, .. } => ids.push(id),
            Event::Done { .. } => {}
        }
    }
    let mut out = serde_json::json!({ "drafts": drafts, "ids": ids });
    if !soft.is_empty() {
        out["softTokens"] = soft.into();
    }
    Ok(out)
}

/// The tiny Gemma 4 with a vision tower (`crates/runtime/tests/vision.rs`'s), its projector
/// and an image that needs no resize at the smallest budget, which keeps the browser's
/// encode short.
const VISION_MODEL: &str = "gemma4_tiny_vision_e2b.gguf";
const VISION_MMPROJ: &str = "gemma4_tiny_vision_e2b_mmproj.gguf";
const VISION_IMAGE: &str = "exact_480x336.png";
const IMAGE_TOKENS: u32 = 70;

/// The vision chat's questions; the first message holds the picture (about 110 positions in
/// all, so the prefill attention walks more than one 64-key chunk).
const VISION_TURNS: [&str; 2] = ["What is in this picture?", "And its colours?"];

/// A chat request: greedy, few tokens, distinct ones (see `request`). The first message's
/// `images` is how many images it holds; the browser puts its images there.
fn vision_request(messages: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({
        "messages": messages,
        "maxTokens": 4,
        "presencePenalty": 1000.0,
        "imageTokens": IMAGE_TOKENS,
    })
}

/// What the browser's vision checks compare with: the image's soft tokens (from the file),
/// and a chat of `VISION_TURNS` in one session about the same picture as decoded pixels (the
/// browser sends an `ImageBitmap`): each turn's request, tokens, images encoded and cached
/// tokens.
fn native_vision(fixtures: &Path) -> Result<serde_json::Value, TaskError> {
    let opts = LoadOptions {
        gpu: native_gpu(),
        mmproj: Some(fixtures.join(VISION_MMPROJ)),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(fixtures.join(VISION_MODEL), opts))?;
    let png = std::fs::read(fixtures.join(VISION_IMAGE))?;
    let file = ImageInput::from_bytes(png.clone()).with_budget(IMAGE_TOKENS);
    let pixels = ImageInput::from_rgb(wgemma_vision::decode(&png)?).with_budget(IMAGE_TOKENS);
    let (soft, rows) = pollster::block_on(model.encode_image_to_vec(&file))?;
    let mut session = model.session(session_options_from_json(&session_options())?)?;
    let mut messages = Vec::new();
    let mut turns = Vec::new();
    for (i, question) in VISION_TURNS.into_iter().enumerate() {
        let mut message = serde_json::json!({"role": "user", "content": question});
        if i == 0 {
            message["images"] = 1.into();
        }
        messages.push(message);
        let request = vision_request(&messages);
        let (ids, reply, t) = generate(&mut session, &request, vec![pixels.clone()])?;
        turns.push(serde_json::json!({
            "request": request,
            "ids": ids,
            "encodedImages": t.encoded_images,
            "cachedTokens": t.cached_tokens,
        }));
        messages.push(serde_json::json!({"role": "assistant", "content": reply}));
    }
    Ok(serde_json::json!({
        "imageTokens": IMAGE_TOKENS,
        "softTokens": soft,
        "rows": rows,
        "turns": turns,
    }))
}

/// The tiny Gemma 4 with an audio tower (`crates/runtime/tests/audio.rs`'s), its projector
/// (which holds a vision tower too) and a 1.3 s clip (33 soft tokens).
const AUDIO_MODEL: &str = "gemma4_tiny_audio.gguf";
const AUDIO_MMPROJ: &str = "gemma4_tiny_audio_mmproj.gguf";
const AUDIO_CLIP: &str = "a16k.wav";

/// The audio chat's questions; the first message holds the clip.
const AUDIO_TURNS: [&str; 2] = ["What do you hear?", "Is it rising?"];

/// What the browser's audio checks compare with: the clip's soft tokens, and a chat of
/// `AUDIO_TURNS` in one session about it (the browser sends it decoded, an `AudioBuffer`).
fn native_audio(fixtures: &Path) -> Result<serde_json::Value, TaskError> {
    let opts = LoadOptions {
        gpu: native_gpu(),
        mmproj: Some(fixtures.join(AUDIO_MMPROJ)),
        ..LoadOptions::default()
    };
    let model = pollster::block_on(Model::load_file(fixtures.join(AUDIO_MODEL), opts))?;
    let clip = AudioInput::from_bytes(&std::fs::read(fixtures.join(AUDIO_CLIP))?)?;
    let (soft, rows) = pollster::block_on(model.encode_audio_to_vec(&clip))?;
    let mut session = model.session(session_options_from_json(&session_options())?)?;
    let mut messages = Vec::new();
    let mut turns = Vec::new();
    for (i, question) in AUDIO_TURNS.into_iter().enumerate() {
        let mut message = serde_json::json!({"role": "user", "content": question});
        if i == 0 {
            message["audio"] = 1.into();
        }
        messages.push(message);
        let request = vision_request(&messages);
        let (ids, reply, t) =
            generate_with(&mut session, &request, Vec::new(), vec![clip.clone()])?;
        turns.push(serde_json::json!({
            "request": request,
            "ids": ids,
            "encodedAudio": t.encoded_audio,
            "cachedTokens": t.cached_tokens,
        }));
        messages.push(serde_json::json!({"role": "assistant", "content": reply}));
    }
    Ok(serde_json::json!({ "softTokens": soft, "rows": rows, "turns": turns }))
}

/// Writes a native run's results for the browser test (`{what}-native.json`) and says what
/// they are.
fn write_native(out: &Path, what: &str, v: &serde_json::Value) -> Result<PathBuf, TaskError> {
    let path = out.join(format!("{what}-native.json"));
    std::fs::write(&path, v.to_string())?;
    let turns: Vec<String> = v["turns"]
        .as_array()
        .map(|t| t.iter().map(|t| t["ids"].to_string()).collect())
        .unwrap_or_default();
    eprintln!(
        "native {what} (no f16): {} soft tokens, turns {}",
        v["rows"],
        turns.join(", ")
    );
    Ok(path)
}

/// The browser binary, or an error that says how to get it.
pub(crate) fn require_chromium(path: &Path) -> Result<(), TaskError> {
    if path.exists() {
        return Ok(());
    }
    Err(format!("{} not found: apt-get install chromium", path.display()).into())
}

/// Installs playwright-core (the driver only; it never downloads a browser).
pub(crate) fn ensure_playwright(tests: &Path) -> Result<(), TaskError> {
    if tests.join("node_modules/playwright-core").is_dir() {
        return Ok(());
    }
    let status = Command::new("npm")
        .current_dir(tests)
        .args(["ci", "--no-audit", "--no-fund"])
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .status()
        .map_err(|e| format!("running npm (install nodejs and npm): {e}"))?;
    if !status.success() {
        return Err("npm ci in web/tests failed".into());
    }
    Ok(())
}

pub fn run(a: Args) -> Result<(), TaskError> {
    let root = workspace_root();
    require_chromium(&a.chromium)?;
    let out = root.join(&a.out);
    std::fs::create_dir_all(&out)?;
    let t = std::time::Instant::now();
    if !a.no_build {
        let wasm = build(&root)?;
        eprintln!(
            "wasm package built in {:.0} s: {} is {:.2} MiB",
            t.elapsed().as_secs_f64(),
            wasm.display(),
            std::fs::metadata(&wasm)?.len() as f64 / (1u64 << 20) as f64
        );
    }
    let name = |p: &Path| {
        format!(
            "models/{}",
            p.file_name().and_then(|n| n.to_str()).unwrap_or_default()
        )
    };
    let mut models = Vec::new();
    let synth = |name: &str, spec: SynthSpec| -> Result<PathBuf, TaskError> {
        let path = out.join(name);
        let file = std::fs::File::create(&path)?;
        write_synthetic(&spec, std::io::BufWriter::new(file))?;
        Ok(path)
    };
    let tiny = synth("tiny.gguf", SynthSpec::tiny_gemma3(GgmlType::Q4K))?;
    // Gemma 4 with per-layer embeddings: the browser fetches their rows by range requests.
    let tiny4 = synth("tiny-gemma4.gguf", SynthSpec::tiny_gemma4(GgmlType::Q8_0))?;
    // Every weight dtype the kernels read, so Chromium's WGSL compiler sees each kernel
    // variant: a few tokens each, against the native run.
    let mut dtype_cases = Vec::new();
    for dtype in GPU_DTYPES {
        let path = synth(
            &format!("tiny-{}.gguf", dtype.name()),
            SynthSpec::tiny_gemma3(dtype),
        )?;
        let ids = native_tokens(&path, &[dtype_request()])?.remove(0);
        if ids.len() < 2 {
            return Err(format!("the native {dtype} run stopped too early to compare").into());
        }
        dtype_cases.push(
            serde_json::json!({ "dtype": dtype.name(), "model": name(&path), "expected": ids }),
        );
        models.push(path);
    }
    let native = native_tokens(&tiny, &[request(), demo_request()])?;
    let (expected, expected_demo) = (&native[0], &native[1]);
    let expected4 = native_tokens(&tiny4, &[request()])?.remove(0);
    eprintln!("native (no f16): {expected:?}, demo {expected_demo:?}, gemma4 {expected4:?}");
    if expected.len() < 8 || expected4.len() < 8 {
        return Err("a native run stopped too early to compare anything".into());
    }
    let fixtures = root.join("crates/gemma4-vision/tests/fixtures");
    let vision_path = write_native(&out, "vision", &native_vision(&fixtures)?)?;
    let audio_fixtures = root.join("crates/gemma4-audio/tests/fixtures");
    let audio_path = write_native(&out, "audio", &native_audio(&audio_fixtures)?)?;
    let diffusion_file = root.join(DIFFUSION_MODEL);
    let diffusion_native =
        native_diffusion(&diffusion_file, None, &diffusion_request(), Vec::new(), 64)?;
    let dg_vision = [
        root.join(DIFFUSION_VISION_MODEL),
        fixtures.join(DIFFUSION_VISION_MMPROJ),
    ];
    let picture = ImageInput::from_bytes(std::fs::read(fixtures.join(VISION_IMAGE))?);
    let dg_vision_native = native_diffusion(
        &dg_vision[0],
        Some(dg_vision[1].clone()),
        &diffusion_image_request(),
        vec![picture.with_budget(IMAGE_TOKENS)],
        256,
    )?;
    let tests = root.join("web/tests");
    ensure_playwright(&tests)?;
    models.extend([tiny.clone(), tiny4.clone(), diffusion_file.clone()]);
    models.extend(dg_vision.iter().cloned());
    let vision_files = [VISION_MODEL, VISION_MMPROJ, VISION_IMAGE].map(|f| fixtures.join(f));
    models.extend(vision_files.iter().cloned());
    let audio_files = [AUDIO_MODEL, AUDIO_MMPROJ, AUDIO_CLIP].map(|f| audio_fixtures.join(f));
    models.extend(audio_files.iter().cloned());
    models.extend(a.bench_model.iter().cloned());
    let server = Server::start(root.join("web"), models, 0)?;
    let mut node = Command::new("node");
    node.current_dir(&tests)
        .arg("browser.mjs")
        .env("WGEMMA_URL", format!("http://{}", server.addr))
        .env("WGEMMA_CHROMIUM", &a.chromium)
        .env("WGEMMA_MODEL", name(&tiny))
        .env("WGEMMA_MODEL_FILE", &tiny)
        .env("WGEMMA_G4_MODEL", name(&tiny4))
        .env("WGEMMA_G4_EXPECTED", serde_json::to_string(&expected4)?)
        .env("WGEMMA_DG_MODEL", name(&diffusion_file))
        .env("WGEMMA_DG_REQUEST", diffusion_request().to_string())
        .env("WGEMMA_DG_EXPECTED", diffusion_native.to_string())
        .env("WGEMMA_DGV_MODEL", name(&dg_vision[0]))
        .env("WGEMMA_DGV_MMPROJ", name(&dg_vision[1]))
        .env("WGEMMA_DGV_REQUEST", diffusion_image_request().to_string())
        .env("WGEMMA_DGV_EXPECTED", dg_vision_native.to_string())
        .env("WGEMMA_DTYPE_REQUEST", dtype_request().to_string())
        .env(
            "WGEMMA_DTYPE_CASES",
            serde_json::Value::Array(dtype_cases).to_string(),
        )
        .env("WGEMMA_REQUEST", request().to_string())
        .env("WGEMMA_EXPECTED", serde_json::to_string(expected)?)
        .env("WGEMMA_VISION_MODEL", name(&vision_files[0]))
        .env("WGEMMA_VISION_MMPROJ", name(&vision_files[1]))
        .env("WGEMMA_VISION_IMAGE", name(&vision_files[2]))
        .env("WGEMMA_VISION_IMAGE_FILE", &vision_files[2])
        .env("WGEMMA_VISION_NATIVE", &vision_path)
        .env("WGEMMA_AUDIO_MODEL", name(&audio_files[0]))
        .env("WGEMMA_AUDIO_MMPROJ", name(&audio_files[1]))
        .env("WGEMMA_AUDIO_CLIP", name(&audio_files[2]))
        .env("WGEMMA_AUDIO_CLIP_FILE", &audio_files[2])
        .env("WGEMMA_AUDIO_NATIVE", &audio_path)
        .env("WGEMMA_DEMO_REQUEST", demo_request().to_string())
        .env(
            "WGEMMA_DEMO_EXPECTED",
            serde_json::to_string(expected_demo)?,
        )
        .env("WGEMMA_OUT", &out);
    if let Some(b) = &a.bench_model {
        node.env("WGEMMA_BENCH", name(b));
    }
    let result = node
        .output()
        .map_err(|e| format!("running node (install nodejs): {e}"))?;
    let stdout = String::from_utf8_lossy(&result.stdout);
    eprint!("{}", String::from_utf8_lossy(&result.stderr));
    std::fs::write(out.join("results.json"), stdout.as_bytes())?;
    let parsed: serde_json::Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("the browser test printed no results ({e}): {stdout}"))?;
    println!("{}", serde_json::to_string_pretty(&parsed)?);
    if !result.status.success() {
        return Err("browser test failed".into());
    }
    eprintln!(
        "browser test passed in {:.0} s; screenshot {}",
        t.elapsed().as_secs_f64(),
        out.join("demo.png").display()
    );
    Ok(())
}
