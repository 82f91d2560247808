//! `wgemma pull`: fetch the default model, with a progress bar.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use wgemma::pull::DEFAULT_MODEL;

use super::CliError;

/// Returns the default model's path, fetching it first (with progress on stderr) if needed.
pub fn run() -> Result<PathBuf, CliError> {
    if DEFAULT_MODEL.is_cached() {
        return Ok(DEFAULT_MODEL.path()?);
    }
    eprintln!(
        "fetching {} ({} MB) into the cache",
        DEFAULT_MODEL.name,
        DEFAULT_MODEL.size / 1_000_000
    );
    let bar = ProgressBar::new(DEFAULT_MODEL.size).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let path = DEFAULT_MODEL.ensure(|p| bar.set_position(p.done))?;
    bar.finish_and_clear();
    Ok(path)
}
