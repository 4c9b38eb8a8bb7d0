//! FP16 scale selection that keeps the documented error bounds after rounding to FP16.
//!
//! Rounding a scale to FP16 can make it slightly *smaller* than the exact ratio, which would
//! push the largest element of a group past the last code and break `|x - x̂| ≤ scale/2`. These
//! helpers step to neighbouring FP16 values until the bound provably holds in exact arithmetic
//! (the checks are done in f64, where products of an FP16 value and a small integer are exact).

use half::f16;

use crate::error::{CodecError, Result};

/// The next representable FP16 above `h` (finite `h`; may return +inf).
pub(crate) fn next_up(h: f16) -> f16 {
    let b = h.to_bits();
    let n = if b == 0 || b == 0x8000 {
        0x0001
    } else if b & 0x8000 == 0 {
        b + 1
    } else {
        b - 1
    };
    f16::from_bits(n)
}

/// The next representable FP16 below `h` (finite `h`; may return -inf).
pub(crate) fn next_down(h: f16) -> f16 {
    let b = h.to_bits();
    let n = if b == 0 || b == 0x8000 {
        0x8001
    } else if b & 0x8000 == 0 {
        b - 1
    } else {
        b + 1
    };
    f16::from_bits(n)
}

/// The smallest FP16 `h ≥ 0` with `h · steps ≥ span` (exactly), for `span > 0`, `steps ≥ 1`.
pub(crate) fn smallest_covering(span: f64, steps: f64, group: usize) -> Result<f16> {
    let out_of_range = || CodecError::ScaleOutOfRange {
        group,
        needed: span / steps,
    };
    let mut h = f16::from_f64(span / steps);
    if !h.is_finite() {
        return Err(out_of_range());
    }
    while (h.to_f64()) * steps < span {
        h = next_up(h);
        if !h.is_finite() {
            return Err(out_of_range());
        }
    }
    loop {
        let lower = next_down(h);
        if lower.to_f64() > 0.0 && lower.to_f64() * steps >= span {
            h = lower;
        } else {
            return Ok(h);
        }
    }
}

/// The largest FP16 `≤ v` (finite `v`).
pub(crate) fn floor_f16(v: f64, group: usize) -> Result<f16> {
    let out_of_range = || CodecError::ScaleOutOfRange { group, needed: v };
    let mut h = f16::from_f64(v);
    if !h.is_finite() {
        // from_f64 rounds to nearest, so a value just above f16::MAX may still floor to MAX.
        if v > 0.0 {
            h = f16::MAX;
        } else {
            return Err(out_of_range());
        }
    }
    while h.to_f64() > v {
        h = next_down(h);
        if !h.is_finite() {
            return Err(out_of_range());
        }
    }
    Ok(h)
}

/// Reads a little-endian FP16 at `bytes[0..2]`.
pub(crate) fn read_f16(bytes: &[u8]) -> f16 {
    f16::from_le_bytes([bytes[0], bytes[1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_scale_is_tight_and_sufficient() {
        for &(span, steps) in &[(1.0, 7.0), (3.3, 127.0), (1e-7, 1.0), (65504.0 * 7.0, 7.0)] {
            let h = smallest_covering(span, steps, 0).unwrap();
            assert!(h.to_f64() * steps >= span);
            assert!(next_down(h).to_f64() * steps < span || next_down(h).to_f64() <= 0.0);
        }
        assert!(smallest_covering(1e6, 1.0, 3).is_err());
    }

    #[test]
    fn floor_is_below() {
        for &v in &[0.1, -0.1, 1.0, -65504.0, 1e-9, -1e-9, 65519.0] {
            let h = floor_f16(v, 0).unwrap();
            assert!(h.to_f64() <= v && next_up(h).to_f64() > v, "{v}");
        }
        assert!(floor_f16(-70000.0, 0).is_err());
    }
}
