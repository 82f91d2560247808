//! `wgemma run PROMPT`: one reply, streamed.

use std::io::Write;

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use wgemma::{
    Event, GenerateRequest, Message, Model, Prompt, SamplingHints, SamplingParams, SessionOptions,
    StopReason, Timings,
};

use super::CliError;
use super::diffuse::{self, DiffusionArgs};
use super::load::{AdapterArgs, Media, MediaArgs, ModelArg, is_diffusion, load_source, resolve};

/// Sampling and length settings shared by `run` and `chat`. A sampling setting left out
/// comes from the model (its file's recommended settings, or an Ollama model's parameters),
/// else from Gemma's published ones: temperature 1.0, top-k 64, top-p 0.95.
#[derive(clap::Args, Clone, Debug)]
pub struct GenArgs {
    /// Randomness of the draw: 0 always takes the most likely token. [default: the model's,
    /// else 1.0]
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Draw among the k most likely tokens: 1 to 64, or 0 for all. [default: the model's,
    /// else 64]
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<usize>,
    /// Draw among the most likely tokens whose probabilities add up to this (0 to 1; 1: off).
    /// [default: the model's, else 0.95]
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than this times the most likely one (0 to 1; 0: off).
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Make recently generated tokens less likely (above 0; 1: off, 1.1: a little).
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// The same seed, settings and prompt give the same reply. [default: a new one each run]
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Always take the most likely token (the same as --temperature 0).
    #[arg(long, conflicts_with = "temperature")]
    pub greedy: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// Positions the conversation holds, prompt and replies together (0: as many as the model
    /// allows). [default: 4096, or the model's limit if lower]
    #[arg(long, allow_negative_numbers = true)]
    pub context: Option<usize>,
    /// Stop a reply that repeats itself in a loop (the same stretch of text three times in a
    /// row). Off by default: replies are never cut short unless asked.
    #[arg(long)]
    pub stop_loops: bool,
    /// Turn control-token text in the prompt (`<end_of_turn>`, `<start_of_turn>`) into
    /// control tokens. By default what you type is plain text; only the chat format adds them.
    #[arg(long)]
    pub parse_special: bool,
}

/// The context a session gets when `--context` is left out.
const DEFAULT_CONTEXT: usize = 4096;

impl GenArgs {
    /// Checks the settings given on the command line (before a model is loaded).
    pub fn check(&self) -> Result<(), CliError> {
        self.sampling(&SamplingHints::default()).map(drop)
    }

    /// The sampling settings: those given, else the model's hints, else Gemma's.
    pub fn sampling(&self, hints: &SamplingHints) -> Result<SamplingParams, CliError> {
        let seed = self.seed.unwrap_or_else(wgemma::fresh_seed);
        let mut p = hints.apply(SamplingParams::gemma(seed));
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        if self.greedy {
            p.temperature = 0.0;
        }
        p.top_k = self.top_k.unwrap_or(p.top_k);
        p.top_p = self.top_p.unwrap_or(p.top_p);
        p.min_p = self.min_p.unwrap_or(p.min_p);
        p.repeat_penalty = self.repeat_penalty.unwrap_or(p.repeat_penalty);
        p.validate()
            .map_err(|e| format!("--{} {}: {}", e.name, e.value, e.rule))?;
        Ok(p)
    }

    /// The session for `model`: `--context` checked against what the model holds.
    pub fn session(&self, model: &Model) -> Result<SessionOptions, CliError> {
        let limit = model.config().context_length.max(1);
        let context = match self.context {
            None => DEFAULT_CONTEXT.min(limit),
            Some(0) => limit,
            Some(n) if n > limit => {
                return Err(format!(
                    "--context {n}: this model holds at most {limit} positions (its {}.context_length)",
                    model.config().arch.name()
                )
                .into());
            }
            Some(n) => n,
        };
        Ok(SessionOptions {
            context,
            ..SessionOptions::default()
        })
    }

    /// A request for `prompt` with these settings.
    pub fn request(
        &self,
        prompt: Prompt,
        sampling: SamplingParams,
        media: Media,
    ) -> GenerateRequest {
        GenerateRequest {
            sampling,
            max_tokens: self.max_tokens as usize,
            images: media.images,
            audio: media.audio,
            parse_special: self.parse_special,
            stop_loops: self.stop_loops,
            ..GenerateRequest::new(prompt)
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    adapters: AdapterArgs,
    #[command(flatten)]
    gen_args: GenArgs,
    #[command(flatten)]
    media: MediaArgs,
    #[command(flatten)]
    diffusion: DiffusionArgs,
    /// Continue the prompt as plain text (no chat format) and print only the generated text.
    /// The default for a model without a chat template (a pretrained one).
    #[arg(long, conflicts_with_all = ["chat", "system"])]
    raw: bool,
    /// Use Gemma's chat format even for a model without a chat template.
    #[arg(long)]
    chat: bool,
    /// A system prompt (folded into the first turn as Gemma 3 does).
    #[arg(long)]
    system: Option<String>,
    /// The prompt.
    prompt: String,
}

pub fn run(args: Args) -> Result<(), CliError> {
    args.gen_args.check()?;
    let source = resolve(&args.model)?;
    if is_diffusion(&source)? {
        if !args.adapters.lora.is_empty() || !args.media.audio.is_empty() {
            return Err("--lora and --audio are not supported with a DiffusionGemma model".into());
        }
        let request = diffuse::Request {
            model: &args.model,
            gen_args: &args.gen_args,
            diffusion: &args.diffusion,
            prompt: args.prompt,
            system: args.system,
            images: args.media.read()?.images,
            raw: args.raw,
        };
        return diffuse::run(source, request);
    }
    let loaded = load_source(&args.model, source, args.raw)?;
    let model = &loaded.model;
    let sampling = args.gen_args.sampling(&loaded.sampling)?;
    let mut session = model.session(args.gen_args.session(model)?)?;
    args.adapters.apply(model, &mut session)?;
    let media = args.media.read()?;
    let chat = !args.raw && (loaded.chat || args.chat || args.system.is_some());
    if !args.raw && !chat {
        eprintln!(
            "note: {} has no chat template (a pretrained model): continuing your text as written (--chat uses Gemma's chat format anyway, --raw hides this note)",
            loaded.label
        );
    }
    let prompt = if chat {
        let mut messages = Vec::new();
        if let Some(system) = args.system {
            messages.push(Message::system(system));
        }
        let message = Message::user(args.prompt)
            .with_images(media.images.len())
            .with_audio(media.audio.len());
        messages.push(message);
        Prompt::Chat(messages)
    } else {
        // The images and clips open the text, as in a chat message.
        Prompt::Text(
            wgemma::IMAGE_PLACEHOLDER.repeat(media.images.len())
                + &wgemma::AUDIO_PLACEHOLDER.repeat(media.audio.len())
                + &args.prompt,
        )
    };
    let req = args.gen_args.request(prompt, sampling, media);
    let (_, timings, reason) = stream_reply(&mut session, req)?;
    if !args.raw {
        print_stats(&timings, reason);
    }
    Ok(())
}

/// Streams one reply to stdout; returns its text, timings and why it stopped.
pub fn stream_reply(
    session: &mut wgemma::Session,
    req: GenerateRequest,
) -> Result<(String, Timings, StopReason), CliError> {
    // Long prompts take a while on slow GPUs: a bar (on a terminal only) while they are read.
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("reading the prompt {bar:40} {pos}/{len} tokens, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let shown = bar.clone();
    session.set_prompt_progress(Some(Box::new(move |done, total| {
        shown.set_length(total as u64);
        shown.set_position(done as u64);
    })));
    let mut out = std::io::stdout().lock();
    let mut stream = Box::pin(session.generate(req));
    let mut reply = String::new();
    let mut end = (Timings::default(), StopReason::MaxTokens);
    while let Some(event) = pollster::block_on(stream.next()) {
        bar.finish_and_clear();
        match event? {
            Event::Token { text, .. } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
                reply.push_str(&text);
            }
            Event::Draft { .. } => {}
            Event::Done { reason, timings } => end = (timings, reason),
        }
    }
    writeln!(out)?;
    Ok((reply, end.0, end.1))
}

pub fn print_stats(t: &Timings, reason: StopReason) {
    let media = [(t.encoded_images, "image"), (t.encoded_audio, "audio clip")];
    let encoded: Vec<String> = media
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}{}", if *n == 1 { "" } else { "s" }))
        .collect();
    if !encoded.is_empty() {
        eprintln!("{} encoded in {:.0} ms", encoded.join(" and "), t.encode_ms);
    }
    let stop = match reason {
        StopReason::EndOfGeneration => "end of reply",
        StopReason::MaxTokens => "--max-tokens reached",
        StopReason::StopString => "stop string",
        StopReason::Cancelled => "stopped",
        StopReason::ContextFull => "the context is full (--context)",
        StopReason::Loop => "the reply repeats itself (--stop-loops)",
    };
    eprintln!(
        "prompt: {} tokens ({} cached), {:.1} tok/s | generated: {} tokens, {:.1} tok/s | stop: {stop}",
        t.prompt_tokens,
        t.cached_tokens,
        t.prompt_tok_per_s(),
        t.generated_tokens,
        t.decode_tok_per_s()
    );
}
