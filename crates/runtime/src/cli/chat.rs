//! `wgemma chat`: an interactive multi-turn conversation. The session's KV cache carries over
//! between turns, so each turn feeds only its new tokens.

use std::io::{BufRead, Write};

use wgemma::{GenerateRequest, Message, Prompt, Role};

use super::CliError;
use super::load::{AdapterArgs, ModelArg, load};
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
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load(&args.model, false)?;
    let mut session = model.session(args.gen_args.session())?;
    args.adapters.apply(&model, &mut session)?;
    let mut messages: Vec<Message> = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message {
            role: Role::System,
            content: system.clone(),
        });
    }
    eprintln!(
        "chatting with {} (/reset to start over, /exit or Ctrl-D to quit)",
        model.info().name.as_deref().unwrap_or("the model")
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
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
                pollster::block_on(session.reset())?;
                continue;
            }
            _ => {}
        }
        messages.push(Message {
            role: Role::User,
            content: line,
        });
        let req = GenerateRequest {
            prompt: Prompt::Chat(messages.clone()),
            sampling: args.gen_args.sampling(),
            max_tokens: args.gen_args.max_tokens,
            stop: Vec::new(),
        };
        let reply = reply_text(&mut session, req, args.stats);
        match reply {
            Ok(text) => messages.push(Message {
                role: Role::Assistant,
                content: text,
            }),
            Err(e) => {
                // The turn failed (context full, ...): drop it and keep the conversation.
                eprintln!("error: {e}");
                messages.pop();
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
