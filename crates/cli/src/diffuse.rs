//! `wgemma run` with a DiffusionGemma model: the reply arrives a block at a time. On a
//! terminal each block's current draft is redrawn in place after every denoising step, and
//! replaced by the block's text once it is done; elsewhere only the finished text is printed.

use std::io::{IsTerminal, Write};

use futures::StreamExt;
use wgemma::{
    DiffusionGenerate, DiffusionModel, EntropyBound, Event, ModelSource, Prompt, StopReason,
    Timings,
};

use super::CliError;
use super::load::{ModelArg, progress};
use super::run::GenArgs;

/// Settings of text diffusion (DiffusionGemma models).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DiffusionArgs {
    /// Text diffusion: most denoising steps a block takes. [default: the model's, else 48]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub steps: Option<u32>,
    /// Text diffusion: tokens a block denoises together. [default: the model's canvas]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub canvas: Option<u32>,
    /// Text diffusion: how much uncertainty the positions accepted in one step may carry
    /// together (higher: more tokens a step, fewer steps). [default: the model's, else 0.1]
    #[arg(long, allow_negative_numbers = true)]
    pub entropy_bound: Option<f32>,
}

impl DiffusionArgs {
    /// The sampler: the model's defaults with what was given.
    fn sampler(&self, model: &DiffusionModel) -> Result<EntropyBound, CliError> {
        let mut s = model.config().sampler;
        s.max_steps = self.steps.unwrap_or(s.max_steps);
        s.entropy_bound = self.entropy_bound.unwrap_or(s.entropy_bound);
        s.check()
            .map_err(|e| format!("--steps / --entropy-bound: {e}"))?;
        Ok(s)
    }
}

/// What a DiffusionGemma run is asked.
pub struct Request<'a> {
    pub model: &'a ModelArg,
    pub gen_args: &'a GenArgs,
    pub diffusion: &'a DiffusionArgs,
    pub prompt: String,
    pub system: Option<String>,
    /// Images the prompt opens with (the model needs a vision tower: `--mmproj`).
    pub images: Vec<wgemma::ImageInput>,
    /// Plain text, no chat format; no statistics.
    pub raw: bool,
}

/// Runs a DiffusionGemma model on one prompt.
pub fn run(source: ModelSource, r: Request<'_>) -> Result<(), CliError> {
    let path = source.model.clone();
    let (bar, mut opts) = progress(r.model, r.raw);
    opts.mmproj = opts.mmproj.or(source.projector);
    let model = pollster::block_on(DiffusionModel::load_file(&path, opts))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    bar.finish_and_clear();
    let limit = model.config().text.context_length.max(1);
    let context = r
        .gen_args
        .context
        .filter(|&c| c > 0)
        .unwrap_or(4096.min(limit));
    let canvas = r.diffusion.canvas.map(|c| c as usize);
    let mut chat = model.session(context, canvas)?;
    let n_images = r.images.len();
    let prompt = if r.raw {
        // The images open the text, as in a chat message.
        Prompt::Text(wgemma::IMAGE_PLACEHOLDER.repeat(n_images) + &r.prompt)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = r.system {
            messages.push(wgemma::Message::system(system));
        }
        messages.push(wgemma::Message::user(r.prompt).with_images(n_images));
        Prompt::Chat(messages)
    };
    let req = DiffusionGenerate {
        max_tokens: r.gen_args.max_tokens as usize,
        sampler: Some(r.diffusion.sampler(&model)?),
        parse_special: r.gen_args.parse_special,
        images: r.images,
        ..DiffusionGenerate::new(prompt, r.gen_args.seed.unwrap_or_else(wgemma::fresh_seed))
    };
    let (timings, reason) = stream(&mut chat, req)?;
    if !r.raw {
        print_stats(
            &timings,
            reason,
            canvas.unwrap_or(model.config().canvas_length),
        );
    }
    Ok(())
}

/// Streams the reply to stdout (drafts redrawn in place on a terminal).
fn stream(
    chat: &mut wgemma::DiffusionChat,
    req: DiffusionGenerate,
) -> Result<(Timings, StopReason), CliError> {
    let live = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let mut stream = Box::pin(chat.generate(req));
    let mut end = (Timings::default(), StopReason::MaxTokens);
    // Whether a draft is on screen after the saved cursor position.
    let mut drafting = false;
    while let Some(event) = pollster::block_on(stream.next()) {
        match event? {
            Event::Draft { text, .. } if live => {
                // Save the cursor where the block starts; then clear back to it each step.
                let to_start = if drafting { "\x1b[u\x1b[J" } else { "\x1b[s" };
                write!(out, "{to_start}\x1b[2m{text}\x1b[0m")?;
                drafting = true;
            }
            Event::Draft { .. } => {}
            Event::Token { text, .. } => {
                if drafting {
                    write!(out, "\x1b[u\x1b[J")?;
                    drafting = false;
                }
                out.write_all(text.as_bytes())?;
            }
            Event::Done { reason, timings } => end = (timings, reason),
        }
        out.flush()?;
    }
    if drafting {
        write!(out, "\x1b[u\x1b[J")?;
    }
    writeln!(out)?;
    Ok(end)
}

fn print_stats(t: &Timings, reason: StopReason, canvas: usize) {
    let stop = match reason {
        StopReason::EndOfGeneration => "end of reply",
        StopReason::MaxTokens => "--max-tokens reached",
        StopReason::Cancelled => "stopped",
        _ => "other",
    };
    let per_step = t.ms_per_step();
    let images = match t.encoded_images {
        0 => String::new(),
        n => format!(" ({n} image(s) encoded in {:.0} ms)", t.encode_ms),
    };
    eprintln!(
        "prompt: {} tokens{images}, {:.0} ms | {} block(s), {} steps ({:.1} a block), {per_step:.1} ms a step | \
         {} tokens: {:.1} tok/s effective, {:.0} tok/s in-step | stop: {stop}",
        t.prompt_tokens,
        t.prompt_ms,
        t.blocks,
        t.denoising_steps,
        t.denoising_steps as f64 / t.blocks.max(1) as f64,
        t.generated_tokens,
        t.decode_tok_per_s(),
        canvas as f64 / (per_step / 1e3).max(1e-9),
    );
}
