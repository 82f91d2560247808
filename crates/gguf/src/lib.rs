//! GGUF for wgemma: read and write the format, know every ggml dtype, dequantize on the CPU,
//! and fetch tensor bytes from a mapped file, memory, or an asynchronous byte-range source.
//!
//! ```
//! use wgemma_gguf::{write_gguf, Gguf, GgmlType, TensorSpec, Value};
//! let meta = vec![("general.architecture".to_string(), Value::String("gemma3".into()))];
//! let t = TensorSpec::new("w", GgmlType::F32, &[4, 2]);
//! let bytes = write_gguf(&meta, &[(t, vec![0u8; 32])], 32).unwrap();
//! let g = Gguf::parse(&bytes).unwrap();
//! assert_eq!(g.architecture(), Some("gemma3"));
//! assert_eq!(g.tensor("w").unwrap().n_rows(), 2);
//! ```

mod dequant;
mod dtype;
mod error;
mod file;
pub mod ollama;
mod quantize;
mod source;
pub mod synth;
mod value;
mod write;

pub use dequant::{IQ4_NL_LEVELS, dequantize, dequantize_to_vec, k4_scale_min, q3k_scales};
pub use dtype::{GgmlType, QK_K};
pub use error::{GgufError, MetadataError, QUOTE_CHARS, Quoted, SourceError, TensorError};
pub use file::{DEFAULT_ALIGNMENT, Gguf, MAX_DIMS, MAX_NAME_LEN, Metadata, TensorInfo};
pub use quantize::quantize;
pub use source::{
    BytesSource, FIRST_HEADER_READ, FetchedRows, MaybeSendSync, RangeSource, RowFetcher,
    TensorSource, read_header,
};
#[cfg(not(target_arch = "wasm32"))]
pub use source::{FileRangeSource, MmapSource, cache_dir, read_file_header};
pub use value::{Array, Value, ValueType};
pub use write::{GgufWriter, TensorSpec, WriteError, write_gguf};

/// Dequantizes whole tensor `t` of `g` from `source` to f32.
pub fn read_tensor_f32<S: TensorSource + ?Sized>(
    g: &Gguf,
    source: &S,
    t: &TensorInfo,
) -> Result<Vec<f32>, ReadError> {
    let r = g.tensor_range(t);
    let bytes = source.bytes(r.start, r.end - r.start)?;
    Ok(dequantize_to_vec(t.dtype, bytes)?)
}

/// Dequantizes row `row` of tensor `t` (e.g. one token's embedding) without touching the rest.
pub fn read_row_f32<S: TensorSource + ?Sized>(
    g: &Gguf,
    source: &S,
    t: &TensorInfo,
    row: u64,
) -> Result<Vec<f32>, ReadError> {
    let r = g.row_range(t, row)?;
    let bytes = source.bytes(r.start, r.end - r.start)?;
    Ok(dequantize_to_vec(t.dtype, bytes)?)
}

/// A tensor read that failed in the source or in decoding.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// Runs the parser and everything a loader does with its result over arbitrary bytes. The fuzz
/// target calls it, and a normal test replays the fuzz corpus through it; it must never panic.
#[doc(hidden)]
pub fn exercise_parser(data: &[u8]) {
    // The file cut short at a few places, as a streaming reader sees it.
    for cut in [data.len() / 3, data.len() / 2] {
        if let Err(GgufError::NeedMoreBytes { at_least, .. }) =
            Gguf::parse_prefix(&data[..cut], data.len() as u64)
        {
            assert!(at_least > cut as u64 && at_least <= data.len() as u64);
        }
    }
    let Ok(g) = Gguf::parse(data) else { return };
    for (key, value) in g.metadata.entries() {
        let _ = value.to_json();
        let _ = g.metadata.get_u32(key);
        let _ = g.metadata.get_f32(key);
        let _ = g.metadata.get_str_array(key);
        let _ = g.metadata.get_u32_array(key);
        let _ = g.metadata.get_u32_per_layer(key, 3);
    }
    let src = BytesSource::new(data.to_vec());
    for t in g.tensors() {
        if t.n_bytes <= 1 << 16 && t.dtype.can_dequantize() {
            read_tensor_f32(&g, &src, t).expect("a parsed tensor is readable");
            if t.n_rows() > 0 {
                read_row_f32(&g, &src, t, t.n_rows() - 1).expect("the last row is readable");
            }
        }
    }
}
