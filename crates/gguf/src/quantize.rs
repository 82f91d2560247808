//! Straightforward CPU quantizers into the ggml block layouts.
//!
//! They make test fixtures and synthetic models: each picks scales from the block's range (no
//! importance search like llama.cpp's), which is accurate enough for round-trip bounds and
//! gives files that every ggml reader decodes the same way.

use half::{bf16, f16};

use crate::dequant::IQ4_NL_LEVELS;
use crate::dtype::{GgmlType, QK_K};
use crate::error::TensorError;

/// Quantizes `values` into `dtype` blocks. `values.len()` must be a whole number of blocks.
pub fn quantize(dtype: GgmlType, values: &[f32]) -> Result<Vec<u8>, TensorError> {
    let bs = dtype.block_size();
    if !values.len().is_multiple_of(bs) {
        return Err(TensorError::PartialBlock {
            dtype,
            elements: values.len(),
            block_size: bs,
        });
    }
    let mut out = Vec::with_capacity(values.len() / bs * dtype.block_bytes());
    let blocks = values.chunks_exact(bs);
    match dtype {
        GgmlType::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&f16::from_f32(v).to_le_bytes())),
        GgmlType::Bf16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&bf16::from_f32(v).to_le_bytes())),
        GgmlType::Q4_0 => blocks.for_each(|x| q4_0(x, &mut out)),
        GgmlType::Q4_1 => blocks.for_each(|x| q4_1(x, &mut out)),
        GgmlType::Q5_0 => blocks.for_each(|x| q5_0(x, &mut out)),
        GgmlType::Q5_1 => blocks.for_each(|x| q5_1(x, &mut out)),
        GgmlType::Q8_0 => blocks.for_each(|x| q8_0(x, &mut out)),
        GgmlType::Q2K => blocks.for_each(|x| q2_k(x, &mut out)),
        GgmlType::Q3K => blocks.for_each(|x| q3_k(x, &mut out)),
        GgmlType::Q4K => blocks.for_each(|x| q45_k(x, false, &mut out)),
        GgmlType::Q5K => blocks.for_each(|x| q45_k(x, true, &mut out)),
        GgmlType::Q6K => blocks.for_each(|x| q6_k(x, &mut out)),
        GgmlType::Iq4Nl => blocks.for_each(|x| iq4_nl(x, &mut out)),
        GgmlType::Iq4Xs => blocks.for_each(|x| iq4_xs(x, &mut out)),
        other => return Err(TensorError::UnsupportedDtype(other)),
    }
    debug_assert_eq!(out.len(), values.len() / bs * dtype.block_bytes());
    Ok(out)
}

fn push_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The element of largest magnitude, with its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    x.iter()
        .copied()
        .fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// Packs 32 4-bit codes as ggml does: byte j holds code j (low nibble) and code j+16 (high).
fn pack_nibbles(codes: &[u8; 32], out: &mut Vec<u8>) {
    for j in 0..16 {
        out.push(codes[j] | (codes[j + 16] << 4));
    }
}

fn q4_0(x: &[f32], out: &mut Vec<u8>) {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = inverse(d);
    push_f16(out, d);
    let codes: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8);
    pack_nibbles(&codes, out);
}

fn q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 15.0;
    let id = inverse(d);
    push_f16(out, d);
    push_f16(out, lo);
    let codes: [u8; 32] =
        std::array::from_fn(|j| (((x[j] - lo) * id + 0.5) as i32).clamp(0, 15) as u8);
    pack_nibbles(&codes, out);
}

/// Writes the 5th bits (qh) and low nibbles of 32 5-bit codes.
fn pack_5bit(codes: &[u8; 32], out: &mut Vec<u8>) {
    let mut qh = 0u32;
    for (j, &c) in codes.iter().enumerate() {
        qh |= u32::from((c >> 4) & 1) << j;
    }
    out.extend_from_slice(&qh.to_le_bytes());
    let low: [u8; 32] = std::array::from_fn(|j| codes[j] & 0xF);
    pack_nibbles(&low, out);
}

fn q5_0(x: &[f32], out: &mut Vec<u8>) {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = inverse(d);
    push_f16(out, d);
    let codes: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i32).clamp(0, 31) as u8);
    pack_5bit(&codes, out);
}

fn q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 31.0;
    let id = inverse(d);
    push_f16(out, d);
    push_f16(out, lo);
    let codes: [u8; 32] =
        std::array::from_fn(|j| (((x[j] - lo) * id + 0.5) as i32).clamp(0, 31) as u8);
    pack_5bit(&codes, out);
}

fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    push_f16(out, d);
    out.extend(
        x.iter()
            .map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8),
    );
}

/// Quantizes per-sub-block scales (all >= 0) to `bits` bits against one f16 super-scale.
/// Returns the super-scale and the codes.
fn quantize_scales<const N: usize>(scales: &[f32; N], levels: f32) -> (f32, [u8; N]) {
    let max = scales.iter().fold(0.0f32, |m, &v| m.max(v));
    // Round the super-scale through f16 first so the codes match what a reader reconstructs.
    let d = f16::from_f32(max / levels).to_f32();
    let id = inverse(d);
    (
        d,
        std::array::from_fn(|i| (scales[i] * id).round().clamp(0.0, levels) as u8),
    )
}

fn q2_k(x: &[f32], out: &mut Vec<u8>) {
    // 16 sub-blocks of 16: x ~ d*sc*q - dmin*m with q in 0..=3, sc and m 4-bit.
    let mut scale = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    for (i, sub) in x.chunks_exact(16).enumerate() {
        let (lo, hi) = min_max(sub);
        let lo = lo.min(0.0);
        scale[i] = (hi - lo) / 3.0;
        mins[i] = -lo;
    }
    let (d, sc) = quantize_scales(&scale, 15.0);
    let (dmin, mc) = quantize_scales(&mins, 15.0);
    let mut codes = [0u8; QK_K];
    for (i, sub) in x.chunks_exact(16).enumerate() {
        let dl = d * sc[i] as f32;
        let ml = dmin * mc[i] as f32;
        let idl = inverse(dl);
        for (l, &v) in sub.iter().enumerate() {
            codes[i * 16 + l] = ((v + ml) * idl).round().clamp(0.0, 3.0) as u8;
        }
    }
    out.extend((0..16).map(|i| sc[i] | (mc[i] << 4)));
    // Element n*128 + j*32 + l (j = shift/2) lives at qs[n*32 + l] bits 2j.
    for n in 0..2 {
        for l in 0..32 {
            let mut b = 0u8;
            for j in 0..4 {
                b |= codes[n * 128 + j * 32 + l] << (2 * j);
            }
            out.push(b);
        }
    }
    push_f16(out, d);
    push_f16(out, dmin);
}

fn q3_k(x: &[f32], out: &mut Vec<u8>) {
    // 16 sub-blocks of 16: x ~ d*(sc-32)*q with q in -4..=3 and sc-32 in -32..=31.
    let mut sub_scale = [0.0f32; 16];
    for (i, sub) in x.chunks_exact(16).enumerate() {
        sub_scale[i] = signed_absmax(sub) / -4.0;
    }
    let max = signed_absmax(&sub_scale);
    let d = f16::from_f32(max / -32.0).to_f32();
    let id = inverse(d);
    let sc: [i8; 16] =
        std::array::from_fn(|i| (sub_scale[i] * id).round().clamp(-32.0, 31.0) as i8);
    let mut codes = [0u8; QK_K]; // q + 4, in 0..=7
    for (i, sub) in x.chunks_exact(16).enumerate() {
        let idl = inverse(d * sc[i] as f32);
        for (l, &v) in sub.iter().enumerate() {
            codes[i * 16 + l] = ((v * idl).round().clamp(-4.0, 3.0) as i32 + 4) as u8;
        }
    }
    // hmask: bit (n*4 + j) of hmask[l] is the high bit of element n*128 + j*32 + l.
    let mut hmask = [0u8; 32];
    let mut qs = [0u8; 64];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let c = codes[n * 128 + j * 32 + l];
                qs[n * 32 + l] |= (c & 3) << (2 * j);
                if c & 4 != 0 {
                    hmask[l] |= 1 << (n * 4 + j);
                }
            }
        }
    }
    out.extend_from_slice(&hmask);
    out.extend_from_slice(&qs);
    let s6: [u8; 16] = std::array::from_fn(|i| (sc[i] as i32 + 32) as u8);
    let mut packed = [0u8; 12];
    for (j, &v) in s6.iter().enumerate() {
        if j < 8 {
            packed[j] |= v & 0xF;
        } else {
            packed[j - 8] |= (v & 0xF) << 4;
        }
        packed[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
    }
    out.extend_from_slice(&packed);
    push_f16(out, d);
}

/// Packs eight 6-bit scales and mins into the 12 bytes Q4_K/Q5_K read with `k4_scale_min`.
fn pack_k4_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

fn q45_k(x: &[f32], five_bits: bool, out: &mut Vec<u8>) {
    let levels = if five_bits { 31.0 } else { 15.0 };
    let mut scale = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for (i, sub) in x.chunks_exact(32).enumerate() {
        let (lo, hi) = min_max(sub);
        let lo = lo.min(0.0);
        scale[i] = (hi - lo) / levels;
        mins[i] = -lo;
    }
    let (d, sc) = quantize_scales(&scale, 63.0);
    let (dmin, mc) = quantize_scales(&mins, 63.0);
    let mut codes = [0u8; QK_K];
    for (i, sub) in x.chunks_exact(32).enumerate() {
        let dl = d * sc[i] as f32;
        let ml = dmin * mc[i] as f32;
        let idl = inverse(dl);
        for (l, &v) in sub.iter().enumerate() {
            codes[i * 32 + l] = ((v + ml) * idl).round().clamp(0.0, levels) as u8;
        }
    }
    push_f16(out, d);
    push_f16(out, dmin);
    out.extend_from_slice(&pack_k4_scales(&sc, &mc));
    if five_bits {
        // Bit 2*chunk (+1 for the high half) of qh[l] is bit 4 of element chunk*64 (+32) + l.
        let mut qh = [0u8; 32];
        for chunk in 0..4 {
            for l in 0..32 {
                qh[l] |= ((codes[chunk * 64 + l] >> 4) & 1) << (2 * chunk);
                qh[l] |= ((codes[chunk * 64 + 32 + l] >> 4) & 1) << (2 * chunk + 1);
            }
        }
        out.extend_from_slice(&qh);
    }
    for chunk in 0..4 {
        for l in 0..32 {
            out.push((codes[chunk * 64 + l] & 0xF) | ((codes[chunk * 64 + 32 + l] & 0xF) << 4));
        }
    }
}

fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    // 16 sub-blocks of 16: x ~ d*sc*q with q in -32..=31 and sc an i8.
    let mut sub_scale = [0.0f32; 16];
    for (i, sub) in x.chunks_exact(16).enumerate() {
        sub_scale[i] = signed_absmax(sub) / -32.0;
    }
    let max = signed_absmax(&sub_scale);
    let d = f16::from_f32(max / -128.0).to_f32();
    let id = inverse(d);
    let sc: [i8; 16] =
        std::array::from_fn(|i| (sub_scale[i] * id).round().clamp(-128.0, 127.0) as i8);
    let mut codes = [0u8; QK_K]; // q + 32, in 0..=63
    for (i, sub) in x.chunks_exact(16).enumerate() {
        let idl = inverse(d * sc[i] as f32);
        for (l, &v) in sub.iter().enumerate() {
            codes[i * 16 + l] = ((v * idl).round().clamp(-32.0, 31.0) as i32 + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let c = &codes[half * 128..half * 128 + 128];
        for l in 0..32 {
            ql[half * 64 + l] = (c[l] & 0xF) | ((c[l + 64] & 0xF) << 4);
            ql[half * 64 + l + 32] = (c[l + 32] & 0xF) | ((c[l + 96] & 0xF) << 4);
            qh[half * 32 + l] = (c[l] >> 4)
                | ((c[l + 32] >> 4) << 2)
                | ((c[l + 64] >> 4) << 4)
                | ((c[l + 96] >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    push_f16(out, d);
}

/// Index of the IQ4 level nearest to `v`.
fn nearest_iq4(v: f32) -> u8 {
    let mut best = 0;
    for (i, &l) in IQ4_NL_LEVELS.iter().enumerate() {
        if (l as f32 - v).abs() < (IQ4_NL_LEVELS[best] as f32 - v).abs() {
            best = i;
        }
    }
    best as u8
}

fn iq4_codes(x: &[f32], d: f32) -> [u8; 32] {
    let id = inverse(d);
    std::array::from_fn(|j| nearest_iq4(x[j] * id))
}

fn iq4_nl(x: &[f32], out: &mut Vec<u8>) {
    let d = f16::from_f32(signed_absmax(x) / IQ4_NL_LEVELS[0] as f32).to_f32();
    push_f16(out, d);
    pack_nibbles(&iq4_codes(x, d), out);
}

fn iq4_xs(x: &[f32], out: &mut Vec<u8>) {
    let mut sub_scale = [0.0f32; 8];
    for (i, sub) in x.chunks_exact(32).enumerate() {
        sub_scale[i] = signed_absmax(sub) / IQ4_NL_LEVELS[0] as f32;
    }
    let max = signed_absmax(&sub_scale);
    let d = f16::from_f32(max / -32.0).to_f32();
    let id = inverse(d);
    let ls: [u8; 8] =
        std::array::from_fn(|i| ((sub_scale[i] * id).round().clamp(-32.0, 31.0) as i32 + 32) as u8);
    push_f16(out, d);
    let mut scales_h = 0u16;
    let mut scales_l = [0u8; 4];
    for (ib, &l) in ls.iter().enumerate() {
        scales_l[ib / 2] |= (l & 0xF) << (4 * (ib % 2));
        scales_h |= u16::from(l >> 4) << (2 * ib);
    }
    out.extend_from_slice(&scales_h.to_le_bytes());
    out.extend_from_slice(&scales_l);
    for (ib, sub) in x.chunks_exact(32).enumerate() {
        let dl = d * (ls[ib] as i32 - 32) as f32;
        pack_nibbles(&iq4_codes(sub, dl), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequantize_to_vec;

    /// Deterministic, non-zero, varied test data (no RNG dependency in the format crate).
    fn wave(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let noise = (s as f32 / u32::MAX as f32) - 0.5;
                (i as f32 * 0.37).sin() * 0.8 + noise + if i % 97 == 0 { 3.0 } else { 0.0 }
            })
            .collect()
    }

    /// Round trip error bound, relative to the RMS of the data, per dtype.
    fn bound(dtype: GgmlType) -> f32 {
        match dtype {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => 1e-3,
            GgmlType::Bf16 => 8e-3,
            GgmlType::Q8_0 => 0.01,
            GgmlType::Q6K => 0.04,
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K => 0.08,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K | GgmlType::Iq4Nl | GgmlType::Iq4Xs => {
                0.16
            }
            GgmlType::Q3K => 0.35,
            GgmlType::Q2K => 0.6,
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_dequantizable_type_round_trips_within_its_bound() {
        for dtype in GgmlType::ALL.into_iter().filter(|t| t.can_dequantize()) {
            for (n, seed) in [(256usize, 1u32), (1024, 7), (2560, 99)] {
                let x = wave(n, seed);
                let q = quantize(dtype, &x).unwrap();
                assert_eq!(
                    q.len() as u64,
                    dtype.bytes_for(n as u64).unwrap(),
                    "{dtype}"
                );
                let y = dequantize_to_vec(dtype, &q).unwrap();
                let rms = (x.iter().map(|v| v * v).sum::<f32>() / n as f32).sqrt();
                let err = (x
                    .iter()
                    .zip(&y)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f32>()
                    / n as f32)
                    .sqrt();
                assert!(
                    err <= bound(dtype) * rms,
                    "{dtype} n={n}: rms error {err} > {} x rms {rms}",
                    bound(dtype)
                );
                // A second round trip is (nearly) exact: the codes are a fixed point.
                let y2 = dequantize_to_vec(dtype, &quantize(dtype, &y).unwrap()).unwrap();
                let drift = y
                    .iter()
                    .zip(&y2)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(drift <= 0.05 * rms, "{dtype}: requantization drift {drift}");
            }
        }
    }

    #[test]
    fn partial_blocks_and_unsupported_types_are_errors() {
        assert!(matches!(
            quantize(GgmlType::Q4K, &[1.0; 100]),
            Err(TensorError::PartialBlock { .. })
        ));
        assert!(matches!(
            quantize(GgmlType::Iq2Xxs, &[1.0; 256]),
            Err(TensorError::UnsupportedDtype(GgmlType::Iq2Xxs))
        ));
        assert!(matches!(
            dequantize_to_vec(GgmlType::Q8_0, &[0u8; 35]),
            Err(TensorError::Misaligned { .. })
        ));
    }

    #[test]
    fn all_zero_blocks_decode_to_zero() {
        for dtype in GgmlType::ALL.into_iter().filter(|t| t.can_dequantize()) {
            let q = quantize(dtype, &vec![0.0; 256]).unwrap();
            let y = dequantize_to_vec(dtype, &q).unwrap();
            assert!(y.iter().all(|&v| v == 0.0), "{dtype}");
        }
    }
}
