//! `wgemma info MODEL [--json]`.

use wgemma::gguf::read_file_header;
use wgemma::{ModelInfo, ModelSource};

use super::CliError;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF path or an Ollama model name (e.g. gemma3:270m).
    model: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let source = ModelSource::resolve(&args.model)?;
    // Plain reads of the header only: a truncated file is an error, never a SIGBUS.
    let header =
        read_file_header(&source.model).map_err(|e| format!("{}: {e}", source.model.display()))?;
    let info = ModelInfo::new(&header);
    if args.json {
        let mut json = info.to_json();
        json["path"] = source.model.display().to_string().into();
        println!("{json}");
    } else {
        println!("path             {}", source.model.display());
        print!("{info}");
        if let Some(p) = &source.projector {
            println!("projector        {}", p.display());
            let header = read_file_header(p).map_err(|e| format!("{}: {e}", p.display()))?;
            if let Some(line) = ModelInfo::new(&header).vision_line() {
                println!("  vision tower   {line}");
            }
        }
    }
    Ok(())
}
