//! DiffusionGemma in the session API: a model that writes a block of tokens at a time by
//! denoising a canvas. A generation streams a [`Event::Draft`] after every denoising step (the
//! block's current best guess, redrawn as it condenses), the block's tokens as
//! [`Event::Token`]s once it is done, and the end with its timings.

use std::sync::Arc;

use futures::Stream;
use wgemma_diffusion::{
    BlockLoop, DiffusionConfig, DiffusionEvent, DiffusionRequest, DiffusionSession, EntropyBound,
    Finish, GpuDiffusion, SeededRng,
};
use wgemma_gguf::{Gguf, RangeSource};
use wgemma_kernels::GpuContext;
use wgemma_text::chat::ChatTemplate;
use wgemma_text::tokenizer::{StreamDecoder, Tokenizer};
use wgemma_text::{LoadOptions as TextLoadOptions, LoadProgress, SoftTokens};
use wgemma_vision::{Encoded, VisionTower};

use crate::clock::now_ms;
use crate::error::Error;
use crate::image::ImageInput;
use crate::info::ModelInfo;
use crate::media::{self, Inputs, Markers, Source, Span};
use crate::model::{LoadOptions, prompt_ids, read_headers, scaled, vision_tower_in};
use crate::session::{CancelHandle, Event, Prompt, StopReason, Timings};

struct Inner {
    gpu: Arc<GpuDiffusion>,
    /// The vision tower, from the model file or a projector file.
    vision: Option<Arc<VisionTower>>,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    info: ModelInfo,
}

/// A loaded DiffusionGemma model; cheap to clone, shared by its sessions.
#[derive(Clone)]
pub struct DiffusionModel {
    inner: Arc<Inner>,
}

/// Whether a GGUF header is a DiffusionGemma model's (run it with [`DiffusionModel`]).
pub fn is_diffusion(header: &Gguf) -> bool {
    header.architecture() == Some("diffusion-gemma")
}

impl DiffusionModel {
    /// Loads a model through any byte-range source: the header first, then the weights (and
    /// the vision tower, where the file holds one).
    pub async fn load<R: RangeSource + ?Sized>(
        source: &R,
        opts: LoadOptions,
    ) -> Result<Self, Error> {
        Self::load_with_projector::<R, R>(source, None, opts).await
    }

    /// [`DiffusionModel::load`] with the vision tower of a llama.cpp projector file (`mmproj`)
    /// read through `projector`, whose header is read first: a file without a vision tower
    /// fails before the model's weights are read.
    pub async fn load_with_projector<R: RangeSource + ?Sized, P: RangeSource + ?Sized>(
        source: &R,
        projector: Option<&P>,
        opts: LoadOptions,
    ) -> Result<Self, Error> {
        let (header, projector) = read_headers(source, projector).await?;
        Self::from_header(header, source, projector, opts).await
    }

    /// Loads a model from a file (mapped; see [`crate::Model::load_file`]), with
    /// `opts.mmproj`'s vision tower where given.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn load_file(
        path: impl AsRef<std::path::Path>,
        mut opts: LoadOptions,
    ) -> Result<Self, Error> {
        let (header, map) = crate::model::read_and_map(path.as_ref())?;
        let projector = match opts.mmproj.take() {
            Some(p) => Some(crate::model::read_and_map(&p)?),
            None => None,
        };
        let projector = projector.as_ref().map(|(h, m)| (m, h.clone()));
        Self::from_header(header, &map, projector, opts).await
    }

    async fn from_header<R: RangeSource + ?Sized, P: RangeSource + ?Sized>(
        header: Gguf,
        source: &R,
        projector: Option<(&P, Gguf)>,
        mut opts: LoadOptions,
    ) -> Result<Self, Error> {
        let span = tracing::info_span!("load");
        let _enter = span.enter();
        let cfg = DiffusionConfig::from_gguf(&header)?;
        let tower_bytes = crate::model::vision_bytes(projector.as_ref().map_or(&header, |p| &p.1))?;
        if projector.is_some() && tower_bytes == 0 {
            return Err(Error::NoTower);
        }
        let tokenizer = Tokenizer::from_metadata(&header.metadata, cfg.text.arch.name())?;
        let template = ChatTemplate::for_architecture(cfg.text.arch.name());
        let ctx = match opts.context.take() {
            Some(c) => c,
            None => Arc::new(GpuContext::new(opts.gpu.clone()).await?),
        };
        let mut progress = opts.on_progress.take();
        let mut report = |done: u64, total: u64| {
            if let Some(f) = progress.as_mut() {
                f(LoadProgress { done, total });
            }
        };
        let placement = TextLoadOptions {
            experts: opts.experts,
            ..Default::default()
        };
        let mut text_total = 0;
        let gpu = GpuDiffusion::load(ctx.clone(), &header, &cfg, source, placement, |p| {
            text_total = p.total;
            report(p.done, p.total + tower_bytes);
        })
        .await?;
        let width = cfg.text.n_embd;
        let total = text_total + tower_bytes;
        let tower_progress = |done, all| report(text_total + scaled(done, all, tower_bytes), total);
        let vision = match projector {
            Some((p, h)) => vision_tower_in(ctx, &h, p, width, tower_progress).await?,
            None => vision_tower_in(ctx, &header, source, width, tower_progress).await?,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                gpu: Arc::new(gpu),
                vision: vision.map(Arc::new),
                tokenizer,
                template,
                info: ModelInfo::new(&header),
            }),
        })
    }

    /// The vision tower, when the model file or its projector file has one.
    pub fn vision(&self) -> Option<&Arc<VisionTower>> {
        self.inner.vision.as_ref()
    }

    /// One image's soft tokens, left on the GPU.
    pub async fn encode_image(&self, image: &ImageInput) -> Result<Encoded, Error> {
        crate::model::encode_image(self.vision(), image).await
    }

    /// One image's soft tokens read back: `[tokens, model width]` row by row, and `tokens`.
    pub async fn encode_image_to_vec(
        &self,
        image: &ImageInput,
    ) -> Result<(Vec<f32>, usize), Error> {
        crate::model::encode_image_to_vec(self.vision(), image).await
    }

    pub fn config(&self) -> &DiffusionConfig {
        &self.inner.gpu.cfg
    }

    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    pub fn chat_template(&self) -> ChatTemplate {
        self.inner.template
    }

    /// The GPU the model runs on.
    pub fn gpu_context(&self) -> &Arc<GpuContext> {
        &self.inner.gpu.text.ctx
    }

    /// Bytes the weights hold on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.inner.gpu.text.gpu_bytes()
    }

    /// A session of `context` positions (the prompt and every block it generates), whose
    /// blocks are `canvas` tokens (`None`: the model's canvas length).
    pub fn session(&self, context: usize, canvas: Option<usize>) -> Result<DiffusionChat, Error> {
        let limit = self.config().text.context_length.max(1);
        if context == 0 || context > limit {
            return Err(Error::Request(format!(
                "a context of {context} positions (this model holds 1 to {limit})"
            )));
        }
        let rows = canvas.unwrap_or(self.config().canvas_length);
        // An image's tokens see each other: a prompt step holds the largest image whole.
        let chunk = match self.vision() {
            Some(_) => *wgemma_vision::TOKEN_BUDGETS.iter().max().unwrap_or(&0) as usize,
            None => 0,
        };
        let session =
            DiffusionSession::with_chunk(self.inner.gpu.clone(), context, rows, chunk.max(512))?;
        Ok(DiffusionChat {
            model: self.clone(),
            session,
            cancel: CancelHandle::default(),
        })
    }
}

/// One DiffusionGemma generation request.
#[derive(Clone, Debug)]
pub struct DiffusionGenerate {
    pub prompt: Prompt,
    /// Tokens to generate at most (blocks are denoised whole; the last is cut).
    pub max_tokens: usize,
    /// The sampler's settings; `None` takes the model's.
    pub sampler: Option<EntropyBound>,
    /// The same seed and request give the same reply.
    pub seed: u64,
    /// Turn control-token text in the prompt into control tokens.
    pub parse_special: bool,
    /// The prompt's images, in order, as [`crate::GenerateRequest::images`] (the model needs a
    /// vision tower: [`DiffusionModel::vision`]).
    pub images: Vec<ImageInput>,
}

impl DiffusionGenerate {
    pub fn new(prompt: Prompt, seed: u64) -> Self {
        Self {
            prompt,
            max_tokens: 256,
            sampler: None,
            seed,
            parse_special: false,
            images: Vec::new(),
        }
    }
}

/// A DiffusionGemma generation's state: a fresh cache per request (a later request does not
/// continue an earlier one).
pub struct DiffusionChat {
    model: DiffusionModel,
    session: DiffusionSession,
    cancel: CancelHandle,
}

/// Per-request state of the stream.
struct Run {
    blocks: BlockLoop,
    rng: SeededRng,
    decoder: StreamDecoder,
    /// Tokens of a finished block not yet streamed.
    queued: std::collections::VecDeque<u32>,
    timings: Timings,
    start_ms: f64,
    denoise_start_ms: f64,
    done: bool,
}

impl DiffusionChat {
    /// Stops the running generation at its next step.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    pub fn model(&self) -> &DiffusionModel {
        &self.model
    }

    /// Generates a reply to `req` as a stream of events: a draft after each denoising step,
    /// then each finished block's tokens, then the end. The request's images are encoded when
    /// the stream is first polled.
    pub fn generate(
        &mut self,
        req: DiffusionGenerate,
    ) -> impl Stream<Item = Result<Event, Error>> + '_ {
        futures::stream::unfold((self, Some(req), None), |(chat, req, run)| async move {
            let mut run: Run = match (req, run) {
                (Some(req), _) => match chat.start(req).await {
                    Ok(run) => run,
                    Err(e) => return Some((Err(e), (chat, None, None))),
                },
                (None, Some(run)) => run,
                (None, None) => return None,
            };
            if run.done {
                return None;
            }
            let item = chat.next_event(&mut run).await;
            if item.is_err() {
                run.done = true;
            }
            Some((item, (chat, None, Some(run))))
        })
    }

    async fn start(&mut self, req: DiffusionGenerate) -> Result<Run, Error> {
        let start_ms = now_ms();
        let m = &self.model;
        let prompt = prompt_ids(
            m.tokenizer(),
            m.chat_template(),
            &req.prompt,
            req.parse_special,
        )?;
        let sampler = req.sampler.unwrap_or(m.config().sampler);
        sampler.check().map_err(Error::Request)?;
        let (prompt, spans) = self.expand_images(prompt, &req.images)?;
        self.session.rewind(0)?;
        self.cancel.withdraw();
        let request = DiffusionRequest {
            max_new_tokens: req.max_tokens.max(1),
            sampler,
            stop_tokens: self.model.tokenizer().end_of_generation().to_vec(),
        };
        let prompt_tokens = prompt.len();
        // The room is checked before any image is encoded.
        let blocks = BlockLoop::new(&self.session, prompt, request)?;
        let soft = self.encode_images(&spans, &req.images).await?;
        let timings = Timings {
            prompt_tokens,
            encoded_images: soft.len(),
            encode_ms: now_ms() - start_ms,
            ..Timings::default()
        };
        Ok(Run {
            blocks: blocks.with_soft(soft),
            rng: SeededRng::new(req.seed),
            decoder: StreamDecoder::new(),
            queued: Default::default(),
            timings,
            start_ms,
            denoise_start_ms: 0.0,
            done: false,
        })
    }

    /// `prompt` with each image placeholder expanded to its marker block, and where each
    /// image's soft tokens go.
    fn expand_images(
        &self,
        prompt: Vec<u32>,
        images: &[ImageInput],
    ) -> Result<(Vec<u32>, Vec<Span>), Error> {
        if images.is_empty() {
            return Ok((prompt, Vec::new()));
        }
        if self.model.vision().is_none() {
            return Err(Error::NoVision);
        }
        let inputs = Inputs {
            images,
            audio: &[],
            image_markers: Markers::image(self.model.tokenizer()),
            audio_markers: None,
        };
        media::expand(&prompt, &inputs)
    }

    /// The images' soft tokens (encoded by the vision tower) over their `spans`.
    async fn encode_images(
        &self,
        spans: &[Span],
        images: &[ImageInput],
    ) -> Result<Vec<SoftTokens>, Error> {
        let mut soft = Vec::with_capacity(spans.len());
        for span in spans {
            let Source::Image(i) = span.source else {
                continue;
            };
            let encoded = self.model.encode_image(&images[i]).await?;
            soft.push(SoftTokens {
                at: span.at,
                rows: encoded.rows,
                bidirectional: true,
            });
        }
        Ok(soft)
    }

    async fn next_event(&mut self, run: &mut Run) -> Result<Event, Error> {
        loop {
            if let Some(id) = run.queued.pop_front() {
                let text = run.decoder.push(self.model.tokenizer(), id);
                return Ok(Event::Token {
                    id,
                    text,
                    logprobs: None,
                });
            }
            if self.cancel.take() {
                run.blocks.cancel();
            }
            let Some(event) = run.blocks.next(&mut self.session, &mut run.rng).await? else {
                run.done = true;
                return Err(Error::Request("the generation has ended".into()));
            };
            match event {
                DiffusionEvent::Encoded { .. } => {
                    run.denoise_start_ms = now_ms();
                    run.timings.prompt_ms = run.denoise_start_ms - run.start_ms;
                }
                DiffusionEvent::Step {
                    block,
                    step,
                    outcome,
                } => {
                    run.timings.denoising_steps += 1;
                    let eog = self.model.tokenizer().end_of_generation();
                    let cut = outcome
                        .argmax
                        .iter()
                        .position(|t| eog.contains(t))
                        .unwrap_or(outcome.argmax.len());
                    let text = self.model.tokenizer().decode(&outcome.argmax[..cut]);
                    return Ok(Event::Draft { block, step, text });
                }
                DiffusionEvent::Block { tokens, .. } => {
                    run.timings.blocks += 1;
                    run.timings.generated_tokens += tokens.len();
                    run.queued.extend(tokens);
                }
                DiffusionEvent::Done(out) => {
                    run.done = true;
                    run.timings.decode_ms = now_ms() - run.denoise_start_ms;
                    let reason = match out.finish {
                        Finish::Stop => StopReason::EndOfGeneration,
                        Finish::Length => StopReason::MaxTokens,
                        Finish::Cancelled => StopReason::Cancelled,
                    };
                    return Ok(Event::Done {
                        reason,
                        timings: run.timings,
                    });
                }
            }
        }
    }
}
