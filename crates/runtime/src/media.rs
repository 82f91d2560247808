//! Images and audio in prompts: how each placeholder (`<|image|>`, `<|audio|>`) becomes its
//! marker block, `<|image>` + N x `<|image|>` + `<image|>` (likewise for audio, N the soft
//! tokens), and which of them a new request can take from the KV cache instead of encoding
//! them again.

use wgemma_text::tokenizer::Tokenizer;

use crate::audio::AudioInput;
use crate::error::Error;
use crate::image::ImageInput;

/// One modality's marker tokens in a Gemma 4 vocabulary.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Markers {
    pub begin: u32,
    pub soft: u32,
    pub end: u32,
}

impl Markers {
    fn of(tok: &Tokenizer, [begin, soft, end]: [&str; 3]) -> Option<Self> {
        Some(Self {
            begin: tok.token_id(begin)?,
            soft: tok.token_id(soft)?,
            end: tok.token_id(end)?,
        })
    }

    pub fn image(tok: &Tokenizer) -> Option<Self> {
        Self::of(tok, ["<|image>", "<|image|>", "<image|>"])
    }

    pub fn audio(tok: &Tokenizer) -> Option<Self> {
        Self::of(tok, ["<|audio>", "<|audio|>", "<audio|>"])
    }
}

/// Which input of the request a span holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Image(usize),
    Audio(usize),
}

/// Where one image's or clip's soft tokens sit in a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// Position of the first soft token.
    pub at: usize,
    pub len: usize,
    pub key: u64,
    pub source: Source,
}

/// A request's images and clips, each list in placeholder order, with the vocabulary's
/// markers for each (`None` where it has none).
pub(crate) struct Inputs<'a> {
    pub images: &'a [ImageInput],
    pub audio: &'a [AudioInput],
    pub image_markers: Option<Markers>,
    pub audio_markers: Option<Markers>,
}

impl Inputs<'_> {
    fn markers(
        what: &str,
        count: usize,
        markers: Option<Markers>,
    ) -> Result<Option<Markers>, Error> {
        match markers {
            None if count > 0 => Err(Error::Request(format!(
                "the model's vocabulary has no {what} tokens"
            ))),
            m => Ok(m),
        }
    }

    /// The soft tokens and cache key of the input a placeholder `t` takes next, if `t` is one.
    fn next(
        &self,
        t: u32,
        [image, audio]: [Option<Markers>; 2],
        seen: &mut [usize; 2],
    ) -> Result<Option<(Markers, usize, u64, Source)>, Error> {
        if let Some(m) = image.filter(|m| m.soft == t) {
            let i = seen[0];
            seen[0] += 1;
            return match self.images.get(i) {
                Some(img) => Ok(Some((
                    m,
                    img.soft_tokens()? as usize,
                    img.key(),
                    Source::Image(i),
                ))),
                None => Ok(None),
            };
        }
        if let Some(m) = audio.filter(|m| m.soft == t) {
            let i = seen[1];
            seen[1] += 1;
            return match self.audio.get(i) {
                Some(a) => Ok(Some((m, a.soft_tokens(), a.key(), Source::Audio(i)))),
                None => Ok(None),
            };
        }
        Ok(None)
    }
}

/// `tokens` with each placeholder (the soft-token id, one per input, in order) expanded to
/// its input's marker block, and where each input's soft tokens go (in prompt order).
pub(crate) fn expand(tokens: &[u32], inputs: &Inputs<'_>) -> Result<(Vec<u32>, Vec<Span>), Error> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut spans = Vec::new();
    let markers = [
        Inputs::markers("image", inputs.images.len(), inputs.image_markers)?,
        Inputs::markers("audio", inputs.audio.len(), inputs.audio_markers)?,
    ];
    let mut seen = [0; 2];
    for &t in tokens {
        match inputs.next(t, markers, &mut seen)? {
            Some((m, len, key, source)) => {
                out.push(m.begin);
                spans.push(Span {
                    at: out.len(),
                    len,
                    key,
                    source,
                });
                out.extend(std::iter::repeat_n(m.soft, len));
                out.push(m.end);
            }
            None => out.push(t),
        }
    }
    for (what, placeholders, given) in [
        ("image", seen[0], inputs.images.len()),
        ("audio", seen[1], inputs.audio.len()),
    ] {
        if placeholders != given {
            return Err(Error::Request(format!(
                "the prompt has {placeholders} {what} placeholders for {given} {what} inputs"
            )));
        }
    }
    Ok((out, spans))
}

/// How much of `tokens` (with its inputs at `spans`) the cache already holds, given what it
/// holds (`cached` tokens with inputs at `cached_spans`): the common token prefix, cut back
/// to the start of the first input that differs or is only partly inside it.
pub(crate) fn reusable_prefix(
    cached: &[u32],
    cached_spans: &[Span],
    tokens: &[u32],
    spans: &[Span],
) -> usize {
    let mut common = cached
        .iter()
        .zip(tokens)
        .take_while(|(a, b)| a == b)
        .count();
    for s in spans {
        let same = cached_spans.contains(s);
        if s.at < common && (!same || s.at + s.len > common) {
            common = common.min(s.at);
        }
    }
    common
}
