//! The 2-, 3- and 4-bit g64 codecs (`syn.q{2,3,4}.{symmetric,asymmetric}.g64.v1`, ternary g64) on
//! AVX2 (and the AVX-VNNI CPUs, which run the same code): the float order of
//! [`super::codec_sym`] — per 64-element group 16 i32 lanes of 4 consecutive products,
//! `fma(float(lane), d_w·d_a, acc)` per lane, the lanes' fold at the end — in fewer
//! instructions per group than [`super::codec_sym::rows_avx2`]'s generic unpacking.
//!
//! The codes are unpacked into two registers whose i16 pair `i` (bytes `2i`, `2i + 1`) holds
//! two codes of lane `i` — the first register codes `4i` and `4i + 2` (3 and 4 bits) or `4i`
//! and `4i + 1` (2 bits), the second the lane's other two — and each activation row's group is
//! prepared once ([`records`]) with its codes in the same two orders. Then
//! `vpmaddubsw(first, a₁) + vpmaddubsw(second, a₂)` (`vpaddw`) is lane `i`'s four products in
//! i16 `i` (at most 4·15·127: no overflow, and no pair sum saturates); symmetric lanes add
//! their start `−2^(b−1)·Σ(4 codes)` there (the lane is then `Σ q·a`). The even i16 lanes
//! widen to i32 by `vpmaddwd` against (1, 0) pairs and the odd ones by an arithmetic shift,
//! so one register holds lanes 0, 2, 4, 6 | 8, 10, 12, 14 and the other 1, 3, … 15: both take
//! the scales `[d₀ ×4 | d₁ ×4]` of the group's two activation blocks, one `d_w·d_a` product
//! for the pair. The fold `(l + l+8)`, then `((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))`, is the
//! even register's halves summed and paired plus the odd register's.
//!
//! Unpacking: 4 bits (byte `j` holds codes `2j`, low nibble, and `2j + 1`): the low nibbles of
//! the 32 bytes are the first register and the high ones the second (a load, a shift, two
//! masks). 2 bits (byte `j` holds lane `j`'s four codes at bits 0, 2, 4, 6): each byte
//! zero-extended to i16 `v`, `t = v | v << 6`, then `t & 0x0303` is codes (0, 1) and
//! `t >> 4 & 0x0303` codes (2, 3) (six instructions for 64 codes; the generic path takes
//! twelve). 3 bits (lane `i`'s twelve bits from bit `12i`): one byte shuffle of the group's
//! first and last 16 bytes puts each lane's 16-bit window in its i16 (the odd lanes', which
//! start mid-byte, shifted down by a blend), then codes (0, 2) are the window's bits 0..3 and
//! 6..9 moved into bytes 0 and 1, and codes (1, 3) the same of the window `>> 3` (thirteen
//! instructions for 64 codes, against eighteen).
//!
//! Asymmetric groups (`x̂ = m + u·d`) take lanes `Σ u·a` (no start) and their minimum's chain
//! `m = fma(m_w, S, m)` beside them, as [`super::codec_sym`] defines it.

use std::arch::x86_64::*;

use bytemuck::{Pod, Zeroable};

use crate::act::BlockQ8x32;

use super::codec_sym::{GROUP, half_at};

/// Whether this kernel takes `bits`-bit codes.
pub(crate) fn supports(bits: u32) -> bool {
    (2..=4).contains(&bits)
}

/// One activation row's group, as this kernel reads it.
#[repr(C, align(32))]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct Rec {
    /// The codes against the first code register: pair `i` is `a₄ᵢ, a₄ᵢ₊₂` (3, 4 bits) or
    /// `a₄ᵢ, a₄ᵢ₊₁` (2 bits).
    first: [i8; 32],
    /// The lanes' other two codes, against the second register.
    second: [i8; 32],
    /// Each lane's start: `−2^(b−1)·Σ` of its 4 codes (symmetric), 0 (asymmetric).
    start: [i16; 16],
    /// The scale of the block each register lane lies in: `[d₀ ×4, d₁ ×4]`.
    da: [f32; 8],
}

/// The records of `act` (activation rows of whole groups, two Q8_0 blocks each) for
/// `bits`-bit codes, row by row, group by group, into `out` (one per group).
pub(crate) fn records(bits: u32, act: &[BlockQ8x32], asym: bool, out: &mut [Rec]) {
    // Within a lane, the positions of the first register's two codes, then the second's.
    let (p, q) = if bits == 2 {
        ([0, 1], [2, 3])
    } else {
        ([0, 2], [1, 3])
    };
    let bias = 1i32 << (bits - 1);
    for (blocks, rec) in act.chunks_exact(2).zip(out.iter_mut()) {
        let a: [i8; GROUP] = std::array::from_fn(|i| blocks[i / 32].qs[i % 32]);
        for i in 0..16 {
            for e in 0..2 {
                rec.first[2 * i + e] = a[4 * i + p[e]];
                rec.second[2 * i + e] = a[4 * i + q[e]];
            }
        }
        for (i, s) in rec.start.iter_mut().enumerate() {
            let sum: i32 = a[4 * i..4 * i + 4].iter().map(|&q| q as i32).sum();
            *s = if asym { 0 } else { (-bias * sum) as i16 };
        }
        for (i, d) in rec.da.iter_mut().enumerate() {
            *d = blocks[i / 4].d;
        }
    }
}

/// The f16 at `p`, as f32 (exact), in every lane.
///
/// # Safety
/// `p` can be read for 2 bytes; the CPU has AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half8(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    _mm256_broadcastss_ps(unsafe { half_at(p) })
}

/// `(E₀ + E₂) + (E₁ + E₃)` of the 128-bit sum of `a`'s halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_fold(a: __m256) -> __m128 {
    let e = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let s = _mm_add_ps(e, _mm_movehl_ps(e, e));
    _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s))
}

/// A group's codes as the two registers of lane pairs (see the module docs), from the code
/// bytes at `p`.
///
/// # Safety
/// `p` can be read for `8·BITS` bytes; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn codes<const BITS: usize>(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        if BITS == 4 {
            let low4 = _mm256_set1_epi8(0x0f);
            let c = _mm256_loadu_si256(p.cast());
            (
                _mm256_and_si256(c, low4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(c), low4),
            )
        } else if BITS == 3 {
            // Lane `i` of a 128-bit half is the 16-bit window at byte ⌊1.5·i⌋ of its 12
            // bytes (the upper half read from byte 8: its lanes start at 4), its 12 bits at
            // bit 0 (even `i`) or 4 (odd `i`, shifted down).
            let x = _mm256_loadu2_m128i(p.add(8).cast(), p.cast());
            let x = _mm256_shuffle_epi8(
                x,
                _mm256_setr_epi8(
                    0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11, 4, 5, 5, 6, 7, 8, 8, 9, 10,
                    11, 11, 12, 13, 14, 14, 15,
                ),
            );
            let y = _mm256_blend_epi16::<0xAA>(x, _mm256_srli_epi16::<4>(x));
            // Codes (0, 2) and (1, 3): bits 0..3 and 6..9 of the window, then of it >> 3,
            // into bytes 0 and 1.
            let pair = |v: __m256i| {
                _mm256_or_si256(
                    _mm256_and_si256(v, _mm256_set1_epi16(0x0007)),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(v), _mm256_set1_epi16(0x0700)),
                )
            };
            (pair(y), pair(_mm256_srli_epi16::<3>(y)))
        } else {
            let low2 = _mm256_set1_epi16(0x0303);
            let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
            let t = _mm256_or_si256(v, _mm256_slli_epi16::<6>(v));
            (
                _mm256_and_si256(t, low2),
                _mm256_and_si256(_mm256_srli_epi16::<4>(t), low2),
            )
        }
    }
}

/// The group's contribution to one weight row and activation row: its two lane registers
/// (even, odd lanes) into `acc` by `fma(float(lane), d, acc)`, `d = d_w·d_a`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lanes<const ASYM: bool>(
    (lo, hi): (__m256i, __m256i),
    dw: __m256,
    (first, second, start, da): (__m256i, __m256i, __m256i, __m256),
    acc: &mut [__m256; 2],
) {
    let p = _mm256_add_epi16(
        _mm256_maddubs_epi16(lo, first),
        _mm256_maddubs_epi16(hi, second),
    );
    let p = if ASYM { p } else { _mm256_add_epi16(p, start) };
    // (1, 0) pairs: `vpmaddwd` against them sign-extends the even i16 lanes.
    let even = _mm256_madd_epi16(p, _mm256_set1_epi32(1));
    let odd = _mm256_srai_epi32::<16>(p);
    let d = _mm256_mul_ps(dw, da);
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(even), d, acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(odd), d, acc[1]);
}

/// A record's four registers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load(rec: &Rec) -> (__m256i, __m256i, __m256i, __m256) {
    // SAFETY: the record is 32-byte aligned and whole.
    unsafe {
        (
            _mm256_load_si256(rec.first.as_ptr().cast()),
            _mm256_load_si256(rec.second.as_ptr().cast()),
            _mm256_load_si256(rec.start.as_ptr().cast()),
            _mm256_load_ps(rec.da.as_ptr()),
        )
    }
}

/// The f16 at `p` as f32 (exact).
///
/// # Safety
/// `p` can be read for 2 bytes; the CPU has F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half1(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    _mm_cvtss_f32(unsafe { half_at(p) })
}

/// The output of one weight row and activation row: the lanes' fold, plus the minimum's
/// chain (asymmetric).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn out<const ASYM: bool>(acc: &[__m256; 2], m: __m128) -> f32 {
    let s = _mm_add_ss(pair_fold(acc[0]), pair_fold(acc[1]));
    _mm_cvtss_f32(if ASYM { _mm_add_ss(s, m) } else { s })
}

/// One activation row against weight rows `r0..r1`, two weight rows a pass (their chains
/// interleaved, each group's record loaded once for both); an odd last row alone.
///
/// # Safety
/// As [`rows`] with `n = 1`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn one_row<const BITS: usize, const ASYM: bool>(
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    recs: &[Rec],
    msum: &[f32],
    y: *mut f32,
    r0: usize,
    r1: usize,
) {
    let hdr = if ASYM { 4 } else { 2 };
    let gb = hdr + 8 * BITS;
    let mut r = r0;
    while r < r1 {
        let two = r + 1 < r1;
        // SAFETY: rows `r` (and `r + 1` when `two`) lie inside `w`; an odd last row takes
        // both chains (its second result is not stored).
        let (p0, p1) = unsafe {
            (
                w.as_ptr().add(r * row_bytes),
                w.as_ptr().add(if two { r + 1 } else { r } * row_bytes),
            )
        };
        let mut acc = [[_mm256_setzero_ps(); 2]; 2];
        let mut m = [_mm_setzero_ps(); 2];
        for (g, rec) in recs[..ng].iter().enumerate() {
            let (g0, g1) = (p0.wrapping_add(g * gb), p1.wrapping_add(g * gb));
            _mm_prefetch::<_MM_HINT_T1>(g0.wrapping_add(6144).cast());
            _mm_prefetch::<_MM_HINT_T1>(g1.wrapping_add(6144).cast());
            let a = load(rec);
            // SAFETY: group `g` of both rows lies inside `w` (header and code bytes).
            unsafe {
                lanes::<ASYM>(codes::<BITS>(g0.add(hdr)), half8(g0), a, &mut acc[0]);
                lanes::<ASYM>(codes::<BITS>(g1.add(hdr)), half8(g1), a, &mut acc[1]);
                if ASYM {
                    let s = _mm_set_ss(msum[g]);
                    m[0] = _mm_fmadd_ss(_mm_set_ss(half1(g0.add(2))), s, m[0]);
                    m[1] = _mm_fmadd_ss(_mm_set_ss(half1(g1.add(2))), s, m[1]);
                }
            }
        }
        // SAFETY: the caller's contract on `y`.
        unsafe {
            *y.add(r) = out::<ASYM>(&acc[0], m[0]);
            if two {
                *y.add(r + 1) = out::<ASYM>(&acc[1], m[1]);
            }
        }
        r += 2;
    }
}

/// Output rows `r0..r1` of `W·X` for the `n` activation rows of `recs` (`n·ng` records from
/// [`records`] for `BITS`; `msum`: [`super::codec_sym::minimum_sums`],
/// asymmetric only), written to `y[t·ystride + r]` — the same bits as
/// [`super::codec_sym::rows_scalar`].
///
/// # Safety
/// `w` holds rows of `ng` groups of `BITS`-bit codes of this codec (`row_bytes` each); `y` is
/// valid for writes at `t·ystride + r` (`t < n`, `r0 <= r < r1`), which this call alone
/// writes; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows<const BITS: usize, const ASYM: bool>(
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    recs: &[Rec],
    msum: &[f32],
    n: usize,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let hdr = if ASYM { 4 } else { 2 };
    let gb = hdr + 8 * BITS;
    debug_assert!((2..=4).contains(&BITS));
    debug_assert!(recs.len() >= n * ng && r1 * row_bytes <= w.len());
    debug_assert_eq!(row_bytes, ng * gb);
    if n == 1 {
        // SAFETY: the caller's contract.
        unsafe { one_row::<BITS, ASYM>(w, row_bytes, ng, recs, msum, y, r0, r1) };
        return;
    }
    let mut t0 = 0;
    while t0 < n {
        // Up to four activation rows a pass, their count a constant of the pass (the
        // accumulators stay in registers).
        let nt = (n - t0).min(4);
        macro_rules! pass {
            ($nt:literal) => {
                for r in r0..r1 {
                    let row = r * row_bytes;
                    let mut acc = [[_mm256_setzero_ps(); 2]; $nt];
                    let mut m = [_mm_setzero_ps(); $nt];
                    for g in 0..ng {
                        // SAFETY: group `g` of row `r` lies inside `w` (the caller's
                        // contract); the prefetch may point past it (it does not fault).
                        let gp = unsafe { w.as_ptr().add(row + g * gb) };
                        // Decode streams the weights once: ask for them ~6 KB ahead.
                        _mm_prefetch::<_MM_HINT_T1>(gp.wrapping_add(6144).cast());
                        // SAFETY: the group's header and code bytes are inside `w`.
                        let (dw, mw, c) = unsafe {
                            (
                                half8(gp),
                                if ASYM { half1(gp.add(2)) } else { 0.0 },
                                codes::<BITS>(gp.add(hdr)),
                            )
                        };
                        for (k, a) in acc.iter_mut().enumerate() {
                            let t = t0 + k;
                            lanes::<ASYM>(c, dw, load(&recs[t * ng + g]), a);
                            if ASYM {
                                m[k] = _mm_fmadd_ss(
                                    _mm_set_ss(mw),
                                    _mm_set_ss(msum[t * ng + g]),
                                    m[k],
                                );
                            }
                        }
                    }
                    for (k, a) in acc.iter().enumerate() {
                        // SAFETY: the caller's contract on `y`.
                        unsafe { *y.add((t0 + k) * ystride + r) = out::<ASYM>(a, m[k]) };
                    }
                }
            };
        }
        match nt {
            1 => pass!(1),
            2 => pass!(2),
            3 => pass!(3),
            _ => pass!(4),
        }
        t0 += nt;
    }
}
