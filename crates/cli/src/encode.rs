//! `wgemma encode --model M [--mmproj P] (--image F | --audio F) [--out X.npy]`: an image's
//! or a clip's soft tokens.

use super::CliError;
use super::load::{ModelArg, load, read_audio, read_image};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// The image (PNG, JPEG, WebP or GIF).
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "audio",
        conflicts_with = "audio"
    )]
    image: Option<std::path::PathBuf>,
    /// The audio clip (WAV, FLAC, MP3 or Ogg/Vorbis); a clip over 30 s gives each 30 s
    /// chunk's tokens in turn.
    #[arg(long, value_name = "PATH")]
    audio: Option<std::path::PathBuf>,
    /// Most soft tokens the image becomes: 70, 140, 280, 560 or 1120.
    #[arg(long, default_value_t = wgemma::DEFAULT_IMAGE_TOKENS)]
    image_tokens: u32,
    /// Write the soft tokens as a float32 .npy array of shape [tokens, model width].
    #[arg(long, value_name = "PATH")]
    out: Option<std::path::PathBuf>,
}

/// Prints the number of soft tokens (and writes them with `--out`).
pub fn run(args: Args) -> Result<(), CliError> {
    let model = load(&args.model, true)?.model;
    let (values, tokens) = match (&args.image, &args.audio) {
        (Some(path), _) => {
            let image = read_image(path, args.image_tokens)?;
            pollster::block_on(model.encode_image_to_vec(&image))?
        }
        (None, Some(path)) => pollster::block_on(model.encode_audio_to_vec(&read_audio(path)?))?,
        (None, None) => return Err("--image or --audio is needed".into()),
    };
    if let Some(out) = &args.out {
        write_npy(out, &values, [tokens, values.len() / tokens.max(1)])
            .map_err(|e| format!("{}: {e}", out.display()))?;
    }
    println!("{tokens}");
    Ok(())
}

/// `values` as a float32 .npy array of `shape` (row-major).
fn write_npy(path: &std::path::Path, values: &[f32], shape: [usize; 2]) -> std::io::Result<()> {
    use npyz::WriterBuilder;
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape.map(|d| d as u64))
        .writer(file)
        .begin_nd()?;
    w.extend(values.iter().copied())?;
    w.finish()
}
