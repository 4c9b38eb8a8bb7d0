//! Block layouts of the ggml encodings the kernels read, as byte offsets (the layouts are
//! ggml-common.h's; see docs/formats.md), and scalar unpackers shared by the reference dots and
//! the reference decoders. Every unpacker returns the *unsigned* quant codes in element order;
//! the offset (−8, −16, −32) or minimum is applied by the caller, once per block.

use half::{bf16, f16};

#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
pub(crate) fn bf16_at(b: &[u8], off: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Q4_0 / Q4_1 / IQ4_NL / MXFP4 nibble order: low nibbles are elements 0..16, high 16..32.
#[inline]
pub(crate) fn unpack_nibbles32(qs: &[u8]) -> [u8; 32] {
    let mut o = [0u8; 32];
    for j in 0..16 {
        o[j] = qs[j] & 15;
        o[j + 16] = qs[j] >> 4;
    }
    o
}

/// Q5_0 / Q5_1: nibbles plus the fifth bit from `qh` (bit j for element j).
#[inline]
pub(crate) fn unpack_q5(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut o = unpack_nibbles32(qs);
    for (j, v) in o.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) << 4) as u8;
    }
    o
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K byte offsets: d, dmin, scales[12], qs[128].
pub(crate) const Q4K_SCALES: usize = 4;
pub(crate) const Q4K_QS: usize = 16;

/// The 256 4-bit codes of a Q4_K block in element order: each 32 bytes of `qs` hold 64
/// elements, low nibbles first.
#[inline]
pub(crate) fn unpack_q4k(qs: &[u8]) -> [u8; 256] {
    let mut o = [0u8; 256];
    for c in 0..4 {
        for l in 0..32 {
            let b = qs[c * 32 + l];
            o[c * 64 + l] = b & 15;
            o[c * 64 + 32 + l] = b >> 4;
        }
    }
    o
}

/// Q5_K byte offsets: d, dmin, scales[12], qh[32], qs[128].
pub(crate) const Q5K_QH: usize = 16;
pub(crate) const Q5K_QS: usize = 48;

/// The 256 5-bit codes of a Q5_K block: Q4_K's nibbles plus bit `2c` / `2c+1` of `qh[l]`.
#[inline]
pub(crate) fn unpack_q5k(qh: &[u8], qs: &[u8]) -> [u8; 256] {
    let mut o = unpack_q4k(qs);
    for c in 0..4 {
        for l in 0..32 {
            o[c * 64 + l] |= ((qh[l] >> (2 * c)) & 1) << 4;
            o[c * 64 + 32 + l] |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
    }
    o
}

/// Q6_K byte offsets: ql[128], qh[64], scales[16] (i8), d.
pub(crate) const Q6K_QH: usize = 128;
pub(crate) const Q6K_SCALES: usize = 192;
pub(crate) const Q6K_D: usize = 208;

/// The 256 6-bit codes of a Q6_K block (0..64; the value is `code − 32`) in element order.
#[inline]
pub(crate) fn unpack_q6k(ql: &[u8], qh: &[u8]) -> [u8; 256] {
    let mut o = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&ql[n * 64..], &qh[n * 32..]);
        let y = &mut o[n * 128..];
        for l in 0..32 {
            y[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q5_fifth_bit_order() {
        let qs = [0u8; 16];
        let o = unpack_q5(1 << 3 | 1 << 20, &qs);
        assert_eq!(o[3], 16);
        assert_eq!(o[20], 16);
        assert_eq!(o.iter().filter(|&&v| v != 0).count(), 2);
    }

    #[test]
    fn q6k_layout_matches_ggml_loop() {
        // element 64+5 of the first half comes from the high nibble of ql[5] and bits 4..6 of qh[5]
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        ql[5] = 0xA0;
        qh[5] = 0b0011_0000;
        let o = unpack_q6k(&ql, &qh);
        assert_eq!(o[69], 0xA | (3 << 4));
    }
}
