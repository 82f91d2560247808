//! `wgemma score --model M --tokens 2,818,... [--image F@POS] [--audio F@POS]`: teacher-forced
//! predictions at every position.

use wgemma::MediaInput;

use super::CliError;
use super::load::{AdapterArgs, ModelArg, load, read_audio, read_image};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    adapters: AdapterArgs,
    /// Comma-separated token ids, fed exactly as given.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// An image whose soft tokens replace the image placeholders (`<|image|>`) of `--tokens`
    /// from index POS on (as many as the image becomes); repeat it for several.
    #[arg(long = "image", value_name = "PATH@POS", value_parser = parse_path_at)]
    images: Vec<(std::path::PathBuf, usize)>,
    /// An audio clip whose soft tokens replace the audio placeholders (`<|audio|>`) of
    /// `--tokens` from index POS on; repeat it for several.
    #[arg(long = "audio", value_name = "PATH@POS", value_parser = parse_path_at)]
    audio: Vec<(std::path::PathBuf, usize)>,
    /// Most soft tokens an image becomes: 70, 140, 280, 560 or 1120.
    #[arg(long, default_value_t = wgemma::DEFAULT_IMAGE_TOKENS)]
    image_tokens: u32,
}

/// `PATH@POS`: the position after the last `@`.
fn parse_path_at(s: &str) -> Result<(std::path::PathBuf, usize), String> {
    let (path, pos) = s
        .rsplit_once('@')
        .ok_or_else(|| format!("{s}: expected PATH@POS"))?;
    let pos = pos
        .parse()
        .map_err(|_| format!("{s}: {pos} is not a token index"))?;
    if path.is_empty() {
        return Err(format!("{s}: a path is needed"));
    }
    Ok((path.into(), pos))
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load(&args.model, true)?.model;
    let context = args.tokens.len().max(16);
    let mut session = model.session(wgemma::SessionOptions {
        context,
        max_batch: 256,
    })?;
    args.adapters.apply(&model, &mut session)?;
    let mut inputs = Vec::new();
    for (path, pos) in &args.images {
        inputs.push((
            *pos,
            MediaInput::Image(read_image(path, args.image_tokens)?),
        ));
    }
    for (path, pos) in &args.audio {
        inputs.push((*pos, MediaInput::Audio(read_audio(path)?)));
    }
    let scored = pollster::block_on(session.score_with(&args.tokens, &inputs))?;
    let positions: Vec<serde_json::Value> = scored
        .iter()
        .map(|(id, logit)| serde_json::json!({ "argmax": id, "logit": logit }))
        .collect();
    println!("{}", serde_json::json!({ "positions": positions }));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_image_argument_is_a_path_and_a_position() {
        let p = |s: &str| super::parse_path_at(s).map(|(p, n)| (p.display().to_string(), n));
        assert_eq!(p("a.png@12"), Ok(("a.png".into(), 12)));
        assert_eq!(p("dir/a@b.png@3"), Ok(("dir/a@b.png".into(), 3)));
        assert!(p("a.png").is_err());
        assert!(p("a.png@x").is_err());
        assert!(p("@4").is_err());
    }
}
