//! GGUF metadata values and typed access to them.

use std::fmt;

use crate::error::Quoted;

/// The value types GGUF metadata can hold, with their on-disk ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The smallest number of bytes one value of this type takes in a file; used to reject
    /// element counts that could not fit in the bytes that remain.
    pub(crate) fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array. Stored typed, so a 262144-entry vocabulary costs what its
/// elements cost and nothing per element on top.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed 128-bit integer when it is any integer type (converters disagree on
    /// which integer width they write, so accessors accept all of them).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as f64 when it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_integer().map(|v| v as f64),
        }
    }

    /// A short description for error messages: the type, and for arrays the element type.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type()),
            v => v.value_type().to_string(),
        }
    }

    /// The value as JSON (arrays included, element by element).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::U8(v) => (*v).into(),
            Value::I8(v) => (*v).into(),
            Value::U16(v) => (*v).into(),
            Value::I16(v) => (*v).into(),
            Value::U32(v) => (*v).into(),
            Value::I32(v) => (*v).into(),
            Value::F32(v) => json_float(f64::from(*v)),
            Value::Bool(v) => (*v).into(),
            Value::String(v) => J::String(v.clone()),
            Value::Array(a) => a.to_json(),
            Value::U64(v) => (*v).into(),
            Value::I64(v) => (*v).into(),
            Value::F64(v) => json_float(*v),
        }
    }
}

fn json_float(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v)
        .map(serde_json::Value::Number)
        .unwrap_or(serde_json::Value::Null)
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Integer elements widened to i128, or `None` for non-integer arrays.
    pub fn integers(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => widen(v),
            Array::I8(v) => widen(v),
            Array::U16(v) => widen(v),
            Array::I16(v) => widen(v),
            Array::U32(v) => widen(v),
            Array::I32(v) => widen(v),
            Array::U64(v) => widen(v),
            Array::I64(v) => widen(v),
            Array::Bool(v) => v.iter().map(|&b| i128::from(b)).collect(),
            _ => return None,
        })
    }

    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Array::F32(v) => J::Array(v.iter().map(|&x| json_float(x.into())).collect()),
            Array::F64(v) => J::Array(v.iter().map(|&x| json_float(x)).collect()),
            Array::Bool(v) => J::Array(v.iter().map(|&x| J::Bool(x)).collect()),
            Array::String(v) => J::Array(v.iter().map(|x| J::String(x.clone())).collect()),
            Array::Array(v) => J::Array(v.iter().map(Array::to_json).collect()),
            other => match other.integers() {
                Some(ints) => J::Array(
                    ints.into_iter()
                        .map(|i| {
                            i64::try_from(i)
                                .map(J::from)
                                .or_else(|_| u64::try_from(i).map(J::from))
                                .unwrap_or(J::Null)
                        })
                        .collect(),
                ),
                None => J::Null,
            },
        }
    }
}

impl fmt::Display for Value {
    /// A short human form (what `wgemma info` and error messages show): strings quoted and
    /// cut at [`crate::QUOTE_CHARS`] characters, arrays past 8 entries as their length and
    /// type. [`Value::to_json`] gives everything.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => write!(f, "{}", Quoted(s)),
            // Rust prints the shortest decimal that round-trips the f32 (1e-6, not 9.99e-7).
            Value::F32(v) => write!(f, "{v}"),
            Value::Array(a) if a.len() > 8 => write!(f, "[{} x {}]", a.len(), a.element_type()),
            Value::Array(Array::String(v)) => {
                f.write_str("[")?;
                for (i, s) in v.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}{}", Quoted(s))?;
                }
                f.write_str("]")
            }
            other => write!(f, "{}", other.to_json()),
        }
    }
}
