//! aarch64 NEON kernels (+ `sdot` when the CPU has `dotprod`), in ggml's x86 float order like
//! every other path. No aarch64 machine here: CI builds the kernel and codec tests for
//! `aarch64-unknown-linux-gnu` and runs them under `qemu-aarch64` (user-mode emulation), so the
//! NEON paths are checked against the scalar path and ggml's fixtures, not timed.
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

/// The 8 i32 lanes of a 32-byte dot in ggml's x86 lane layout (lane `j` = elements
/// `4j..4j+4`), as two vectors of 4 (widening multiplies, pairwise adds: baseline NEON).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn lanes32(w: *const u8, a: *const u8) -> [int32x4_t; 2] {
    unsafe {
        std::array::from_fn(|h| {
            let x = vld1q_s8(w.add(16 * h).cast());
            let y = vld1q_s8(a.add(16 * h).cast());
            // Pair sums of elements 0..8 and 8..16, then sums of adjacent pairs.
            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(y)));
            let hi = vpaddlq_s16(vmull_high_s8(x, y));
            vpaddq_s32(lo, hi)
        })
    }
}

/// [`lanes32`] with `sdot`, whose i32 lane `j` is exactly elements `4j..4j+4`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn lanes32_sdot(w: *const u8, a: *const u8) -> [int32x4_t; 2] {
    unsafe {
        std::array::from_fn(|h| {
            let mut acc = vdupq_n_s32(0);
            let x = vld1q_s8(w.add(16 * h).cast());
            let y = vld1q_s8(a.add(16 * h).cast());
            std::arch::asm!(
                "sdot {acc:v}.4s, {x:v}.16b, {y:v}.16b",
                acc = inout(vreg) acc,
                x = in(vreg) x,
                y = in(vreg) y,
                options(pure, nomem, nostack)
            );
            acc
        })
    }
}

/// ggml's x86 fold of one block into its 8 f32 accumulators: `acc_j = fma(d, lane_j, acc_j)`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fma_lanes(acc: &mut [float32x4_t; 2], d: f32, l: [int32x4_t; 2]) {
    let d = vdupq_n_f32(d);
    for (a, l) in acc.iter_mut().zip(l) {
        *a = vfmaq_f32(*a, vcvtq_f32_s32(l), d);
    }
}

/// ggml's x86 horizontal sum of the 8 accumulators: `((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn hsum8(acc: [float32x4_t; 2]) -> f32 {
    let t = vaddq_f32(acc[0], acc[1]);
    (vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 2)) + (vgetq_lane_f32(t, 1) + vgetq_lane_f32(t, 3))
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

// Q8_0 and Q4_0 in ggml's x86 float order (the scalar path's, so every path gives the same
// bits): per block `d = d_w·d_a`, the 8 four-element lanes, `acc_j = fma(d, lane_j, acc_j)`,
// then [`hsum8`].
macro_rules! neon_q {
    ($q8:ident, $q4:ident, $lanes:ident, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $q8(w: *const u8, a: *const u8, nb: usize) -> f32 {
            unsafe {
                let mut acc = [vdupq_n_f32(0.0); 2];
                for i in 0..nb {
                    let (wb, ab) = (w.add(i * 34), a.add(i * A32));
                    let d = f16(wb) * rd(ab.cast::<f32>());
                    fma_lanes(&mut acc, d, $lanes(wb.add(2), ab.add(8)));
                }
                hsum8(acc)
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn $q4(w: *const u8, a: *const u8, nb: usize) -> f32 {
            unsafe {
                let mut acc = [vdupq_n_f32(0.0); 2];
                let mut codes = [0u8; 32];
                for i in 0..nb {
                    let (wb, ab) = (w.add(i * 18), a.add(i * A32));
                    nibbles32(wb.add(2), &mut codes);
                    for c in codes.iter_mut() {
                        *c = c.wrapping_sub(8);
                    }
                    let d = f16(wb) * rd(ab.cast::<f32>());
                    fma_lanes(&mut acc, d, $lanes(codes.as_ptr(), ab.add(8)));
                }
                hsum8(acc)
            }
        }
    };
}

neon_q!(dot_q8_0, dot_q4_0, lanes32, "neon");
neon_q!(dot_q8_0_sdot, dot_q4_0_sdot, lanes32_sdot, "neon,dotprod");

// TQ1_0 / TQ2_0 against Q8_K in ggml's AVX2 order (the scalar path's `tq_lanes`): per block
// the 8 lanes, lane `k` summing elements `4k..4k+4` of every 32-element vector of codes
// `t + 1`, minus `bsums[2k] + bsums[2k+1]`; `acc_k = fma(lane_k, d_a·d_w, acc_k)`; `hsum8`.
/// `BlockQ8K` = {d: f32, qs: [i8; 256], bsums: [i16; 16]} (292 bytes).
const AK: usize = 292;

macro_rules! neon_tq {
    ($tq1:ident, $tq2:ident, $lanes:ident, $features:literal) => {
        /// The lanes of one block of codes (256 bytes) against `ab`'s Q8_K block, ready to
        /// scale.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn tq_block(codes: *const u8, ab: *const u8, acc: &mut [float32x4_t; 2], d: f32) {
            unsafe {
                let mut l = [vdupq_n_s32(0); 2];
                for v in 0..8 {
                    let x = $lanes(codes.add(32 * v), ab.add(4 + 32 * v));
                    l[0] = vaddq_s32(l[0], x[0]);
                    l[1] = vaddq_s32(l[1], x[1]);
                }
                // bsums pairs: lane k loses bsums[2k] + bsums[2k + 1].
                let bs = vld1q_s16(ab.add(4 + 256).cast());
                let bs2 = vld1q_s16(ab.add(4 + 256 + 16).cast());
                l[0] = vsubq_s32(l[0], vpaddlq_s16(bs));
                l[1] = vsubq_s32(l[1], vpaddlq_s16(bs2));
                fma_lanes(acc, d, l);
            }
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn $tq2(w: *const u8, a: *const u8, nb: usize) -> f32 {
            unsafe {
                let mut acc = [vdupq_n_f32(0.0); 2];
                let mut codes = [0u8; 256];
                let three = vdupq_n_u8(3);
                for i in 0..nb {
                    let (wb, ab) = (w.add(i * 66), a.add(i * AK));
                    // Codes in element order: bytes j..j+32 shifted by 2l, for j in {0, 32}.
                    for (half, j) in [0usize, 32].into_iter().enumerate() {
                        let b0 = vld1q_u8(wb.add(j));
                        let b1 = vld1q_u8(wb.add(j + 16));
                        for l in 0..4 {
                            let sh = vdupq_n_s8(-2 * l as i8);
                            let o = codes.as_mut_ptr().add(128 * half + 32 * l as usize);
                            vst1q_u8(o, vandq_u8(vshlq_u8(b0, sh), three));
                            vst1q_u8(o.add(16), vandq_u8(vshlq_u8(b1, sh), three));
                        }
                    }
                    let d = rd(ab.cast::<f32>()) * f16(wb.add(64));
                    tq_block(codes.as_ptr(), ab, &mut acc, d);
                }
                hsum8(acc)
            }
        }

        #[target_feature(enable = $features)]
        pub(super) unsafe fn $tq1(w: *const u8, a: *const u8, nb: usize) -> f32 {
            unsafe {
                let mut acc = [vdupq_n_f32(0.0); 2];
                for i in 0..nb {
                    let (wb, ab) = (w.add(i * 54), a.add(i * AK));
                    // Base-3 unpacking stays scalar (the multiply-and-shift per trit).
                    let codes =
                        crate::kernels::decode::tq1_codes(std::slice::from_raw_parts(wb, 54));
                    let d = rd(ab.cast::<f32>()) * f16(wb.add(52));
                    tq_block(codes.as_ptr(), ab, &mut acc, d);
                }
                hsum8(acc)
            }
        }
    };
}

mod tq_neon {
    use super::*;
    neon_tq!(dot_tq1_0, dot_tq2_0, lanes32, "neon");
}
mod tq_sdot {
    use super::*;
    neon_tq!(dot_tq1_0, dot_tq2_0, lanes32_sdot, "neon,dotprod");
}

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
        GgmlType::TQ1_0 if sdot => (ActKind::Q8K, tq_sdot::dot_tq1_0),
        GgmlType::TQ1_0 => (ActKind::Q8K, tq_neon::dot_tq1_0),
        GgmlType::TQ2_0 if sdot => (ActKind::Q8K, tq_sdot::dot_tq2_0),
        GgmlType::TQ2_0 => (ActKind::Q8K, tq_neon::dot_tq2_0),
        _ => return None,
    };
    Some(Kernel {
        act,
        dot,
        dot4: None,
        dot2: None,
        many: super::scalar::many(ty),
        many4: None,
    })
}
