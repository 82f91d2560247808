//! CPU dequantization of ggml blocks to f32, written from the block layouts in ggml-common.h.
//!
//! These are the reference every GPU kernel is checked against, so they favour plainness over
//! speed.

use half::{bf16, f16};

use crate::dtype::{GgmlType, QK_K};
use crate::error::TensorError;

/// The 16 non-linear levels of IQ4_NL / IQ4_XS.
pub const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// The 6-bit scale and min of sub-block `j` (0..8) packed in the 12 scale bytes of Q4_K/Q5_K.
pub fn k4_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes `bytes` (whole blocks of `dtype`) into `out`, which must hold exactly the
/// number of elements the blocks encode.
pub fn dequantize(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), TensorError> {
    let bb = dtype.block_bytes();
    let bs = dtype.block_size();
    if !bytes.len().is_multiple_of(bb) {
        return Err(TensorError::Misaligned {
            dtype,
            len: bytes.len(),
            block_bytes: bb,
        });
    }
    let need = bytes.len() / bb * bs;
    if out.len() != need {
        return Err(TensorError::OutputSize {
            have: out.len(),
            need,
        });
    }
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs));
    match dtype {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::Bf16 => blocks
            .for_each(|(b, y)| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| block_q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| block_q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| block_q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| block_q5_1(b, y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| block_q8_0(b, y)),
        GgmlType::Q2K => blocks.for_each(|(b, y)| block_q2_k(b, y)),
        GgmlType::Q3K => blocks.for_each(|(b, y)| block_q3_k(b, y)),
        GgmlType::Q4K => blocks.for_each(|(b, y)| block_q4_k(b, y)),
        GgmlType::Q5K => blocks.for_each(|(b, y)| block_q5_k(b, y)),
        GgmlType::Q6K => blocks.for_each(|(b, y)| block_q6_k(b, y)),
        GgmlType::Iq4Nl => blocks.for_each(|(b, y)| block_iq4_nl(b, y)),
        GgmlType::Iq4Xs => blocks.for_each(|(b, y)| block_iq4_xs(b, y)),
        other => return Err(TensorError::UnsupportedDtype(other)),
    }
    Ok(())
}

/// Dequantizes `bytes` into a new vector.
pub fn dequantize_to_vec(dtype: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, TensorError> {
    let bb = dtype.block_bytes();
    let mut out = vec![0.0; bytes.len() / bb * dtype.block_size()];
    dequantize(dtype, bytes, &mut out)?;
    Ok(out)
}

fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0xF) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The 5th bits of Q5_0/Q5_1 quant `j` (low nibble) and `j + 16` (high nibble).
fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    (
        (((qh >> j) << 4) & 0x10) as u8,
        ((qh >> (j + 12)) & 0x10) as u8,
    )
}

fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (h0, h1) = q5_high_bits(qh, j);
        y[j] = (((qs[j] & 0xF) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let (h0, h1) = q5_high_bits(qh, j);
        y[j] = ((qs[j] & 0xF) | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) | h1) as f32 * d + m;
    }
}

fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..34].iter().enumerate() {
        y[j] = (q as i8) as f32 * d;
    }
}

fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    let mut out = 0;
    let mut is = 0;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[l + 16 * part] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// Unpacks the sixteen 6-bit Q3_K scales (stored as 12 bytes), already offset by -32.
pub fn q3k_scales(packed: &[u8]) -> [i8; 16] {
    let mut s = [0i8; 16];
    for (j, v) in s.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0xF
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *v = ((low | (high << 4)) as i8) - 32;
    }
    s
}

fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    let mut out = 0;
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                for l in 0..16 {
                    let i = l + 16 * part;
                    let low = ((q[i] >> shift) & 3) as i32;
                    let sub = if hmask[i] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - sub) as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for chunk in 0..4 {
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let (sc1, m1) = k4_scale_min(2 * chunk, scales);
        let (sc2, m2) = k4_scale_min(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let y = &mut y[chunk * 64..chunk * 64 + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - min1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for chunk in 0..4 {
        let ql = &qs[chunk * 32..chunk * 32 + 32];
        let (sc1, m1) = k4_scale_min(2 * chunk, scales);
        let (sc2, m2) = k4_scale_min(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let y = &mut y[chunk * 64..chunk * 64 + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - min1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - min2;
        }
    }
}

fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &ql_all[half * 64..half * 64 + 64];
        let qh = &qh_all[half * 32..half * 32 + 32];
        let sc = &sc_all[half * 8..half * 8 + 8];
        let y = &mut y[half * 128..half * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

fn block_iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * IQ4_NL_LEVELS[(q & 0xF) as usize] as f32;
        y[j + 16] = d * IQ4_NL_LEVELS[(q >> 4) as usize] as f32;
    }
}

fn block_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for ib in 0..QK_K / 32 {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF)
            | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
        let dl = d * (ls as i32 - 32) as f32;
        let q = &qs[ib * 16..ib * 16 + 16];
        let y = &mut y[ib * 32..ib * 32 + 32];
        for j in 0..16 {
            y[j] = dl * IQ4_NL_LEVELS[(q[j] & 0xF) as usize] as f32;
            y[j + 16] = dl * IQ4_NL_LEVELS[(q[j] >> 4) as usize] as f32;
        }
    }
}
