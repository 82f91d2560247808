//! Which keys each row of the unified pass over `[prompt | canvas]` sees. Every row's keys
//! are one contiguous range, so a pass needs only each row's first and last key.
//!
//! - A prompt row sees the rows before it and itself (causal), on sliding layers only the last
//!   `window` of them. It never sees the canvas.
//! - A canvas row sees the whole canvas, and of the prompt: on full layers all of it, on
//!   sliding layers only its last `window - 1` positions, whatever the row's own position. This
//!   is what transformers computes (its sliding cache keeps `window - 1` positions for the
//!   denoiser to read); a band that slides with each canvas row is the classic mistake.

/// The first and last key (inclusive) that row `row` of a pass over `prompt` prompt rows and
/// `canvas` canvas rows sees, on a sliding layer of `window` keys when `sliding`.
pub fn key_range(
    row: usize,
    prompt: usize,
    canvas: usize,
    sliding: bool,
    window: usize,
) -> (usize, usize) {
    let reach = |end: usize, keys: usize| {
        if sliding && window > 0 {
            end.saturating_sub(keys)
        } else {
            0
        }
    };
    if row < prompt {
        (reach(row + 1, window), row)
    } else {
        (reach(prompt, window.saturating_sub(1)), prompt + canvas - 1)
    }
}

/// [`key_range`] where the prompt holds images (`images`: each one's first position and
/// length) whose tokens see each other: a prompt row inside one also sees the whole image, on
/// every layer and past the window (transformers masks DiffusionGemma's encoder with the
/// causal or sliding mask OR the same image).
pub fn key_range_with_images(
    row: usize,
    prompt: usize,
    canvas: usize,
    sliding: bool,
    window: usize,
    images: &[(usize, usize)],
) -> (usize, usize) {
    let (lo, hi) = key_range(row, prompt, canvas, sliding, window);
    match images
        .iter()
        .find(|&&(at, len)| row < prompt && at <= row && row < at + len)
    {
        Some(&(at, len)) => (lo.min(at), hi.max(at + len - 1)),
        None => (lo, hi),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask of 8 rows as a table of 0/1, row by row, from each row's key range.
    fn table(range: impl Fn(usize) -> (usize, usize)) -> Vec<String> {
        (0..8)
            .map(|q| {
                let (lo, hi) = range(q);
                (0..8)
                    .map(|k| if (lo..=hi).contains(&k) { '1' } else { '0' })
                    .collect()
            })
            .collect()
    }

    /// The mask for a 5-row prompt and a 3-row canvas with a window of 3: written out by
    /// hand from the rules above.
    #[test]
    fn the_mask_table_of_a_small_pass() {
        let table = |sliding| table(|q| key_range(q, 5, 3, sliding, 3));
        assert_eq!(
            table(true),
            [
                "10000000", "11000000", "11100000", "01110000", "00111000", // prompt
                "00011111", "00011111", "00011111", // canvas: last 2 prompt keys + canvas
            ]
        );
        assert_eq!(
            table(false),
            [
                "10000000", "11000000", "11100000", "11110000", "11111000", "11111111", "11111111",
                "11111111",
            ]
        );
    }

    /// An image at positions 1 to 4 of a 6-row prompt, a 2-row canvas, a window of 2: the
    /// image's rows see all of it on both kinds of layer; the other rows are as without it.
    #[test]
    fn an_image_is_seen_whole_by_its_rows() {
        let table = |sliding| table(|q| key_range_with_images(q, 6, 2, sliding, 2, &[(1, 4)]));
        assert_eq!(
            table(true),
            [
                "10000000", "11111000", "01111000", "01111000", "01111000",
                "00001100", // prompt
                "00000111", "00000111", // canvas: the last prompt key + canvas
            ]
        );
        assert_eq!(
            table(false),
            [
                "10000000", "11111000", "11111000", "11111000", "11111000", "11111100", "11111111",
                "11111111",
            ]
        );
    }

    #[test]
    fn a_prompt_shorter_than_the_window_is_seen_whole() {
        assert_eq!(key_range(2, 2, 4, true, 8), (0, 5));
        assert_eq!(key_range(0, 0, 4, true, 8), (0, 3));
    }
}
