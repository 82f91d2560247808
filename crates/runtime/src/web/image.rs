//! Images from JavaScript, as `web/worker.js` hands them over: `{bytes: Uint8Array}` (a PNG,
//! JPEG, WebP or GIF file, decoded here by the `image` crate as natively) or `{pixels:
//! Uint8Array, width, height}` (RGBA or RGB, row by row, as a canvas gives them), each with an
//! optional `imageTokens` (70, 140, 280, 560 or 1120; 280 by default).

use js_sys::{Array, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};

use super::{bad, field};
use crate::{Error, ImageInput};

/// A whole number in `u32`'s range, or `None` where the field is absent.
fn whole(v: &JsValue, key: &str) -> Result<Option<u32>, Error> {
    match field(v, key) {
        None => Ok(None),
        Some(x) => x
            .as_f64()
            .filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x <= f64::from(u32::MAX))
            .map(|x| Some(x as u32))
            .ok_or_else(|| bad(format!("an image's `{key}` must be a whole number"))),
    }
}

fn bytes(v: JsValue, key: &str) -> Result<Vec<u8>, Error> {
    v.dyn_into::<Uint8Array>()
        .map(|a| a.to_vec())
        .map_err(|_| bad(format!("an image's `{key}` must be a Uint8Array")))
}

/// One image object.
pub fn image_input(v: &JsValue) -> Result<ImageInput, Error> {
    let image = if let Some(b) = field(v, "bytes") {
        ImageInput::from_bytes(bytes(b, "bytes")?)
    } else if let Some(p) = field(v, "pixels") {
        let size = |k| whole(v, k)?.ok_or_else(|| bad(format!("pixels need a `{k}`")));
        ImageInput::from_pixels(size("width")?, size("height")?, &bytes(p, "pixels")?)?
    } else {
        return Err(bad(
            "an image needs `bytes` (a file) or `pixels` with a size",
        ));
    };
    Ok(match whole(v, "imageTokens")? {
        Some(budget) => image.with_budget(budget),
        None => image,
    })
}

/// An array of image objects (or nothing: no images).
pub fn image_inputs(list: &JsValue) -> Result<Vec<ImageInput>, Error> {
    if list.is_undefined() || list.is_null() {
        return Ok(Vec::new());
    }
    let list = list
        .dyn_ref::<Array>()
        .ok_or_else(|| bad("the images must be an array"))?;
    list.iter().map(|v| image_input(&v)).collect()
}
