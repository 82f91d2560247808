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
use wgemma_gguf::{Gguf, RangeSource, read_header};
use wgemma_kernels::GpuContext;
use wgemma_text::chat::ChatTemplate;
use wgemma_text::tokenizer::{StreamDecoder, Tokenizer};
use wgemma_text::{LoadOptions as TextLoadOptions, LoadProgress};

use crate::clock::now_ms;
use crate::error::Error;
use crate::info::ModelInfo;
use crate::model::{LoadOptions, prompt_ids};
use crate::session::{CancelHandle, Event, Prompt, StopReason, Timings};

struct Inner {
    gpu: Arc<GpuDiffusion>,
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
    /// Loads a model through any byte-range source: the header first, then the weights.
    pub async fn load<R: RangeSource + ?Sized>(
        source: &R,
        opts: LoadOptions,
    ) -> Result<Self, Error> {
        let (header, _) = read_header(source).await?;
        Self::from_header(header, source, opts).await
    }

    /// Loads a model from a file (mapped; see [`crate::Model::load_file`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn load_file(
        path: impl AsRef<std::path::Path>,
        opts: LoadOptions,
    ) -> Result<Self, Error> {
        let (header, map) = crate::model::read_and_map(path.as_ref())?;
        Self::from_header(header, &map, opts).await
    }

    async fn from_header<R: RangeSource + ?Sized>(
        header: Gguf,
        source: &R,
        mut opts: LoadOptions,
    ) -> Result<Self, Error> {
        let span = tracing::info_span!("load");
        let _enter = span.enter();
        let cfg = DiffusionConfig::from_gguf(&header)?;
        let tokenizer = Tokenizer::from_metadata(&header.metadata, cfg.text.arch.name())?;
        let template = ChatTemplate::for_architecture(cfg.text.arch.name());
        let ctx = match opts.context.take() {
            Some(c) => c,
            None => Arc::new(GpuContext::new(opts.gpu.clone()).await?),
        };
        let mut progress = opts.on_progress.take();
        let placement = TextLoadOptions {
            experts: opts.experts,
            ..Default::default()
        };
        let gpu = GpuDiffusion::load(ctx, &header, &cfg, source, placement, |p: LoadProgress| {
            if let Some(f) = progress.as_mut() {
                f(p);
            }
        })
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                gpu: Arc::new(gpu),
                tokenizer,
                template,
                info: ModelInfo::new(&header),
            }),
        })
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
        let session = DiffusionSession::with_canvas(self.inner.gpu.clone(), context, rows)?;
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
}

impl DiffusionGenerate {
    pub fn new(prompt: Prompt, seed: u64) -> Self {
        Self {
            prompt,
            max_tokens: 256,
            sampler: None,
            seed,
            parse_special: false,
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
    /// then each finished block's tokens, then the end.
    pub fn generate(
        &mut self,
        req: DiffusionGenerate,
    ) -> impl Stream<Item = Result<Event, Error>> + '_ {
        let start = self.start(req);
        futures::stream::unfold((self, Some(start)), |(chat, run)| async move {
            let mut run = match run? {
                Ok(run) => run,
                Err(e) => return Some((Err(e), (chat, None))),
            };
            if run.done {
                return None;
            }
            let item = chat.next_event(&mut run).await;
            if item.is_err() {
                run.done = true;
            }
            Some((item, (chat, Some(Ok(run)))))
        })
    }

    fn start(&mut self, req: DiffusionGenerate) -> Result<Run, Error> {
        let m = &self.model;
        let prompt = prompt_ids(
            m.tokenizer(),
            m.chat_template(),
            &req.prompt,
            req.parse_special,
        )?;
        let sampler = req.sampler.unwrap_or(m.config().sampler);
        sampler.check().map_err(Error::Request)?;
        self.session.rewind(0)?;
        self.cancel.withdraw();
        let request = DiffusionRequest {
            max_new_tokens: req.max_tokens.max(1),
            sampler,
            stop_tokens: m.tokenizer().end_of_generation().to_vec(),
        };
        let timings = Timings {
            prompt_tokens: prompt.len(),
            ..Timings::default()
        };
        Ok(Run {
            blocks: BlockLoop::new(&self.session, prompt, request)?,
            rng: SeededRng::new(req.seed),
            decoder: StreamDecoder::new(),
            queued: Default::default(),
            timings,
            start_ms: now_ms(),
            denoise_start_ms: 0.0,
            done: false,
        })
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
