//! `wgemma pull`: fetch (or verify) the default model, with a progress bar; and the same
//! fetch for the subcommands that run the default model.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use wgemma::pull::{Check, DEFAULT_MODEL, Outcome, PullEvent, PullOptions, Pulled};

use super::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Download the model again even when a verified copy is cached.
    #[arg(long)]
    force: bool,
}

/// `wgemma pull`: re-hashes the cached model (fetching it again when it is corrupt), or
/// fetches it when missing or with `--force`. Returns its path.
pub fn pull(args: Args) -> Result<PathBuf, CliError> {
    let check = if args.force {
        Check::Force
    } else {
        Check::Rehash
    };
    let pulled = fetch(check)?;
    let how = match pulled.outcome {
        Outcome::Downloaded => "downloaded and verified",
        Outcome::Cached | Outcome::Verified => "verified",
    };
    eprintln!(
        "{} {how} (sha256 {})",
        DEFAULT_MODEL.file_name, DEFAULT_MODEL.sha256
    );
    Ok(pulled.path)
}

/// Returns the default model's path, fetching it first (with progress on stderr) if the
/// cache lacks it or its sidecar does not vouch for it.
pub fn run() -> Result<PathBuf, CliError> {
    Ok(fetch(Check::Sidecar)?.path)
}

fn fetch(check: Check) -> Result<Pulled, CliError> {
    let opts = PullOptions::from_env()?;
    let mut ui = Ui::default();
    let pulled = DEFAULT_MODEL.fetch(&opts, check, |e| ui.event(e));
    ui.finish();
    Ok(pulled?)
}

/// What the bar shows now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Verify,
    Download,
    Unpack,
}

/// The progress on stderr: one bar per phase, made when the phase starts, so that a cached
/// model prints nothing.
#[derive(Default)]
struct Ui {
    bar: Option<(Phase, ProgressBar)>,
}

impl Ui {
    fn event(&mut self, event: PullEvent) {
        match event {
            PullEvent::Waiting { lock } => self.note(&format!(
                "another wgemma is fetching {}; waiting for it to finish (lock {})",
                DEFAULT_MODEL.name,
                lock.display()
            )),
            PullEvent::Verifying { done, total } => self.progress(Phase::Verify, done, total),
            PullEvent::Corrupt { path, problem } => self.note(&format!(
                "the cached {} is corrupt ({problem}); downloading it again",
                path.display()
            )),
            PullEvent::Downloading { done, total } => self.progress(Phase::Download, done, total),
            PullEvent::Retrying {
                url,
                error,
                retry,
                of,
                wait,
            } => self.note(&format!(
                "{url}: {error}; retry {retry} of {of} in {}",
                secs(wait)
            )),
            PullEvent::Unpacking { done, total } => self.progress(Phase::Unpack, done, total),
        }
    }

    fn progress(&mut self, phase: Phase, done: u64, total: u64) {
        if self.bar.as_ref().is_none_or(|(p, _)| *p != phase) {
            self.finish();
            if phase == Phase::Download {
                let mb = |b: u64| b / 1_000_000;
                let resumed = if done > 0 {
                    format!(", resuming at {} MB", mb(done))
                } else {
                    String::new()
                };
                eprintln!(
                    "fetching {} ({} MB) into the cache{resumed}",
                    DEFAULT_MODEL.name,
                    mb(total)
                );
            }
            let label = match phase {
                Phase::Verify => "verifying",
                Phase::Download => "downloading",
                Phase::Unpack => "unpacking",
            };
            let bar = ProgressBar::new(total)
                .with_style(
                    ProgressStyle::with_template(
                        "{prefix:>11} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                )
                .with_prefix(label)
                .with_position(done);
            // Resumed bytes count as done, not as speed.
            bar.reset_eta();
            self.bar = Some((phase, bar));
        }
        if let Some((_, bar)) = &self.bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    }

    /// A line above the bar (or alone).
    fn note(&self, line: &str) {
        match &self.bar {
            Some((_, bar)) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    fn finish(&mut self) {
        if let Some((_, bar)) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
