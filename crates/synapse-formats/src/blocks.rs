//! ggml's quantized block structs, byte for byte (`ggml-common.h`), as `#[repr(C)]`
//! [`bytemuck::Pod`] types.
//!
//! The decoders in [`crate::decode`] read blocks from raw bytes (any alignment, any host
//! endianness); these structs exist so that other rings (the kernels) can view aligned,
//! little-endian block data in place. Each struct's size is asserted at compile time against
//! [`GgmlType::type_size`](crate::GgmlType::type_size) and ggml's own static asserts, and each
//! has a `dequantize` method that calls the scalar reference decoder.
//!
//! Multi-byte fields are stored little-endian in files; the structs are only meaningful on
//! little-endian hosts (every target Synapse serves from).

use crate::decode::{fp4, iq, k_quants, legacy, ternary};
use crate::types::{GgmlType, QK_K};
use bytemuck::{Pod, Zeroable};
use half::f16;

macro_rules! block {
    (
        $(#[$meta:meta])*
        $name:ident: $ty:ident, $size:expr, $decode:path { $($(#[$fm:meta])* $field:ident: $fty:ty),* $(,)? }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
        pub struct $name {
            $($(#[$fm])* pub $field: $fty,)*
        }

        const _: () = assert!(core::mem::size_of::<$name>() == $size);

        impl $name {
            /// The ggml type these blocks belong to.
            pub const TYPE: GgmlType = GgmlType::$ty;
            /// Bytes per block.
            pub const SIZE: usize = $size;
            /// Elements per block.
            pub const ELEMS: usize = block_elems(GgmlType::$ty);

            /// Decodes this block to f32 with the scalar reference decoder.
            pub fn dequantize(&self, out: &mut [f32; Self::ELEMS]) {
                $decode(bytemuck::cast_ref(self), out)
            }
        }
    };
}

const fn block_elems(t: GgmlType) -> usize {
    match t {
        GgmlType::Q1_0 => 128,
        GgmlType::Q2_0 | GgmlType::NVFP4 => 64,
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::Q8_1
        | GgmlType::IQ4_NL
        | GgmlType::MXFP4 => 32,
        _ => QK_K,
    }
}

block! {
    /// Q1_0: 128 signs (bit set: `+d`, clear: `-d`).
    BlockQ1_0: Q1_0, 18, legacy::q1_0 { /** scale */ d: f16, /** one bit per element */ qs: [u8; 16] }
}
block! {
    /// Q2_0: 64 two-bit codes, value `(q - 1) * d`.
    BlockQ2_0: Q2_0, 18, legacy::q2_0 { /** scale */ d: f16, /** four codes per byte */ qs: [u8; 16] }
}
block! {
    /// Q4_0: 32 four-bit codes, value `(q - 8) * d`.
    BlockQ4_0: Q4_0, 18, legacy::q4_0 { /** scale */ d: f16, /** low nibbles: 0..16, high: 16..32 */ qs: [u8; 16] }
}
block! {
    /// Q4_1: 32 four-bit codes, value `q * d + m`.
    BlockQ4_1: Q4_1, 20, legacy::q4_1 { /** scale */ d: f16, /** offset */ m: f16, /** nibbles */ qs: [u8; 16] }
}
block! {
    /// Q5_0: 32 five-bit codes, value `(q - 16) * d`.
    BlockQ5_0: Q5_0, 22, legacy::q5_0 { /** scale */ d: f16, /** fifth bits (u32 LE) */ qh: [u8; 4], /** nibbles */ qs: [u8; 16] }
}
block! {
    /// Q5_1: 32 five-bit codes, value `q * d + m`.
    BlockQ5_1: Q5_1, 24, legacy::q5_1 { /** scale */ d: f16, /** offset */ m: f16, /** fifth bits (u32 LE) */ qh: [u8; 4], /** nibbles */ qs: [u8; 16] }
}
block! {
    /// Q8_0: 32 signed bytes, value `q * d`.
    BlockQ8_0: Q8_0, 34, legacy::q8_0 { /** scale */ d: f16, /** codes */ qs: [i8; 32] }
}
block! {
    /// Q8_1: 32 signed bytes, value `q * d`; `s = d * sum(qs)` is for dot products.
    BlockQ8_1: Q8_1, 36, legacy::q8_1 { /** scale */ d: f16, /** `d * sum(qs)` */ s: f16, /** codes */ qs: [i8; 32] }
}
block! {
    /// MXFP4: 32 E2M1 codes with one E8M0 shared exponent.
    BlockMxfp4: MXFP4, 17, fp4::mxfp4 { /** E8M0 exponent */ e: u8, /** nibbles */ qs: [u8; 16] }
}
block! {
    /// NVFP4: 64 E2M1 codes in 4 sub-blocks of 16, each with a UE4M3 scale.
    BlockNvfp4: NVFP4, 36, fp4::nvfp4 { /** UE4M3 scales */ d: [u8; 4], /** nibbles */ qs: [u8; 32] }
}
block! {
    /// TQ1_0: 256 ternary digits, 5 per byte (base 3) plus 4 per byte in `qh`.
    BlockTq1_0: TQ1_0, 54, ternary::tq1_0 { /** base-3 packed */ qs: [u8; 48], /** base-3 packed, 4 per byte */ qh: [u8; 4], /** scale */ d: f16 }
}
block! {
    /// TQ2_0: 256 two-bit ternary codes, value `(q - 1) * d`.
    BlockTq2_0: TQ2_0, 66, ternary::tq2_0 { /** codes */ qs: [u8; 64], /** scale */ d: f16 }
}
block! {
    /// Q2_K: 16 sub-blocks of 16, 4-bit scales and mins.
    BlockQ2K: Q2_K, 84, k_quants::q2_k { /** scale (low nibble) / min (high nibble) */ scales: [u8; 16], /** codes */ qs: [u8; 64], /** super scale */ d: f16, /** super min */ dmin: f16 }
}
block! {
    /// Q3_K: 16 sub-blocks of 16, 6-bit scales.
    BlockQ3K: Q3_K, 110, k_quants::q3_k { /** high bits */ hmask: [u8; 32], /** low 2 bits */ qs: [u8; 64], /** packed 6-bit scales */ scales: [u8; 12], /** super scale */ d: f16 }
}
block! {
    /// Q4_K: 8 sub-blocks of 32, 6-bit scales and mins.
    BlockQ4K: Q4_K, 144, k_quants::q4_k { /** super scale */ d: f16, /** super min */ dmin: f16, /** packed 6-bit scales/mins */ scales: [u8; 12], /** nibbles */ qs: [u8; 128] }
}
block! {
    /// Q5_K: 8 sub-blocks of 32, 6-bit scales and mins, fifth bit in `qh`.
    BlockQ5K: Q5_K, 176, k_quants::q5_k { /** super scale */ d: f16, /** super min */ dmin: f16, /** packed 6-bit scales/mins */ scales: [u8; 12], /** fifth bits */ qh: [u8; 32], /** nibbles */ qs: [u8; 128] }
}
block! {
    /// Q6_K: 16 sub-blocks of 16, 8-bit scales.
    BlockQ6K: Q6_K, 210, k_quants::q6_k { /** low 4 bits */ ql: [u8; 128], /** high 2 bits */ qh: [u8; 64], /** scales */ scales: [i8; 16], /** super scale */ d: f16 }
}
block! {
    /// Q8_K: 256 signed bytes with an f32 scale (ggml's activation type for k-quant dots).
    BlockQ8K: Q8_K, 292, k_quants::q8_k { /** scale */ d: f32, /** codes */ qs: [i8; 256], /** sums of 16 codes */ bsums: [i16; 16] }
}
block! {
    /// IQ2_XXS: 2.06 bpw lattice codes.
    BlockIq2Xxs: IQ2_XXS, 66, iq::iq2_xxs { /** scale */ d: f16, /** grid indices, signs and scales */ qs: [u16; 32] }
}
block! {
    /// IQ2_XS: 2.31 bpw lattice codes.
    BlockIq2Xs: IQ2_XS, 74, iq::iq2_xs { /** scale */ d: f16, /** 9-bit grid index + 7-bit sign index */ qs: [u16; 32], /** 4-bit scales */ scales: [u8; 8] }
}
block! {
    /// IQ2_S: 2.56 bpw lattice codes.
    BlockIq2S: IQ2_S, 82, iq::iq2_s { /** scale */ d: f16, /** grid indices (low 8 bits) then signs */ qs: [u8; 64], /** grid index high bits */ qh: [u8; 8], /** 4-bit scales */ scales: [u8; 8] }
}
block! {
    /// IQ3_XXS: 3.06 bpw lattice codes.
    BlockIq3Xxs: IQ3_XXS, 98, iq::iq3_xxs { /** scale */ d: f16, /** grid indices then scales and signs */ qs: [u8; 96] }
}
block! {
    /// IQ3_S: 3.44 bpw lattice codes.
    BlockIq3S: IQ3_S, 110, iq::iq3_s { /** scale */ d: f16, /** grid indices (low 8 bits) */ qs: [u8; 64], /** grid index high bits */ qh: [u8; 8], /** signs */ signs: [u8; 32], /** 4-bit scales */ scales: [u8; 4] }
}
block! {
    /// IQ1_S: 1.56 bpw lattice codes.
    BlockIq1S: IQ1_S, 50, iq::iq1_s { /** scale */ d: f16, /** grid indices (low 8 bits) */ qs: [u8; 32], /** high bits, scale and delta sign */ qh: [u16; 8] }
}
block! {
    /// IQ1_M: 1.75 bpw lattice codes; the f16 super scale is spread over `scales`' top nibbles.
    BlockIq1M: IQ1_M, 56, iq::iq1_m { /** grid indices (low 8 bits) */ qs: [u8; 32], /** high bits and delta signs */ qh: [u8; 16], /** 3-bit scales + super scale nibbles */ scales: [u8; 8] }
}
block! {
    /// IQ4_NL: 32 four-bit non-linear codes.
    BlockIq4Nl: IQ4_NL, 18, iq::iq4_nl { /** scale */ d: f16, /** nibbles */ qs: [u8; 16] }
}
block! {
    /// IQ4_XS: 8 sub-blocks of 32 four-bit non-linear codes with 6-bit scales.
    BlockIq4Xs: IQ4_XS, 136, iq::iq4_xs { /** scale */ d: f16, /** scale high bits */ scales_h: u16, /** scale low nibbles */ scales_l: [u8; 4], /** nibbles */ qs: [u8; 128] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_type_table() {
        macro_rules! check {
            ($($b:ty),*) => {$(
                assert_eq!(<$b>::SIZE, <$b>::TYPE.type_size(), "{}", <$b>::TYPE);
                assert_eq!(<$b>::ELEMS, <$b>::TYPE.block_size(), "{}", <$b>::TYPE);
            )*};
        }
        check!(
            BlockQ1_0,
            BlockQ2_0,
            BlockQ4_0,
            BlockQ4_1,
            BlockQ5_0,
            BlockQ5_1,
            BlockQ8_0,
            BlockQ8_1,
            BlockMxfp4,
            BlockNvfp4,
            BlockTq1_0,
            BlockTq2_0,
            BlockQ2K,
            BlockQ3K,
            BlockQ4K,
            BlockQ5K,
            BlockQ6K,
            BlockQ8K,
            BlockIq2Xxs,
            BlockIq2Xs,
            BlockIq2S,
            BlockIq3Xxs,
            BlockIq3S,
            BlockIq1S,
            BlockIq1M,
            BlockIq4Nl,
            BlockIq4Xs
        );
    }

    #[test]
    fn struct_decode_matches_byte_decode() {
        let mut b = BlockQ4_0::zeroed();
        b.d = f16::from_f32(0.5);
        b.qs[0] = 0x3f;
        let mut out = [0.0; 32];
        b.dequantize(&mut out);
        assert_eq!(out[0], (15 - 8) as f32 * 0.5);
        assert_eq!(out[16], (3 - 8) as f32 * 0.5);
    }
}
