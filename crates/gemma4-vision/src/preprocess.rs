//! From an image file's bytes to the tower's input, as transformers' Gemma 4 image processor
//! computes it: RGB, the aspect-preserving resize to the token budget (bicubic), values in
//! [0, 1], and 16 x 16 patches, each flattened in (row, column, channel) order, the patches in
//! row-major order of the grid.
//!
//! The resize is the `image` crate's Catmull-Rom filter (the cubic of a = -0.5 whose support
//! widens with the downscale factor: antialiasing), one axis at a time with 8-bit rounding in
//! between, as torchvision resizes an 8-bit image ([`resize`]). Against transformers'
//! processor the resized pixels differ by at most 2 levels, in under 1% of the values (the
//! references' fixed-point weights; `tests/preprocess.rs`).

use std::io::Cursor;

use image::imageops::{self, FilterType};
use image::{ImageReader, Limits};
/// Decoded 8-bit RGB pixels (the `image` crate's).
pub use image::{Rgb, RgbImage};

/// Pixels a patch side.
pub const PATCH: u32 = 16;
/// Patches a pooled soft token side (3 x 3 patches a token).
pub const POOL: u32 = 3;
/// Soft tokens an image may take: the budgets the model was trained with.
pub const TOKEN_BUDGETS: [u32; 5] = [70, 140, 280, 560, 1120];
/// transformers' default budget (`image_seq_length`).
pub const DEFAULT_TOKEN_BUDGET: u32 = 280;
/// The longest side an image file may declare; a larger one is refused before it is decoded
/// (a forged header can claim billions of pixels).
pub const MAX_SIDE: u32 = 16_384;
/// The most memory decoding one image may take.
const MAX_DECODE_BYTES: u64 = 1 << 30;

/// Why an image cannot become patches.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("not a readable PNG, JPEG, WebP or GIF image: {0}")]
    Decode(String),
    #[error("the image is {width} x {height} pixels; each side may be at most {MAX_SIDE}")]
    TooLarge { width: u32, height: u32 },
    #[error("the image is {width} x {height} pixels: too small or too thin to resize")]
    TooSmall { width: u32, height: u32 },
    #[error(
        "{0} soft tokens per image is not a budget the model knows (70, 140, 280, 560 or 1120)"
    )]
    Budget(u32),
    #[error("{len} bytes of pixels for {width} x {height}: RGB takes 3 a pixel, RGBA 4")]
    PixelCount { len: usize, width: u32, height: u32 },
}

/// An image as the tower takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Patches {
    /// `rows * cols` patches of `PATCH * PATCH * 3` values in [0, 1], each in (row, column,
    /// channel) order, the patches row by row.
    pub pixels: Vec<f32>,
    /// The patch grid (both multiples of [`POOL`]).
    pub rows: u32,
    pub cols: u32,
}

impl Patches {
    /// Values a patch.
    pub const PATCH_VALUES: usize = (PATCH * PATCH * 3) as usize;

    /// The soft tokens the image becomes: one per `POOL x POOL` patches.
    pub fn soft_tokens(&self) -> u32 {
        (self.rows / POOL) * (self.cols / POOL)
    }

    /// Patch `i`'s position as the tower's position tables index it: (column, row).
    pub fn position(&self, i: u32) -> (u32, u32) {
        (i % self.cols, i / self.cols)
    }
}

/// An image file's reader with its format guessed from its first bytes.
fn reader(bytes: &[u8], limits: Option<Limits>) -> Result<ImageReader<Cursor<&[u8]>>, ImageError> {
    let mut r = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    if r.format().is_none() {
        return Err(ImageError::Decode("unknown file format".into()));
    }
    if let Some(l) = limits {
        r.limits(l);
    }
    Ok(r)
}

/// Errors unless a `width x height` image is one wgemma takes.
fn check_sides(width: u32, height: u32) -> Result<(), ImageError> {
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(ImageError::TooLarge { width, height });
    }
    if width == 0 || height == 0 {
        return Err(ImageError::TooSmall { width, height });
    }
    Ok(())
}

/// An image file's (width, height) from its header, without decoding it; refused as
/// [`decode`] refuses it.
pub fn dimensions(bytes: &[u8]) -> Result<(u32, u32), ImageError> {
    let (width, height) = reader(bytes, None)?
        .into_dimensions()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    check_sides(width, height)?;
    Ok((width, height))
}

/// Decodes a PNG, JPEG, WebP or GIF file (a GIF's first frame) to RGB (alpha dropped, as
/// PIL's `convert("RGB")` does). Sides over [`MAX_SIDE`] are refused from the header.
pub fn decode(bytes: &[u8]) -> Result<RgbImage, ImageError> {
    dimensions(bytes)?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    let image = reader(bytes, Some(limits))?
        .decode()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    Ok(image.into_rgb8())
}

/// Decoded 8-bit pixels, row by row without padding, as RGB: 3 bytes a pixel (RGB) or 4
/// (RGBA, what a browser canvas hands out; alpha dropped as [`decode`] drops it).
pub fn from_pixels(width: u32, height: u32, pixels: &[u8]) -> Result<RgbImage, ImageError> {
    check_sides(width, height)?;
    let bad = || ImageError::PixelCount {
        len: pixels.len(),
        width,
        height,
    };
    let n = (width as usize)
        .checked_mul(height as usize)
        .ok_or_else(bad)?;
    let rgb = if pixels.len() == n * 3 {
        pixels.to_vec()
    } else if pixels.len() == n * 4 {
        pixels
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect()
    } else {
        return Err(bad());
    };
    RgbImage::from_raw(width, height, rgb).ok_or_else(bad)
}

/// The soft tokens a `width x height` image becomes at `budget` (what [`patches`] gives it).
pub fn soft_tokens(width: u32, height: u32, budget: u32) -> Result<u32, ImageError> {
    if !TOKEN_BUDGETS.contains(&budget) {
        return Err(ImageError::Budget(budget));
    }
    let side = PATCH * POOL;
    let (th, tw) =
        resized_size(height, width, budget).ok_or(ImageError::TooSmall { width, height })?;
    Ok((th / side) * (tw / side))
}

/// The size (height, width) transformers resizes a `height x width` image to for `budget` soft
/// tokens: scaled (up or down) to the budget's area, each side then down to a multiple of
/// `PATCH * POOL`; a side that would be 0 becomes one multiple and the other keeps the aspect
/// ratio (floored) up to the budget's longest side. `None` where both would be 0.
pub fn resized_size(height: u32, width: u32, budget: u32) -> Option<(u32, u32)> {
    let side = PATCH * POOL;
    let max_patches = budget * POOL * POOL;
    let (h, w) = (f64::from(height), f64::from(width));
    let factor = (f64::from(max_patches) * f64::from(PATCH * PATCH) / (h * w)).sqrt();
    let fit = |ideal: f64| (ideal / f64::from(side)).floor() as u32 * side;
    let (th, tw) = (fit(factor * h), fit(factor * w));
    let longest = budget * side;
    match (th, tw) {
        (0, 0) => None,
        (0, _) => Some((side, ((width / height) * side).min(longest))),
        (_, 0) => Some((((height / width) * side).min(longest), side)),
        fits => Some(fits),
    }
}

/// `image` resized to `width x height` as torchvision resizes an 8-bit image (transformers'
/// default processor), which is how PIL does it: the antialiased cubic (a = -0.5) along the
/// rows, rounded to 8 bits, then along the columns. Each pass is the `image` crate's
/// Catmull-Rom resize of one axis (the other axis's pass keeps its size, where the filter's
/// weights are 1 and 0: a copy); the rounding between them moves values by up to 26 levels
/// at sharp edges against one pass in float.
fn resize(image: &RgbImage, width: u32, height: u32) -> RgbImage {
    let rows = imageops::resize(image, width, image.height(), FilterType::CatmullRom);
    imageops::resize(&rows, width, height, FilterType::CatmullRom)
}

/// `image` resized for `budget` soft tokens ([`resized_size`]) and cut into patches.
pub fn patches(image: &RgbImage, budget: u32) -> Result<Patches, ImageError> {
    if !TOKEN_BUDGETS.contains(&budget) {
        return Err(ImageError::Budget(budget));
    }
    let (width, height) = image.dimensions();
    let (th, tw) =
        resized_size(height, width, budget).ok_or(ImageError::TooSmall { width, height })?;
    let resized;
    let image = if (th, tw) == (height, width) {
        image
    } else {
        resized = resize(image, tw, th);
        &resized
    };
    let (rows, cols) = (th / PATCH, tw / PATCH);
    let mut pixels = Vec::with_capacity((rows * cols) as usize * Patches::PATCH_VALUES);
    for pr in 0..rows {
        for pc in 0..cols {
            for y in pr * PATCH..(pr + 1) * PATCH {
                for x in pc * PATCH..(pc + 1) * PATCH {
                    let p = image.get_pixel(x, y);
                    pixels.extend(p.0.iter().map(|&v| f32::from(v) / 255.0));
                }
            }
        }
    }
    Ok(Patches { pixels, rows, cols })
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageFormat, Rgb, Rgba, RgbaImage};

    /// transformers' own examples (reference/multimodal.md): an image's resize for 280
    /// tokens, and the soft tokens it gives.
    #[test]
    fn sizes_follow_transformers() {
        for ((h, w), want, tokens) in [
            ((480, 640), (672, 912), 266),
            ((1080, 1920), (576, 1056), 264),
            ((224, 224), (768, 768), 256),
            ((768, 768), (768, 768), 256),
        ] {
            let got = resized_size(h, w, 280).unwrap();
            assert_eq!(got, want, "{h} x {w}");
            assert_eq!((got.0 / 48) * (got.1 / 48), tokens);
        }
        // Thin images: one side at the multiple, the other by the aspect ratio, capped.
        assert_eq!(resized_size(10, 3000, 280), Some((48, 280 * 48)));
        assert_eq!(resized_size(4, 2000, 70), Some((48, 70 * 48)));
        assert_eq!(resized_size(3000, 10, 280), Some((280 * 48, 48)));
        // Every budget stays within its tokens.
        for budget in TOKEN_BUDGETS {
            for (h, w) in [(1, 1), (17, 9001), (4000, 3000), (333, 777)] {
                let (th, tw) = resized_size(h, w, budget).unwrap();
                assert!(th % 48 == 0 && tw % 48 == 0 && th > 0 && tw > 0);
                if th > 48 && tw > 48 {
                    assert!((th / 48) * (tw / 48) <= budget, "{h} x {w} at {budget}");
                }
            }
        }
    }

    /// PNG's chunk checksum (CRC-32, reflected, polynomial 0xEDB88320).
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    fn encode(image: &RgbaImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        image.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    /// Each format decodes to the same RGB pixels (alpha dropped); a 96 x 48 image needs no
    /// resize for 2 tokens' grid and keeps its pixels, patch by patch.
    #[test]
    fn formats_decode_and_patches_keep_pixel_order() {
        let src = RgbaImage::from_fn(96, 48, |x, y| Rgba([x as u8 * 2, y as u8 * 5, 77, 128]));
        let rgb = RgbImage::from_fn(96, 48, |x, y| Rgb([x as u8 * 2, y as u8 * 5, 77]));
        for format in [ImageFormat::Png, ImageFormat::WebP] {
            assert_eq!(decode(&encode(&src, format)).unwrap(), rgb, "{format:?}");
        }
        let gif = decode(&encode(&src, ImageFormat::Gif)).unwrap();
        assert_eq!(gif.dimensions(), (96, 48));
        let mut jpeg = Cursor::new(Vec::new());
        rgb.write_to(&mut jpeg, ImageFormat::Jpeg).unwrap();
        let jpeg = decode(jpeg.get_ref()).unwrap();
        assert_eq!(jpeg.dimensions(), (96, 48));
        // 96 x 48 at 70 tokens: scaled up to 528 x 240; the grid is whole tokens.
        let p = patches(&rgb, 70).unwrap();
        assert_eq!((p.rows % 3, p.cols % 3), (0, 0));
        assert_eq!(Some((p.rows * 16, p.cols * 16)), resized_size(48, 96, 70));
        assert_eq!((p.rows, p.cols), (15, 33));
        assert_eq!(
            p.pixels.len(),
            (p.rows * p.cols) as usize * Patches::PATCH_VALUES
        );
        assert!(p.pixels.iter().all(|v| (0.0..=1.0).contains(v)));
        // An image already at its size is not resized: patch 1's first value is pixel
        // (16, 0)'s red, its second row starts at pixel (16, 1).
        let exact = RgbImage::from_fn(960, 624, |x, y| Rgb([(x % 256) as u8, (y % 256) as u8, 3]));
        assert_eq!(resized_size(624, 960, 280), Some((624, 960)));
        let p = patches(&exact, 280).unwrap();
        assert_eq!((p.rows, p.cols, p.soft_tokens()), (39, 60, 260));
        let patch1 = &p.pixels[Patches::PATCH_VALUES..];
        assert_eq!(patch1[0], 16.0 / 255.0);
        assert_eq!(patch1[16 * 3 + 1], 1.0 / 255.0);
        assert_eq!(p.position(61), (1, 1));
    }

    /// Broken files, a forged size, an empty image and a budget the model does not know
    /// give their errors.
    #[test]
    fn bad_images_give_errors() {
        let png = encode(&RgbaImage::new(8, 8), ImageFormat::Png);
        for bytes in [&b""[..], b"not an image", &png[..20]] {
            assert!(matches!(decode(bytes), Err(ImageError::Decode(_))));
        }
        // A PNG header claiming 100000 x 100000 pixels (IHDR's width and height, its CRC
        // made right).
        let mut forged = png.clone();
        forged[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        forged[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32(&forged[12..29]);
        forged[29..33].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(decode(&forged), Err(ImageError::TooLarge { .. })));
        let rgb = RgbImage::new(48, 48);
        assert!(matches!(patches(&rgb, 281), Err(ImageError::Budget(281))));
    }

    /// Pixels as a browser hands them (RGBA or RGB) give the file's RGB; the header's size
    /// and the soft-token count agree with what decoding and `patches` give.
    #[test]
    fn pixels_and_sizes_agree_with_decoding() {
        let src = RgbaImage::from_fn(97, 61, |x, y| Rgba([x as u8, y as u8 * 3, 200, 17]));
        let png = encode(&src, ImageFormat::Png);
        let decoded = decode(&png).unwrap();
        assert_eq!(from_pixels(97, 61, src.as_raw()).unwrap(), decoded);
        assert_eq!(from_pixels(97, 61, decoded.as_raw()).unwrap(), decoded);
        assert_eq!(dimensions(&png).unwrap(), (97, 61));
        for budget in TOKEN_BUDGETS {
            let p = patches(&decoded, budget).unwrap();
            assert_eq!(soft_tokens(97, 61, budget).unwrap(), p.soft_tokens());
        }
        for (w, h, len) in [(97, 61, 97 * 61 * 2), (97, 61, 97 * 61 * 4 + 1), (2, 2, 0)] {
            let e = from_pixels(w, h, &vec![0; len]);
            assert!(matches!(e, Err(ImageError::PixelCount { .. })), "{e:?}");
        }
        assert!(matches!(
            from_pixels(0, 5, &[]),
            Err(ImageError::TooSmall { .. })
        ));
        assert!(matches!(
            from_pixels(MAX_SIDE + 1, 1, &[]),
            Err(ImageError::TooLarge { .. })
        ));
        assert!(matches!(
            soft_tokens(10, 10, 100),
            Err(ImageError::Budget(100))
        ));
        assert!(matches!(dimensions(&png[..20]), Err(ImageError::Decode(_))));
    }
}
