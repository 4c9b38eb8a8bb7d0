//! Element-wise types: F32, F16, BF16, F64, the integer types, and the safetensors FP8
//! formats E4M3FN and E5M2 (which have no ggml type id).
//!
//! F16, BF16 and both FP8 formats widen to f32 exactly (NaN stays NaN, signed zeros and
//! subnormals are kept). F64 rounds to nearest-even; integers convert as Rust's `as f32`
//! (round to nearest-even), the same as a C cast on IEEE hosts.

/// F32: little-endian copy.
pub fn f32_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
        *v = f32::from_le_bytes(*b);
    }
}

/// F16 (IEEE binary16): exact widening.
pub fn f16_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
        *v = half::f16::from_le_bytes(*b).to_f32();
    }
}

/// BF16: the top half of an f32 (`bits << 16`).
pub fn bf16_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
        *v = f32::from_bits((u16::from_le_bytes(*b) as u32) << 16);
    }
}

/// F64: rounded to the nearest f32 (overflow gives ±inf).
pub fn f64_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<8>().0) {
        *v = f64::from_le_bytes(*b) as f32;
    }
}

/// I8 → f32.
pub fn i8_le(src: &[u8], dst: &mut [f32]) {
    for (v, &b) in dst.iter_mut().zip(src) {
        *v = b as i8 as f32;
    }
}

/// I16 → f32.
pub fn i16_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<2>().0) {
        *v = i16::from_le_bytes(*b) as f32;
    }
}

/// I32 → f32 (rounded to nearest-even above 2^24).
pub fn i32_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
        *v = i32::from_le_bytes(*b) as f32;
    }
}

/// I64 → f32 (rounded to nearest-even above 2^24).
pub fn i64_le(src: &[u8], dst: &mut [f32]) {
    for (v, b) in dst.iter_mut().zip(src.as_chunks::<8>().0) {
        *v = i64::from_le_bytes(*b) as f32;
    }
}

/// One FP8 E4M3FN code to f32: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no
/// infinities; `S.1111.111` is NaN; exponent 0 is subnormal (`m · 2⁻⁹`).
pub fn f8_e4m3fn_to_f32(x: u8) -> f32 {
    let sign = if x & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((x >> 3) & 0x0f) as i32;
    let man = (x & 7) as f32;
    if exp == 0x0f && x & 7 == 7 {
        return f32::NAN.copysign(sign);
    }
    let mag = if exp == 0 {
        man * f32::from_bits(((127 - 9) as u32) << 23)
    } else {
        (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    sign * mag
}

/// One FP8 E5M2 code to f32: the top byte of an IEEE binary16 (infinities and NaNs included).
pub fn f8_e5m2_to_f32(x: u8) -> f32 {
    half::f16::from_bits((x as u16) << 8).to_f32()
}
