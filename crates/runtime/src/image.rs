//! Images in prompts: what a request carries, and the soft tokens it becomes.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use wgemma_vision::preprocess::{dimensions, from_pixels, soft_tokens};
use wgemma_vision::{DEFAULT_TOKEN_BUDGET, Patches, TOKEN_BUDGETS, decode, patches};

use crate::error::Error;

/// An image's pixels as a request carries them.
#[derive(Clone, Debug)]
pub enum ImageData {
    /// A PNG, JPEG, WebP or GIF file's bytes.
    Encoded(Arc<[u8]>),
    /// Decoded RGB pixels.
    Rgb(Arc<wgemma_vision::preprocess::RgbImage>),
}

/// One image of a prompt, with the most soft tokens it may become.
#[derive(Clone, Debug)]
pub struct ImageInput {
    pub data: ImageData,
    /// 70, 140, 280 (the default), 560 or 1120 soft tokens at most.
    pub budget: u32,
}

impl ImageInput {
    /// An image file's bytes (PNG, JPEG, WebP or GIF) at the default budget.
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Self {
        Self {
            data: ImageData::Encoded(bytes.into()),
            budget: DEFAULT_TOKEN_BUDGET,
        }
    }

    /// Decoded RGB pixels at the default budget.
    pub fn from_rgb(image: wgemma_vision::preprocess::RgbImage) -> Self {
        Self {
            data: ImageData::Rgb(Arc::new(image)),
            budget: DEFAULT_TOKEN_BUDGET,
        }
    }

    /// Decoded 8-bit pixels, row by row: RGB (3 bytes a pixel) or RGBA (4, as a browser's
    /// canvas gives them; alpha dropped as for files), at the default budget.
    pub fn from_pixels(width: u32, height: u32, pixels: &[u8]) -> Result<Self, Error> {
        Ok(Self::from_rgb(from_pixels(width, height, pixels)?))
    }

    /// This image at another soft-token budget.
    pub fn with_budget(mut self, budget: u32) -> Self {
        self.budget = budget;
        self
    }

    fn check_budget(&self) -> Result<(), Error> {
        if !TOKEN_BUDGETS.contains(&self.budget) {
            return Err(Error::Request(format!(
                "an image budget of {} soft tokens; wgemma takes {TOKEN_BUDGETS:?}",
                self.budget
            )));
        }
        Ok(())
    }

    /// The soft tokens the image becomes, from its size alone (a file's header), so an
    /// image the cache holds already is never decoded again.
    pub fn soft_tokens(&self) -> Result<u32, Error> {
        self.check_budget()?;
        let (width, height) = match &self.data {
            ImageData::Encoded(bytes) => dimensions(bytes)?,
            ImageData::Rgb(rgb) => rgb.dimensions(),
        };
        Ok(soft_tokens(width, height, self.budget)?)
    }

    /// The image with its file decoded to RGB pixels, what [`ImageInput::patches`] would
    /// otherwise decode where the prompt is read: a server decodes on a worker thread of its
    /// own rather than on the thread that steps every generation.
    pub fn decoded(&self) -> Result<Self, Error> {
        self.check_budget()?;
        Ok(match &self.data {
            ImageData::Encoded(bytes) => Self {
                data: ImageData::Rgb(Arc::new(decode(bytes)?)),
                budget: self.budget,
            },
            ImageData::Rgb(_) => self.clone(),
        })
    }

    /// Decodes and resizes the image into the tower's patches.
    pub fn patches(&self) -> Result<Patches, Error> {
        self.check_budget()?;
        let decoded;
        let rgb = match &self.data {
            ImageData::Encoded(bytes) => {
                decoded = decode(bytes)?;
                &decoded
            }
            ImageData::Rgb(rgb) => rgb.as_ref(),
        };
        Ok(patches(rgb, self.budget)?)
    }

    /// What tells two images apart in the cache: their pixels (or bytes) and budget.
    pub(crate) fn key(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.budget.hash(&mut h);
        match &self.data {
            ImageData::Encoded(b) => (0u8, &b[..]).hash(&mut h),
            ImageData::Rgb(img) => (1u8, img.width(), img.height(), img.as_raw()).hash(&mut h),
        }
        h.finish()
    }
}
