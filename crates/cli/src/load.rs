//! Resolving `--model` and loading it with a progress bar.

use indicatif::{ProgressBar, ProgressStyle};
use wgemma::pull::DEFAULT_MODEL;
use wgemma::{LoadOptions, Model, ModelSource, SamplingHints};

use super::CliError;

/// `--model` shared by the subcommands that run a model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArg {
    /// A GGUF path or an Ollama model name (gemma3:270m); the default model when absent,
    /// fetched on first use.
    #[arg(long, short)]
    pub model: Option<String>,
    /// Keep a mixture-of-experts model's experts in host memory and copy each layer's in as
    /// it runs: less GPU memory, slower steps. By default they stay on the GPU when they fit.
    #[arg(long)]
    pub stream_experts: bool,
    /// A llama.cpp projector file (mmproj GGUF) with the model's vision tower; not needed
    /// when the model file holds the tower (Ollama's do).
    #[arg(long, value_name = "PATH")]
    pub mmproj: Option<std::path::PathBuf>,
}

/// A loaded model and what its files recommend.
pub struct Loaded {
    pub model: Model,
    /// Sampling settings the model recommends: its Ollama manifest's, else its GGUF's.
    pub sampling: SamplingHints,
    /// Whether the model is meant for chat: its GGUF or its Ollama manifest has a chat
    /// template.
    pub chat: bool,
    /// What the user called it (a path or an Ollama name).
    pub label: String,
}

/// The model files `--model` names: a path, an Ollama name, or the default model (fetched
/// first if needed).
pub fn resolve(arg: &ModelArg) -> Result<ModelSource, CliError> {
    Ok(match arg.model.as_deref() {
        None => default_source()?,
        Some(name) if name == DEFAULT_MODEL.name => default_source()?,
        Some(spec) => ModelSource::resolve(spec)?,
    })
}

/// Whether the model file is a DiffusionGemma model (`diffusion-gemma`).
pub fn is_diffusion(source: &ModelSource) -> Result<bool, CliError> {
    let path = &source.model;
    let header =
        wgemma::gguf::read_file_header(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(wgemma::is_diffusion(&header))
}

/// A progress bar for uploading weights (hidden when `quiet`), and load options that feed it.
pub fn progress(arg: &ModelArg, quiet: bool) -> (ProgressBar, LoadOptions) {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(1).with_style(
            ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    };
    let progress_bar = bar.clone();
    let opts = LoadOptions {
        on_progress: Some(Box::new(move |p| {
            progress_bar.set_length(p.total);
            progress_bar.set_position(p.done);
        })),
        gpu: wgemma::ContextOptions::default().with_env(),
        experts: if arg.stream_experts {
            wgemma::ExpertPlacement::Streamed
        } else {
            wgemma::ExpertPlacement::Auto
        },
        mmproj: arg.mmproj.clone(),
        ..LoadOptions::default()
    };
    (bar, opts)
}

/// Loads the model, showing upload progress on stderr unless `quiet`.
pub fn load(arg: &ModelArg, quiet: bool) -> Result<Loaded, CliError> {
    load_source(arg, resolve(arg)?, quiet)
}

/// [`load`] of a resolved source.
pub fn load_source(arg: &ModelArg, source: ModelSource, quiet: bool) -> Result<Loaded, CliError> {
    let path = &source.model;
    let (bar, opts) = progress(arg, quiet);
    let model = pollster::block_on(Model::load_file(path, opts))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    bar.finish_and_clear();
    let info = model.info();
    Ok(Loaded {
        // An Ollama model's own parameters are what its users expect; the GGUF's keys fill in.
        sampling: source.sampling_hints().or(info.sampling.clone()),
        chat: info.chat_template || source.chat_template,
        label: info.name.clone().unwrap_or_else(|| source.label.clone()),
        model,
    })
}

/// The default model, fetched first if needed.
fn default_source() -> Result<ModelSource, CliError> {
    Ok(ModelSource {
        model: super::pull::run()?,
        projector: None,
        label: DEFAULT_MODEL.name.to_string(),
        params: None,
        chat_template: false,
        template: None,
    })
}

/// `--lora PATH[:SCALE]` shared by the subcommands that generate or score.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AdapterArgs {
    /// A LoRA adapter to apply: a llama.cpp GGUF adapter file or a PEFT adapter directory
    /// (adapter_config.json + adapter_model.safetensors), with its scale after a colon (1 by
    /// default). Repeat it for several adapters.
    #[arg(long = "lora", value_name = "PATH[:SCALE]", value_parser = parse_adapter)]
    pub lora: Vec<(std::path::PathBuf, f32)>,
}

/// `PATH[:SCALE]`: the text after the last colon is the scale where it is a number, else
/// part of the path.
fn parse_adapter(s: &str) -> Result<(std::path::PathBuf, f32), String> {
    let (path, scale) = match s.rsplit_once(':') {
        Some((path, scale)) if !path.is_empty() => match scale.parse::<f32>() {
            Ok(v) if v.is_finite() => (path, v),
            Ok(_) => return Err(format!("{scale}: the scale must be a finite number")),
            Err(_) => (s, 1.0),
        },
        _ => (s, 1.0),
    };
    if path.is_empty() {
        return Err("an adapter path is needed".into());
    }
    Ok((path.into(), scale))
}

impl AdapterArgs {
    /// Reads the adapters for `model` and applies them to `session`.
    pub fn apply(&self, model: &Model, session: &mut wgemma::Session) -> Result<(), CliError> {
        if self.lora.is_empty() {
            return Ok(());
        }
        let mut adapters = Vec::new();
        for (path, scale) in &self.lora {
            let a = model
                .load_adapter(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            adapters.push((a, *scale));
        }
        pollster::block_on(session.set_adapters(&adapters))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_adapter;

    #[test]
    fn an_adapter_argument_is_a_path_and_an_optional_scale() {
        let p = |s: &str| parse_adapter(s).map(|(p, v)| (p.display().to_string(), v));
        assert_eq!(p("a.gguf"), Ok(("a.gguf".into(), 1.0)));
        assert_eq!(p("a.gguf:0.5"), Ok(("a.gguf".into(), 0.5)));
        assert_eq!(p("dir/x:y"), Ok(("dir/x:y".into(), 1.0)));
        assert_eq!(p("c:/a:-2"), Ok(("c:/a".into(), -2.0)));
        assert_eq!(p(":2"), Ok((":2".into(), 1.0)));
        assert!(p("a:inf").is_err());
        assert!(p("").is_err());
    }
}

/// `--image PATH`, `--image-tokens N` and `--audio PATH`, shared by the subcommands that take
/// images and audio.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MediaArgs {
    /// An image (PNG, JPEG, WebP or GIF) for the prompt; repeat it for several. The model
    /// needs a vision tower (`--mmproj`, or a model file that holds one).
    #[arg(long = "image", value_name = "PATH")]
    pub images: Vec<std::path::PathBuf>,
    /// Most soft tokens an image becomes: 70, 140, 280, 560 or 1120 (more: finer detail,
    /// slower).
    #[arg(long, default_value_t = wgemma::DEFAULT_IMAGE_TOKENS)]
    pub image_tokens: u32,
    /// An audio clip (WAV, FLAC, MP3 or Ogg/Vorbis, up to 10 minutes; 25 soft tokens a
    /// second) for the prompt, after the images; repeat it for several. The model needs an
    /// audio tower (Gemma 4 E2B/E4B with `--mmproj`, or a model file that holds one).
    #[arg(long = "audio", value_name = "PATH")]
    pub audio: Vec<std::path::PathBuf>,
}

/// A prompt's images and clips, read.
#[derive(Clone, Debug, Default)]
pub struct Media {
    pub images: Vec<wgemma::ImageInput>,
    pub audio: Vec<wgemma::AudioInput>,
}

impl MediaArgs {
    /// Reads the images and clips.
    pub fn read(&self) -> Result<Media, CliError> {
        Ok(Media {
            images: self
                .images
                .iter()
                .map(|p| read_image(p, self.image_tokens))
                .collect::<Result<_, _>>()?,
            audio: self
                .audio
                .iter()
                .map(|p| read_audio(p))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// An image file as a prompt's image.
pub fn read_image(path: &std::path::Path, budget: u32) -> Result<wgemma::ImageInput, CliError> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(wgemma::ImageInput::from_bytes(bytes).with_budget(budget))
}

/// An audio file as a prompt's clip (decoded and turned into features here, so a bad file is
/// reported with its name).
pub fn read_audio(path: &std::path::Path) -> Result<wgemma::AudioInput, CliError> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    wgemma::AudioInput::from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()).into())
}
