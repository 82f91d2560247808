//! ggml tensor types: ids as stored in GGUF, block geometry, and byte sizes.

use std::fmt;

/// A ggml tensor element type, with the numeric id GGUF stores for it.
///
/// Ids that ggml retired (4, 5, 31-33, 36-38) are not representable: a file that uses them is
/// rejected as an unknown type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq1S = 19,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    Iq1M = 29,
    Bf16 = 30,
    Tq1_0 = 34,
    Tq2_0 = 35,
    Mxfp4 = 39,
    Nvfp4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 35] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q8K,
        Self::Iq2Xxs,
        Self::Iq2Xs,
        Self::Iq3Xxs,
        Self::Iq1S,
        Self::Iq4Nl,
        Self::Iq3S,
        Self::Iq2S,
        Self::Iq4Xs,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::Iq1M,
        Self::Bf16,
        Self::Tq1_0,
        Self::Tq2_0,
        Self::Mxfp4,
        Self::Nvfp4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// The type with GGUF id `id`, if ggml still defines it.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The id GGUF stores for this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | Bf16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Iq4Nl | Mxfp4 => 32,
            Nvfp4 | Q2_0 => 64,
            Q1_0 => 128,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | Iq2Xxs | Iq2Xs | Iq3Xxs | Iq1S | Iq3S | Iq2S
            | Iq4Xs | Iq1M | Tq1_0 | Tq2_0 => QK_K,
        }
    }

    /// Bytes per block, exactly as ggml lays the block struct out.
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | Bf16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            Q4_0 => 2 + 16,
            Q4_1 => 4 + 16,
            Q5_0 => 2 + 4 + 16,
            Q5_1 => 4 + 4 + 16,
            Q8_0 => 2 + 32,
            Q8_1 => 4 + 32,
            Mxfp4 => 1 + 16,
            Nvfp4 => 4 + 32,
            Q1_0 => 2 + 16,
            Q2_0 => 2 + 16,
            Iq4Nl => 2 + 16,
            Q2K => 2 * 2 + QK_K / 16 + QK_K / 4,
            Q3K => 2 + QK_K / 4 + QK_K / 8 + 12,
            Q4K => 2 * 2 + 12 + QK_K / 2,
            Q5K => 2 * 2 + 12 + QK_K / 2 + QK_K / 8,
            Q6K => 2 + QK_K / 16 + 3 * QK_K / 4,
            Q8K => 4 + QK_K + QK_K / 16 * 2,
            Iq2Xxs => 2 + QK_K / 8 * 2,
            Iq2Xs => 2 + QK_K / 8 * 2 + QK_K / 32,
            Iq2S => 2 + QK_K / 4 + QK_K / 16,
            Iq3Xxs => 2 + 3 * (QK_K / 8),
            Iq3S => 2 + 13 * (QK_K / 32) + QK_K / 64,
            Iq1S => 2 + QK_K / 8 + QK_K / 16,
            Iq1M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            Iq4Xs => 2 + 2 + QK_K / 64 + QK_K / 2,
            Tq1_0 => 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5,
            Tq2_0 => 2 + QK_K / 4,
        }
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }

    /// Whether [`crate::dequantize`] can turn this type into f32 on the CPU.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | Bf16
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2K
                | Q3K
                | Q4K
                | Q5K
                | Q6K
                | Iq4Nl
                | Iq4Xs
        )
    }

    /// ggml's name for the type (`Q4_K`, `BF16`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            Iq2Xxs => "IQ2_XXS",
            Iq2Xs => "IQ2_XS",
            Iq3Xxs => "IQ3_XXS",
            Iq1S => "IQ1_S",
            Iq4Nl => "IQ4_NL",
            Iq3S => "IQ3_S",
            Iq2S => "IQ2_S",
            Iq4Xs => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            Iq1M => "IQ1_M",
            Bf16 => "BF16",
            Tq1_0 => "TQ1_0",
            Tq2_0 => "TQ2_0",
            Mxfp4 => "MXFP4",
            Nvfp4 => "NVFP4",
            Q1_0 => "Q1_0",
            Q2_0 => "Q2_0",
        }
    }

    /// The type named `name` (case-insensitive, as [`GgmlType::name`] spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_retired_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }

    #[test]
    fn block_sizes_match_ggml_structs() {
        // The sizes ggml's static_asserts pin down.
        assert_eq!(GgmlType::Q4_0.block_bytes(), 18);
        assert_eq!(GgmlType::Q5_0.block_bytes(), 22);
        assert_eq!(GgmlType::Q8_0.block_bytes(), 34);
        assert_eq!(GgmlType::Q2K.block_bytes(), 84);
        assert_eq!(GgmlType::Q3K.block_bytes(), 110);
        assert_eq!(GgmlType::Q4K.block_bytes(), 144);
        assert_eq!(GgmlType::Q5K.block_bytes(), 176);
        assert_eq!(GgmlType::Q6K.block_bytes(), 210);
        assert_eq!(GgmlType::Q8K.block_bytes(), 292);
        assert_eq!(GgmlType::Iq4Xs.block_bytes(), 136);
        assert_eq!(GgmlType::Iq3S.block_bytes(), 110);
        assert_eq!(GgmlType::Tq1_0.block_bytes(), 54);
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4K.bytes_for(100), None);
    }
}
