//! One activation row against a Q4_K or Q6_K matrix on AVX-512 VNNI: two weight rows per 512-bit
//! register, one per 256-bit half, in the float order of ggml's `vec_dot_q4_K_q8_K` (x86) per
//! row: per super-block the 8 i32 lanes `Σ_c madd(maddubs(codes, q8), scale)`, `acc = fma(d_a·d,
//! lanes, acc)`; the mins in 4 lanes, `accm = fma(−d_a·dmin, madd(mins, pairwise bsums), accm)`;
//! at the end `hsum_float_8(acc) + (accm₀ + accm₂ + (accm₁ + accm₃))`; Q6_K: the lanes start
//! at `−32·madd(scales, bsums)` and add `madd(maddubs(codes, q8), scale)` per 32 elements —
//! the same bits as the per-row kernels, with every instruction serving two rows.

use std::arch::x86_64::*;

use super::gemv32::{dpair, halves, spread};
use super::x86::avx512vnni::k4_scales;
use crate::blocks::{Q4K_QS, Q4K_SCALES, Q6K_D, Q6K_QH, Q6K_SCALES};
use synapse_formats::GgmlType;

/// The types this kernel handles.
pub(crate) fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// Bytes of a Q4_K block and of a Q8_K activation block (`d`, `qs[256]`, `bsums[16]`).
const TS: usize = 144;
const AK: usize = 292;
/// Bytes ahead of the current block to prefetch (each row is streamed once).
const PREFETCH: usize = 1536;

/// The mins' 4 lanes reduced as the per-row kernel does: `(m0 + m2) + (m1 + m3)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum4(v: __m128) -> f32 {
    let m2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)))
}

/// Output rows `r0..r1` of `W·x` (`ty` one of [`supports`]) for one Q8_K activation row `a`
/// (`nb` blocks), written to `y[r]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `w` holds the rows (`row_bytes` each) of
/// `nb` blocks of `ty`; `a` holds `nb` Q8_K blocks; `y` is valid for writes at `r0..r1`,
/// which this call alone writes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: &[u8],
    y: *mut f32,
    r0: usize,
    r1: usize,
) {
    // SAFETY: forwarded contract.
    unsafe {
        if ty == GgmlType::Q6_K {
            q6k_rows(w, row_bytes, nb, a, y, r0, r1)
        } else {
            q4k_rows(w, row_bytes, nb, a, y, r0, r1)
        }
    }
}

/// [`rows`] for Q4_K.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn q4k_rows(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: &[u8],
    y: *mut f32,
    r0: usize,
    r1: usize,
) {
    let m4 = _mm512_set1_epi8(15);
    // Prefetch at least the next pair's rows: the pair reads rows r and r + 1 side by side,
    // so a fixed distance shorter than two rows would only touch data already streaming.
    let dist = PREFETCH.max(2 * row_bytes);
    let mut r = r0;
    while r < r1 {
        let rb = if r + 1 < r1 { r + 1 } else { r };
        // SAFETY: rows r and rb are inside `w`; blocks and activations sized by the caller.
        unsafe {
            let (pa, pb) = (
                w.as_ptr().add(r * row_bytes),
                w.as_ptr().add(rb * row_bytes),
            );
            let mut acc = _mm512_setzero_ps();
            let mut accm = _mm256_setzero_ps();
            for i in 0..nb {
                let (wa, wb, ab) = (pa.add(i * TS), pb.add(i * TS), a.as_ptr().add(i * AK));
                for k in [0, 64, 128] {
                    _mm_prefetch::<_MM_HINT_T0>(wa.wrapping_add(dist + k).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(dist + k).cast());
                }
                let da = std::ptr::read_unaligned(ab.cast::<f32>());
                let (sca, ma) = k4_scales(wa.add(Q4K_SCALES));
                let (scb, mb) = k4_scales(wb.add(Q4K_SCALES));
                // Scales as words: [a0..a7, b0..b7] in a ymm, spread per sub-block below.
                let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_set_epi64x(
                    i64::from_le_bytes(scb),
                    i64::from_le_bytes(sca),
                )));
                let mut sumi = _mm512_setzero_si512();
                for c in 0..4 {
                    let q = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256(wa.add(Q4K_QS + 32 * c).cast())),
                        _mm256_loadu_si256(wb.add(Q4K_QS + 32 * c).cast()),
                        1,
                    );
                    let lo = _mm512_and_si512(q, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    let alo = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(4 + 64 * c).cast()));
                    let ahi =
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(4 + 64 * c + 32).cast()));
                    let (j0, j1) = (2 * c as i16, 2 * c as i16 + 1);
                    let s_lo = _mm512_permutexvar_epi16(
                        _mm512_set_epi16(
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0 + 8,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                            j0,
                        ),
                        sc16,
                    );
                    let s_hi = _mm512_permutexvar_epi16(
                        _mm512_set_epi16(
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1 + 8,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                            j1,
                        ),
                        sc16,
                    );
                    let plo = _mm512_madd_epi16(_mm512_maddubs_epi16(lo, alo), s_lo);
                    let phi = _mm512_madd_epi16(_mm512_maddubs_epi16(hi, ahi), s_hi);
                    sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(plo, phi));
                }
                // Mins: madd(mins, pairwise bsums), 4 lanes per row.
                let q8s = _mm_hadd_epi16(
                    _mm_loadu_si128(ab.add(260).cast()),
                    _mm_loadu_si128(ab.add(276).cast()),
                );
                let mv = _mm256_cvtepu8_epi16(_mm_set_epi64x(
                    i64::from_le_bytes(mb),
                    i64::from_le_bytes(ma),
                ));
                let prod = _mm256_madd_epi16(mv, _mm256_set_m128i(q8s, q8s));
                let dv = spread(dpair(wa, wb), da);
                let dmin = _mm_mul_ps(dpair(wa.add(2), wb.add(2)), _mm_set1_ps(-da));
                let dm = _mm256_permutexvar_ps(
                    _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0),
                    _mm256_castps128_ps256(dmin),
                );
                accm = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(prod), accm);
                acc = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(sumi), acc);
            }
            let (ya, yb) = halves(acc);
            // `+ 0.0`: the per-row kernel adds Q5_K's (here empty) scalar min sum there.
            *y.add(r) = ya + (hsum4(_mm256_castps256_ps128(accm)) + 0.0);
            if rb != r {
                *y.add(rb) = yb + (hsum4(_mm256_extractf128_ps(accm, 1)) + 0.0);
            }
        }
        r += 2;
    }
}

/// Bytes of a Q6_K block.
const TS6: usize = 210;

/// Two rows' 32-byte chunks at `a + off` and `b + off` as one zmm (row `a` low).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ld2(a: *const u8, b: *const u8, off: usize) -> __m512i {
    // SAFETY: 32 bytes at both addresses (caller).
    unsafe {
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(a.add(off).cast())),
            _mm256_loadu_si256(b.add(off).cast()),
            1,
        )
    }
}

/// [`rows`] for Q6_K.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn q6k_rows(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    a: &[u8],
    y: *mut f32,
    r0: usize,
    r1: usize,
) {
    let m4 = _mm512_set1_epi8(15);
    let m2 = _mm512_set1_epi8(3);
    // Prefetch at least the next pair's rows: the pair reads rows r and r + 1 side by side,
    // so a fixed distance shorter than two rows would only touch data already streaming.
    let dist = PREFETCH.max(2 * row_bytes);
    let mut r = r0;
    while r < r1 {
        let rb = if r + 1 < r1 { r + 1 } else { r };
        // SAFETY: rows r and rb are inside `w`; blocks and activations sized by the caller.
        unsafe {
            let (pa, pb) = (
                w.as_ptr().add(r * row_bytes),
                w.as_ptr().add(rb * row_bytes),
            );
            let mut acc = _mm512_setzero_ps();
            for i in 0..nb {
                let (wa, wb, ab) = (pa.add(i * TS6), pb.add(i * TS6), a.as_ptr().add(i * AK));
                for k in [0, 64, 128, 192] {
                    _mm_prefetch::<_MM_HINT_T0>(wa.wrapping_add(dist + k).cast());
                    _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(dist + k).cast());
                }
                // Scales as words: row a's 16 in words 0..16, row b's in 16..32.
                let sc16 = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128(wa.add(Q6K_SCALES).cast())),
                    _mm_loadu_si128(wb.add(Q6K_SCALES).cast()),
                    1,
                ));
                // −32·Σ_g sc_g·bsum_g, the lanes' start.
                let bs = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(260).cast()));
                let corr = _mm512_madd_epi16(sc16, bs);
                let mut sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(corr, 5));
                for n in 0..2 {
                    let ql0 = ld2(wa, wb, 64 * n);
                    let ql1 = ld2(wa, wb, 64 * n + 32);
                    let qh = ld2(wa, wb, Q6K_QH + 32 * n);
                    let hb = |v: __m512i| _mm512_slli_epi16(_mm512_and_si512(v, m2), 4);
                    let codes = [
                        _mm512_or_si512(_mm512_and_si512(ql0, m4), hb(qh)),
                        _mm512_or_si512(_mm512_and_si512(ql1, m4), hb(_mm512_srli_epi16(qh, 2))),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(ql0, 4), m4),
                            hb(_mm512_srli_epi16(qh, 4)),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16(ql1, 4), m4),
                            hb(_mm512_srli_epi16(qh, 6)),
                        ),
                    ];
                    for (k, c) in codes.into_iter().enumerate() {
                        let g = (n * 8 + 2 * k) as i16;
                        let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                            ab.add(4 + 16 * g as usize).cast(),
                        ));
                        let p = _mm512_maddubs_epi16(c, av);
                        // Words: [a_g ×8, a_g+1 ×8, b_g ×8, b_g+1 ×8].
                        let (g0, g1, h0, h1) = (g, g + 1, g + 16, g + 17);
                        let s = _mm512_permutexvar_epi16(
                            _mm512_set_epi16(
                                h1, h1, h1, h1, h1, h1, h1, h1, h0, h0, h0, h0, h0, h0, h0, h0, g1,
                                g1, g1, g1, g1, g1, g1, g1, g0, g0, g0, g0, g0, g0, g0, g0,
                            ),
                            sc16,
                        );
                        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, s));
                    }
                }
                let da = std::ptr::read_unaligned(ab.cast::<f32>());
                let dv = spread(dpair(wa.add(Q6K_D), wb.add(Q6K_D)), da);
                acc = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(sumi), acc);
            }
            let (ya, yb) = halves(acc);
            *y.add(r) = ya;
            if rb != r {
                *y.add(rb) = yb;
            }
        }
        r += 2;
    }
}
