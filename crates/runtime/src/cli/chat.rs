//! `wgemma chat`: an interactive multi-turn conversation. The session's KV cache carries over
//! between turns, so each turn feeds only its new tokens.

use std::io::{BufRead, Write};

use wgemma::{GenerateRequest, Message, Prompt, Role};

use super::CliError;
use super::load::{AdapterArgs, ModelArg, load, read_image};
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
    let model = load(&args.model, false)?;
    let mut session = model.session(args.gen_args.session())?;
    args.adapters.apply(&model, &mut session)?;
    let mut messages: Vec<Message> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message {
            images: 0,
            role: Role::System,
            content: system.clone(),
        });
    }
    eprintln!(
        "chatting with {} (/image PATH attaches an image to your next message, /reset starts over, /exit or Ctrl-D quits)",
        model.info().name.as_deref().unwrap_or("the model")
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    // Every image of the conversation so far, in order, and those waiting for the next message.
    let (mut images, mut pending) = (Vec::new(), Vec::new());
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m.role == Role::System);
                images.clear();
                pending.clear();
                pollster::block_on(session.reset())?;
                continue;
            }
            cmd if cmd.starts_with("/image") => {
                let path = cmd.trim_start_matches("/image").trim();
                match read_image(std::path::Path::new(path), args.image_tokens) {
                    Ok(image) if !path.is_empty() => {
                        pending.push(image);
                        eprintln!(
                            "attached {path} ({} waiting for your message)",
                            pending.len()
                        );
                    }
                    Ok(_) => eprintln!("usage: /image PATH"),
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
            _ => {}
        }
        let attached = pending.len();
        images.append(&mut pending);
        messages.push(Message {
            images: attached,
            role: Role::User,
            content: line,
        });
        let req = GenerateRequest {
            prompt: Prompt::Chat(messages.clone()),
            sampling: args.gen_args.sampling(),
            max_tokens: args.gen_args.max_tokens,
            stop: Vec::new(),
            images: images.clone(),
        };
        let reply = reply_text(&mut session, req, args.stats);
        match reply {
            Ok(text) => messages.push(Message {
                images: 0,
                role: Role::Assistant,
                content: text,
            }),
            Err(e) => {
                // The turn failed (context full, a bad image, ...): drop it and its images
                // and keep the conversation.
                eprintln!("error: {e}");
                messages.pop();
                images.truncate(images.len() - attached);
            }
        }
    }
    Ok(())
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
