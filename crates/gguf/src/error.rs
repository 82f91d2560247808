//! Errors of the GGUF crate.

use crate::dtype::GgmlType;

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
    #[error("metadata key {key:?}: unknown value type id {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {key:?}: arrays nested deeper than {max_depth} levels")]
    NestingTooDeep { key: String, max_depth: usize },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("general.alignment must be a non-zero power of two, found {0}")]
    BadAlignment(String),
    #[error("tensor {name:?}: unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    OverlappingTensors { first: String, second: String },
    #[error(
        "tensor {name:?}: its data [{start}, {end}) lies past the end of the file ({file_len} bytes)"
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
    #[error("metadata key {0:?} is missing")]
    Missing(String),
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key:?} holds {value}, which does not fit in {expected}")]
    OutOfRange {
        key: String,
        expected: &'static str,
        value: String,
    },
}

/// A tensor lookup or dequantization that could not be done.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    #[error("tensor {0:?} is not in the file")]
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
    #[error("row {row} is out of range (tensor {name:?} has {rows} rows)")]
    RowOutOfRange { name: String, row: u64, rows: u64 },
    #[error("tensor {name:?} has shape {dims:?}, expected {expected}")]
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
    #[error("{0}")]
    Other(String),
}
