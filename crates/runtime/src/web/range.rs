//! A byte-range source backed by JavaScript: the worker hands over an object with `size` and
//! `read(offset, length) -> Promise<Uint8Array>` (HTTP Range requests through the persistent
//! cache, or slices of a `File`), so the wasm heap holds one read at a time, never the file.

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wgemma_gguf::{RangeSource, SourceError};

pub struct JsRangeSource {
    reader: JsValue,
    read: Function,
    size: u64,
}

/// The message of a JS exception or rejection.
pub fn js_message(e: &JsValue) -> String {
    e.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"))
}

impl JsRangeSource {
    pub fn new(reader: JsValue) -> Result<Self, SourceError> {
        let field = |k: &str| Reflect::get(&reader, &JsValue::from_str(k)).ok();
        let size = field("size")
            .and_then(|s| s.as_f64())
            .filter(|s| *s >= 0.0 && s.fract() == 0.0 && *s <= (1u64 << 53) as f64)
            .ok_or_else(|| SourceError::Other("the reader has no valid `size`".into()))?;
        let read = field("read")
            .and_then(|f| f.dyn_into::<Function>().ok())
            .ok_or_else(|| SourceError::Other("the reader has no `read` function".into()))?;
        Ok(Self {
            reader,
            read,
            size: size as u64,
        })
    }
}

impl RangeSource for JsRangeSource {
    fn len(&self) -> u64 {
        self.size
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, SourceError>> {
        let size = self.size;
        let call = (offset.checked_add(len).is_some_and(|end| end <= size)).then(|| {
            self.read.call2(
                &self.reader,
                &JsValue::from_f64(offset as f64),
                &JsValue::from_f64(len as f64),
            )
        });
        async move {
            let promise = call
                .ok_or(SourceError::OutOfRange { offset, len, size })?
                .map_err(|e| SourceError::Other(js_message(&e)))?;
            let value = JsFuture::from(Promise::resolve(&promise))
                .await
                .map_err(|e| SourceError::Other(js_message(&e)))?;
            let bytes = value.dyn_into::<Uint8Array>().map_err(|_| {
                SourceError::Other("the reader did not resolve to a Uint8Array".into())
            })?;
            if u64::from(bytes.length()) != len {
                return Err(SourceError::Other(format!(
                    "asked for {len} bytes at {offset}, the reader gave {}",
                    bytes.length()
                )));
            }
            Ok(bytes.to_vec())
        }
    }
}
