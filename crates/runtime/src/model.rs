//! Loading a model: header, configuration, tokenizer, chat template, weights onto the GPU.

use std::sync::Arc;

use wgemma_gguf::{Gguf, RangeSource, read_header};
use wgemma_kernels::{ContextOptions, GpuContext};
use wgemma_text::chat::ChatTemplate;
use wgemma_text::lora::LoraAdapter;
use wgemma_text::tokenizer::Tokenizer;
use wgemma_text::{
    ExpertPlacement, GpuModel, GpuSession, LoadProgress, PleRows, SessionOptions, TextConfig,
};

use wgemma_audio::{AudioConfig, AudioTower};
use wgemma_vision::{Encoded, VisionConfig, VisionTower};

use crate::audio::AudioInput;
use crate::image::ImageInput;
use crate::media::Markers;

use crate::error::Error;
use crate::info::ModelInfo;
use crate::session::Session;

/// How to load a model.
#[derive(Default)]
pub struct LoadOptions {
    /// Called as weights upload, with bytes done and total.
    pub on_progress: Option<Box<dyn FnMut(LoadProgress)>>,
    /// Which GPU to use (ignored when `context` is given).
    pub gpu: ContextOptions,
    /// A GPU context to share between models.
    pub context: Option<Arc<GpuContext>>,
    /// Where Gemma 4's per-layer embedding table is read a row per token at run time:
    /// [`Model::load_file`] sets the mapped file where this is `None`, the browser binding
    /// its range reader. [`PleRows::Gpu`] uploads the whole table instead.
    pub rows: Option<PleRows>,
    /// Where a mixture-of-experts model's experts live: by default on the GPU when they fit
    /// there, else streamed in from host memory layer by layer.
    pub experts: ExpertPlacement,
    /// A llama.cpp projector file (`mmproj`) whose vision and audio towers
    /// [`Model::load_file`] loads with the model (not needed when the model file holds the
    /// towers, as Ollama's do).
    #[cfg(not(target_arch = "wasm32"))]
    pub mmproj: Option<std::path::PathBuf>,
}

pub(crate) struct Inner {
    pub gpu: Arc<GpuModel>,
    /// The vision tower, from the model file or a projector file.
    pub vision: Option<Arc<VisionTower>>,
    /// The audio tower, likewise.
    pub audio: Option<Arc<AudioTower>>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub info: ModelInfo,
}

/// A LoRA adapter uploaded for one model; sessions of that model apply it with a scale
/// ([`Session::set_adapters`]). Cheap to clone.
#[derive(Clone)]
pub struct Adapter {
    pub(crate) gpu: Arc<wgemma_text::PreparedLora>,
}

/// A loaded model; cheap to clone, shared by its sessions.
#[derive(Clone)]
pub struct Model {
    pub(crate) inner: Arc<Inner>,
}

impl Model {
    /// Loads a model through any byte-range source: the header first (a few requests), then
    /// the weights tile by tile straight to the GPU.
    pub async fn load<R: RangeSource + ?Sized>(
        source: &R,
        opts: LoadOptions,
    ) -> Result<Self, Error> {
        Self::load_with_projector::<R, R>(source, None, opts).await
    }

    /// [`Model::load`] with the vision and audio towers of a llama.cpp projector file
    /// (`mmproj`) read through `projector`. The projector's header is read first, so a file
    /// without a tower fails before the model's weights are read; progress counts both files'
    /// weights.
    pub async fn load_with_projector<R: RangeSource + ?Sized, P: RangeSource + ?Sized>(
        source: &R,
        projector: Option<&P>,
        opts: LoadOptions,
    ) -> Result<Self, Error> {
        let (header, projector) = read_headers(source, projector).await?;
        Self::load_read(header, source, projector, opts).await
    }

    /// [`Model::load_with_projector`] once the headers are read.
    async fn load_read<R: RangeSource + ?Sized, P: RangeSource + ?Sized>(
        header: Gguf,
        source: &R,
        projector: Option<(&P, Gguf)>,
        mut opts: LoadOptions,
    ) -> Result<Self, Error> {
        let span = tracing::info_span!("load");
        let _enter = span.enter();
        let projector = match projector {
            Some((p, h)) => {
                let towers = Towers::of(&h)?;
                if towers.is_empty() {
                    return Err(Error::NoTower);
                }
                Some((p, h, towers))
            }
            None => None,
        };
        let ctx = match opts.context.take() {
            Some(c) => c,
            None => Arc::new(GpuContext::new(opts.gpu.clone()).await?),
        };
        // The projector's towers load after the model file's weights (and towers).
        let extra = projector
            .as_ref()
            .map_or(0, |(_, h, t)| t.bytes(h).iter().sum());
        let mut progress = opts.on_progress.take();
        let mut report = |done: u64, total: u64| {
            if let Some(f) = progress.as_mut() {
                f(LoadProgress { done, total });
            }
        };
        let mut model_total = 0;
        let mut model = Self::from_header(
            header,
            source,
            ctx.clone(),
            opts.rows.take(),
            opts.experts,
            &mut |p: LoadProgress| {
                model_total = p.total;
                report(p.done, p.total + extra);
            },
        )
        .await?;
        if let Some((projector, header, towers)) = projector {
            let total = model_total + extra;
            let (vision, audio) = towers
                .load(ctx, &header, projector, &mut |done| {
                    report(model_total + done, total)
                })
                .await?;
            if let Some(v) = vision {
                model.set_tower(Tower::Vision(Box::new(v)))?;
            }
            if let Some(a) = audio {
                model.set_tower(Tower::Audio(Box::new(a)))?;
            }
        }
        Ok(model)
    }

    /// Adds a projector file's tower, checked against the model's width.
    fn set_tower(&mut self, tower: Tower) -> Result<(), Error> {
        let width = self.inner.gpu.cfg.n_embd;
        let (what, projects_to) = match &tower {
            Tower::Vision(t) => ("vision", t.cfg.projection_dim),
            Tower::Audio(t) => ("audio", t.cfg.text_width),
        };
        check_projection(what, projects_to, width)?;
        let inner = Arc::get_mut(&mut self.inner).ok_or(Error::Busy)?;
        match tower {
            Tower::Vision(t) => inner.vision = Some(Arc::new(*t)),
            Tower::Audio(t) => inner.audio = Some(Arc::new(*t)),
        }
        Ok(())
    }

    async fn from_header<R: RangeSource + ?Sized>(
        header: Gguf,
        source: &R,
        ctx: Arc<GpuContext>,
        rows: Option<PleRows>,
        experts: ExpertPlacement,
        on_progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, Error> {
        let cfg = TextConfig::from_gguf(&header)?;
        if cfg.arch == wgemma_text::Arch::DiffusionGemma {
            return Err(Error::DiffusionModel);
        }
        let tokenizer = Tokenizer::from_metadata(&header.metadata, cfg.arch.name())?;
        let template = ChatTemplate::for_architecture(cfg.arch.name());
        let info = ModelInfo::new(&header);
        let placement = wgemma_text::LoadOptions {
            experts,
            ..Default::default()
        };
        // An Ollama blob holds its towers beside the text weights: they load after them,
        // within the same progress.
        let towers = Towers::of(&header)?;
        let tower_bytes: u64 = towers.bytes(&header).iter().sum();
        let mut text_total = 0;
        let gpu = GpuModel::load_with(
            ctx.clone(),
            &header,
            &cfg,
            source,
            rows,
            placement,
            &mut |p: LoadProgress| {
                text_total = p.total;
                on_progress(LoadProgress {
                    done: p.done,
                    total: p.total + tower_bytes,
                });
            },
        )
        .await?;
        let total = text_total + tower_bytes;
        let (vision, audio) = towers
            .load(ctx, &header, source, &mut |done| {
                on_progress(LoadProgress {
                    done: text_total + done,
                    total,
                })
            })
            .await?;
        let (vision, audio) = (vision.map(Arc::new), audio.map(Arc::new));
        tracing::info!(
            architecture = cfg.arch.name(),
            layers = cfg.n_layer,
            gpu_bytes = gpu.gpu_bytes(),
            streamed_experts = gpu.streams_experts(),
            "model loaded"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                gpu: Arc::new(gpu),
                vision,
                audio,
                tokenizer,
                template,
                info,
            }),
        })
    }

    /// Loads a local GGUF (native only).
    ///
    /// The headers (model and `mmproj`) are read with ordinary reads, so a file that is cut
    /// short, or is cut while its header is read, is an error. The weights are then uploaded
    /// from a memory map, and Gemma 4's per-layer embedding rows are read from that map for as
    /// long as the model lives: if the file is truncated or rewritten in place meanwhile, a
    /// read past its new end faults and the process dies of SIGBUS instead of returning an
    /// error (the risk every mmap-based loader takes, llama.cpp's included). Replace a model
    /// file by writing a new one and renaming it over the old: the map keeps the old file.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn load_file(
        path: impl AsRef<std::path::Path>,
        mut opts: LoadOptions,
    ) -> Result<Self, Error> {
        let (header, map) = read_and_map(path.as_ref())?;
        let map = Arc::new(map);
        if opts.rows.is_none() {
            opts.rows = Some(PleRows::Mapped(map.clone()));
        }
        let (projector_header, projector_map) = match opts.mmproj.take() {
            Some(p) => {
                let (h, m) = read_and_map(&p)?;
                (Some(h), Some(m))
            }
            None => (None, None),
        };
        let projector = projector_map.as_ref().zip(projector_header);
        Self::load_read(header, &map, projector, opts).await
    }

    /// Reads a LoRA adapter for this model from the bytes of a llama.cpp GGUF adapter, and
    /// uploads it (checked against the model's projections).
    pub fn adapter_from_gguf(&self, bytes: Vec<u8>) -> Result<Adapter, Error> {
        let g = Gguf::parse(&bytes)?;
        let lora = LoraAdapter::from_gguf(&g, &wgemma_gguf::BytesSource::new(bytes))?;
        self.adapter(lora)
    }

    /// Reads a PEFT adapter for this model from its `adapter_config.json` and
    /// `adapter_model.safetensors`, and uploads it.
    pub fn adapter_from_peft(&self, config: &[u8], safetensors: &[u8]) -> Result<Adapter, Error> {
        self.adapter(LoraAdapter::from_peft(config, safetensors)?)
    }

    /// Uploads an adapter read already.
    pub fn adapter(&self, lora: LoraAdapter) -> Result<Adapter, Error> {
        Ok(Adapter {
            gpu: self.inner.gpu.prepare_adapter(&lora)?,
        })
    }

    /// Reads a LoRA adapter from a path: a PEFT adapter's directory, or a GGUF adapter file.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_adapter(&self, path: impl AsRef<std::path::Path>) -> Result<Adapter, Error> {
        let path = path.as_ref();
        let lora = if path.is_dir() {
            LoraAdapter::from_peft_dir(path)?
        } else {
            let (g, map) = read_and_map(path)?;
            LoraAdapter::from_gguf(&g, &map)?
        };
        self.adapter(lora)
    }

    /// A new conversation with its own KV cache. Where an image's tokens see each other (Gemma
    /// 4 26B/31B with a vision tower), prefill steps take at least the largest image (1120
    /// soft tokens, or the whole context if shorter), which a step never cuts.
    pub fn session(&self, opts: SessionOptions) -> Result<Session, Error> {
        let gpu = GpuSession::new(self.inner.gpu.clone(), self.session_sizes(opts))?;
        Ok(Session::new(self.clone(), gpu))
    }

    /// A session whose cache is a slot of `pool` ([`crate::Batch`]).
    pub(crate) fn pooled_session(
        &self,
        opts: SessionOptions,
        pool: &Arc<wgemma_text::KvPool>,
    ) -> Result<Session, Error> {
        let gpu = GpuSession::in_pool(self.inner.gpu.clone(), self.session_sizes(opts), pool)?;
        Ok(Session::new(self.clone(), gpu))
    }

    /// The most sessions of `context` positions a pool holds.
    pub(crate) fn max_pooled_slots(&self, context: usize) -> usize {
        wgemma_text::KvPool::max_slots(&self.inner.gpu, context)
    }

    /// The pool of KV caches for `slots` sessions of `context` positions.
    pub(crate) fn kv_pool(
        &self,
        slots: usize,
        context: usize,
    ) -> Result<Arc<wgemma_text::KvPool>, Error> {
        Ok(wgemma_text::KvPool::new(
            self.inner.gpu.clone(),
            slots,
            context,
        )?)
    }

    /// `opts` with room for the largest image in one step where the model's images see each
    /// other.
    fn session_sizes(&self, mut opts: SessionOptions) -> SessionOptions {
        if self.vision().is_some() && self.config().bidirectional_images() {
            let largest = *wgemma_vision::TOKEN_BUDGETS.iter().max().unwrap_or(&0) as usize;
            opts.max_batch = opts.max_batch.max(largest.min(opts.context));
        }
        opts
    }

    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    pub fn config(&self) -> &TextConfig {
        &self.inner.gpu.cfg
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Token ids for a prompt (before images and clips become their soft tokens);
    /// `parse_special` as in [`crate::GenerateRequest::parse_special`].
    pub fn prompt_tokens(
        &self,
        prompt: &crate::Prompt,
        parse_special: bool,
    ) -> Result<Vec<u32>, Error> {
        prompt_ids(
            self.tokenizer(),
            self.chat_template(),
            prompt,
            parse_special,
        )
    }

    pub fn chat_template(&self) -> ChatTemplate {
        self.inner.template
    }

    /// One image's soft tokens, left on the GPU (see [`Model::encode_image_to_vec`]).
    pub async fn encode_image(&self, image: &ImageInput) -> Result<Encoded, Error> {
        encode_image(self.vision(), image).await
    }

    /// One image's soft tokens read back: `[tokens, model width]` row by row, and `tokens`.
    pub async fn encode_image_to_vec(
        &self,
        image: &ImageInput,
    ) -> Result<(Vec<f32>, usize), Error> {
        encode_image_to_vec(self.vision(), image).await
    }

    /// One clip's soft tokens, left on the GPU: one block of rows per 30 s chunk, in order.
    pub async fn encode_audio(&self, audio: &AudioInput) -> Result<Vec<Encoded>, Error> {
        let tower = self.audio().ok_or(Error::NoAudio)?;
        let mut out = Vec::with_capacity(audio.chunks().len());
        for chunk in audio.chunks() {
            let e = tower.encode(chunk).await?;
            out.push(Encoded {
                rows: e.rows,
                tokens: e.tokens,
                width: e.width,
            });
        }
        Ok(out)
    }

    /// One clip's soft tokens read back: `[tokens, model width]` row by row (all chunks), and
    /// `tokens`.
    pub async fn encode_audio_to_vec(
        &self,
        audio: &AudioInput,
    ) -> Result<(Vec<f32>, usize), Error> {
        let (mut rows, mut tokens) = (Vec::new(), 0);
        for e in self.encode_audio(audio).await? {
            rows.extend(self.gpu_context().read_f32(&e.rows).await?);
            tokens += e.tokens as usize;
        }
        Ok((rows, tokens))
    }

    /// The vocabulary's image markers (`<|image>`, `<|image|>`, `<image|>`).
    pub(crate) fn image_markers(&self) -> Option<Markers> {
        Markers::image(self.tokenizer())
    }

    /// The vocabulary's audio markers (`<|audio>`, `<|audio|>`, `<audio|>`).
    pub(crate) fn audio_markers(&self) -> Option<Markers> {
        Markers::audio(self.tokenizer())
    }

    /// The audio tower, when the model file or its projector file has one.
    pub fn audio(&self) -> Option<&Arc<AudioTower>> {
        self.inner.audio.as_ref()
    }

    /// The vision tower, when the model file or its projector file has one.
    pub fn vision(&self) -> Option<&Arc<VisionTower>> {
        self.inner.vision.as_ref()
    }

    /// The GPU this model lives on.
    pub fn gpu_context(&self) -> &Arc<GpuContext> {
        &self.inner.gpu.ctx
    }

    /// Bytes of weights on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.inner.gpu.gpu_bytes()
    }
}

/// The headers of a model file and of its projector file, if any (the projector with its
/// reader).
pub(crate) async fn read_headers<'p, R: RangeSource + ?Sized, P: RangeSource + ?Sized>(
    source: &R,
    projector: Option<&'p P>,
) -> Result<(Gguf, Option<(&'p P, Gguf)>), Error> {
    let (header, _) = read_header(source).await?;
    let projector = match projector {
        Some(p) => Some((p, read_header(p).await?.0)),
        None => None,
    };
    Ok((header, projector))
}

/// `done / total` of `part` bytes (a tower's own count scaled onto its share of the file, so
/// progress never goes back).
pub(crate) fn scaled(done: u64, total: u64, part: u64) -> u64 {
    let share = u128::from(done) * u128::from(part) / u128::from(total.max(1));
    (share as u64).min(part)
}

/// A tower a projector file adds.
enum Tower {
    Vision(Box<VisionTower>),
    Audio(Box<AudioTower>),
}

/// The towers a file holds: a projector file's, or an Ollama blob's beside its text model.
struct Towers {
    vision: Option<VisionConfig>,
    audio: Option<AudioConfig>,
}

impl Towers {
    fn of(g: &Gguf) -> Result<Self, Error> {
        Ok(Self {
            vision: VisionConfig::from_gguf(g)?,
            audio: AudioConfig::from_gguf(g)?,
        })
    }

    fn is_empty(&self) -> bool {
        self.vision.is_none() && self.audio.is_none()
    }

    /// Bytes of each tower's tensors in `g`: `[vision, audio]` (0 for a tower it lacks).
    fn bytes(&self, g: &Gguf) -> [u64; 2] {
        let sum = |has: bool, of: fn(&str) -> bool| -> u64 {
            let tensors = g.tensors().iter().filter(|t| of(&t.name));
            if has {
                tensors.map(|t| t.n_bytes).sum()
            } else {
                0
            }
        };
        [
            sum(self.vision.is_some(), |n| {
                n.starts_with("v.") || n.starts_with("mm.input_projection")
            }),
            sum(self.audio.is_some(), |n| {
                n.starts_with("a.") || n.starts_with("mm.a.")
            }),
        ]
    }

    /// Uploads the towers from `source` (the file `g` describes), vision first, calling
    /// `progress(done)` in bytes of [`Towers::bytes`]' sum (each tower's own count scaled
    /// onto its share, so progress never goes back).
    async fn load<R: RangeSource + ?Sized>(
        self,
        ctx: Arc<GpuContext>,
        g: &Gguf,
        source: &R,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(Option<VisionTower>, Option<AudioTower>), Error> {
        let [vision_bytes, audio_bytes] = self.bytes(g);
        let vision = match self.vision {
            Some(cfg) => Some(
                load_tower(ctx.clone(), g, &cfg, source, |done, all| {
                    progress(scaled(done, all, vision_bytes));
                })
                .await?,
            ),
            None => None,
        };
        let audio = match self.audio {
            Some(cfg) => Some(
                AudioTower::load(ctx, g, &cfg, source, |done, all| {
                    progress(vision_bytes + scaled(done, all, audio_bytes));
                })
                .await?,
            ),
            None => None,
        };
        Ok((vision, audio))
    }
}

/// One image's soft tokens from `vision` (a model's tower, if it has one), left on the GPU.
pub(crate) async fn encode_image(
    vision: Option<&Arc<VisionTower>>,
    image: &ImageInput,
) -> Result<Encoded, Error> {
    let vision = vision.ok_or(Error::NoVision)?;
    Ok(vision.encode(&image.patches()?).await?)
}

/// One image's soft tokens from `vision` read back: `[tokens, model width]` row by row, and
/// `tokens`.
pub(crate) async fn encode_image_to_vec(
    vision: Option<&Arc<VisionTower>>,
    image: &ImageInput,
) -> Result<(Vec<f32>, usize), Error> {
    let vision = vision.ok_or(Error::NoVision)?;
    let patches = image.patches()?;
    let rows = vision.encode_to_vec(&patches).await?;
    Ok((rows, patches.soft_tokens() as usize))
}

/// A `what` tower's output width against the model's: a projector for another model is an
/// error.
fn check_projection(what: &str, projects_to: usize, width: usize) -> Result<(), Error> {
    if projects_to != width {
        return Err(Error::Request(format!(
            "the {what} tower projects to width {projects_to}, the model is {width} wide: a projector for another model"
        )));
    }
    Ok(())
}

/// The vision tower of `g` (a projector file's, or a model file's own), if it has one:
/// uploaded from `source` with `progress(done, total)`, checked to project to `width` (a text
/// model's).
pub(crate) async fn vision_tower_in<R: RangeSource + ?Sized>(
    ctx: Arc<GpuContext>,
    g: &Gguf,
    source: &R,
    width: usize,
    progress: impl FnMut(u64, u64),
) -> Result<Option<VisionTower>, Error> {
    let Some(cfg) = VisionConfig::from_gguf(g)? else {
        return Ok(None);
    };
    check_projection("vision", cfg.projection_dim, width)?;
    load_tower(ctx, g, &cfg, source, progress).await.map(Some)
}

/// Bytes of the vision tower's tensors in `g` (0 without one).
pub(crate) fn vision_bytes(g: &Gguf) -> Result<u64, Error> {
    let towers = Towers {
        vision: VisionConfig::from_gguf(g)?,
        audio: None,
    };
    Ok(towers.bytes(g)[0])
}

/// The vision tower `cfg` describes (an mmproj file's, or an Ollama blob's), uploaded with
/// `progress(done, total)` in bytes.
async fn load_tower<R: RangeSource + ?Sized>(
    ctx: Arc<GpuContext>,
    header: &Gguf,
    cfg: &VisionConfig,
    source: &R,
    progress: impl FnMut(u64, u64),
) -> Result<VisionTower, Error> {
    let tower = VisionTower::load(ctx, header, cfg, source, progress).await?;
    tracing::info!(
        layers = cfg.n_layer,
        width = cfg.n_embd,
        "vision tower loaded"
    );
    Ok(tower)
}

/// The header of the GGUF at `path`, read with plain reads (a truncated file is an error, not
/// a SIGBUS), and the file mapped for its tensors. A file whose length changed between the
/// two is refused: the header would not describe the map.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn read_and_map(
    path: &std::path::Path,
) -> Result<(Gguf, wgemma_gguf::MmapSource), Error> {
    let open = |reason: String| crate::source::SourceError::Open {
        path: path.display().to_string(),
        reason,
    };
    let header = wgemma_gguf::read_file_header(path).map_err(|e| match e {
        wgemma_gguf::GgufError::Source(e) => Error::from(open(e.to_string())),
        e => Error::from(e),
    })?;
    let map = wgemma_gguf::MmapSource::open(path).map_err(|e| open(e.to_string()))?;
    let mapped = wgemma_gguf::TensorSource::len(&map);
    if mapped != header.file_len {
        return Err(open(format!(
            "the file changed while it was opened ({} bytes, then {mapped})",
            header.file_len
        ))
        .into());
    }
    Ok((header, map))
}

/// A text prompt as plain text whose [`crate::IMAGE_PLACEHOLDER`]s alone are markup.
/// Token ids for `prompt` with `tok` (and `template` for a conversation); `parse_special` as
/// in [`crate::GenerateRequest::parse_special`].
pub(crate) fn prompt_ids(
    tok: &Tokenizer,
    template: ChatTemplate,
    prompt: &crate::Prompt,
    parse_special: bool,
) -> Result<Vec<u32>, Error> {
    use crate::Prompt;
    let ids = match prompt {
        Prompt::Text(t) if parse_special => tok.encode(t, tok.add_bos_default(), true),
        Prompt::Text(t) => tok.encode_marked(&image_markup(t), tok.add_bos_default()),
        Prompt::Chat(messages) => {
            let marked = template.render_marked(messages, true)?;
            if parse_special {
                tok.encode(marked.as_str(), true, true)
            } else {
                tok.encode_marked(&marked, true)
            }
        }
        Prompt::Tokens(t) => t.clone(),
    };
    if ids.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    Ok(ids)
}

fn image_markup(text: &str) -> wgemma_text::tokenizer::MarkedText {
    let mut marked = wgemma_text::tokenizer::MarkedText::new();
    wgemma_text::chat::push_content(&mut marked, text);
    marked
}
