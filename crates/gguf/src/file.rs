//! The parsed GGUF header: metadata and tensor table, and the parser that builds it.
//!
//! The parser never trusts a count or a length: every one is checked against the bytes the file
//! can still hold before anything is allocated, so hostile files give an error instead of a
//! panic, a hang, or a huge allocation.

use std::collections::HashMap;
use std::ops::Range;

use crate::dtype::GgmlType;
use crate::error::{GgufError, MetadataError, TensorError};
use crate::value::{Array, Value, ValueType};

/// "GGUF" as the first four bytes of every file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are rejected (real files never nest at all).
const MAX_ARRAY_DEPTH: usize = 4;
/// The longest metadata key or tensor name accepted. Real ones are identifiers of under a
/// hundred bytes (ggml caps tensor names at 64); a longer one is a corrupt length, rejected
/// before its bytes are read, which also keeps any error that names it short.
pub const MAX_NAME_LEN: u64 = 4096;

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: GgmlType,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes the data takes.
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Elements per row (the contiguous dimension).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of all dimensions but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        // Checked at parse time: the row length is a whole number of blocks.
        self.dtype.bytes_for(self.row_len()).unwrap_or(0)
    }

    /// Checks that the tensor has exactly the dimensions `expected` (ggml order).
    pub fn expect_dims(&self, expected: &[u64]) -> Result<(), TensorError> {
        if self.dims == expected {
            Ok(())
        } else {
            Err(TensorError::Shape {
                name: self.name.clone(),
                dims: self.dims.clone(),
                expected: format!("{expected:?}"),
            })
        }
    }
}

/// Metadata key/value pairs in file order, with lookup by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! int_getter {
    ($get:ident, $opt:ident, $t:ty, $name:literal) => {
        #[doc = concat!("The value of `key` as ", $name, "; any integer type that fits is accepted.")]
        pub fn $get(&self, key: &str) -> Result<$t, MetadataError> {
            self.$opt(key)?
                .ok_or_else(|| MetadataError::Missing(key.to_string()))
        }

        #[doc = concat!("Like the non-`opt` getter, but a missing key is `Ok(None)`.")]
        pub fn $opt(&self, key: &str) -> Result<Option<$t>, MetadataError> {
            let Some(v) = self.get(key) else {
                return Ok(None);
            };
            let i = v.as_integer().ok_or_else(|| MetadataError::WrongType {
                key: key.to_string(),
                expected: $name,
                found: v.describe(),
            })?;
            <$t>::try_from(i)
                .map(Some)
                .map_err(|_| MetadataError::OutOfRange {
                    key: key.to_string(),
                    expected: $name,
                    value: i.to_string(),
                })
        }
    };
}

impl Metadata {
    /// Builds metadata from pairs; a repeated key is an error.
    pub fn from_entries(entries: Vec<(String, Value)>) -> Result<Self, GgufError> {
        let mut index = HashMap::with_capacity(entries.len());
        for (i, (k, _)) in entries.iter().enumerate() {
            if index.insert(k.clone(), i).is_some() {
                return Err(GgufError::DuplicateKey(k.clone()));
            }
        }
        Ok(Self { entries, index })
    }

    pub fn entries(&self) -> &[(String, Value)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    int_getter!(get_u32, opt_u32, u32, "u32");
    int_getter!(get_u64, opt_u64, u64, "u64");
    int_getter!(get_i32, opt_i32, i32, "i32");

    /// The value of `key` as f32; integer values are converted.
    pub fn get_f32(&self, key: &str) -> Result<f32, MetadataError> {
        self.opt_f32(key)?
            .ok_or_else(|| MetadataError::Missing(key.to_string()))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, MetadataError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_f64()
            .map(|f| Some(f as f32))
            .ok_or_else(|| wrong_type(key, "f32", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, MetadataError> {
        self.opt_bool(key)?
            .ok_or_else(|| MetadataError::Missing(key.to_string()))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, MetadataError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => match v.as_integer() {
                Some(0) => Ok(Some(false)),
                Some(1) => Ok(Some(true)),
                _ => Err(wrong_type(key, "bool", v)),
            },
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, MetadataError> {
        self.opt_str(key)?
            .ok_or_else(|| MetadataError::Missing(key.to_string()))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, MetadataError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(key, "string", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, MetadataError> {
        match self.get(key) {
            None => Err(MetadataError::Missing(key.to_string())),
            Some(Value::Array(a)) => Ok(a),
            Some(v) => Err(wrong_type(key, "array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], MetadataError> {
        match self.get_array(key)? {
            Array::String(v) => Ok(v),
            a => Err(MetadataError::WrongType {
                key: key.to_string(),
                expected: "array of string",
                found: format!("array of {}", a.element_type()),
            }),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], MetadataError> {
        match self.get_array(key)? {
            Array::F32(v) => Ok(v),
            a => Err(MetadataError::WrongType {
                key: key.to_string(),
                expected: "array of f32",
                found: format!("array of {}", a.element_type()),
            }),
        }
    }

    /// An integer array converted to `u32`s (any integer element type that fits is accepted).
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, MetadataError> {
        let a = self.get_array(key)?;
        let ints = a.integers().ok_or_else(|| MetadataError::WrongType {
            key: key.to_string(),
            expected: "array of integers",
            found: format!("array of {}", a.element_type()),
        })?;
        ints.into_iter()
            .map(|i| {
                u32::try_from(i).map_err(|_| MetadataError::OutOfRange {
                    key: key.to_string(),
                    expected: "u32",
                    value: i.to_string(),
                })
            })
            .collect()
    }

    /// A per-layer value: either one scalar for all `n` layers, or an array of `n` integers.
    pub fn get_u32_per_layer(&self, key: &str, n: usize) -> Result<Vec<u32>, MetadataError> {
        match self.get(key) {
            Some(Value::Array(_)) => {
                let v = self.get_u32_array(key)?;
                if v.len() != n {
                    return Err(MetadataError::WrongType {
                        key: key.to_string(),
                        expected: "one entry per layer",
                        found: format!("array of {} entries for {n} layers", v.len()),
                    });
                }
                Ok(v)
            }
            _ => Ok(vec![self.get_u32(key)?; n]),
        }
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> MetadataError {
    MetadataError::WrongType {
        key: key.to_string(),
        expected,
        found: found.describe(),
    }
}

/// A parsed GGUF header: version, metadata, tensor table and where the data section starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    pub version: u32,
    pub metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Alignment of tensor data (from `general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// Length of the whole file.
    pub file_len: u64,
}

impl Gguf {
    /// Parses a whole file held in memory.
    pub fn parse(bytes: &[u8]) -> Result<Self, GgufError> {
        Self::parse_prefix(bytes, bytes.len() as u64)
    }

    /// Parses the header from the first bytes of a file whose total length is `file_len`.
    ///
    /// When the header runs past `prefix`, returns [`GgufError::NeedMoreBytes`] with the length
    /// of prefix that is needed at least; every other error is final.
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Self, GgufError> {
        let mut c = Cursor {
            buf: prefix,
            pos: 0,
            file_len,
        };
        let magic: [u8; 4] = c.array("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // The smallest a key/value pair can be: key length, empty key, type id, one byte.
        c.check_count("metadata count", n_kv, 8 + 4 + 1)?;

        let mut entries = Vec::with_capacity(c.capacity_hint(n_kv as usize, 13));
        for _ in 0..n_kv {
            let key = c.name("metadata key")?;
            let type_id = c.u32("metadata value type")?;
            let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                key: key.clone(),
                type_id,
            })?;
            let value = c.value(&key, ty, 0)?;
            entries.push((key, value));
        }
        let metadata = Metadata::from_entries(entries)?;

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_integer() {
                Some(a) if a > 0 && (a as u128).is_power_of_two() && a <= 1 << 30 => a as u64,
                _ => return Err(GgufError::BadAlignment(v.to_string())),
            },
        };

        // The smallest a tensor entry can be: name length, empty name, n_dims, type, offset.
        c.check_count("tensor count", n_tensors, 8 + 4 + 4 + 8)?;
        let mut tensors = Vec::with_capacity(c.capacity_hint(n_tensors as usize, 24));
        let mut tensor_index = HashMap::with_capacity(tensors.capacity());
        for _ in 0..n_tensors {
            let t = c.tensor_info()?;
            if t.offset % alignment != 0 {
                return Err(GgufError::BadTensor {
                    name: t.name,
                    reason: format!(
                        "data offset {} is not a multiple of the alignment {alignment}",
                        t.offset
                    ),
                });
            }
            if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(t.name));
            }
            tensors.push(t);
        }

        let header_end = c.pos as u64;
        let data_offset = header_end.div_ceil(alignment) * alignment;
        check_tensor_layout(&tensors, data_offset, file_len)?;

        Ok(Self {
            version,
            metadata,
            tensors,
            tensor_index,
            alignment,
            data_offset,
            file_len,
        })
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`, or an error naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, TensorError> {
        self.tensor(name)
            .ok_or_else(|| TensorError::Missing(name.to_string()))
    }

    /// Absolute byte range of a tensor's data in the file.
    pub fn tensor_range(&self, t: &TensorInfo) -> Range<u64> {
        let start = self.data_offset + t.offset;
        start..start + t.n_bytes
    }

    /// Absolute byte range of one row of a tensor (for row gathers that touch nothing else).
    pub fn row_range(&self, t: &TensorInfo, row: u64) -> Result<Range<u64>, TensorError> {
        if row >= t.n_rows() {
            return Err(TensorError::RowOutOfRange {
                name: t.name.clone(),
                row,
                rows: t.n_rows(),
            });
        }
        let rb = t.row_bytes();
        let start = self.data_offset + t.offset + row * rb;
        Ok(start..start + rb)
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.opt_str("general.architecture").ok().flatten()
    }

    /// Total number of tensor elements (the parameter count).
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(TensorInfo::n_elements).sum()
    }
}

fn check_tensor_layout(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::DataPastEnd {
                    name: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                });
            }
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].n_bytes > pair[1].offset {
            return Err(GgufError::OverlappingTensors {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}

/// A bounds-checked little-endian reader over a prefix of a file.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file_len: u64,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let start = self.pos as u64;
        let end = start.checked_add(n).filter(|&e| e <= self.file_len);
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                what,
                offset: start,
                needed: n,
                file_len: self.file_len,
            });
        };
        if end > self.buf.len() as u64 {
            return Err(GgufError::NeedMoreBytes {
                have: self.buf.len() as u64,
                at_least: end,
            });
        }
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Rejects `count` entries of at least `min_size` bytes each when the rest of the file
    /// could not hold them; this bounds every allocation by the file's size.
    fn check_count(&self, what: &'static str, count: u64, min_size: u64) -> Result<(), GgufError> {
        let remaining = self.file_len.saturating_sub(self.pos as u64);
        if count.saturating_mul(min_size) > remaining {
            return Err(GgufError::ImplausibleCount {
                what,
                count,
                offset: self.pos as u64,
                remaining,
            });
        }
        Ok(())
    }

    /// How many of `n` entries of at least `min_size` bytes to reserve room for: never more than
    /// the bytes already in memory could hold, so a count that is plausible for the file but not
    /// yet read costs nothing up front.
    fn capacity_hint(&self, n: usize, min_size: usize) -> usize {
        n.min(self.buf.len().saturating_sub(self.pos) / min_size)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        // Real vocabularies are UTF-8; a stray invalid byte must not make the file unreadable.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// A metadata key or tensor name: a string of at most [`MAX_NAME_LEN`] bytes, checked
    /// before anything is read (a streaming reader would otherwise fetch the bogus length).
    fn name(&mut self, what: &'static str) -> Result<String, GgufError> {
        let offset = self.pos as u64;
        let len = self.u64(what)?;
        if len > MAX_NAME_LEN {
            return Err(GgufError::NameTooLong {
                what,
                len,
                offset,
                max: MAX_NAME_LEN,
            });
        }
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, key: &str, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>("u8 value")?[0]),
            ValueType::I8 => Value::I8(self.array::<1>("i8 value")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16 value")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16 value")?)),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32 value")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32 value")?)),
            ValueType::Bool => Value::Bool(self.array::<1>("bool value")?[0] != 0),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64 value")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64 value")?)),
            ValueType::Array => Value::Array(self.array_value(key, depth)?),
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                key: key.to_string(),
                max_depth: MAX_ARRAY_DEPTH,
            });
        }
        let type_id = self.u32("array element type")?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
        })?;
        let n = self.u64("array length")?;
        self.check_count("array length", n, ty.min_encoded_size())?;
        let n = usize::try_from(n).map_err(|_| GgufError::ImplausibleCount {
            what: "array length",
            count: n,
            offset: self.pos as u64,
            remaining: self.file_len.saturating_sub(self.pos as u64),
        })?;

        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let size = std::mem::size_of::<$t>();
                let bytes = self.take(n as u64 * size as u64, "array data")?;
                Array::$variant(
                    bytes
                        .chunks_exact(size)
                        .map(|c| {
                            <$t>::from_le_bytes(c.try_into().expect("chunk has the element size"))
                        })
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n as u64, "array data")?.to_vec()),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => Array::Bool(
                self.take(n as u64, "array data")?
                    .iter()
                    .map(|&b| b != 0)
                    .collect(),
            ),
            ValueType::String => {
                let mut v = Vec::with_capacity(self.capacity_hint(n, 8));
                for _ in 0..n {
                    v.push(self.string("array string")?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(self.capacity_hint(n, 12));
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, GgufError> {
        let name = self.name("tensor name")?;
        let n_dims = self.u32("tensor dimension count")? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::BadTensor {
                name,
                reason: format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            });
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(self.u64("tensor dimension")?);
        }
        let type_id = self.u32("tensor type")?;
        let dtype = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            name: name.clone(),
            type_id,
        })?;
        let offset = self.u64("tensor offset")?;

        // Zero dims are legal, but every partial product (rows, row bytes) must still fit:
        // check the product with zeros counted as ones.
        let fits = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1)))
            .is_some_and(|n| n <= i64::MAX as u64);
        if !fits {
            return Err(GgufError::BadTensor {
                name,
                reason: format!("dimensions {dims:?} overflow"),
            });
        }
        let n_elements = dims.iter().product::<u64>();
        if dims[0] % dtype.block_size() as u64 != 0 {
            return Err(GgufError::BadTensor {
                name,
                reason: format!(
                    "row length {} is not a multiple of the {dtype} block size {}",
                    dims[0],
                    dtype.block_size()
                ),
            });
        }
        let n_bytes = dtype
            .bytes_for(n_elements)
            .ok_or_else(|| GgufError::BadTensor {
                name: name.clone(),
                reason: "byte size overflows".to_string(),
            })?;
        Ok(TensorInfo {
            name,
            dtype,
            dims,
            offset,
            n_bytes,
        })
    }
}
