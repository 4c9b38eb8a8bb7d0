//! aarch64 NEON kernels (+ `sdot` when the CPU has `dotprod`). Written and compiled in CI with
//! `cargo check --target aarch64-unknown-linux-gnu`; not run on this project's x86 machines.
//!
//! `vdotq_s32` is still unstable in `std::arch`, so the `dotprod` variant issues `sdot` through
//! inline assembly inside a `#[target_feature(enable = "dotprod")]` function.

use super::{DotFn, Kernel};
use crate::act::ActKind;
use std::arch::aarch64::*;
use std::ptr::read_unaligned as rd;
use synapse_formats::GgmlType;

const A32: usize = 40; // BlockQ8x32: d f32, s f32, qs[32]

#[inline]
#[target_feature(enable = "neon")]
unsafe fn f16(p: *const u8) -> f32 {
    half::f16::from_bits(unsafe { rd(p.cast::<u16>()) }).to_f32()
}

/// Σ w·a over 32 signed bytes, widening multiplies (baseline NEON).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn idot32(w: *const u8, a: *const u8) -> i32 {
    unsafe {
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            let x = vld1q_s8(w.add(16 * h).cast());
            let y = vld1q_s8(a.add(16 * h).cast());
            let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
            let hi = vmull_high_s8(x, y);
            acc = vpadalq_s16(acc, lo);
            acc = vpadalq_s16(acc, hi);
        }
        vaddvq_s32(acc)
    }
}

/// Σ w·a over 32 signed bytes with `sdot`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn idot32_sdot(w: *const u8, a: *const u8) -> i32 {
    unsafe {
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            let x = vld1q_s8(w.add(16 * h).cast());
            let y = vld1q_s8(a.add(16 * h).cast());
            std::arch::asm!(
                "sdot {acc:v}.4s, {x:v}.16b, {y:v}.16b",
                acc = inout(vreg) acc,
                x = in(vreg) x,
                y = in(vreg) y,
                options(pure, nomem, nostack)
            );
        }
        vaddvq_s32(acc)
    }
}

/// Q4_0 codes (0..15, low nibbles first) into 32 bytes at `out`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn nibbles32(qs: *const u8, out: &mut [u8; 32]) {
    unsafe {
        let b = vld1q_u8(qs);
        let m = vdupq_n_u8(15);
        vst1q_u8(out.as_mut_ptr(), vandq_u8(b, m));
        vst1q_u8(out.as_mut_ptr().add(16), vshrq_n_u8(b, 4));
    }
}

macro_rules! neon_q {
    ($q8:ident, $q4:ident, $idot:ident, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $q8(w: *const u8, a: *const u8, nb: usize) -> f32 {
            unsafe {
                let mut acc = 0f32;
                for i in 0..nb {
                    let (wb, ab) = (w.add(i * 34), a.add(i * A32));
                    let s = $idot(wb.add(2), ab.add(8));
                    acc += f16(wb) * rd(ab.cast::<f32>()) * s as f32;
                }
                acc
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn $q4(w: *const u8, a: *const u8, nb: usize) -> f32 {
            unsafe {
                let mut acc = 0f32;
                let mut codes = [0u8; 32];
                for i in 0..nb {
                    let (wb, ab) = (w.add(i * 18), a.add(i * A32));
                    nibbles32(wb.add(2), &mut codes);
                    for c in codes.iter_mut() {
                        *c = c.wrapping_sub(8);
                    }
                    let s = $idot(codes.as_ptr(), ab.add(8));
                    acc += f16(wb) * rd(ab.cast::<f32>()) * s as f32;
                }
                acc
            }
        }
    };
}

neon_q!(dot_q8_0, dot_q4_0, idot32, "neon");
neon_q!(dot_q8_0_sdot, dot_q4_0_sdot, idot32_sdot, "neon,dotprod");

#[target_feature(enable = "neon")]
unsafe fn dot_f32(w: *const u8, a: *const u8, n: usize) -> f32 {
    unsafe {
        let (w, a) = (w.cast::<f32>(), a.cast::<f32>());
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, s) in acc.iter_mut().enumerate() {
                *s = vfmaq_f32(*s, vld1q_f32(w.add(i + 4 * k)), vld1q_f32(a.add(i + 4 * k)));
            }
            i += 16;
        }
        let mut s = vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ));
        while i < n {
            s += rd(w.add(i)) * *a.add(i);
            i += 1;
        }
        s
    }
}

/// The NEON kernel for `ty`, if it has one (others use the scalar kernels, which LLVM
/// vectorizes for NEON anyway).
pub(crate) fn select(ty: GgmlType) -> Option<Kernel> {
    let sdot = std::arch::is_aarch64_feature_detected!("dotprod");
    let (act, dot): (ActKind, DotFn) = match ty {
        GgmlType::F32 => (ActKind::F32, dot_f32),
        GgmlType::Q8_0 if sdot => (ActKind::Q8x32, dot_q8_0_sdot),
        GgmlType::Q8_0 => (ActKind::Q8x32, dot_q8_0),
        GgmlType::Q4_0 if sdot => (ActKind::Q8x32, dot_q4_0_sdot),
        GgmlType::Q4_0 => (ActKind::Q8x32, dot_q4_0),
        _ => return None,
    };
    Some(Kernel {
        act,
        dot,
        dot4: None,
        many: super::scalar::many(ty),
    })
}
