//! Text to token ids and back, for the vocabularies Gemma GGUFs carry, matching llama.cpp's
//! `llama_tokenize` id for id.
//!
//! Encoding runs in two stages, as in llama.cpp:
//! 1. Special-token pre-pass: the text of every CONTROL, USER_DEFINED or UNKNOWN token is cut
//!    out of the input, longest token text first. USER_DEFINED tokens are always cut out;
//!    CONTROL and UNKNOWN ones only when the caller asks to parse special tokens. For Gemma 3
//!    this cuts out every newline, tab and multi-space run before the model algorithm runs.
//! 2. The model algorithm on each remaining piece of text:
//!    - SentencePiece style (`tokenizer.ggml.model = "llama"`, Gemma 3): spaces become `▁`,
//!      adjacent symbols merge when their concatenation is a token, highest score first;
//!      leftovers fall back to `<0xXX>` byte tokens.
//!    - Gemma 4 BPE (`tokenizer.ggml.model = "gemma4"`, or Ollama's `"llama"` with
//!      `tokenizer.ggml.pre = "gemma4"`): spaces become `▁`, the text splits into newline and
//!      non-newline runs, pairs merge by `tokenizer.ggml.merges` rank, lowest first; leftovers
//!      fall back to `<0xXX>` byte tokens (dropped when the vocabulary lacks one).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::ops::Range;

use wgemma_gguf::{Array, Metadata, MetadataError};

/// Why a tokenizer could not be built from GGUF metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(
        "unsupported tokenizer model {} (expected \"llama\" or \"gemma4\")",
        wgemma_gguf::Quoted(.0)
    )]
    UnsupportedModel(String),
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("the vocabulary has {0} tokens, more than 32-bit ids can address")]
    VocabTooLarge(usize),
    #[error("metadata key {key:?} has {found} entries for {expected} tokens")]
    TooShort {
        key: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("metadata key {key:?} holds {found}, expected an array of numbers")]
    WrongArrayType { key: &'static str, found: String },
    #[error("no usable {0} token id (missing from the metadata or outside the vocabulary)")]
    MissingSpecial(&'static str),
}

/// Which encoding algorithm a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// llama.cpp's SPM: score-ordered bigram merging (Gemma 3).
    SentencePiece,
    /// llama.cpp's BPE with the Gemma 4 pre-tokenizer: rank-ordered merges.
    Gemma4Bpe,
}

/// Prompt text built from markup (a chat template's `<start_of_turn>`, `<|image|>`, whose
/// control-token text becomes those tokens) and plain text (what a user typed, whose
/// `<end_of_turn>` stays the characters `<end_of_turn>`: a user cannot forge a turn). As in
/// llama.cpp without special-token parsing, the vocabulary's user-defined tokens (Gemma 3's
/// whitespace runs, `<start_of_image>`) are still split out of plain text: they are ordinary
/// pieces, not control tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkedText {
    text: String,
    /// Byte ranges of plain text, ascending and disjoint.
    plain: Vec<Range<usize>>,
}

impl MarkedText {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends markup: control-token text in it becomes control tokens.
    pub fn push_markup(&mut self, markup: &str) {
        self.text.push_str(markup);
    }

    /// Appends plain text: control-token text in it stays text.
    pub fn push_plain(&mut self, text: &str) {
        let start = self.text.len();
        self.text.push_str(text);
        match self.plain.last_mut() {
            Some(last) if last.end == start => last.end = self.text.len(),
            _ if text.is_empty() => {}
            _ => self.plain.push(start..self.text.len()),
        }
    }

    /// All of it, markup and plain text alike.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `start..end` touches plain text.
    fn overlaps_plain(&self, start: usize, end: usize) -> bool {
        let first_after = self.plain.partition_point(|r| r.end <= start);
        self.plain.get(first_after).is_some_and(|r| r.start < end)
    }
}

impl From<MarkedText> for String {
    fn from(m: MarkedText) -> String {
        m.text
    }
}

/// llama.cpp token attributes, derived from the GGUF token types. A token can carry more than
/// one: llama.cpp adds CONTROL to tokens whose text looks like an end-of-generation marker.
mod attr {
    pub const NORMAL: u8 = 1;
    pub const UNKNOWN: u8 = 2;
    pub const CONTROL: u8 = 4;
    pub const USER_DEFINED: u8 = 8;
    pub const UNUSED: u8 = 16;
    pub const BYTE: u8 = 32;

    /// GGUF `tokenizer.ggml.token_type` values (1..=6) to attributes; anything else is
    /// "undefined", which renders as nothing and is never special.
    pub fn from_gguf_type(t: i128) -> u8 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

/// Token texts llama.cpp treats as end-of-generation markers. It forces CONTROL onto them,
/// which changes both pre-splitting and rendering (Gemma 3's `</s>` HTML token, for example,
/// stops being split out when special tokens are not parsed, and renders as nothing).
const LLAMA_CPP_EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts that end a Gemma turn: Gemma 3's `<end_of_turn>`, Gemma 4's `<turn|>` and
/// `<|tool_response>` (the host runs the tool), and `<eos>`.
const GEMMA_STOP_TEXTS: &[&str] = &["<eos>", "<end_of_turn>", "<turn|>", "<|tool_response>"];

/// SentencePiece's visible space.
const SPACE_MARK: &str = "\u{2581}";

/// A vocabulary and its encoding rules, built from GGUF metadata.
#[derive(Clone)]
pub struct Tokenizer {
    algorithm: Algorithm,
    pieces: Vec<Box<str>>,
    scores: Vec<f32>,
    attrs: Vec<u8>,
    ids: HashMap<Box<str>, u32>,
    /// Id of the `<0xXX>` token for each byte value, when the vocabulary has it.
    byte_ids: [Option<u32>; 256],
    specials: Specials,
    /// BPE merge ranks keyed by the ids of both sides (see [`Merges`]).
    merges: Merges,
    bos: u32,
    eos: u32,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Sorted, deduplicated.
    end_of_generation: Vec<u32>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The vocabulary itself is far too large to print.
        f.debug_struct("Tokenizer")
            .field("algorithm", &self.algorithm)
            .field("vocab_size", &self.pieces.len())
            .field("special_tokens", &self.specials.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("end_of_generation", &self.end_of_generation)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF describes (`tokenizer.ggml.*` keys). `architecture` is
    /// `general.architecture`: a `"gemma4"` model always uses the Gemma 4 BPE, since Ollama's
    /// Gemma 4 blobs declare the `"llama"` tokenizer model.
    pub fn from_metadata(meta: &Metadata, architecture: &str) -> Result<Self, TokenizerError> {
        let model = meta.get_str("tokenizer.ggml.model")?;
        let pre = meta.opt_str("tokenizer.ggml.pre")?;
        let algorithm = match model {
            "gemma4" => Algorithm::Gemma4Bpe,
            "llama"
                if pre == Some("gemma4")
                    || architecture == "gemma4"
                    || architecture == "diffusion-gemma" =>
            {
                Algorithm::Gemma4Bpe
            }
            "llama" => Algorithm::SentencePiece,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };

        let texts = meta.get_str_array("tokenizer.ggml.tokens")?;
        let n = texts.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        let n_u32 = u32::try_from(n).map_err(|_| TokenizerError::VocabTooLarge(n))?;
        let scores = read_scores(meta, n)?;
        let mut attrs = read_attrs(meta, n)?;

        // llama.cpp renames empty tokens so that they can never match (an empty special token
        // would otherwise match everywhere).
        let pieces: Vec<Box<str>> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| match t.is_empty() {
                true => format!("[EMPTY_{i}]").into_boxed_str(),
                false => t.as_str().into(),
            })
            .collect();
        let mut ids = HashMap::with_capacity(n);
        for (id, piece) in (0..n_u32).zip(&pieces) {
            // A repeated text maps to its last id, as in llama.cpp.
            ids.insert(piece.clone(), id);
        }

        let mut marked = 0;
        for text in LLAMA_CPP_EOG_TEXTS {
            if let Some(&id) = ids.get(*text) {
                attrs[id as usize] |= attr::CONTROL;
                marked += 1;
            }
        }
        // Gemma 4's `</s>` is an ordinary token: llama.cpp recognises that vocabulary by its
        // `<|tool_response>` marker and resets `</s>` to NORMAL.
        if let (Some(&s), true) = (ids.get("</s>"), ids.contains_key("<|tool_response>")) {
            attrs[s as usize] = attr::NORMAL;
        }

        // llama.cpp's defaults when the GGUF names no id.
        let (default_bos, default_eos, default_unk) = match algorithm {
            Algorithm::SentencePiece => (Some(1), Some(2), Some(0)),
            Algorithm::Gemma4Bpe => (None, None, None),
        };
        let bos = special_id(meta, "tokenizer.ggml.bos_token_id", default_bos, n_u32)?
            .ok_or(TokenizerError::MissingSpecial("bos"))?;
        let eos = special_id(meta, "tokenizer.ggml.eos_token_id", default_eos, n_u32)?
            .ok_or(TokenizerError::MissingSpecial("eos"))?;
        let unk = special_id(meta, "tokenizer.ggml.unknown_token_id", default_unk, n_u32)?;

        let mut end_of_generation = vec![eos];
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            end_of_generation.extend(special_id(meta, key, None, n_u32)?);
        }
        // Ollama writes every stop id of the HF generation config here; being optional, a
        // malformed list is ignored rather than fatal.
        match meta.get_u32_array("tokenizer.ggml.eos_token_ids") {
            Ok(list) => end_of_generation.extend(list.into_iter().filter(|&id| id < n_u32)),
            Err(MetadataError::Missing(_)) => {}
            Err(e) => tracing::warn!(%e, "ignoring tokenizer.ggml.eos_token_ids"),
        }
        end_of_generation.extend(GEMMA_STOP_TEXTS.iter().filter_map(|t| ids.get(*t)));
        end_of_generation.sort_unstable();
        end_of_generation.dedup();

        // Gemma 4 always starts with BOS: llama.cpp overrides a GGUF that says otherwise.
        let add_bos = match algorithm {
            Algorithm::Gemma4Bpe => true,
            Algorithm::SentencePiece => meta
                .opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(true),
        };
        let add_eos = meta
            .opt_bool("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false);
        let add_space_prefix = algorithm == Algorithm::SentencePiece
            && meta
                .opt_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);

        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids.get(format!("<0x{b:02X}>").as_str()).copied();
        }

        let merges = match algorithm {
            Algorithm::Gemma4Bpe => {
                Merges::new(meta.get_str_array("tokenizer.ggml.merges")?, &ids, n_u32)
            }
            Algorithm::SentencePiece => Merges::default(),
        };
        let specials = Specials::new(&pieces, &attrs);
        tracing::debug!(
            ?algorithm,
            vocab = n,
            specials = specials.tokens.len(),
            marked_control = marked,
            "tokenizer loaded"
        );
        Ok(Self {
            algorithm,
            pieces,
            scores,
            attrs,
            ids,
            byte_ids,
            specials,
            merges,
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
            end_of_generation,
        })
    }

    /// Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// with `add_special`, BOS (and EOS) are added where the vocabulary asks for them; with
    /// `parse_special`, the text of control tokens (`<start_of_turn>`, `<bos>`) becomes those
    /// tokens instead of plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let fragments = if parse_special {
            self.specials.partition(text, Some(&MarkedText::default()))
        } else {
            self.specials.partition(text, None)
        };
        self.encode_fragments(fragments, add_special)
    }

    /// Token ids of a prompt of markup and plain text: control-token text becomes control
    /// tokens only where it lies wholly in markup. Where the plain text holds no control-token
    /// text this equals `encode(text, add_special, true)`: both parse the text in one piece.
    pub fn encode_marked(&self, marked: &MarkedText, add_special: bool) -> Vec<u32> {
        let fragments = self.specials.partition(&marked.text, Some(marked));
        self.encode_fragments(fragments, add_special)
    }

    fn encode_fragments(&self, fragments: Vec<Fragment<'_>>, add_special: bool) -> Vec<u32> {
        let text_len: usize = fragments
            .iter()
            .map(|f| match f {
                Fragment::Text(t) => t.len(),
                Fragment::Special(_) => 1,
            })
            .sum();
        let mut out = Vec::with_capacity(text_len / 3 + 2);
        if add_special && self.add_bos {
            out.push(self.bos);
        }
        let mut after_special = true;
        for fragment in fragments {
            match fragment {
                Fragment::Special(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    match self.algorithm {
                        Algorithm::SentencePiece => {
                            self.encode_spm(t, self.add_space_prefix && after_special, &mut out)
                        }
                        Algorithm::Gemma4Bpe => self.encode_bpe(t, &mut out),
                    }
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.push(self.eos);
        }
        out
    }

    /// The text of `ids`: control tokens render as nothing, `▁` as a space, byte tokens as
    /// their byte; invalid UTF-8 that remains becomes U+FFFD. Out-of-range ids are skipped.
    /// Unlike llama.cpp's `llama_detokenize`, no space clean-up is applied, so decoding the
    /// encoding of text without special tokens gives that text back.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(&self.piece_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` contributes to generated text (llama.cpp's `token_to_piece` with
    /// `special = false`). A byte token is one byte, possibly part of a UTF-8 character that
    /// the following tokens complete; [`StreamDecoder`] reassembles those. Empty for control
    /// tokens and out-of-range ids.
    pub fn piece_bytes(&self, id: u32) -> Cow<'_, [u8]> {
        let (Some(text), Some(&a)) = (self.pieces.get(id as usize), self.attrs.get(id as usize))
        else {
            return Cow::Borrowed(&[]);
        };
        if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            Cow::Borrowed(&[])
        } else if a & attr::USER_DEFINED != 0 {
            Cow::Borrowed(text.as_bytes())
        } else if a & attr::NORMAL != 0 {
            if text.contains(SPACE_MARK) {
                Cow::Owned(text.replace(SPACE_MARK, " ").into_bytes())
            } else {
                Cow::Borrowed(text.as_bytes())
            }
        } else if a & attr::BYTE != 0 {
            // `<0xXX>`: llama.cpp reads the two hex digits after `<0x`.
            match text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => Cow::Borrowed(&ALL_BYTES[b as usize..b as usize + 1]),
                None => Cow::Borrowed(&[]),
            }
        } else {
            Cow::Borrowed(&[])
        }
    }

    /// The token's text as stored in the vocabulary (with `▁`, `<0xXX>` and control names).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(|p| &**p)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn bos(&self) -> u32 {
        self.bos
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Whether encoding with `add_special` starts with BOS (always for Gemma 4).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// Whether generating `id` ends the model's turn: EOS, the end-of-turn marker
    /// (`<end_of_turn>`, `<turn|>`), Gemma 4's `<|tool_response>`, and any stop ids the GGUF
    /// lists.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// Every end-of-generation id, sorted.
    pub fn end_of_generation(&self) -> &[u32] {
        &self.end_of_generation
    }

    /// Whether the token is a control token (renders as nothing; only produced from text
    /// when special tokens are parsed).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// llama.cpp's SPM session on one piece of text.
    fn encode_spm(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        let mut escaped = String::with_capacity(text.len() + 8);
        if space_prefix {
            escaped.push_str(SPACE_MARK);
        }
        escaped.push_str(&text.replace(' ', SPACE_MARK));
        let mut symbols = Symbols::new(&escaped);
        // Highest score first: the key orders like `f32::total_cmp`.
        symbols.merge_all(|pair, _| {
            let id = *self.ids.get(pair)?;
            let bits = self.scores[id as usize].to_bits() as i32;
            Some(bits ^ ((((bits >> 31) as u32) >> 1) as i32))
        });
        // Every merged symbol is a token (only token texts are queued), so a symbol that is
        // not a token is a single character missing from the vocabulary: llama.cpp's
        // "resegment" then always ends in byte fallback.
        for s in symbols.chain() {
            match self.ids.get(s) {
                Some(&id) => out.push(id),
                None => {
                    for &b in s.as_bytes() {
                        if let Some(id) = self.spm_byte_token(b) {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }

    /// `<0xXX>`, else the one-character token (llama.cpp's `byte_to_token`), else `<unk>`
    /// (where llama.cpp would throw).
    fn spm_byte_token(&self, b: u8) -> Option<u32> {
        let single = || {
            let mut buf = [0; 4];
            let s: &str = char::from(b).encode_utf8(&mut buf);
            self.ids.get(s).copied().filter(|_| b.is_ascii())
        };
        self.byte_ids[b as usize].or_else(single).or(self.unk)
    }

    /// llama.cpp's BPE session with the Gemma 4 pre-tokenizer on one piece of text.
    fn encode_bpe(&self, text: &str, out: &mut Vec<u32>) {
        let escaped = text.replace(' ', SPACE_MARK);
        for word in newline_runs(&escaped) {
            // A whole newline run that is a token stays one token (llama.cpp PR 21343).
            if word.bytes().all(|b| b == b'\n') {
                if let Some(&id) = self.ids.get(word) {
                    out.push(id);
                    continue;
                }
            }
            self.bpe_word(word, out);
        }
    }

    fn bpe_word(&self, word: &str, out: &mut Vec<u32>) {
        let mut symbols = Symbols::new(word);
        // Lowest rank first.
        symbols.merge_all(|pair, mid| {
            let (left, right) = pair.split_at(mid);
            self.merges.rank(left, right, &self.ids).map(Reverse)
        });
        for s in symbols.chain() {
            match self.ids.get(s) {
                Some(&id) => out.push(id),
                // Bytes without a `<0xXX>` token are dropped, as llama.cpp does.
                None => out.extend(s.bytes().filter_map(|b| self.byte_ids[b as usize])),
            }
        }
    }
}

/// Every byte value once, so that a byte token's piece can be borrowed.
static ALL_BYTES: [u8; 256] = {
    let mut a = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        a[i] = i as u8;
        i += 1;
    }
    a
};

/// Splits into maximal runs of `\n` and of everything else (the `[^\n]+|[\n]+` pre-tokenizer).
fn newline_runs(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        let first = *bytes.get(start)?;
        let newline = first == b'\n';
        let len = bytes[start..]
            .iter()
            .position(|&b| (b == b'\n') != newline)
            .unwrap_or(bytes.len() - start);
        let run = text.get(start..start + len);
        start += len;
        run
    })
}

/// `tokenizer.ggml.scores`: f32 (llama.cpp converter) or integer (some Ollama blobs); all
/// zero when absent.
fn read_scores(meta: &Metadata, n: usize) -> Result<Vec<f32>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.scores";
    if !meta.contains(KEY) {
        return Ok(vec![0.0; n]);
    }
    let scores: Vec<f32> = match meta.get_array(KEY)? {
        Array::F32(v) => v.clone(),
        a => a
            .integers()
            .ok_or_else(|| TokenizerError::WrongArrayType {
                key: KEY,
                found: format!("an array of {}", a.element_type()),
            })?
            .into_iter()
            .map(|i| i as f32)
            .collect(),
    };
    truncate_to(scores, n, KEY)
}

/// `tokenizer.ggml.token_type` as attributes; every token NORMAL when absent.
fn read_attrs(meta: &Metadata, n: usize) -> Result<Vec<u8>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.token_type";
    if !meta.contains(KEY) {
        return Ok(vec![attr::NORMAL; n]);
    }
    let a = meta.get_array(KEY)?;
    let types = a.integers().ok_or_else(|| TokenizerError::WrongArrayType {
        key: KEY,
        found: format!("an array of {}", a.element_type()),
    })?;
    truncate_to(
        types.into_iter().map(attr::from_gguf_type).collect(),
        n,
        KEY,
    )
}

/// Per-token arrays may be longer than the vocabulary (llama.cpp ignores the rest), not shorter.
fn truncate_to<T>(mut v: Vec<T>, n: usize, key: &'static str) -> Result<Vec<T>, TokenizerError> {
    if v.len() < n {
        return Err(TokenizerError::TooShort {
            key,
            found: v.len(),
            expected: n,
        });
    }
    v.truncate(n);
    Ok(v)
}

/// A special-token id from the metadata, else `default`; ids outside the vocabulary are
/// ignored, as llama.cpp does.
fn special_id(
    meta: &Metadata,
    key: &str,
    default: Option<u32>,
    n: u32,
) -> Result<Option<u32>, TokenizerError> {
    let default = default.filter(|&d| d < n);
    Ok(match meta.opt_u32(key)? {
        Some(id) if id < n => Some(id),
        Some(id) => {
            tracing::warn!(key, id, "special token id outside the vocabulary");
            default
        }
        None => default,
    })
}

/// Symbols of one merge session: contiguous byte ranges of the text, linked as a list; a
/// symbol merged into its left neighbour keeps length 0.
struct Symbols<'t> {
    text: &'t str,
    start: Vec<usize>,
    len: Vec<usize>,
    prev: Vec<Option<usize>>,
    next: Vec<Option<usize>>,
}

impl<'t> Symbols<'t> {
    /// One symbol per character.
    fn new(text: &'t str) -> Self {
        let start: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let n = start.len();
        let len = (0..n)
            .map(|i| start.get(i + 1).copied().unwrap_or(text.len()) - start[i])
            .collect();
        Self {
            text,
            start,
            len,
            prev: (0..n).map(|i| i.checked_sub(1)).collect(),
            next: (0..n).map(|i| (i + 1 < n).then_some(i + 1)).collect(),
        }
    }

    fn count(&self) -> usize {
        self.start.len()
    }

    fn text(&self, i: usize) -> &'t str {
        &self.text[self.start[i]..self.start[i] + self.len[i]]
    }

    /// The text of symbol `left` followed by symbol `right` (its next).
    fn pair(&self, left: usize, right: usize) -> &'t str {
        let start = self.start[left];
        &self.text[start..start + self.len[left] + self.len[right]]
    }

    /// llama.cpp's merge loop, shared by SPM and BPE: merges adjacent symbols, the pair with
    /// the greatest `priority` first (the leftmost on ties), until no adjacent pair has one.
    /// `priority` sees the pair's text and where the right symbol starts in it.
    fn merge_all<P: Ord>(&mut self, priority: impl Fn(&'t str, usize) -> Option<P>) {
        let mut queue = BinaryHeap::new();
        let consider = |s: &Self, queue: &mut BinaryHeap<Candidate<P>>, left, right| {
            let (Some(l), Some(r)) = (left, right) else {
                return;
            };
            if let Some(p) = priority(s.pair(l, r), s.len[l]) {
                queue.push(Candidate {
                    priority: p,
                    left: Reverse(l),
                    right: r,
                    size: s.len[l] + s.len[r],
                });
            }
        };
        for i in 1..self.count() {
            consider(self, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(c) = queue.pop() {
            let (l, r) = (c.left.0, c.right);
            // Stale: a side was merged away or grew since the pair was queued. Sizes only
            // grow, so this is also llama.cpp's BPE "same text" check.
            if self.len[l] == 0 || self.len[r] == 0 || self.len[l] + self.len[r] != c.size {
                continue;
            }
            self.merge(l, r);
            consider(self, &mut queue, self.prev[l], Some(l));
            consider(self, &mut queue, Some(l), self.next[l]);
        }
    }

    /// Merges `right` (the next symbol) into `left`.
    fn merge(&mut self, left: usize, right: usize) {
        self.len[left] += self.len[right];
        self.len[right] = 0;
        let after = self.next[right];
        self.next[left] = after;
        if let Some(a) = after {
            self.prev[a] = Some(left);
        }
    }

    /// The surviving symbols' texts, in order.
    fn chain(&self) -> impl Iterator<Item = &'t str> + '_ {
        let mut at = (self.count() > 0).then_some(0);
        std::iter::from_fn(move || {
            let i = at?;
            at = self.next[i];
            Some(self.text(i))
        })
    }
}

/// A merge candidate. The queue pops the greatest priority, then the leftmost pair.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Candidate<P> {
    priority: P,
    left: Reverse<usize>,
    right: usize,
    size: usize,
}

/// BPE merge ranks. Each side of a merge rule is interned as its token id, or as an id past
/// the vocabulary for the rare side that is not a token, so the table is keyed by two `u32`s
/// instead of two strings (Gemma 4 has hundreds of thousands of rules).
#[derive(Clone, Default)]
struct Merges {
    ranks: HashMap<(u32, u32), u32>,
    /// Merge sides that are not tokens.
    extra: HashMap<Box<str>, u32>,
}

impl Merges {
    fn new(rules: &[String], ids: &HashMap<Box<str>, u32>, n_vocab: u32) -> Self {
        let mut m = Self::default();
        let mut next_extra = n_vocab;
        let mut intern = |s: &str, extra: &mut HashMap<Box<str>, u32>| {
            if let Some(&id) = ids.get(s) {
                return id;
            }
            *extra.entry(s.into()).or_insert_with(|| {
                let id = next_extra;
                next_extra = next_extra.saturating_add(1);
                id
            })
        };
        for (rank, rule) in (0u32..).zip(rules) {
            // Split at the first space after the first byte, so that a rule may merge a
            // leading space (llama.cpp's `find(' ', 1)`). Rules without one never apply.
            let Some(pos) = rule.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&rule[..pos], &rule[pos + 1..]);
            let key = (intern(a, &mut m.extra), intern(b, &mut m.extra));
            // The first rule for a pair wins (llama.cpp inserts with `emplace`).
            m.ranks.entry(key).or_insert(rank);
        }
        m
    }

    fn rank(&self, left: &str, right: &str, ids: &HashMap<Box<str>, u32>) -> Option<u32> {
        let key = |s: &str| ids.get(s).or_else(|| self.extra.get(s)).copied();
        self.ranks.get(&(key(left)?, key(right)?)).copied()
    }
}

/// A piece of input after the special-token pre-pass.
enum Fragment<'t> {
    Text(&'t str),
    Special(u32),
}

/// One special token, in llama.cpp's matching order.
#[derive(Clone)]
struct SpecialToken {
    id: u32,
    len: usize,
    /// CONTROL or UNKNOWN: only matched when special tokens are parsed.
    needs_parse_special: bool,
}

/// The special tokens, sorted as llama.cpp sorts them (longer text first; ties by id), and a
/// byte trie of their texts so that one pass over the input finds every match.
#[derive(Clone)]
struct Specials {
    tokens: Vec<SpecialToken>,
    /// Trie node for each first byte; 0 means no special token starts with it.
    root: Box<[u32; 256]>,
    nodes: Vec<TrieNode>,
}

#[derive(Clone, Default)]
struct TrieNode {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    /// Index into `Specials::tokens` of the token whose text ends here.
    token: Option<u32>,
}

/// Token `rank` matches at `start`, `start + 1`, ..., `start + count - 1`. Whitespace-run
/// tokens match at every position of a long run, so runs keep that compact.
#[derive(Clone, Copy)]
struct MatchRun {
    rank: u32,
    start: usize,
    count: usize,
}

impl Specials {
    fn new(pieces: &[Box<str>], attrs: &[u8]) -> Self {
        let special = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut tokens: Vec<SpecialToken> = (0u32..)
            .zip(pieces.iter().zip(attrs))
            .filter(|(_, (_, a))| *a & special != 0)
            .map(|(id, (p, a))| SpecialToken {
                id,
                len: p.len(),
                needs_parse_special: a & (attr::CONTROL | attr::UNKNOWN) != 0,
            })
            .collect();
        // Stable, so equal lengths stay in id order (llama.cpp's order there is unspecified;
        // no two equal-length Gemma special tokens can overlap, so it does not matter).
        tokens.sort_by_key(|t| std::cmp::Reverse(t.len));

        let mut s = Self {
            tokens,
            root: Box::new([0; 256]),
            nodes: vec![TrieNode::default()],
        };
        for rank in 0..s.tokens.len() {
            let text = pieces[s.tokens[rank].id as usize].as_bytes();
            let node = s.insert(text);
            // Texts are unique in a valid vocabulary; if not, the first in order wins.
            let slot = &mut s.nodes[node as usize].token;
            if slot.is_none() {
                *slot = u32::try_from(rank).ok();
            }
        }
        s
    }

    /// The trie node for `text`, creating the path as needed.
    fn insert(&mut self, text: &[u8]) -> u32 {
        let Some((&first, rest)) = text.split_first() else {
            return 0;
        };
        let mut node = self.root[first as usize];
        if node == 0 {
            node = self.new_node();
            self.root[first as usize] = node;
        }
        for &b in rest {
            let children = &self.nodes[node as usize].children;
            node = match children.binary_search_by_key(&b, |c| c.0) {
                Ok(j) => children[j].1,
                Err(j) => {
                    let child = self.new_node();
                    self.nodes[node as usize].children.insert(j, (b, child));
                    child
                }
            };
        }
        node
    }

    fn new_node(&mut self) -> u32 {
        self.nodes.push(TrieNode::default());
        (self.nodes.len() - 1) as u32
    }

    /// Ranks of the special tokens whose text starts `rest`, shortest first.
    fn matches_at(&self, rest: &[u8], parse_special: bool, out: &mut Vec<u32>) {
        let Some(&first) = rest.first() else { return };
        let mut node = self.root[first as usize];
        let mut depth = 1;
        while node != 0 {
            let n = &self.nodes[node as usize];
            if let Some(rank) = n.token {
                if parse_special || !self.tokens[rank as usize].needs_parse_special {
                    out.push(rank);
                }
            }
            let Some(&b) = rest.get(depth) else { break };
            node = match n.children.binary_search_by_key(&b, |c| c.0) {
                Ok(j) => n.children[j].1,
                Err(_) => 0,
            };
            depth += 1;
        }
    }

    /// Splits `text` into plain text and special tokens exactly as llama.cpp's
    /// `tokenizer_st_partition`: for each special token in order, every leftmost
    /// non-overlapping occurrence that lies wholly inside text not yet claimed is cut out.
    ///
    /// llama.cpp searches the whole text once per special token; here one trie pass finds all
    /// occurrences, and they are then claimed token by token in the same order. An
    /// occurrence of a token is claimed when it overlaps no earlier claim and starts after
    /// the previous claim of the same token.
    ///
    /// `marked` is `None` when control tokens are not parsed; otherwise they are parsed where
    /// they touch none of its plain text.
    fn partition<'t>(&self, text: &'t str, marked: Option<&MarkedText>) -> Vec<Fragment<'t>> {
        let mut runs = self.find_runs(text.as_bytes(), marked.is_some());
        runs.sort_unstable_by_key(|r| (r.rank, r.start));

        // start -> (end, id) of claimed occurrences.
        let mut claimed: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        let mut rank = u32::MAX;
        let mut last_end = 0;
        for run in runs {
            if run.rank != rank {
                rank = run.rank;
                last_end = 0;
            }
            let tok = &self.tokens[run.rank as usize];
            let mut pos = run.start.max(last_end);
            while pos < run.start + run.count {
                // Claims are disjoint, so the one starting last before our end is the only
                // candidate for an overlap; every start before its end overlaps it too.
                if let Some((_, &(end, _))) = claimed.range(..pos + tok.len).next_back() {
                    if end > pos {
                        pos = end;
                        continue;
                    }
                }
                if tok.needs_parse_special
                    && marked.is_some_and(|m| m.overlaps_plain(pos, pos + tok.len))
                {
                    pos += 1;
                    continue;
                }
                claimed.insert(pos, (pos + tok.len, tok.id));
                pos += tok.len;
                last_end = pos;
            }
        }

        let mut fragments = Vec::with_capacity(2 * claimed.len() + 1);
        let mut at = 0;
        for (start, (end, id)) in claimed {
            // Token texts are whole UTF-8 sequences, so matches fall on character boundaries.
            if let Some(t) = text.get(at..start).filter(|t| !t.is_empty()) {
                fragments.push(Fragment::Text(t));
            }
            fragments.push(Fragment::Special(id));
            at = end;
        }
        if let Some(t) = text.get(at..).filter(|t| !t.is_empty()) {
            fragments.push(Fragment::Text(t));
        }
        fragments
    }

    /// Every occurrence of every special token in `bytes`, as runs of consecutive starts.
    fn find_runs(&self, bytes: &[u8], parse_special: bool) -> Vec<MatchRun> {
        let mut done = Vec::new();
        let mut open: Vec<MatchRun> = Vec::new();
        let mut next_open = Vec::new();
        let mut here = Vec::new();
        for i in 0..bytes.len() {
            here.clear();
            self.matches_at(&bytes[i..], parse_special, &mut here);
            if here.is_empty() && open.is_empty() {
                continue;
            }
            // Both lists are ordered by token length, so one merge walk pairs them up.
            next_open.clear();
            let mut k = 0;
            for &rank in &here {
                let len = self.tokens[rank as usize].len;
                while k < open.len() && self.tokens[open[k].rank as usize].len < len {
                    done.push(open[k]);
                    k += 1;
                }
                if k < open.len() && open[k].rank == rank {
                    next_open.push(MatchRun {
                        count: open[k].count + 1,
                        ..open[k]
                    });
                    k += 1;
                } else {
                    next_open.push(MatchRun {
                        rank,
                        start: i,
                        count: 1,
                    });
                }
            }
            done.extend_from_slice(&open[k..]);
            std::mem::swap(&mut open, &mut next_open);
        }
        done.extend(open);
        done
    }
}

/// Turns generated token ids into text as they arrive, holding back the bytes of a UTF-8
/// character until the tokens that complete it have come (Gemma spells rare characters as
/// several byte tokens), so no event ever ends in the middle of a character.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text completed by it (often empty for byte tokens).
    /// Bytes that can never form a character are emitted as U+FFFD right away.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(&tokenizer.piece_bytes(id));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        out
    }

    /// Ends the stream: whatever is still held back, with U+FFFD for an unfinished character.
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
