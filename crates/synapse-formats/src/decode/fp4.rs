//! The 4-bit float block types: MXFP4 (32 E2M1 values, one E8M0 exponent) and NVFP4
//! (64 E2M1 values in sub-blocks of 16, each with a UE4M3 scale).
//!
//! ggml stores E2M1 values doubled (`kvalues_fp4`) and halves the scale instead; every
//! product here is exact or a single rounding, matching `dequantize_row_mxfp4/nvfp4` bit for bit.

use super::iq_tables::KVALUES_FP4;

/// E8M0 exponent to `2^(e - 127) / 2` (ggml's `GGML_E8M0_TO_FP32_HALF`; 255 is not NaN).
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

/// UE4M3 scale to f32, halved (ggml's `ggml_ue4m3_to_fp32`): bias 7, no sign (bit 7 is
/// ignored), 0x00 and 0x7F decode to 0.
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = ((x >> 3) & 0x0f) as i32;
    let man = (x & 7) as f32;
    let raw = if exp == 0 {
        man * f32::from_bits(((127 - 9) as u32) << 23)
    } else {
        (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    raw * 0.5
}

/// MXFP4: `kvalues_fp4[q] · e8m0_half(e)`, low nibbles first.
pub fn mxfp4(b: &[u8; 17], y: &mut [f32; 32]) {
    let d = e8m0_to_f32_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        y[j] = KVALUES_FP4[(q & 0x0f) as usize] as f32 * d;
        y[j + 16] = KVALUES_FP4[(q >> 4) as usize] as f32 * d;
    }
}

/// NVFP4: four sub-blocks of 16, `kvalues_fp4[q] · ue4m3_half(d[s])`.
pub fn nvfp4(b: &[u8; 36], y: &mut [f32; 64]) {
    for s in 0..4 {
        let d = ue4m3_to_f32_half(b[s]);
        let qs = &b[4 + 8 * s..4 + 8 * s + 8];
        let yb = &mut y[16 * s..16 * s + 16];
        for (j, &q) in qs.iter().enumerate() {
            yb[j] = KVALUES_FP4[(q & 0x0f) as usize] as f32 * d;
            yb[j + 8] = KVALUES_FP4[(q >> 4) as usize] as f32 * d;
        }
    }
}
