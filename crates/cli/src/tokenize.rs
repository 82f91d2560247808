//! `wgemma tokenize --model M TEXT`: token ids as a JSON array (BOS added when the model asks
//! for it, special-token text parsed, as llama.cpp's llama-tokenize does).

use super::CliError;
use super::load::ModelArg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Do not add the BOS token.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text (<start_of_turn>...) as plain text.
    #[arg(long)]
    no_parse_special: bool,
    text: String,
}

pub fn run(args: Args) -> Result<(), CliError> {
    // Only the tokenizer is needed: read the header, not the weights.
    let path = match args.model.model.as_deref() {
        Some(spec) if spec != wgemma::pull::DEFAULT_MODEL.name => {
            wgemma::ModelSource::resolve(spec)?.model
        }
        _ => super::pull::run()?,
    };
    let header =
        wgemma::gguf::read_file_header(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let arch = header.architecture().unwrap_or_default().to_string();
    let tok = wgemma::Tokenizer::from_metadata(&header.metadata, &arch)?;
    let add_bos = !args.no_bos && tok.add_bos_default();
    let ids = tok.encode(&args.text, add_bos, !args.no_parse_special);
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
