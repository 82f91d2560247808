//! A streaming GGUF writer: the header first, then each tensor's bytes in table order, so that
//! multi-gigabyte synthetic models never sit in memory whole.

use std::io::{self, Write};

use crate::dtype::GgmlType;
use crate::error::Quoted;
use crate::file::{DEFAULT_ALIGNMENT, MAGIC, MAX_NAME_LEN};
use crate::value::{Array, Value};

/// A tensor to be written: name, type and dimensions (ggml order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: GgmlType, dims: &[u64]) -> Self {
        Self {
            name: name.into(),
            dtype,
            dims: dims.to_vec(),
        }
    }

    /// Bytes of data the tensor takes (`None` if the row is not whole blocks).
    pub fn n_bytes(&self) -> Option<u64> {
        self.dtype.bytes_for(self.dims.iter().product())
    }
}

/// Errors of the writer: I/O, or tensors that do not match their specs.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("tensor {}: {reason}", Quoted(.name))]
    Tensor { name: String, reason: String },
    #[error("{what} {} is {len} bytes; readers take at most {MAX_NAME_LEN}", Quoted(.name))]
    NameTooLong {
        what: &'static str,
        name: String,
        len: usize,
    },
    #[error("alignment {0} is not a non-zero power of two")]
    Alignment(u64),
}

/// Writes a GGUF file to `W`: construct with the metadata and the tensor table, then call
/// [`GgufWriter::write_tensor`] once per tensor in table order, then [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    out: W,
    specs: Vec<TensorSpec>,
    sizes: Vec<u64>,
    next: usize,
    alignment: u64,
    pos: u64,
}

impl<W: Write> GgufWriter<W> {
    /// Writes the header (version 3). `general.alignment` is set from `alignment` when it is not
    /// the default, replacing any such key in `metadata`.
    pub fn new(
        mut out: W,
        metadata: &[(String, Value)],
        specs: Vec<TensorSpec>,
        alignment: u64,
    ) -> Result<Self, WriteError> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(WriteError::Alignment(alignment));
        }
        // The reader refuses longer names as corrupt lengths; never write a file it refuses.
        let names = metadata.iter().map(|(k, _)| ("metadata key", k));
        let names = names.chain(specs.iter().map(|s| ("tensor name", &s.name)));
        for (what, name) in names {
            if name.len() as u64 > MAX_NAME_LEN {
                return Err(WriteError::NameTooLong {
                    what,
                    name: name.clone(),
                    len: name.len(),
                });
            }
        }
        let sizes = specs
            .iter()
            .map(|s| {
                s.n_bytes().ok_or_else(|| WriteError::Tensor {
                    name: s.name.clone(),
                    reason: format!("dims {:?} are not whole {} blocks", s.dims, s.dtype),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut meta: Vec<(&str, Value)> = metadata
            .iter()
            .filter(|(k, _)| k != "general.alignment")
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        if alignment != DEFAULT_ALIGNMENT {
            meta.push(("general.alignment", Value::U32(alignment as u32)));
        }

        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(specs.len() as u64).to_le_bytes());
        h.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        for (k, v) in &meta {
            put_str(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        let mut offset = 0u64;
        for (s, &size) in specs.iter().zip(&sizes) {
            put_str(&mut h, &s.name);
            h.extend_from_slice(&(s.dims.len() as u32).to_le_bytes());
            for d in &s.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&s.dtype.id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + size).div_ceil(alignment) * alignment;
        }
        out.write_all(&h)?;
        let mut w = Self {
            out,
            specs,
            sizes,
            next: 0,
            alignment,
            pos: h.len() as u64,
        };
        w.pad()?;
        Ok(w)
    }

    fn pad(&mut self) -> io::Result<()> {
        let aligned = self.pos.div_ceil(self.alignment) * self.alignment;
        let zeros = vec![0u8; (aligned - self.pos) as usize];
        self.out.write_all(&zeros)?;
        self.pos = aligned;
        Ok(())
    }

    /// Writes the data of the next tensor in table order.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), WriteError> {
        let Some(spec) = self.specs.get(self.next) else {
            return Err(WriteError::Tensor {
                name: String::new(),
                reason: "more tensors written than the table holds".into(),
            });
        };
        if data.len() as u64 != self.sizes[self.next] {
            return Err(WriteError::Tensor {
                name: spec.name.clone(),
                reason: format!(
                    "{} bytes given, {} expected",
                    data.len(),
                    self.sizes[self.next]
                ),
            });
        }
        self.out.write_all(data)?;
        self.pos += data.len() as u64;
        self.pad()?;
        self.next += 1;
        Ok(())
    }

    /// Writes the data of the next tensor in table order from pieces produced one at a time
    /// (multi-gigabyte tensors never sit in memory whole).
    pub fn write_tensor_chunks(
        &mut self,
        chunks: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<(), WriteError> {
        let Some(spec) = self.specs.get(self.next) else {
            return Err(WriteError::Tensor {
                name: String::new(),
                reason: "more tensors written than the table holds".into(),
            });
        };
        let (name, expected) = (spec.name.clone(), self.sizes[self.next]);
        let mut written = 0u64;
        for chunk in chunks {
            written += chunk.len() as u64;
            if written > expected {
                break;
            }
            self.out.write_all(&chunk)?;
        }
        if written != expected {
            return Err(WriteError::Tensor {
                name,
                reason: format!("{written} bytes given, {expected} expected"),
            });
        }
        self.pos += written;
        self.pad()?;
        self.next += 1;
        Ok(())
    }

    /// The length of the whole file: what is written so far plus the tensors still to come.
    pub fn file_len(&self) -> u64 {
        self.sizes[self.next..].iter().fold(self.pos, |pos, size| {
            (pos + size).div_ceil(self.alignment) * self.alignment
        })
    }

    /// What is written so far (the header, once constructed).
    pub fn written(&self) -> &W {
        &self.out
    }

    /// Checks that every tensor was written and returns the output.
    pub fn finish(mut self) -> Result<W, WriteError> {
        if let Some(spec) = self.specs.get(self.next) {
            return Err(WriteError::Tensor {
                name: spec.name.clone(),
                reason: "never written".into(),
            });
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes a whole GGUF file into memory.
pub fn write_gguf(
    metadata: &[(String, Value)],
    tensors: &[(TensorSpec, Vec<u8>)],
    alignment: u64,
) -> Result<Vec<u8>, WriteError> {
    let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(Vec::new(), metadata, specs, alignment)?;
    for (_, data) in tensors {
        w.write_tensor(data)?;
    }
    w.finish()
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::String(s) => put_str(h, s),
        Value::Array(a) => put_array(h, a),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(h: &mut Vec<u8>, a: &Array) {
    h.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            $v.iter()
                .for_each(|x| h.extend_from_slice(&x.to_le_bytes()))
        };
    }
    match a {
        Array::U8(v) => h.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::Bool(v) => h.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(h, s)),
        Array::Array(v) => v.iter().for_each(|x| put_array(h, x)),
    }
}
