//! A conversation: generation as a stream of events, cancellation, and KV-cache reuse across
//! turns (a new request feeds only what differs from what the cache already holds).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::Stream;
use tracing::Instrument;
use wgemma_kernels::Profiler;
use wgemma_text::chat::Message;
use wgemma_text::tokenizer::StreamDecoder;
use wgemma_text::{
    ForwardError, GpuSession, MAX_TOP_LOGPROBS, PrefillWatch, SamplingParams, SoftTokens,
    TokenLogprobs,
};

use crate::audio::AudioInput;
use crate::clock::now_ms;
use crate::error::Error;
use crate::image::ImageInput;
use crate::media::{self, Inputs, Source, Span};
use crate::model::{Adapter, Model};
use crate::repeat::RecentText;

/// What to generate from.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Plain text, tokenized as is (no chat template).
    Text(String),
    /// A conversation, rendered with the model's chat template and ending with the prompt
    /// for the model's turn.
    Chat(Vec<Message>),
    /// Token ids, fed as given.
    Tokens(Vec<u32>),
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops when the text contains any of these (the stop string is not emitted).
    pub stop: Vec<String>,
    /// The prompt's images, in order: the images of every message of a chat (each message's
    /// [`crate::Message::images`] of them, earlier turns' too: those already in the cache are
    /// not encoded again), or one per `<|image|>` placeholder of a text or token prompt.
    pub images: Vec<ImageInput>,
    /// The prompt's audio clips, in order, as [`GenerateRequest::images`] (one per
    /// `<|audio|>` placeholder; a chat message's [`crate::Message::audio`] of them).
    pub audio: Vec<AudioInput>,
    /// Whether control-token text in the prompt's text (`<end_of_turn>` typed by a user)
    /// becomes control tokens. Off by default: text is plain text and only the chat template
    /// adds control tokens (and, in a text prompt, [`crate::IMAGE_PLACEHOLDER`] marks where an
    /// image goes).
    pub parse_special: bool,
    /// Stop when the reply starts repeating itself in a loop ([`StopReason::Loop`]): the same
    /// stretch of text three times in a row at its end. Off by default: a model's output is
    /// never cut short unless asked.
    pub stop_loops: bool,
    /// Report each generated token's log-probability and those of the this many most likely
    /// tokens (at most [`wgemma_text::MAX_TOP_LOGPROBS`]) in its [`Event::Token`]. Steps are
    /// then queued one at a time.
    pub logprobs: Option<u32>,
    /// Generate past end-of-turn and end-of-sequence tokens (they are emitted as text like any
    /// other) until `max_tokens`, a stop string or the context's end: for benchmarks that need
    /// a fixed length, as llama-server's and vLLM's `ignore_eos`. Off by default.
    pub ignore_eos: bool,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens: 256,
            stop: Vec::new(),
            images: Vec::new(),
            audio: Vec::new(),
            parse_special: false,
            stop_loops: false,
            logprobs: None,
            ignore_eos: false,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-turn or end-of-sequence token.
    EndOfGeneration,
    MaxTokens,
    StopString,
    Cancelled,
    /// The KV cache is full.
    ContextFull,
    /// The reply repeated itself in a loop ([`GenerateRequest::stop_loops`]).
    Loop,
}

/// Where time went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens in the request.
    pub prompt_tokens: usize,
    /// Of those, how many were already in the cache.
    pub cached_tokens: usize,
    /// Time to the first generated token (prefill and first sample).
    pub prompt_ms: f64,
    pub generated_tokens: usize,
    /// Time from the first to the last generated token.
    pub decode_ms: f64,
    /// Images the request encoded (those the cache held already are not), and the time
    /// that took (part of `prompt_ms`).
    pub encoded_images: usize,
    /// Audio clips the request encoded (likewise; their time is in `encode_ms` too).
    pub encoded_audio: usize,
    pub encode_ms: f64,
    /// Text diffusion (DiffusionGemma): blocks generated and denoising steps over them
    /// (`decode_ms` is their time); 0 for a model that writes a token at a time.
    pub blocks: usize,
    pub denoising_steps: usize,
}

impl Timings {
    /// Prompt tokens processed per second.
    pub fn prompt_tok_per_s(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / (self.prompt_ms / 1e3).max(1e-9)
    }

    /// Generated tokens per second after the first (text diffusion: all of them, over the
    /// denoising time).
    pub fn decode_tok_per_s(&self) -> f64 {
        let counted = if self.blocks > 0 {
            self.generated_tokens
        } else {
            self.generated_tokens.saturating_sub(1)
        };
        counted as f64 / (self.decode_ms / 1e3).max(1e-9)
    }

    /// Text diffusion: the mean time of a denoising step (with the encoder passes between
    /// blocks).
    pub fn ms_per_step(&self) -> f64 {
        self.decode_ms / self.denoising_steps.max(1) as f64
    }
}

/// What a generation stream yields.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A generated token; `text` is the text it completes (possibly empty while a UTF-8
    /// character or a possible stop string is incomplete); its log-probabilities where the
    /// request asked ([`GenerateRequest::logprobs`]).
    Token {
        id: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    /// Text diffusion (DiffusionGemma): after denoising step `step` of block `block`, the
    /// block's current best guess (cut at an end-of-generation token). Each draft replaces
    /// the one before; the block's tokens follow as [`Event::Token`]s once it is done.
    Draft {
        block: usize,
        step: u32,
        text: String,
    },
    /// The end, with why and how fast.
    Done {
        reason: StopReason,
        timings: Timings,
    },
}

/// Where one step's GPU time went ([`Session::profile`]).
#[derive(Clone, Debug)]
pub struct StepProfile {
    /// `prefill` or `decode`.
    pub what: &'static str,
    pub tokens: usize,
    /// Per kernel: its name, how many dispatches, their total microseconds; costliest first.
    pub kernels: Vec<(&'static str, usize, f64)>,
}

/// Stops a running generation from elsewhere (another task, a UI button).
#[derive(Clone, Debug, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Withdraws a cancel no generation has acted on yet, so it cannot stop the next one.
    pub fn withdraw(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

/// A conversation with a model: its KV cache lives on the GPU between requests.
pub struct Session {
    model: Model,
    gpu: GpuSession,
    cancel: CancelHandle,
    /// Where the cache holds images' and clips' soft tokens.
    media: Vec<Span>,
}

/// Per-request state of the generation loop, over the session it runs in (passed to each
/// method, so that a [`crate::Batch`] can hold many of both).
pub(crate) struct Run {
    req: GenerateRequest,
    decoder: StreamDecoder,
    /// Text decoded but held back because it might begin a stop string.
    held: String,
    /// The last token read back.
    last: Option<u32>,
    /// Prompt tokens in the cache (where generated tokens start).
    prompt_len: usize,
    /// Sampling steps queued so far.
    submitted: usize,
    generated: usize,
    timings: Timings,
    start_ms: f64,
    first_ms: f64,
    /// The end, when text still had to go out before it.
    pending_done: Option<StopReason>,
    done: bool,
    /// The end of the reply, for [`GenerateRequest::stop_loops`].
    recent: RecentText,
    /// Decode steps are queued ahead of the readback (a session generating alone); off,
    /// each token comes from a step the caller runs ([`crate::Batch`]).
    pipelined: bool,
    /// The log-probabilities of the token read last, for its event.
    logprobs: Option<TokenLogprobs>,
    /// What the cache held of the prompt when the request came, where a [`crate::Batch`]
    /// read the rest in chunks before the run started (its timings count those as read).
    arrived_cached: Option<usize>,
}

impl Session {
    pub(crate) fn new(model: Model, gpu: GpuSession) -> Self {
        Self {
            model,
            gpu,
            cancel: CancelHandle::default(),
            media: Vec::new(),
        }
    }

    pub(crate) fn gpu_mut(&mut self) -> &mut GpuSession {
        &mut self.gpu
    }

    /// Compiles the GPU pipelines a request uses, so that the first request does not wait
    /// for them (hundreds of milliseconds in a browser): call it after creating the session,
    /// before the user's first prompt arrives.
    pub fn compile_pipelines(&self) -> Result<(), Error> {
        Ok(self.gpu.compile_pipelines()?)
    }

    /// A handle that stops the current (or next) generation within one step.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Applies LoRA adapters (uploaded for this session's model), each with its scale, to
    /// what the session computes from now on, in place of the ones before; none is the base
    /// model. Positions already in the cache keep what they were computed with: call
    /// [`Session::reset`] to recompute a conversation under new adapters.
    pub async fn set_adapters(&mut self, adapters: &[(Adapter, f32)]) -> Result<(), Error> {
        self.gpu.drain().await?;
        let gpu: Vec<_> = adapters.iter().map(|(a, s)| (a.gpu.clone(), *s)).collect();
        Ok(self.gpu.set_adapters(&gpu)?)
    }

    /// Calls `progress(done, total)` with the prompt tokens read so far after each pass of a
    /// prompt that takes several (of [`SessionOptions::max_batch`] tokens each): a progress
    /// bar for long prompts. While it is set, [`CancelHandle::cancel`] also stops a long
    /// prompt between passes (the reply ends with [`StopReason::Cancelled`], and the cache
    /// keeps what was read). Passes are then waited for one by one, a small cost.
    ///
    /// [`SessionOptions::max_batch`]: wgemma_text::SessionOptions::max_batch
    pub fn set_prompt_progress(
        &mut self,
        progress: Option<Box<dyn FnMut(usize, usize) + Send + Sync>>,
    ) {
        let cancel = self.cancel.clone();
        self.gpu.watch_prefill(progress.map(|mut progress| {
            Box::new(move |done, total| {
                progress(done, total);
                if cancel.take() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }) as PrefillWatch
        }));
    }

    /// Tokens in the KV cache.
    pub fn cached_tokens(&self) -> &[u32] {
        self.gpu.tokens()
    }

    /// Prepares `req`'s text prompt, `tokens` ([`Session::text_prompt`]), to be read `chunk`
    /// tokens at a time ([`crate::Batch`]): where it fits the context and more than `chunk`
    /// of its tokens are not cached, drops the cache past what it shares with the prompt and
    /// returns that shared length. `None`: the request starts as usual, its prompt read at
    /// once (and its run says what is wrong with it, if anything).
    pub(crate) async fn chunked_prompt(
        &mut self,
        req: &GenerateRequest,
        tokens: &[u32],
        chunk: usize,
    ) -> Result<Option<usize>, Error> {
        if chunk == 0 || tokens.is_empty() || tokens.len() + 1 > self.gpu.capacity() {
            return Ok(None);
        }
        check_request(req)?;
        self.gpu.drain().await?;
        let common = media::reusable_prefix(self.gpu.tokens(), &self.media, tokens, &[])
            .min(tokens.len() - 1);
        if tokens.len() - common <= chunk {
            return Ok(None);
        }
        self.gpu.rewind(common)?;
        self.media.retain(|i| i.at + i.len <= common);
        Ok(Some(common))
    }

    /// `req`'s prompt as tokens where it is text only (and well formed).
    pub(crate) fn text_prompt(&self, req: &GenerateRequest) -> Option<Vec<u32>> {
        if !req.images.is_empty() || !req.audio.is_empty() {
            return None;
        }
        expanded_prompt(&self.model, req)
            .ok()
            .and_then(|(tokens, spans)| spans.is_empty().then_some(tokens))
    }

    /// Positions from the start of the cache that hold text (before its first image or clip).
    pub(crate) fn text_prefix(&self) -> usize {
        let first = self.media.iter().map(|m| m.at).min();
        first.unwrap_or(usize::MAX).min(self.gpu.tokens().len())
    }

    /// Takes the first `len` positions of `from`'s cache (another slot of the same pool, text
    /// there: [`Session::text_prefix`]) in place of its own conversation.
    pub(crate) async fn adopt_prefix(&mut self, from: &Session, len: usize) -> Result<(), Error> {
        if len > from.text_prefix() {
            return Err(Error::Request(format!(
                "{len} positions asked for, {} of text held",
                from.text_prefix()
            )));
        }
        self.gpu.drain().await?;
        self.gpu.adopt_prefix(&from.gpu, len)?;
        self.media.clear();
        Ok(())
    }

    /// Reads `tokens` into the cache after what it holds: a chunk of a prompt.
    pub(crate) async fn read_chunk(&mut self, tokens: &[u32]) -> Result<(), Error> {
        self.gpu.fetch_rows(tokens).await?;
        Ok(self.gpu.feed(tokens).await?)
    }

    /// Whether a cancel waits to be acted on.
    pub(crate) fn cancel_requested(&self) -> bool {
        self.cancel.0.load(Ordering::Relaxed)
    }

    /// Positions the session holds.
    pub fn capacity(&self) -> usize {
        self.gpu.capacity()
    }

    /// Forgets the conversation (the cache is reused from the start).
    pub async fn reset(&mut self) -> Result<(), Error> {
        self.gpu.drain().await?;
        Ok(self.gpu.rewind(0)?)
    }

    /// Token ids for a prompt; `parse_special` as in [`GenerateRequest::parse_special`].
    pub fn prompt_tokens(&self, prompt: &Prompt, parse_special: bool) -> Result<Vec<u32>, Error> {
        self.model.prompt_tokens(prompt, parse_special)
    }

    /// Runs tokens through the model without generating (teacher forcing): after each token,
    /// the token the model ranks first and its logit. Starts from an empty cache.
    pub async fn score(&mut self, tokens: &[u32]) -> Result<Vec<(u32, f32)>, Error> {
        self.score_with_images(tokens, &[]).await
    }

    /// [`Session::score`] with images: each `(pos, image)` puts the image's soft tokens at
    /// `tokens[pos..]`, which must hold as many image placeholders (`<|image|>`).
    pub async fn score_with_images(
        &mut self,
        tokens: &[u32],
        images: &[(usize, ImageInput)],
    ) -> Result<Vec<(u32, f32)>, Error> {
        let media: Vec<_> = images
            .iter()
            .map(|(at, i)| (*at, MediaInput::Image(i.clone())))
            .collect();
        self.score_with(tokens, &media).await
    }

    /// [`Session::score`] with images and audio: each `(pos, input)` puts the input's soft
    /// tokens at `tokens[pos..]`, which must hold as many of its placeholders (`<|image|>`,
    /// `<|audio|>`; a long clip's chunks one after the other).
    pub async fn score_with(
        &mut self,
        tokens: &[u32],
        inputs: &[(usize, MediaInput)],
    ) -> Result<Vec<(u32, f32)>, Error> {
        self.gpu.drain().await?;
        self.gpu.rewind(0)?;
        self.media.clear();
        let soft = self.soft_tokens(tokens, inputs).await?;
        let r = self.gpu.score_with(tokens, &soft).await;
        if r.is_err() {
            self.gpu.rewind(0)?;
        }
        Ok(r?)
    }

    /// Encodes each `(pos, input)` into the soft tokens that go at `tokens[pos..]`, checking
    /// that the tokens there are as many of the input's placeholders.
    async fn soft_tokens(
        &self,
        tokens: &[u32],
        inputs: &[(usize, MediaInput)],
    ) -> Result<Vec<SoftTokens>, Error> {
        let mut soft = Vec::with_capacity(inputs.len());
        for (at, input) in inputs {
            let (encoded, markers, bidirectional) = match input {
                MediaInput::Image(i) => (
                    vec![self.model.encode_image(i).await?],
                    self.model.image_markers(),
                    true,
                ),
                MediaInput::Audio(a) => (
                    self.model.encode_audio(a).await?,
                    self.model.audio_markers(),
                    false,
                ),
            };
            let len: usize = encoded.iter().map(|e| e.tokens as usize).sum();
            let soft_id = markers
                .ok_or_else(|| {
                    Error::Request("the vocabulary has no tokens for this input".into())
                })?
                .soft;
            if tokens
                .get(*at..at + len)
                .is_none_or(|t| t.iter().any(|&x| x != soft_id))
            {
                return Err(Error::Request(format!(
                    "an input of {len} soft tokens at token {at}: the tokens there are not {len} of its placeholders"
                )));
            }
            let mut pos = *at;
            for e in encoded {
                let n = e.tokens as usize;
                soft.push(SoftTokens {
                    at: pos,
                    rows: e.rows,
                    bidirectional,
                });
                pos += n;
            }
        }
        Ok(soft)
    }

    /// GPU time per kernel of one pass over `tokens` (a prefill) and of one decode step after
    /// it (timed as [`wgemma_kernels::Recorder::profiled`] says): `None` when the adapter has
    /// no timestamp queries. Starts from an empty cache and leaves one.
    pub async fn profile(&mut self, tokens: &[u32]) -> Result<Option<Vec<StepProfile>>, Error> {
        self.profile_fed(tokens, &[]).await
    }

    /// [`Session::profile`] of a request's prompt with its images and clips: each tower's
    /// forward on each input first (`vision`, `audio`: one entry an image or a 30 s chunk),
    /// then the prefill with their soft tokens in place and one decode step. Starts from an
    /// empty cache and leaves one.
    pub async fn profile_request(
        &mut self,
        req: &GenerateRequest,
    ) -> Result<Option<Vec<StepProfile>>, Error> {
        let (tokens, spans) = expanded_prompt(&self.model, req)?;
        if spans.is_empty() {
            return self.profile(&tokens).await;
        }
        let mut towers = Vec::new();
        let mut placed = Vec::with_capacity(spans.len());
        for span in &spans {
            let input = match span.source {
                Source::Image(i) => MediaInput::Image(req.images[i].clone()),
                Source::Audio(i) => MediaInput::Audio(req.audio[i].clone()),
            };
            match self.profile_tower(&input).await? {
                Some(steps) => towers.extend(steps),
                None => return Ok(None),
            }
            placed.push((span.at, input));
        }
        self.gpu.drain().await?;
        self.gpu.rewind(0)?;
        self.media.clear();
        let soft = self.soft_tokens(&tokens, &placed).await?;
        Ok(self.profile_fed(&tokens, &soft).await?.map(|steps| {
            towers.extend(steps);
            towers
        }))
    }

    /// One input's tower forward, timed per kernel (`None` without timestamp queries).
    async fn profile_tower(&self, input: &MediaInput) -> Result<Option<Vec<StepProfile>>, Error> {
        let mut steps = Vec::new();
        match input {
            MediaInput::Image(image) => {
                let vision = self.model.vision().ok_or(Error::NoVision)?;
                let patches = image.patches()?;
                let Some(kernels) = vision.profile(&patches).await? else {
                    return Ok(None);
                };
                steps.push(StepProfile {
                    what: "vision",
                    tokens: patches.soft_tokens() as usize,
                    kernels,
                });
            }
            MediaInput::Audio(clip) => {
                let tower = self.model.audio().ok_or(Error::NoAudio)?;
                for chunk in clip.chunks() {
                    let Some(kernels) = tower.profile(chunk).await? else {
                        return Ok(None);
                    };
                    steps.push(StepProfile {
                        what: "audio",
                        tokens: chunk.soft_tokens,
                        kernels,
                    });
                }
            }
        }
        Ok(Some(steps))
    }

    /// [`Session::profile`] with `soft` tokens in the prefill.
    async fn profile_fed(
        &mut self,
        tokens: &[u32],
        soft: &[SoftTokens],
    ) -> Result<Option<Vec<StepProfile>>, Error> {
        let ctx = self.model.gpu_context().clone();
        let Some(mut profiler) = Profiler::new(&ctx, 4096) else {
            return Ok(None);
        };
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.gpu.drain().await?;
        self.gpu.rewind(0)?;
        let mut steps = Vec::new();
        for (what, fed, soft) in [("prefill", tokens, soft), ("decode", &tokens[..1], &[][..])] {
            self.gpu.fetch_rows(fed).await?;
            if !soft.is_empty() {
                self.gpu.fetch_rows(&[self.model.config().pad_id]).await?;
            }
            let r = self.gpu.feed_profiled(fed, soft, Some(&mut profiler)).await;
            let kernels = profiler.read(&ctx).await;
            r?;
            steps.push(StepProfile {
                what,
                tokens: fed.len(),
                kernels: kernels?,
            });
        }
        self.gpu.rewind(0)?;
        Ok(Some(steps))
    }

    /// Generates a reply. Dropping the stream stops generation; the session stays usable
    /// either way, and its cache keeps everything fed so far for the next request.
    pub fn generate(
        &mut self,
        req: GenerateRequest,
    ) -> impl Stream<Item = Result<Event, Error>> + '_ {
        futures::stream::unfold((self, Run::new(req)), |(s, mut run)| async move {
            if run.done {
                return None;
            }
            let item = run.step(s).await;
            Some((item, (s, run)))
        })
    }
}

impl Run {
    pub(crate) fn new(req: GenerateRequest) -> Self {
        Self {
            req,
            decoder: StreamDecoder::new(),
            held: String::new(),
            last: None,
            prompt_len: 0,
            submitted: 0,
            generated: 0,
            timings: Timings::default(),
            start_ms: now_ms(),
            first_ms: 0.0,
            pending_done: None,
            done: false,
            recent: RecentText::default(),
            pipelined: true,
            logprobs: None,
            arrived_cached: None,
        }
    }

    pub(crate) fn request(&self) -> &GenerateRequest {
        &self.req
    }

    /// Notes that `cached` tokens of the prompt were in the cache when the request came,
    /// before its prompt was read in chunks.
    pub(crate) fn arrived_with(&mut self, cached: usize) {
        self.arrived_cached = Some(cached);
    }

    /// The run has given its last event (`Done` or an error).
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// The prompt is in the cache and the first token sampled.
    pub(crate) fn started(&self) -> bool {
        self.submitted > 0
    }

    /// From now on each token comes from a step the caller runs (see [`Run::pipelined`]).
    pub(crate) fn stop_pipelining(&mut self) {
        self.pipelined = false;
    }

    /// From now on the run queues its own steps ahead of the readback.
    pub(crate) fn start_pipelining(&mut self) {
        self.pipelined = true;
    }

    /// Ends the run: settles the cache, then emits any text still held back before `Done`.
    async fn end(&mut self, s: &mut Session, reason: StopReason) -> Result<Event, Error> {
        let event = self.finish(reason);
        if matches!(event, Event::Done { .. }) {
            self.settle(s).await?;
        }
        Ok(event)
    }

    /// The text still held back, or the `Done` event when there is none.
    fn finish(&mut self, reason: StopReason) -> Event {
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(&self.decoder.flush());
        if !rest.is_empty() && reason != StopReason::StopString {
            self.pending_done = Some(reason);
            return Event::Token {
                id: self.last.unwrap_or(0),
                text: rest,
                logprobs: None,
            };
        }
        self.done_event(reason)
    }

    fn done_event(&mut self, reason: StopReason) -> Event {
        if self.first_ms > 0.0 {
            self.timings.decode_ms = now_ms() - self.first_ms;
        }
        self.timings.generated_tokens = self.generated;
        Event::Done {
            reason,
            timings: self.timings,
        }
    }

    /// Starts the request: reuses the cached prefix, feeds the rest of the prompt and queues
    /// the first sample.
    pub(crate) async fn start(&mut self, s: &mut Session) -> Result<(), Error> {
        self.start_prefill(s)
            .instrument(tracing::info_span!("prefill"))
            .await
    }

    async fn start_prefill(&mut self, s: &mut Session) -> Result<(), Error> {
        check_request(&self.req)?;
        let (tokens, spans) = expanded_prompt(&s.model, &self.req)?;
        s.gpu.drain().await?;
        s.gpu.set_logprobs(self.req.logprobs)?;
        // Reuse the cached prefix (and the inputs in it), but always feed at least one token
        // for logits.
        let common =
            media::reusable_prefix(s.gpu.tokens(), &s.media, &tokens, &spans).min(tokens.len() - 1);
        self.timings.prompt_tokens = tokens.len();
        self.timings.cached_tokens = self.arrived_cached.unwrap_or(common);
        if tokens.len() + 1 > s.gpu.capacity() {
            return Err(ForwardError::ContextOverflow {
                need: tokens.len() + 1,
                capacity: s.gpu.capacity(),
            }
            .into());
        }
        // Only the images past the cached prefix are decoded, before the cache is touched,
        // so a bad image leaves the conversation as it was.
        let mut fresh = Vec::new();
        for span in spans.iter().filter(|span| span.at >= common) {
            fresh.push(match span.source {
                Source::Image(i) => {
                    let vision = s.model.vision().ok_or(Error::NoVision)?;
                    Fresh::Image(vision.clone(), span, self.req.images[i].patches()?)
                }
                Source::Audio(i) => {
                    s.model.audio().ok_or(Error::NoAudio)?;
                    Fresh::Audio(span, &self.req.audio[i])
                }
            });
        }
        s.gpu.rewind(common)?;
        s.media.retain(|i| i.at + i.len <= common);
        self.prompt_len = tokens.len();
        let encode_start = now_ms();
        let mut soft = Vec::with_capacity(fresh.len());
        for f in fresh {
            f.encode(&s.model, common, &mut soft, &mut self.timings)
                .await?;
        }
        self.timings.encode_ms = now_ms() - encode_start;
        s.gpu.fetch_rows(&tokens[common..]).await?;
        if !soft.is_empty() {
            s.gpu.fetch_rows(&[s.model.config().pad_id]).await?;
        }
        s.gpu
            .begin_with(&tokens[common..], &soft, &self.req.sampling, 0)
            .await?;
        s.media = spans;
        self.submitted = 1;
        Ok(())
    }

    /// Queues decode steps until the pipeline is full or no more are wanted.
    async fn top_up(&mut self, s: &mut Session) -> Result<(), Error> {
        let gpu = &mut s.gpu;
        let depth = if self.pipelined {
            gpu.pipeline_depth()
        } else {
            0
        };
        while gpu.in_flight() < depth
            && self.submitted < self.req.max_tokens
            && gpu.position() < gpu.capacity()
        {
            gpu.advance(&self.req.sampling, self.submitted as u32)
                .await?;
            self.submitted += 1;
        }
        Ok(())
    }

    /// Waits for the next sampled token, or says why there is none.
    async fn sample_next(&mut self, s: &mut Session) -> Result<Result<u32, StopReason>, Error> {
        if self.last.is_none() && self.submitted == 0 {
            match self.start(s).await {
                Err(Error::Forward(ForwardError::Interrupted)) => {
                    return Ok(Err(StopReason::Cancelled));
                }
                started => started?,
            }
        }
        self.top_up(s).await?;
        if s.gpu.in_flight() == 0 {
            return Ok(Err(StopReason::ContextFull));
        }
        let span = tracing::debug_span!("decode", step = self.generated);
        let token = s.gpu.next_token().instrument(span).await?;
        self.read_logprobs(s).await?;
        Ok(Ok(token))
    }

    /// Leaves the cache holding the prompt and the tokens generated before the last one:
    /// the session's own queued steps past the stop are read and dropped (a batched step
    /// queued with this row is read later by [`crate::Batch`], which drops its token).
    async fn settle(&mut self, s: &mut Session) -> Result<(), Error> {
        let gpu = &mut s.gpu;
        gpu.drain().await?;
        if self.submitted > 0 {
            gpu.rewind(self.prompt_len + self.generated)?;
        }
        Ok(())
    }

    /// The next event: one that needs no new token, else the token of the session's own
    /// next step. An error ends the run too.
    pub(crate) async fn step(&mut self, s: &mut Session) -> Result<Event, Error> {
        let event = match self.ready_event(s).await {
            Some(event) => event,
            None => match self.sample_next(s).await {
                Ok(Ok(id)) => self.on_token(s, id).await,
                Ok(Err(reason)) => self.end(s, reason).await,
                Err(e) => Err(e),
            },
        };
        self.note_end(&event);
        event
    }

    /// Marks the run done after its last event.
    pub(crate) fn note_end(&mut self, event: &Result<Event, Error>) {
        if matches!(event, Err(_) | Ok(Event::Done { .. })) {
            self.done = true;
        }
    }

    /// The next event when it needs no new token: the end after text held back, a cancel,
    /// the token limit, a full context (for a run whose steps the caller runs).
    pub(crate) async fn ready_event(&mut self, s: &mut Session) -> Option<Result<Event, Error>> {
        let event = if let Some(reason) = self.pending_done.take() {
            match self.settle(s).await {
                Ok(()) => Ok(self.done_event(reason)),
                Err(e) => Err(e),
            }
        } else if s.cancel.take() {
            self.end(s, StopReason::Cancelled).await
        } else if self.generated >= self.req.max_tokens {
            self.end(s, StopReason::MaxTokens).await
        } else if !self.pipelined
            && self.started()
            && !s.gpu.token_on_gpu()
            && s.gpu.position() >= s.gpu.capacity()
        {
            self.end(s, StopReason::ContextFull).await
        } else {
            return None;
        };
        self.note_end(&event);
        Some(event)
    }

    /// The event of a token sampled for this run (by the session's step or the caller's).
    pub(crate) async fn on_token(&mut self, s: &mut Session, id: u32) -> Result<Event, Error> {
        if self.last.is_none() {
            self.first_ms = now_ms();
            self.timings.prompt_ms = self.first_ms - self.start_ms;
        }
        self.last = Some(id);
        let tok = s.model.tokenizer();
        if tok.is_end_of_generation(id) && !self.req.ignore_eos {
            return self.end(s, StopReason::EndOfGeneration).await;
        }
        self.generated += 1;
        let piece = self.decoder.push(tok, id);
        self.held.push_str(&piece);
        if let Some(at) = self
            .req
            .stop
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let text = self.held[..at].to_string();
            self.held.clear();
            self.decoder.flush();
            // The text before the stop string still goes out, then the end.
            self.pending_done = Some(StopReason::StopString);
            let logprobs = self.logprobs.take();
            return Ok(Event::Token { id, text, logprobs });
        }
        if self.req.stop_loops {
            self.recent.push(&piece);
            if self.recent.repeats() {
                self.pending_done = Some(StopReason::Loop);
                let text = std::mem::take(&mut self.held);
                let logprobs = self.logprobs.take();
                return Ok(Event::Token { id, text, logprobs });
            }
        }
        let keep = held_back(&self.held, &self.req.stop);
        let text: String = self.held.drain(..self.held.len() - keep).collect();
        let logprobs = self.logprobs.take();
        Ok(Event::Token { id, text, logprobs })
    }

    /// Reads the log-probabilities of the token just read back, where the request asked.
    pub(crate) async fn read_logprobs(&mut self, s: &mut Session) -> Result<(), Error> {
        if self.req.logprobs.is_some() {
            self.logprobs = Some(s.gpu.logprobs().await?);
        }
        Ok(())
    }

    /// Counts a step the caller queued for this run ([`crate::Batch`]).
    pub(crate) fn stepped(&mut self) {
        self.submitted += 1;
    }

    /// Whether a step the caller queues now could give this run a token it wants: not
    /// ending, below its token limit counting the steps queued, and with room in the cache
    /// for the token fed.
    pub(crate) fn has_room(&self, s: &Session) -> bool {
        !self.is_ending()
            && self.submitted < self.req.max_tokens
            && s.gpu.position() < s.gpu.capacity()
    }

    /// Whether the run has given its last token and only its end is still to come (after a
    /// stop string, or after text it held back): a token sampled for it now is dropped.
    pub(crate) fn is_ending(&self) -> bool {
        self.pending_done.is_some()
    }

    /// Whether the caller may queue this run's steps ahead of their readback: not where the
    /// request reads log-probabilities, which the next step's logits would overwrite.
    pub(crate) fn may_queue_ahead(&self) -> bool {
        self.req.logprobs.is_none()
    }

    /// The run's sampling and its step number, for a step the caller runs.
    pub(crate) fn sampling(&self) -> (&SamplingParams, u32) {
        (&self.req.sampling, self.submitted as u32)
    }
}

/// An image or a clip of a request's prompt that the cache does not hold, ready to encode.
enum Fresh<'a> {
    Image(
        Arc<wgemma_vision::VisionTower>,
        &'a Span,
        wgemma_vision::Patches,
    ),
    Audio(&'a Span, &'a AudioInput),
}

impl Fresh<'_> {
    /// Encodes the input and adds its soft tokens (positions counted from `common`, where the
    /// pass starts): an image's see each other where the model says so, a clip's are causal.
    async fn encode(
        self,
        model: &Model,
        common: usize,
        soft: &mut Vec<SoftTokens>,
        timings: &mut Timings,
    ) -> Result<(), Error> {
        let (span, encoded, bidirectional) = match self {
            Fresh::Image(vision, span, patches) => {
                timings.encoded_images += 1;
                let e = vision.encode(&patches).await?;
                (span, vec![e], true)
            }
            Fresh::Audio(span, clip) => {
                timings.encoded_audio += 1;
                (span, model.encode_audio(clip).await?, false)
            }
        };
        let mut at = span.at;
        for e in encoded {
            soft.push(SoftTokens {
                at: at - common,
                rows: e.rows,
                bidirectional,
            });
            at += e.tokens as usize;
        }
        if at - span.at != span.len {
            return Err(Error::Request(format!(
                "an input became {} soft tokens where its size promised {}",
                at - span.at,
                span.len
            )));
        }
        Ok(())
    }
}

/// An image or an audio clip for [`Session::score_with`].
#[derive(Clone, Debug)]
pub enum MediaInput {
    Image(ImageInput),
    Audio(AudioInput),
}

/// `req`'s prompt tokens with its images' and clips' placeholders expanded to their soft
/// tokens, and where each input's soft tokens sit. A model without the tower an input needs
/// says so first (the input's tokens would otherwise be measured against the context).
/// The checks a request passes before its prompt touches the cache.
fn check_request(req: &GenerateRequest) -> Result<(), Error> {
    req.sampling.validate()?;
    if req.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
        return Err(Error::Request(format!(
            "at most {MAX_TOP_LOGPROBS} top log-probabilities a token"
        )));
    }
    Ok(())
}

fn expanded_prompt(model: &Model, req: &GenerateRequest) -> Result<(Vec<u32>, Vec<Span>), Error> {
    if !req.images.is_empty() && model.vision().is_none() {
        return Err(Error::NoVision);
    }
    if !req.audio.is_empty() && model.audio().is_none() {
        return Err(Error::NoAudio);
    }
    let tokens = model.prompt_tokens(&req.prompt, req.parse_special)?;
    if req.images.is_empty() && req.audio.is_empty() {
        return Ok((tokens, Vec::new()));
    }
    let inputs = Inputs {
        images: &req.images,
        audio: &req.audio,
        image_markers: model.image_markers(),
        audio_markers: model.audio_markers(),
    };
    media::expand(&tokens, &inputs)
}

/// How many bytes at the end of `text` could begin one of the stop strings.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n) && text.ends_with(&s[..n])))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_stops_once_unless_withdrawn() {
        let c = CancelHandle::default();
        c.cancel();
        assert!(c.take(), "a cancel is seen");
        assert!(!c.take(), "and seen once");
        c.cancel();
        c.withdraw();
        assert!(!c.take(), "a withdrawn cancel is not seen");
    }

    #[test]
    fn stop_strings_hold_back_only_what_could_start_one() {
        let stops = ["</end>".to_string()];
        assert_eq!(held_back("text </e", &stops), 3);
        assert_eq!(held_back("text", &stops), 0);
        assert_eq!(held_back("a <", &stops), 1);
    }
}
