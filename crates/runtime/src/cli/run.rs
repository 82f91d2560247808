//! `wgemma run PROMPT`: one reply, streamed.

use std::io::Write;

use futures::StreamExt;
use wgemma::{
    Event, GenerateRequest, Message, Prompt, Role, SamplingParams, SessionOptions, StopReason,
    Timings,
};

use super::CliError;
use super::load::{AdapterArgs, ImageArgs, ModelArg, load};

/// Sampling and length settings shared by `run` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct GenArgs {
    /// 0 for greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Positions the session's KV cache holds.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
}

impl GenArgs {
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }

    pub fn session(&self) -> SessionOptions {
        SessionOptions {
            context: self.context,
            ..SessionOptions::default()
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
    images: ImageArgs,
    /// Feed the prompt as plain text (no chat template) and print only the generated text.
    #[arg(long)]
    raw: bool,
    /// A system prompt (folded into the first turn as Gemma does).
    #[arg(long)]
    system: Option<String>,
    /// The prompt.
    prompt: String,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load(&args.model, args.raw)?;
    let mut session = model.session(args.gen_args.session())?;
    args.adapters.apply(&model, &mut session)?;
    let images = args.images.read()?;
    let prompt = if args.raw {
        // The images open the text, as in a chat message.
        Prompt::Text(wgemma::IMAGE_PLACEHOLDER.repeat(images.len()) + &args.prompt)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = args.system {
            messages.push(Message {
                images: 0,
                role: Role::System,
                content: system,
            });
        }
        messages.push(Message {
            images: images.len(),
            role: Role::User,
            content: args.prompt,
        });
        Prompt::Chat(messages)
    };
    let req = GenerateRequest {
        prompt,
        sampling: args.gen_args.sampling(),
        max_tokens: args.gen_args.max_tokens,
        stop: Vec::new(),
        images,
    };
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
    let mut out = std::io::stdout().lock();
    let mut stream = Box::pin(session.generate(req));
    let mut reply = String::new();
    let mut end = (Timings::default(), StopReason::MaxTokens);
    while let Some(event) = pollster::block_on(stream.next()) {
        match event? {
            Event::Token { text, .. } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
                reply.push_str(&text);
            }
            Event::Done { reason, timings } => end = (timings, reason),
        }
    }
    writeln!(out)?;
    Ok((reply, end.0, end.1))
}

pub fn print_stats(t: &Timings, reason: StopReason) {
    if t.encoded_images > 0 {
        eprintln!(
            "images: {} encoded in {:.0} ms",
            t.encoded_images, t.encode_ms
        );
    }
    eprintln!(
        "prompt: {} tokens ({} cached), {:.1} tok/s | generated: {} tokens, {:.1} tok/s | stop: {reason:?}",
        t.prompt_tokens,
        t.cached_tokens,
        t.prompt_tok_per_s(),
        t.generated_tokens,
        t.decode_tok_per_s()
    );
}
