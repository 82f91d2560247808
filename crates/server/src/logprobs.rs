//! Log-probabilities in OpenAI's shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and the completions' legacy `{tokens, token_logprobs, top_logprobs,
//! text_offset}`. Each token is named by its own text (its bytes where they are not whole
//! UTF-8, as a byte-fallback token's are).

use serde_json::{Map, Value, json};
use wgemma::{TokenLogprobs, Tokenizer};

/// A token's text as OpenAI shows it, and its bytes.
fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.piece_bytes(id).into_owned();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

fn entry(tok: &Tokenizer, id: u32, logprob: f32) -> Value {
    let (text, bytes) = token_text(tok, id);
    json!({"token": text, "logprob": logprob, "bytes": bytes})
}

/// Each token's `{token, logprob, bytes, top_logprobs}`: the entries of chat's `content`, and
/// Ollama's `logprobs` list as it is.
pub fn entries(tok: &Tokenizer, tokens: &[TokenLogprobs]) -> Value {
    let entries: Vec<Value> = tokens
        .iter()
        .map(|lp| {
            let mut e = entry(tok, lp.token, lp.logprob);
            let top: Vec<Value> = lp.top.iter().map(|&(id, l)| entry(tok, id, l)).collect();
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect();
    Value::Array(entries)
}

/// Chat's `logprobs` of `tokens`.
pub fn chat(tok: &Tokenizer, tokens: &[TokenLogprobs]) -> Value {
    json!({"content": entries(tok, tokens), "refusal": null})
}

/// The completions' `logprobs` of `tokens`, whose text starts `offset` characters into the
/// reply.
pub fn completion(tok: &Tokenizer, tokens: &[TokenLogprobs], mut offset: usize) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for lp in tokens {
        let (text, _) = token_text(tok, lp.token);
        offsets.push(offset);
        offset += text.chars().count();
        texts.push(text);
        lps.push(lp.logprob);
        let top: Map<String, Value> = lp
            .top
            .iter()
            .map(|&(id, l)| (token_text(tok, id).0, json!(l)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({
        "tokens": texts,
        "token_logprobs": lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}
