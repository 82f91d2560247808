//! `wgemma chat`: an interactive multi-turn conversation. The session's KV cache carries over
//! between turns, so each turn feeds only its new tokens.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wgemma::{GenerateRequest, Message, Prompt, Role};

use super::CliError;
use super::load::{AdapterArgs, Media, ModelArg, load, read_audio, read_image};
use super::run::{GenArgs, print_stats, stream_reply};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    adapters: AdapterArgs,
    #[command(flatten)]
    gen_args: GenArgs,
    /// A system prompt for the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Print speed after each reply.
    #[arg(long)]
    stats: bool,
    /// Most soft tokens an image (`/image PATH`) becomes: 70, 140, 280, 560 or 1120.
    #[arg(long, default_value_t = wgemma::DEFAULT_IMAGE_TOKENS)]
    image_tokens: u32,
}

pub fn run(args: Args) -> Result<(), CliError> {
    args.gen_args.check()?;
    let loaded = load(&args.model, false)?;
    let model = &loaded.model;
    let sampling = args.gen_args.sampling(&loaded.sampling)?;
    let mut session = model.session(args.gen_args.session(model)?)?;
    args.adapters.apply(model, &mut session)?;
    let interrupt = Interrupt::install(session.cancel_handle())?;
    let mut messages: Vec<Message> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system.clone()));
    }
    if !loaded.chat {
        eprintln!(
            "note: {} has no chat template (a pretrained model?): its replies may just continue your text",
            loaded.label
        );
    }
    eprintln!(
        "chatting with {} (/image PATH or /audio PATH attaches an image or a clip to your next message, /reset starts over; Ctrl-C stops a reply, /exit, Ctrl-D or Ctrl-C at the prompt quits)",
        loaded.label
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    // Every image and clip of the conversation so far, in order, and those waiting for the
    // next message.
    let (mut media, mut pending) = (Media::default(), Media::default());
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/reset" => {
                messages.retain(|m| m.role == Role::System);
                media = Media::default();
                pending = Media::default();
                pollster::block_on(session.reset())?;
                continue;
            }
            cmd if cmd.starts_with("/image") || cmd.starts_with("/audio") => {
                attach(cmd, args.image_tokens, &mut pending);
                continue;
            }
            _ => {}
        }
        let attached = (pending.images.len(), pending.audio.len());
        media.images.append(&mut pending.images);
        media.audio.append(&mut pending.audio);
        messages.push(
            Message::user(line)
                .with_images(attached.0)
                .with_audio(attached.1),
        );
        let req = args.gen_args.request(
            Prompt::Chat(messages.clone()),
            sampling.clone(),
            media.clone(),
        );
        let reply = interrupt.replying(|| reply_text(&mut session, req, args.stats));
        match reply {
            // A reply stopped by Ctrl-C stays in the conversation as far as it went.
            Ok(text) => messages.push(Message::assistant(text)),
            Err(e) => {
                // The turn failed (context full, a bad image, ...): drop it with its images
                // and clips and keep the conversation.
                eprintln!("error: {e}");
                messages.pop();
                media.images.truncate(media.images.len() - attached.0);
                media.audio.truncate(media.audio.len() - attached.1);
            }
        }
    }
    Ok(())
}

/// `/image PATH` or `/audio PATH`: reads the image or the clip for the next message.
fn attach(cmd: &str, budget: u32, pending: &mut Media) {
    let (command, path) = cmd.split_at(6);
    let path = path.trim();
    if path.is_empty() {
        eprintln!("usage: {command} PATH");
        return;
    }
    let read = match command {
        "/image" => read_image(path.as_ref(), budget).map(|i| pending.images.push(i)),
        _ => read_audio(path.as_ref()).map(|a| pending.audio.push(a)),
    };
    match read {
        Ok(()) => eprintln!(
            "attached {path} ({} waiting for your message)",
            pending.images.len() + pending.audio.len()
        ),
        Err(e) => eprintln!("error: {e}"),
    }
}

/// What Ctrl-C does in a chat, as in `ollama run`: during a reply it stops the reply (the
/// conversation goes on); at the prompt it ends the program.
struct Interrupt {
    replying: Arc<AtomicBool>,
    cancel: wgemma::CancelHandle,
}

impl Interrupt {
    fn install(cancel: wgemma::CancelHandle) -> Result<Self, CliError> {
        let replying = Arc::new(AtomicBool::new(false));
        let (flag, stop) = (replying.clone(), cancel.clone());
        ctrlc::set_handler(move || {
            if flag.load(Ordering::SeqCst) {
                stop.cancel();
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })?;
        Ok(Self { replying, cancel })
    }

    /// Runs `reply` with Ctrl-C stopping it rather than the program.
    fn replying<T>(&self, reply: impl FnOnce() -> T) -> T {
        self.replying.store(true, Ordering::SeqCst);
        let out = reply();
        self.replying.store(false, Ordering::SeqCst);
        // A Ctrl-C that came as the reply ended must not stop the next one.
        self.cancel.withdraw();
        out
    }
}

/// Streams a reply and returns its text.
fn reply_text(
    session: &mut wgemma::Session,
    req: GenerateRequest,
    stats: bool,
) -> Result<String, CliError> {
    let (text, timings, reason) = stream_reply(session, req)?;
    if stats {
        print_stats(&timings, reason);
    }
    Ok(text.trim().to_string())
}
