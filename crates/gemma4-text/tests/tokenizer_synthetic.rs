//! Tokenizers built from small synthetic vocabularies: the Gemma 4 BPE (no real Gemma 4 vocab
//! is at hand), a tiny SentencePiece vocab for merge-order corner cases, and metadata errors.

use wgemma_gguf::{Array, Metadata, Value};
use wgemma_text::tokenizer::{Algorithm, StreamDecoder, Tokenizer, TokenizerError};

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// A vocabulary under construction: texts and GGUF token types.
#[derive(Default)]
struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
}

impl Vocab {
    fn add(&mut self, text: &str, ty: i32) -> u32 {
        self.tokens.push(text.to_string());
        self.types.push(ty);
        (self.tokens.len() - 1) as u32
    }

    fn id(&self, text: &str) -> u32 {
        self.tokens.iter().position(|t| t == text).unwrap() as u32
    }

    /// All 256 `<0xXX>` tokens except those in `missing`.
    fn add_bytes(&mut self, missing: &[u8]) {
        for b in 0..=255u8 {
            if !missing.contains(&b) {
                self.add(&format!("<0x{b:02X}>"), BYTE);
            }
        }
    }
}

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

/// The Gemma 4 layout: specials first (ids as in the real vocab where it matters), then
/// pieces, then byte tokens.
fn gemma4_vocab(missing_bytes: &[u8]) -> Vocab {
    let mut v = Vocab::default();
    for (t, ty) in [
        ("<pad>", CONTROL),
        ("<eos>", CONTROL),
        ("<bos>", CONTROL),
        ("<unk>", UNKNOWN),
        ("<|turn>", CONTROL),
        ("<turn|>", CONTROL),
        // The llama.cpp converter makes these USER_DEFINED.
        ("<|tool_response>", USER_DEFINED),
        ("<|\"|>", USER_DEFINED),
        // An ordinary token in Gemma 4.
        ("</s>", NORMAL),
    ] {
        v.add(t, ty);
    }
    for t in [
        "\n", "\n\n", "▁", "a", "b", "c", "ab", "bc", "abc", "▁a", "▁b", "aa", "u", "s", "e", "r",
        "us", "use", "user", "a\n", "h", "i", "hi",
    ] {
        v.add(t, NORMAL);
    }
    v.add_bytes(missing_bytes);
    v
}

const GEMMA4_MERGES: &[&str] = &[
    "a b", "b c", "ab c", "▁ a", "▁ b", "a a", "u s", "us e", "use r", "\n \n", "a \n", "h i",
];

fn metadata(model: &str, pre: Option<&str>, v: &Vocab, merges: &[&str]) -> Metadata {
    let mut e = vec![
        (
            "general.architecture".to_string(),
            Value::String("gemma4".into()),
        ),
        (
            "tokenizer.ggml.model".to_string(),
            Value::String(model.into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(Array::String(v.tokens.clone())),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(Array::I32(v.types.clone())),
        ),
        (
            "tokenizer.ggml.scores".to_string(),
            Value::Array(Array::F32(vec![-1000.0; v.tokens.len()])),
        ),
        ("tokenizer.ggml.merges".to_string(), strings(merges)),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(1)),
        // Gemma 4 GGUFs may say false; llama.cpp adds BOS anyway.
        (
            "tokenizer.ggml.add_bos_token".to_string(),
            Value::Bool(false),
        ),
    ];
    if let Some(p) = pre {
        e.push(("tokenizer.ggml.pre".to_string(), Value::String(p.into())));
    }
    Metadata::from_entries(e).unwrap()
}

fn gemma4() -> (Tokenizer, Vocab) {
    let v = gemma4_vocab(&[]);
    let tok = Tokenizer::from_metadata(&metadata("gemma4", None, &v, GEMMA4_MERGES), "gemma4");
    (tok.unwrap(), v)
}

fn ids(v: &Vocab, texts: &[&str]) -> Vec<u32> {
    texts.iter().map(|t| v.id(t)).collect()
}

#[test]
fn bpe_merges_lowest_rank_first() {
    let (tok, v) = gemma4();
    assert_eq!(tok.algorithm(), Algorithm::Gemma4Bpe);
    // (a,b) has rank 0, so "ab" forms before (b,c) is considered; then (ab,c) has rank 2.
    assert_eq!(tok.encode("abc", false, true), ids(&v, &["abc"]));
    // With (b,c) ranked first and no rule for (a,bc), the result is a + bc.
    let merges = ["b c", "a b"];
    let t2 = Tokenizer::from_metadata(&metadata("gemma4", None, &v, &merges), "gemma4").unwrap();
    assert_eq!(t2.encode("abc", false, true), ids(&v, &["a", "bc"]));
    // Chained merges build a whole word.
    assert_eq!(tok.encode("user", false, true), ids(&v, &["user"]));
}

#[test]
fn bpe_equal_ranks_merge_leftmost_first() {
    let (tok, v) = gemma4();
    assert_eq!(tok.encode("aaa", false, true), ids(&v, &["aa", "a"]));
    assert_eq!(
        tok.encode("aaaaa", false, true),
        ids(&v, &["aa", "aa", "a"])
    );
}

#[test]
fn bpe_spaces_become_marks() {
    let (tok, v) = gemma4();
    assert_eq!(tok.encode("a b", false, true), ids(&v, &["a", "▁b"]));
    // (a,b) outranks (▁,a), and nothing merges ▁ with "ab".
    assert_eq!(tok.encode(" ab", false, true), ids(&v, &["▁", "ab"]));
    assert_eq!(tok.encode(" a", false, true), ids(&v, &["▁a"]));
    assert_eq!(tok.encode("  ", false, true), ids(&v, &["▁", "▁"]));
    assert_eq!(tok.decode(&tok.encode(" a b  c ", false, true)), " a b  c ");
}

#[test]
fn bpe_newline_runs_are_split_out() {
    let (tok, v) = gemma4();
    // A newline run that is a token stays whole.
    assert_eq!(
        tok.encode("a\n\nb", false, true),
        ids(&v, &["a", "\n\n", "b"])
    );
    // A longer run is merged on its own ("\n \n" is rank 9).
    assert_eq!(tok.encode("\n\n\n", false, true), ids(&v, &["\n\n", "\n"]));
    // No merge crosses a run boundary, even though "a \n" is a rule and "a\n" a token.
    assert_eq!(
        tok.encode("a\nhi", false, true),
        ids(&v, &["a", "\n", "hi"])
    );
}

#[test]
fn bpe_byte_fallback() {
    let (tok, v) = gemma4();
    assert_eq!(
        tok.encode("aé", false, true),
        ids(&v, &["a", "<0xC3>", "<0xA9>"])
    );
    assert_eq!(tok.decode(&tok.encode("aé😀", false, true)), "aé😀");
    // A byte without its token is dropped, as llama.cpp does.
    let v2 = gemma4_vocab(&[0xA9]);
    let t2 = Tokenizer::from_metadata(&metadata("gemma4", None, &v2, GEMMA4_MERGES), "gemma4");
    assert_eq!(t2.unwrap().encode("é", false, true), ids(&v2, &["<0xC3>"]));
}

#[test]
fn bpe_special_tokens() {
    let (tok, v) = gemma4();
    let text = "<|turn>user\nab<turn|>";
    assert_eq!(
        tok.encode(text, false, true),
        ids(&v, &["<|turn>", "user", "\n", "ab", "<turn|>"])
    );
    let plain = tok.encode(text, false, false);
    assert!(!plain.contains(&4) && !plain.contains(&5), "{plain:?}");
    assert_eq!(tok.decode(&plain), text);
    // USER_DEFINED tokens are split out even when special tokens are not parsed...
    assert_eq!(
        tok.encode("a<|\"|>b", false, false),
        ids(&v, &["a", "<|\"|>", "b"])
    );
    // ...except `<|tool_response>`, which llama.cpp marks CONTROL as an end-of-generation
    // token.
    assert_eq!(tok.encode("<|tool_response>", false, true), vec![6]);
    assert!(!tok.encode("<|tool_response>", false, false).contains(&6));
    // Gemma 4's `</s>` is ordinary text, never split out, and renders as itself.
    assert!(!tok.encode("</s>", false, true).contains(&8));
    assert_eq!(tok.decode(&[8]), "</s>");
}

#[test]
fn bpe_bos_is_forced_and_stops_are_found() {
    let (tok, v) = gemma4();
    assert!(tok.add_bos_default());
    assert_eq!(tok.encode("ab", true, true), vec![2, v.id("ab")]);
    assert_eq!(tok.encode("", true, true), vec![2]);
    assert!(tok.encode("", false, true).is_empty());
    assert_eq!(tok.end_of_generation(), &[1, 5, 6]);
    assert!(tok.is_end_of_generation(5) && !tok.is_end_of_generation(4));
    assert_eq!(tok.decode(&[2, 4, v.id("hi"), 5, 1]), "hi");
}

#[test]
fn ollama_gemma4_blobs_use_bpe() {
    let v = gemma4_vocab(&[]);
    // Ollama declares the "llama" model with the "gemma4" pre-tokenizer...
    let m = metadata("llama", Some("gemma4"), &v, GEMMA4_MERGES);
    let tok = Tokenizer::from_metadata(&m, "gemma4").unwrap();
    assert_eq!(tok.algorithm(), Algorithm::Gemma4Bpe);
    assert_eq!(tok.encode("abc", false, true), ids(&v, &["abc"]));
    // ...and the architecture alone is enough too.
    let m = metadata("llama", None, &v, GEMMA4_MERGES);
    let tok = Tokenizer::from_metadata(&m, "gemma4").unwrap();
    assert_eq!(tok.algorithm(), Algorithm::Gemma4Bpe);
    // The same file read as another architecture is SentencePiece.
    let tok = Tokenizer::from_metadata(&m, "gemma3").unwrap();
    assert_eq!(tok.algorithm(), Algorithm::SentencePiece);
}

#[test]
fn bpe_stream_decoder_joins_byte_tokens() {
    let (tok, _) = gemma4();
    let ids = tok.encode("a😀b", false, true);
    assert_eq!(ids.len(), 6);
    let mut dec = StreamDecoder::new();
    let events: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id)).collect();
    assert_eq!(events, ["a", "", "", "", "😀", "b"]);
    assert_eq!(dec.flush(), "");
    // An unfinished character comes out as U+FFFD at the end.
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&tok, ids[1]), "");
    assert_eq!(dec.flush(), "\u{FFFD}");
}

/// A SentencePiece vocab with llama.cpp's default ids (`<unk>` 0, `<s>` 1, `</s>` 2).
fn spm(pieces: &[(&str, f32)], extra: Vec<(String, Value)>) -> (Tokenizer, Vocab) {
    let mut v = Vocab::default();
    v.add("<unk>", UNKNOWN);
    v.add("<s>", CONTROL);
    v.add("</s>", CONTROL);
    let mut scores = vec![0.0; 3];
    for &(p, s) in pieces {
        v.add(p, NORMAL);
        scores.push(s);
    }
    v.add_bytes(&[]);
    scores.resize(v.tokens.len(), 0.0);
    let mut e = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(Array::String(v.tokens.clone())),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(Array::I32(v.types.clone())),
        ),
        (
            "tokenizer.ggml.scores".to_string(),
            Value::Array(Array::F32(scores)),
        ),
    ];
    e.extend(extra);
    let m = Metadata::from_entries(e).unwrap();
    (Tokenizer::from_metadata(&m, "gemma3").unwrap(), v)
}

#[test]
fn spm_merges_highest_score_first_then_leftmost() {
    let pieces = [
        ("a", -1.0),
        ("b", -1.0),
        ("c", -1.0),
        ("ab", -3.0),
        ("bc", -2.0),
    ];
    let no_prefix = vec![(
        "tokenizer.ggml.add_space_prefix".to_string(),
        Value::Bool(false),
    )];
    let (tok, v) = spm(&pieces, no_prefix.clone());
    assert_eq!(tok.encode("abc", false, true), ids(&v, &["a", "bc"]));
    let (tok, v) = spm(&[("a", -1.0), ("aa", -2.0)], no_prefix);
    assert_eq!(tok.encode("aaa", false, true), ids(&v, &["aa", "a"]));
    // Characters outside the vocabulary fall back to bytes.
    assert_eq!(
        tok.encode("aß", false, true),
        ids(&v, &["a", "<0xC3>", "<0x9F>"])
    );
}

#[test]
fn spm_defaults_without_keys() {
    // No ids and no flags in the metadata: llama.cpp's SPM defaults (BOS 1, EOS 2, BOS added,
    // a space prefix before text that starts the input or follows a special token).
    let (tok, v) = spm(&[("▁a", -1.0), ("a", -2.0), ("▁", -3.0)], vec![]);
    assert_eq!((tok.bos(), tok.eos()), (1, 2));
    assert!(tok.add_bos_default());
    assert_eq!(tok.encode("a", true, true), vec![1, v.id("▁a")]);
    assert_eq!(
        tok.encode("a</s>a", false, true),
        ids(&v, &["▁a", "</s>", "▁a"])
    );
    assert_eq!(tok.end_of_generation(), &[2]);
}

#[test]
fn metadata_errors() {
    let v = gemma4_vocab(&[]);
    let base = metadata("gemma4", None, &v, GEMMA4_MERGES);
    let with = |key: &str, value: Option<Value>| {
        let mut e: Vec<(String, Value)> = base
            .entries()
            .iter()
            .filter(|(k, _)| k != key)
            .cloned()
            .collect();
        if let Some(value) = value {
            e.push((key.to_string(), value));
        }
        Tokenizer::from_metadata(&Metadata::from_entries(e).unwrap(), "gemma4")
    };
    assert!(matches!(
        with("tokenizer.ggml.model", None),
        Err(TokenizerError::Metadata(_))
    ));
    assert!(matches!(
        with("tokenizer.ggml.model", Some(Value::String("bert".into()))),
        Err(TokenizerError::UnsupportedModel(m)) if m == "bert"
    ));
    assert!(matches!(
        with("tokenizer.ggml.tokens", Some(strings(&[]))),
        Err(TokenizerError::EmptyVocab)
    ));
    assert!(matches!(
        with("tokenizer.ggml.tokens", Some(Value::U32(3))),
        Err(TokenizerError::Metadata(_))
    ));
    assert!(matches!(
        with("tokenizer.ggml.scores", Some(strings(&["x"]))),
        Err(TokenizerError::WrongArrayType { .. })
    ));
    assert!(matches!(
        with(
            "tokenizer.ggml.token_type",
            Some(Value::Array(Array::I32(vec![1; 3])))
        ),
        Err(TokenizerError::TooShort { found: 3, .. })
    ));
    assert!(matches!(
        with("tokenizer.ggml.merges", None),
        Err(TokenizerError::Metadata(_))
    ));
    // Gemma 4 has no default BOS, so one outside the vocabulary is an error.
    assert!(matches!(
        with("tokenizer.ggml.bos_token_id", Some(Value::U32(1 << 20))),
        Err(TokenizerError::MissingSpecial("bos"))
    ));
    // Missing optional arrays are fine.
    assert!(with("tokenizer.ggml.scores", None).is_ok());
    assert!(with("tokenizer.ggml.token_type", None).is_ok());
}

#[test]
fn hostile_text_does_not_panic() {
    let (tok, _) = gemma4();
    let mut text = String::new();
    for c in [
        '\u{0}',
        '<',
        '|',
        '\n',
        ' ',
        'é',
        '\u{10FFFF}',
        '\u{FFFD}',
        '▁',
    ] {
        text.push(c);
        for parse_special in [false, true] {
            let ids = tok.encode(&text.repeat(50), true, parse_special);
            let _ = tok.decode(&ids);
        }
    }
    assert_eq!(tok.decode(&[u32::MAX, 0, 3]), "");
}

/// A synthetic Gemma 4 vocabulary (random merges, CONTROL and USER_DEFINED specials, a
/// missing byte token, odd merge rules) written as a GGUF and run through llama.cpp's
/// `llama-tokenize`; recorded by `xtask/scripts/tokenizer_golden.py gemma4-synth`.
#[test]
fn bpe_matches_llama_cpp_on_a_synthetic_vocab() {
    let g: serde_json::Value =
        serde_json::from_str(include_str!("golden/tokenizer_gemma4_synth.json")).unwrap();
    let v = &g["vocab"];
    let str_array = |key: &str| {
        let items: Vec<String> = serde_json::from_value(v[key].clone()).unwrap();
        Value::Array(Array::String(items))
    };
    let types: Vec<i32> = serde_json::from_value(v["token_type"].clone()).unwrap();
    let m = Metadata::from_entries(vec![
        (
            "tokenizer.ggml.model".into(),
            Value::String("gemma4".into()),
        ),
        ("tokenizer.ggml.tokens".into(), str_array("tokens")),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.merges".into(), str_array("merges")),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ])
    .unwrap();
    let tok = Tokenizer::from_metadata(&m, "llama").unwrap();
    let cases = g["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let add_special = c["add_special"].as_bool().unwrap();
        let parse_special = c["parse_special"].as_bool().unwrap();
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
        let got = tok.encode(text, add_special, parse_special);
        if got != want {
            failures.push(format!(
                "{text:?} add_special={add_special} parse_special={parse_special}\n  want {want:?}\n  got  {got:?}"
            ));
        }
    }
    assert!(cases.len() > 500);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
