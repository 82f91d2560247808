//! Errors of the GGUF crate.
//!
//! Keys and tensor names in these errors come from the file, so they are quoted through
//! [`Quoted`]: a corrupt length must not turn one error message into megabytes.

use std::fmt;

use crate::dtype::GgmlType;

/// How many characters of a string taken from the input an error message quotes.
pub const QUOTE_CHARS: usize = 64;

/// A string taken from the input, as error messages show it: Debug-quoted, and past
/// [`QUOTE_CHARS`] characters cut, with its whole length in bytes after the cut.
///
/// ```
/// use wgemma_gguf::Quoted;
/// assert_eq!(Quoted("general.name").to_string(), "\"general.name\"");
/// let long = "x".repeat(1000);
/// assert!(Quoted(&long).to_string().ends_with("\"… (1000 bytes)"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `nth` stops after QUOTE_CHARS characters: a huge string is never walked whole.
        match self.0.char_indices().nth(QUOTE_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}… ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: the first four bytes are {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error(
        "GGUF version {0} is not supported (this reader handles versions 2 and 3; a big-endian file also reads as an odd version)"
    )]
    UnsupportedVersion(u32),
    #[error(
        "file is truncated: {what} needs {needed} bytes at offset {offset}, but the file has {file_len} bytes"
    )]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    /// Only from [`crate::Gguf::parse_prefix`]: the prefix ends before the header does.
    #[error("the header continues past the {have} bytes read so far; read at least {at_least}")]
    NeedMoreBytes { have: u64, at_least: u64 },
    #[error(
        "{what} claims {count} entries at offset {offset}, more than the {remaining} bytes left could hold"
    )]
    ImplausibleCount {
        what: &'static str,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error(
        "{what} at offset {offset} claims {len} bytes; names are at most {max} bytes (a corrupt length?)"
    )]
    NameTooLong {
        what: &'static str,
        len: u64,
        offset: u64,
        max: u64,
    },
    #[error("metadata key {}: unknown value type id {type_id}", Quoted(.key))]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {}: arrays nested deeper than {max_depth} levels", Quoted(.key))]
    NestingTooDeep { key: String, max_depth: usize },
    #[error("metadata key {} appears twice", Quoted(.0))]
    DuplicateKey(String),
    #[error("general.alignment must be a non-zero power of two, found {0}")]
    BadAlignment(String),
    #[error("tensor {}: unknown ggml type id {type_id}", Quoted(.name))]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor {}: {reason}", Quoted(.name))]
    BadTensor { name: String, reason: String },
    #[error("tensor {} appears twice", Quoted(.0))]
    DuplicateTensor(String),
    #[error("tensors {} and {} overlap in the data section", Quoted(.first), Quoted(.second))]
    OverlappingTensors { first: String, second: String },
    #[error(
        "tensor {}: its data [{start}, {end}) lies past the end of the file ({file_len} bytes)",
        Quoted(.name)
    )]
    DataPastEnd {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// A metadata lookup that did not find what it needed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata key {} is missing", Quoted(.0))]
    Missing(String),
    #[error("metadata key {} holds {found}, expected {expected}", Quoted(.key))]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {} holds {value}, which does not fit in {expected}", Quoted(.key))]
    OutOfRange {
        key: String,
        expected: &'static str,
        value: String,
    },
}

/// A tensor lookup or dequantization that could not be done.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    #[error("tensor {} is not in the file", Quoted(.0))]
    Missing(String),
    #[error("dtype {0} cannot be dequantized on the CPU")]
    UnsupportedDtype(GgmlType),
    #[error("{dtype}: {len} bytes is not a whole number of {block_bytes}-byte blocks")]
    Misaligned {
        dtype: GgmlType,
        len: usize,
        block_bytes: usize,
    },
    #[error("{dtype}: {elements} elements is not a whole number of {block_size}-element blocks")]
    PartialBlock {
        dtype: GgmlType,
        elements: usize,
        block_size: usize,
    },
    #[error("output holds {have} values, {need} are needed")]
    OutputSize { have: usize, need: usize },
    #[error("row {row} is out of range (tensor {} has {rows} rows)", Quoted(.name))]
    RowOutOfRange { name: String, row: u64, rows: u64 },
    #[error("tensor {} has shape {dims:?}, expected {expected}", Quoted(.name))]
    Shape {
        name: String,
        dims: Vec<u64>,
        expected: String,
    },
}

/// A read from a tensor source that failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("read of {len} bytes at offset {offset} is past the end of the source ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("is a directory, not a GGUF file")]
    IsDirectory,
    #[error("is not a regular file (a FIFO, socket or device): a GGUF file is needed")]
    NotRegularFile,
    #[error(
        "the file no longer holds the {len} bytes at offset {offset} ({size} bytes when opened): it changed while being read"
    )]
    Shrank { offset: u64, len: u64, size: u64 },
    #[error("{0}")]
    Other(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_quoted_whole() {
        assert_eq!(Quoted("").to_string(), "\"\"");
        assert_eq!(Quoted("a\"b\n").to_string(), "\"a\\\"b\\n\"");
        let exact = "é".repeat(QUOTE_CHARS);
        assert_eq!(Quoted(&exact).to_string(), format!("{exact:?}"));
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary_with_their_length() {
        let long = "é".repeat(QUOTE_CHARS + 1);
        let q = Quoted(&long).to_string();
        assert_eq!(
            q,
            format!(
                "{:?}… ({} bytes)",
                "é".repeat(QUOTE_CHARS),
                2 * (QUOTE_CHARS + 1)
            )
        );
        // Megabytes of control bytes (each escaped to several characters) still quote short.
        let huge = "\u{1}".repeat(8 << 20);
        let q = Quoted(&huge).to_string();
        assert!(q.len() < 16 * QUOTE_CHARS, "{} bytes", q.len());
        assert!(q.ends_with(&format!("… ({} bytes)", 8 << 20)));
    }

    #[test]
    fn errors_quote_keys_and_names_capped() {
        let key = "k".repeat(1 << 20);
        let errors: Vec<String> = vec![
            GgufError::UnknownValueType {
                key: key.clone(),
                type_id: 99,
            }
            .to_string(),
            GgufError::NestingTooDeep {
                key: key.clone(),
                max_depth: 4,
            }
            .to_string(),
            GgufError::DuplicateKey(key.clone()).to_string(),
            GgufError::UnknownTensorType {
                name: key.clone(),
                type_id: 99,
            }
            .to_string(),
            GgufError::BadTensor {
                name: key.clone(),
                reason: "r".into(),
            }
            .to_string(),
            GgufError::DuplicateTensor(key.clone()).to_string(),
            GgufError::OverlappingTensors {
                first: key.clone(),
                second: key.clone(),
            }
            .to_string(),
            GgufError::DataPastEnd {
                name: key.clone(),
                start: 0,
                end: 1,
                file_len: 0,
            }
            .to_string(),
            MetadataError::Missing(key.clone()).to_string(),
            MetadataError::WrongType {
                key: key.clone(),
                expected: "u32",
                found: "string".into(),
            }
            .to_string(),
            MetadataError::OutOfRange {
                key: key.clone(),
                expected: "u32",
                value: "-1".into(),
            }
            .to_string(),
            TensorError::Missing(key.clone()).to_string(),
            TensorError::RowOutOfRange {
                name: key.clone(),
                row: 1,
                rows: 1,
            }
            .to_string(),
            TensorError::Shape {
                name: key.clone(),
                dims: vec![1],
                expected: "[2]".into(),
            }
            .to_string(),
        ];
        for e in errors {
            let head: String = e.chars().take(200).collect();
            assert!(e.len() < 400, "{} bytes: {head}", e.len());
            assert!(e.contains(&format!("({} bytes)", 1 << 20)), "{e}");
        }
    }
}
