//! `wgemma score --model M --tokens 2,818,...`: teacher-forced predictions at every position.

use super::CliError;
use super::load::{AdapterArgs, ModelArg, load};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    adapters: AdapterArgs,
    /// Comma-separated token ids, fed exactly as given.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load(&args.model, true)?;
    let context = args.tokens.len().max(16);
    let mut session = model.session(wgemma::SessionOptions {
        context,
        max_batch: 256,
    })?;
    args.adapters.apply(&model, &mut session)?;
    let scored = pollster::block_on(session.score(&args.tokens))?;
    let positions: Vec<serde_json::Value> = scored
        .iter()
        .map(|(id, logit)| serde_json::json!({ "argmax": id, "logit": logit }))
        .collect();
    println!("{}", serde_json::json!({ "positions": positions }));
    Ok(())
}
