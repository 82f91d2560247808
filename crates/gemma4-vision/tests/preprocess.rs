//! Image preprocessing against transformers' Gemma 4 image processor
//! (`xtask/scripts/gemma4_image_golden.py`, the command in the golden): the patch grid, the
//! patch order, and the resized pixels, for images scaled up, scaled down, thin and already
//! at their size. Resizing in one float pass instead of two rounded ones fails it (up to 26
//! levels off at the test images' sharp edges).

use std::path::Path;

use wgemma_vision::{Patches, decode, patches};

fn dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests"))
}

/// Our patches put back together as an image's 8-bit levels, row by row.
fn levels(p: &Patches) -> Vec<u8> {
    let (w, h) = (p.cols as usize * 16, p.rows as usize * 16);
    let mut out = vec![0u8; w * h * 3];
    for (i, patch) in p.pixels.chunks(Patches::PATCH_VALUES).enumerate() {
        let (px, py) = p.position(i as u32);
        for (j, v) in patch.iter().enumerate() {
            let (y, x, c) = (j / 48, (j / 3) % 16, j % 3);
            let at = ((py as usize * 16 + y) * w + px as usize * 16 + x) * 3 + c;
            out[at] = (v * 255.0).round() as u8;
        }
    }
    out
}

#[test]
fn patches_match_transformers() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("golden/preprocess.json")).unwrap(),
    )
    .unwrap();
    for case in golden["cases"].as_array().unwrap() {
        let budget = case["budget"].as_u64().unwrap() as u32;
        let name = format!("{} at {budget}", case["image"].as_str().unwrap());
        let bytes = std::fs::read(dir().join("fixtures").join(case["image"].as_str().unwrap()));
        let p = patches(&decode(&bytes.unwrap()).unwrap(), budget).unwrap();
        let grid = (
            case["rows"].as_u64().unwrap(),
            case["cols"].as_u64().unwrap(),
        );
        assert_eq!((u64::from(p.rows), u64::from(p.cols)), grid, "{name}");
        for (i, pos) in case["positions"].as_array().unwrap().iter().enumerate() {
            let want = (pos[0].as_u64().unwrap(), pos[1].as_u64().unwrap());
            let (x, y) = p.position(i as u32);
            assert_eq!((u64::from(x), u64::from(y)), want, "{name}: patch {i}");
        }
        let resized = std::fs::read(dir().join("golden").join(case["resized"].as_str().unwrap()));
        let want = decode(&resized.unwrap()).unwrap().into_raw();
        let got = levels(&p);
        assert_eq!(got.len(), want.len(), "{name}");
        let diffs: Vec<u8> = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
        let max = diffs.iter().max().copied().unwrap_or(0);
        let off = diffs.iter().filter(|&&d| d > 0).count() as f64 / diffs.len() as f64;
        eprintln!(
            "{name}: max {max} levels off, {:.4}% of values differ",
            off * 100.0
        );
        // torchvision's 8-bit resize weighs in fixed point, we in f32 (as PIL would, to
        // the same 2 levels).
        assert!(
            max <= 2 && off < 0.01,
            "{name}: max {max} levels off, {off} of values differ"
        );
    }
}
