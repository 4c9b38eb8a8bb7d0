//! The many-row K-quant GEMM on AVX-512 VNNI: 16 activation rows per 512-bit register.
//!
//! The float order is the one [`super::scalar`]'s `*_tiled` dots define (ggml's tiled K-quant
//! matmul): per super-block the integer sums `s1 = Σ sc·(raw − bias·bsum)` and
//! `s2 = Σ m·bsum`, then `r = s1·d`, `r = fma(−dmin, s2, r)`, `acc = fma(r, d_a, acc)`. Only
//! the integer part is organised differently, which changes nothing: the activations of 16
//! rows are interleaved four bytes at a time (`[k/4][row][4]`), so one `vpdpbusd` of a
//! broadcast group of four weight codes against one 64-byte load advances 16 outputs, and
//! each weight super-block is unpacked once for all activation rows.

use std::arch::x86_64::*;

use crate::act::BlockQ8K;
use crate::blocks::*;
use synapse_formats::GgmlType;

/// Activation rows per group (one i32 lane each).
pub(crate) const G: usize = 16;
/// Bytes of one packed (group, super-block): codes, d per row, per row the 8 sums of 32 (two
/// 16-sums each) as i16 pairs `[4][row]` (the Q4_K/Q5_K mins' operand: one `vpdpwssd` covers
/// two sub-blocks), then the 16 sums of 16 as i16 pairs `[8][row]` (Q6_K's `−32·Σ sc·bsum`,
/// likewise).
pub(crate) const PACK: usize = 256 * G + G * 4 + 4 * G * 4 + 8 * G * 4;
/// Offset of the i16-pair sums of 32 in a packed super-block.
const PAIRS: usize = 256 * G + G * 4;
/// Offset of the i16-pair sums of 16.
const PAIRS16: usize = PAIRS + 4 * G * 4;

/// The K-quants this GEMM handles.
pub(crate) fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::IQ4_XS
    )
}

/// Activation rows from which a call takes this GEMM rather than the per-row kernels (same
/// bits): 8 for Q4_K/Q5_K/Q6_K; a whole group for Q2_K/Q3_K/IQ4_XS, whose four-row tiles are
/// faster below it (kbench, 1 thread, 2048×1024: 8 rows 63.5 / 54.0 / 66.9 GF/s here against
/// 111.7 / 87.8 / 79.1, 64 rows 164.8 / 157.4 / 177.6 against 106.4 / 86.2 / 78.7).
pub(crate) fn min_rows(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ4_XS => G,
        _ => 8,
    }
}

/// How a type's super-block enters [`superblock2`]: sixteen sub-blocks of 16 (Q6_K, Q2_K,
/// Q3_K) or eight of 32; the codes' bias as a left shift (`u = v + 2^shift`: Q6_K 32, Q3_K 4,
/// IQ4_XS 128), taken off as `2^shift·Σ sc·bsum`; and whether minimums multiply the sub-block
/// sums (Q4_K/Q5_K over 32, Q2_K over 16).
#[derive(Clone, Copy)]
struct Shape {
    sub16: bool,
    bias_shift: Option<u32>,
    mins: bool,
}

fn shape(ty: GgmlType) -> Shape {
    match ty {
        GgmlType::Q6_K => Shape {
            sub16: true,
            bias_shift: Some(5),
            mins: false,
        },
        GgmlType::Q3_K => Shape {
            sub16: true,
            bias_shift: Some(2),
            mins: false,
        },
        GgmlType::Q2_K => Shape {
            sub16: true,
            bias_shift: None,
            mins: true,
        },
        GgmlType::IQ4_XS => Shape {
            sub16: false,
            bias_shift: Some(7),
            mins: false,
        },
        _ => Shape {
            sub16: false,
            bias_shift: None,
            mins: true,
        },
    }
}

/// Packs `n` rows of `nb` Q8K blocks into `ceil(n/16)` groups × `nb` packed super-blocks
/// (missing rows of the last group are zeros: d = 0, so they add exactly 0).
pub(crate) fn pack(act: &[BlockQ8K], n: usize, nb: usize, out: &mut [u8]) {
    let groups = n.div_ceil(G);
    debug_assert!(out.len() >= groups * nb * PACK);
    for g in 0..groups {
        for kb in 0..nb {
            let p = &mut out[(g * nb + kb) * PACK..(g * nb + kb + 1) * PACK];
            let (q, rest) = p.split_at_mut(256 * G);
            let (d, rest) = rest.split_at_mut(G * 4);
            let (pairs, pairs16) = rest.split_at_mut(4 * G * 4);
            for c in 0..G {
                let t = g * G + c;
                let blk = (t < n).then(|| &act[t * nb + kb]);
                for k4 in 0..64 {
                    let dst = &mut q[(k4 * G + c) * 4..(k4 * G + c) * 4 + 4];
                    match blk {
                        Some(b) => {
                            for (o, v) in dst.iter_mut().zip(&b.qs[4 * k4..4 * k4 + 4]) {
                                *o = *v as u8;
                            }
                        }
                        None => dst.fill(0),
                    }
                }
                let dv = blk.map_or(0f32, |b| b.d);
                d[c * 4..c * 4 + 4].copy_from_slice(&dv.to_le_bytes());
                for j in 0..4 {
                    // |sum of 32 quants| <= 32·127: an i16.
                    let s32 = |s: usize| blk.map_or(0i16, |b| b.bsums[2 * s] + b.bsums[2 * s + 1]);
                    let (lo, hi) = (s32(2 * j), s32(2 * j + 1));
                    pairs[(j * G + c) * 4..(j * G + c) * 4 + 2].copy_from_slice(&lo.to_le_bytes());
                    pairs[(j * G + c) * 4 + 2..(j * G + c) * 4 + 4]
                        .copy_from_slice(&hi.to_le_bytes());
                }
                for j in 0..8 {
                    let b16 = |s: usize| blk.map_or(0i16, |b| b.bsums[s]);
                    let o = (j * G + c) * 4;
                    pairs16[o..o + 2].copy_from_slice(&b16(2 * j).to_le_bytes());
                    pairs16[o + 2..o + 4].copy_from_slice(&b16(2 * j + 1).to_le_bytes());
                }
            }
        }
    }
}

/// One weight super-block, unpacked: codes in element order (unsigned, biased where the
/// type's values are signed), per-sub scales and mins.
struct Unpacked {
    codes: [u8; 256],
    sc: [i32; 16],
    /// Mins of sub-blocks 2j, 2j+1 as the i16 pair `m[2j] | m[2j+1] << 16`.
    m2: [i32; 8],
    /// Biased types: scales of sub-blocks 2j, 2j+1 as an i16 pair.
    sc2: [i32; 8],
    d: f32,
    dmin: f32,
}

/// `v[2j] | v[2j+1] << 16` as i16 pairs.
fn pairs16(v: &[i32]) -> [i32; 8] {
    let mut o = [0i32; 8];
    for (j, p) in o.iter_mut().enumerate().take(v.len() / 2) {
        *p = (v[2 * j] as i16 as u16 as i32) | ((v[2 * j + 1] as i16 as u16 as i32) << 16);
    }
    o
}

fn unpack(ty: GgmlType, b: &[u8]) -> Unpacked {
    let mut u = Unpacked {
        codes: [0; 256],
        sc: [0; 16],
        m2: [0; 8],
        sc2: [0; 8],
        d: 0.0,
        dmin: 0.0,
    };
    match ty {
        GgmlType::Q2_K => {
            // scales[16] (scale low nibble, min high), qs[64], d, dmin.
            // SAFETY: this GEMM runs only on AVX-512 CPUs (AVX2 included); 64 code bytes.
            unsafe { q23_codes(b[16..80].as_ptr(), None, &mut u.codes) };
            let m: [i32; 16] = std::array::from_fn(|s| (b[s] >> 4) as i32);
            u.sc = std::array::from_fn(|s| (b[s] & 15) as i32);
            u.m2 = pairs16(&m);
            u.d = f16_at(b, 80);
            u.dmin = f16_at(b, 82);
        }
        GgmlType::Q3_K => {
            // hmask[32], qs[64], scales[12], d: v = lo2 − 4 where the hmask bit is clear,
            // entered as u = v + 4 = lo2 + 4·bit.
            // SAFETY: as for Q2_K; 32 hmask bytes, then 64 code bytes.
            unsafe { q23_codes(b[32..96].as_ptr(), Some(b[..32].as_ptr()), &mut u.codes) };
            let raw = super::decode::q3k_scales(&b[96..108]);
            u.sc = raw.map(|v| v as i32 - 32);
            u.sc2 = pairs16(&u.sc);
            u.d = f16_at(b, 108);
        }
        GgmlType::IQ4_XS => {
            // d, scales_h, scales_l[4], qs[128]: values entered as u = v + 128.
            // SAFETY: as for Q2_K; 128 code bytes.
            unsafe { iq4xs_codes(b[8..136].as_ptr(), &mut u.codes) };
            let sc = super::decode::iq4xs_scales(b);
            u.sc[..8].copy_from_slice(&sc);
            u.sc2 = pairs16(&sc);
            u.d = f16_at(b, 0);
        }
        GgmlType::Q6_K => {
            u.codes = unpack_q6k(&b[..128], &b[Q6K_QH..Q6K_QH + 64]);
            for (s, v) in u.sc.iter_mut().enumerate() {
                *v = (b[Q6K_SCALES + s] as i8) as i32;
                u.sc2[s / 2] |= ((*v as i16 as u16) as i32) << (16 * (s % 2));
            }
            u.d = f16_at(b, Q6K_D);
        }
        _ => {
            u.codes = if ty == GgmlType::Q5_K {
                unpack_q5k(&b[Q5K_QH..Q5K_QH + 32], &b[Q5K_QS..Q5K_QS + 128])
            } else {
                unpack_q4k(&b[Q4K_QS..Q4K_QS + 128])
            };
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &b[Q4K_SCALES..Q4K_SCALES + 12]);
                u.sc[j] = s as i32;
                u.m2[j / 2] |= (m as i32) << (16 * (j % 2));
            }
            u.d = f16_at(b, 0);
            u.dmin = f16_at(b, 2);
        }
    }
    u
}

/// Q2_K's codes (`hmask` `None`) or Q3_K's biased values `lo2 + 4·bit` in element order:
/// element `32g + j` is bits `2·(g % 4)` of code byte `32·(g / 4) + j` (and bit `g` of
/// `hmask[j]`) — the scalar `q2k_codes`/`q3k_values` (+4), 32 bytes a step.
///
/// # Safety
/// The CPU has AVX2; `qs` holds 64 bytes, `hmask` 32.
#[target_feature(enable = "avx2")]
unsafe fn q23_codes(qs: *const u8, hmask: Option<*const u8>, out: &mut [u8; 256]) {
    // SAFETY: the caller's contract; stores stay inside `out`.
    unsafe {
        let q = [
            _mm256_loadu_si256(qs.cast()),
            _mm256_loadu_si256(qs.add(32).cast()),
        ];
        let hm = hmask.map(|h| _mm256_loadu_si256(h.cast()));
        for g in 0..8 {
            let sh = _mm_cvtsi32_si128(2 * (g % 4) as i32);
            let mut c = _mm256_and_si256(_mm256_srl_epi16(q[g / 4], sh), _mm256_set1_epi8(3));
            if let Some(h) = hm {
                let bit = _mm256_srl_epi16(h, _mm_cvtsi32_si128(g as i32));
                let four = _mm256_slli_epi16(_mm256_and_si256(bit, _mm256_set1_epi8(1)), 2);
                c = _mm256_or_si256(c, four);
            }
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * g).cast(), c);
        }
    }
}

/// IQ4_XS's values biased by 128 (`kvalues_iq4nl[nibble] + 128`, unsigned) in element order,
/// from its 128 code bytes (16 a sub-block, low nibbles first).
///
/// # Safety
/// The CPU has AVX2; `qs` holds 128 bytes.
#[target_feature(enable = "avx2")]
unsafe fn iq4xs_codes(qs: *const u8, out: &mut [u8; 256]) {
    // SAFETY: the caller's contract; stores stay inside `out`.
    unsafe {
        let t = _mm_loadu_si128(super::decode::KVALUES_IQ4NL_BIASED.as_ptr().cast());
        let table = _mm256_set_m128i(t, t);
        let m = _mm_set1_epi8(15);
        for ib in 0..8 {
            let b = _mm_loadu_si128(qs.add(16 * ib).cast());
            let (lo, hi) = (_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
            let v = _mm256_shuffle_epi8(table, _mm256_set_m128i(hi, lo));
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * ib).cast(), v);
        }
    }
}

/// Output rows `r0..r1` against all packed groups: `y[t·rows + r]` for `t < n`.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VL and VNNI; `w` holds `rows` weight rows of `nb` blocks of
/// `ty` (`row_bytes` each), `packed` `ceil(n/16)·nb` packed super-blocks, and `y` is valid for
/// `n·rows` writes of which this call writes only rows `r0..r1`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    packed: &[u8],
    n: usize,
    rows: usize,
    y: *mut f32,
    r0: usize,
    r1: usize,
) {
    let ts = ty.type_size();
    let groups = n.div_ceil(G);
    // Weight rows in tiles of RTK, each super-block unpacked once per tile; per tile every
    // activation group is swept (its packed super-blocks stay in L1/L2), two weight rows per
    // pass sharing each activation load.
    UNPACKED.with(|cell| {
        let us = &mut *cell.borrow_mut();
        us.clear();
        let mut t0 = r0;
        while t0 < r1 {
            let t1 = (t0 + RTK).min(r1);
            us.clear();
            for r in t0..t1 {
                let wr = &w[r * row_bytes..(r + 1) * row_bytes];
                us.extend((0..nb).map(|kb| unpack(ty, &wr[kb * ts..(kb + 1) * ts])));
            }
            let nt = t1 - t0;
            for g in 0..groups {
                let gp = &packed[g * nb * PACK..(g + 1) * nb * PACK];
                // Super-block outer: each packed activation super-block (5 KB) serves all the
                // tile's rows while in L1; one accumulator per row.
                let mut acc = [_mm512_setzero_ps(); RTK];
                for kb in 0..nb {
                    let p = &gp[kb * PACK..(kb + 1) * PACK];
                    let mut r = 0;
                    while r < nt {
                        let rb = if r + 1 < nt { r + 1 } else { r };
                        // SAFETY: `p` is one packed super-block (PACK bytes) and the CPU has
                        // the features this function is compiled for.
                        let (x, z) = unsafe {
                            superblock2(ty, &us[r * nb + kb], &us[rb * nb + kb], p, acc[r], acc[rb])
                        };
                        acc[r] = x;
                        acc[rb] = z;
                        r += 2;
                    }
                }
                for (r, a) in acc.iter().enumerate().take(nt) {
                    // SAFETY: forwarded contract (`y` valid for n·rows, row t0 + r is this
                    // call's).
                    unsafe { store_group(*a, g, n, rows, t0 + r, y) };
                }
            }
            t0 = t1;
        }
    })
}

/// Weight rows per tile of [`rows`].
const RTK: usize = 8;

thread_local! {
    /// The unpacked super-blocks of one weight-row tile.
    static UNPACKED: std::cell::RefCell<Vec<Unpacked>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes output row `r` of group `g`'s 16 activation rows (`y[t·rows + r]`, `t < n` only).
///
/// # Safety
/// AVX-512F is available, `y` is valid for `n·rows` writes and `r < rows`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_group(v: __m512, g: usize, n: usize, rows: usize, r: usize, y: *mut f32) {
    let mut o = [0f32; G];
    // SAFETY: 16 floats.
    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    for (c, v) in o.iter().enumerate() {
        let t = g * G + c;
        if t < n {
            // SAFETY: t < n and r < rows: inside `y`.
            unsafe { *y.add(t * rows + r) = *v };
        }
    }
}

/// One packed super-block against two unpacked weight super-blocks (`ua`, `ub`): each
/// activation load serves both; per row the integer sums and float steps of ggml's order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn superblock2(
    ty: GgmlType,
    ua: &Unpacked,
    ub: &Unpacked,
    p: &[u8],
    acc_a: __m512,
    acc_b: __m512,
) -> (__m512, __m512) {
    let q = p.as_ptr();
    // SAFETY: offsets inside the PACK-byte packed block.
    let dp = unsafe { q.add(256 * G) };
    let code = |u: &Unpacked, k4: usize| {
        u32::from_le_bytes([
            u.codes[4 * k4],
            u.codes[4 * k4 + 1],
            u.codes[4 * k4 + 2],
            u.codes[4 * k4 + 3],
        ]) as i32
    };
    let (mut s1a, mut s1b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    let (mut s2a, mut s2b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    let sh = shape(ty);
    // Sub-blocks and 4-byte groups per sub; the packed sums of a sub-block and their pairs.
    let (nsub, per) = if sh.sub16 { (16, 4) } else { (8, 8) };
    let (sums, npairs) = if sh.sub16 { (PAIRS16, 8) } else { (PAIRS, 4) };
    for s in 0..nsub {
        let (mut ra, mut rb) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for gi in 0..per {
            let k4 = s * per + gi;
            // SAFETY: k4 < 64: 64 bytes at k4·64 inside the codes part.
            let a = unsafe { _mm512_loadu_si512(q.add(k4 * G * 4).cast()) };
            ra = _mm512_dpbusd_epi32(ra, _mm512_set1_epi32(code(ua, k4)), a);
            rb = _mm512_dpbusd_epi32(rb, _mm512_set1_epi32(code(ub, k4)), a);
        }
        s1a = _mm512_add_epi32(s1a, _mm512_mullo_epi32(ra, _mm512_set1_epi32(ua.sc[s])));
        s1b = _mm512_add_epi32(s1b, _mm512_mullo_epi32(rb, _mm512_set1_epi32(ub.sc[s])));
    }
    if let Some(shift) = sh.bias_shift {
        // s1 −= 2^shift·Σ_s sc_s·bsum_s: two sub-blocks per `vpdpwssd` (exact integers, so
        // the same s1 as subtracting the bias times each sub-block's sum first).
        let (mut ca, mut cb) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for j in 0..npairs {
            // SAFETY: 64 bytes of pairs inside the packed block.
            let bs = unsafe { _mm512_loadu_si512(q.add(sums + j * G * 4).cast()) };
            ca = _mm512_dpwssd_epi32(ca, bs, _mm512_set1_epi32(ua.sc2[j]));
            cb = _mm512_dpwssd_epi32(cb, bs, _mm512_set1_epi32(ub.sc2[j]));
        }
        let shift = _mm_cvtsi32_si128(shift as i32);
        s1a = _mm512_sub_epi32(s1a, _mm512_sll_epi32(ca, shift));
        s1b = _mm512_sub_epi32(s1b, _mm512_sll_epi32(cb, shift));
    }
    if sh.mins {
        // s2 = Σ_s m_s·(sum of sub-block s): two sub-blocks per `vpdpwssd` (exact integers).
        for j in 0..npairs {
            // SAFETY: 64 bytes of pairs inside the packed block.
            let bs = unsafe { _mm512_loadu_si512(q.add(sums + j * G * 4).cast()) };
            s2a = _mm512_dpwssd_epi32(s2a, bs, _mm512_set1_epi32(ua.m2[j]));
            s2b = _mm512_dpwssd_epi32(s2b, bs, _mm512_set1_epi32(ub.m2[j]));
        }
    }
    let mut ra = _mm512_mul_ps(_mm512_cvtepi32_ps(s1a), _mm512_set1_ps(ua.d));
    let mut rb = _mm512_mul_ps(_mm512_cvtepi32_ps(s1b), _mm512_set1_ps(ub.d));
    if sh.mins {
        ra = _mm512_fnmadd_ps(_mm512_set1_ps(ua.dmin), _mm512_cvtepi32_ps(s2a), ra);
        rb = _mm512_fnmadd_ps(_mm512_set1_ps(ub.dmin), _mm512_cvtepi32_ps(s2b), rb);
    }
    // SAFETY: 16 floats of d at the end of the packed block.
    let da = unsafe { _mm512_loadu_ps(dp.cast()) };
    (
        _mm512_fmadd_ps(ra, da, acc_a),
        _mm512_fmadd_ps(rb, da, acc_b),
    )
}

// ---- 32-element block types (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1) ----------------------------
//
// ggml's order for these (vec_dot and tinyBLAS alike): per block, 8 i32 lanes of 4
// consecutive products each, `acc_j = fma(d_w·d_a, lane_j, acc_j)`, `hsum_float_8` at the
// end. With 16 activation rows interleaved four bytes at a time, one `vpdpbusd` yields lane j
// of a block for all 16 rows at once. `vpdpbusd` multiplies unsigned by signed bytes, so the
// weight codes enter biased (Q8_0 + 128, Q5_0 and Q4_0 unsigned as stored) and the bias times
// each lane's activation sum (packed beside the codes) is subtracted: exact integers.
// Q4_1 and Q5_1 (ggml's `_q8_1` dots) have unsigned codes (no bias) and add each row's
// `Σ_b m_w·s_a` (each product rounded, added in block order, 16 rows at once) after the
// horizontal sum, as `vec_dot_q4_1_q8_1` does.

/// Bytes of one packed (group, 32-block): codes `[8 lanes][16 rows][4]`, lane sums
/// `[8][16]` i32, d per row, s (ggml's `block_q8_1::s`) per row.
pub(crate) const PACK32: usize = 32 * G + 8 * G * 4 + G * 4 + G * 4;

/// The 32-block types this GEMM handles.
pub(crate) fn supports32(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL
    )
}

/// Whether `ty` carries per-block mins (`Σ m·s` added after the lanes' sum).
fn mins32(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1)
}

/// Packs `n` rows of `nb` Q8x32 blocks into `ceil(n/16)` groups × `nb` packed blocks; the
/// lane sums are stored as `−bias·Σ`, the value each lane's `vpdpbusd` starts from.
pub(crate) fn pack32(
    act: &[crate::act::BlockQ8x32],
    n: usize,
    nb: usize,
    bias: i32,
    out: &mut [u8],
) {
    let groups = n.div_ceil(G);
    debug_assert!(out.len() >= groups * nb * PACK32);
    for g in 0..groups {
        for b in 0..nb {
            let p = &mut out[(g * nb + b) * PACK32..(g * nb + b + 1) * PACK32];
            let (q, rest) = p.split_at_mut(32 * G);
            let (sums, ds) = rest.split_at_mut(8 * G * 4);
            let (d, sv) = ds.split_at_mut(G * 4);
            for c in 0..G {
                let t = g * G + c;
                let blk = (t < n).then(|| &act[t * nb + b]);
                for j in 0..8 {
                    let mut s = 0i32;
                    for e in 0..4 {
                        let v = blk.map_or(0i8, |bl| bl.qs[4 * j + e]);
                        q[(j * G + c) * 4 + e] = v as u8;
                        s += v as i32;
                    }
                    sums[(j * G + c) * 4..(j * G + c) * 4 + 4]
                        .copy_from_slice(&(-bias * s).to_le_bytes());
                }
                let dv = blk.map_or(0f32, |bl| bl.d);
                d[c * 4..c * 4 + 4].copy_from_slice(&dv.to_le_bytes());
                let s = blk.map_or(0f32, |bl| bl.s);
                sv[c * 4..c * 4 + 4].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
}

/// The bias [`codes32`] puts on `ty`'s codes.
pub(crate) fn bias32(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q8_0 | GgmlType::IQ4_NL => 128,
        GgmlType::Q5_0 => 16,
        GgmlType::Q4_1 | GgmlType::Q5_1 => 0,
        _ => 8,
    }
}

/// One block's weight codes as unsigned bytes (Q8_0 + 128, IQ4_NL's values + 128, Q5_0 and
/// Q4_0 as stored, i.e. with [`bias32`]'s bias), written as 8 little-endian words at `out`, with AVX-512BW.
///
/// # Safety
/// `b` points at one whole block of `ty`, `out` at 8 writable words; the CPU has AVX-512
/// F/BW/VL.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn codes32_simd(ty: GgmlType, b: *const u8, out: *mut u32) {
    // SAFETY: forwarded contract.
    unsafe {
        let nib = |qs: *const u8| {
            let q = _mm_loadu_si128(qs.cast());
            let m = _mm_set1_epi8(15);
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
        };
        let v = match ty {
            GgmlType::Q8_0 => {
                _mm256_xor_si256(_mm256_loadu_si256(b.add(2).cast()), _mm256_set1_epi8(-128))
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (qh, qs) = if ty == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
                let qh = std::ptr::read_unaligned(b.add(qh).cast::<u32>());
                let v = nib(b.add(qs));
                _mm256_mask_add_epi8(v, qh, v, _mm256_set1_epi8(16))
            }
            GgmlType::Q4_1 => nib(b.add(4)),
            GgmlType::IQ4_NL => {
                let t = _mm_loadu_si128(super::decode::KVALUES_IQ4NL_BIASED.as_ptr().cast());
                _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nib(b.add(2)))
            }
            _ => nib(b.add(2)),
        };
        _mm256_storeu_si256(out.cast(), v);
    }
}

thread_local! {
    /// A weight row's codes as little-endian 4-byte groups and its block scales.
    static ROW32: std::cell::RefCell<(Vec<u32>, Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Output rows `r0..r1` of a 32-block matrix against all packed groups.
///
/// # Safety
/// As [`rows`], with `packed` holding `ceil(n/16)·nb` blocks packed by [`pack32`] with
/// [`bias32`]`(ty)`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows32(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    packed: &[u8],
    n: usize,
    rows: usize,
    y: *mut f32,
    r0: usize,
    r1: usize,
) {
    ROW32.with(|cell| {
        let (u4b, dwb, mwb) = &mut *cell.borrow_mut();
        // Grown only (shrinking and regrowing between matrices of different widths cleared
        // them again on every call).
        if u4b.len() < RT * nb * 8 {
            u4b.resize(RT * nb * 8, 0);
            dwb.resize(RT * nb, 0.0);
            mwb.resize(RT * nb, 0.0);
        }
        let (u4s, dws, mws) = (
            &mut u4b[..RT * nb * 8],
            &mut dwb[..RT * nb],
            &mut mwb[..RT * nb],
        );
        // SAFETY: forwarded contract.
        unsafe {
            if mins32(ty) {
                rows32_inner::<true>(
                    ty, w, row_bytes, nb, packed, n, rows, y, r0, r1, u4s, dws, mws,
                )
            } else {
                rows32_inner::<false>(
                    ty, w, row_bytes, nb, packed, n, rows, y, r0, r1, u4s, dws, mws,
                )
            }
        }
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows32_inner<const MINS: bool>(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    packed: &[u8],
    n: usize,
    rows: usize,
    y: *mut f32,
    r0: usize,
    r1: usize,
    u4s: &mut [u32],
    dws: &mut [f32],
    mws: &mut [f32],
) {
    let ts = ty.type_size();
    let groups = n.div_ceil(G);
    // Weight rows in tiles of RT, unpacked once; per tile every activation group is swept
    // while its packed blocks stay in L1, two weight rows per pass sharing each load.
    let mut t0 = r0;
    while t0 < r1 {
        let t1 = (t0 + RT).min(r1);
        for r in t0..t1 {
            let wr = &w[r * row_bytes..(r + 1) * row_bytes];
            let o = (r - t0) * nb;
            for b in 0..nb {
                let blk = &wr[b * ts..(b + 1) * ts];
                // SAFETY: `blk` is one whole block; u4s has room for block o + b's 8 words.
                unsafe { codes32_simd(ty, blk.as_ptr(), u4s[(o + b) * 8..].as_mut_ptr()) };
                dws[o + b] = f16_at(blk, 0);
                if MINS {
                    mws[o + b] = f16_at(blk, 2);
                }
            }
        }
        for g in 0..groups {
            let gp = &packed[g * nb * PACK32..(g + 1) * nb * PACK32];
            let mut r = t0;
            while r + 2 <= t1 {
                let (o0, o1) = ((r - t0) * nb, (r + 1 - t0) * nb);
                // SAFETY: `gp` holds nb packed blocks; the CPU has the enabled features.
                let (v0, v1) = unsafe {
                    group2::<MINS>(
                        gp,
                        nb,
                        (&u4s[o0 * 8..], &dws[o0..], &mws[o0..]),
                        (&u4s[o1 * 8..], &dws[o1..], &mws[o1..]),
                    )
                };
                // SAFETY: forwarded contract (`y` valid for n·rows, rows r, r+1 are this call's).
                unsafe {
                    store_group(v0, g, n, rows, r, y);
                    store_group(v1, g, n, rows, r + 1, y);
                }
                r += 2;
            }
            if r < t1 {
                let o0 = (r - t0) * nb;
                // SAFETY: as above.
                let v0 = unsafe { group1::<MINS>(gp, nb, &u4s[o0 * 8..], &dws[o0..], &mws[o0..]) };
                // SAFETY: as above.
                unsafe { store_group(v0, g, n, rows, r, y) };
            }
        }
        t0 = t1;
    }
}

/// Weight rows per tile of [`rows32_inner`].
const RT: usize = 16;

/// `hsum_float_8` per output: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum8(acc: &[__m512; 8]) -> __m512 {
    let t0 = _mm512_add_ps(acc[0], acc[4]);
    let t1 = _mm512_add_ps(acc[1], acc[5]);
    let t2 = _mm512_add_ps(acc[2], acc[6]);
    let t3 = _mm512_add_ps(acc[3], acc[7]);
    _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3))
}

/// One weight row (codes `u4`, scales `dw`, mins `mw` when `MINS`) against one packed group
/// of `nb` blocks.
///
/// # Safety
/// `gp` holds `nb` packed blocks of [`PACK32`] bytes, `u4` `8·nb` codes, `dw` (and with
/// `MINS` `mw`) `nb` values; the CPU has AVX-512 F/BW/VL, VNNI and FMA.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn group1<const MINS: bool>(
    gp: &[u8],
    nb: usize,
    u4: &[u32],
    dw: &[f32],
    mw: &[f32],
) -> __m512 {
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut sm = _mm512_setzero_ps();
    for b in 0..nb {
        let p = gp[b * PACK32..].as_ptr();
        // SAFETY: one packed block of PACK32 bytes starts at `p`.
        unsafe {
            let sp = p.add(32 * G).cast::<i32>();
            let da = _mm512_loadu_ps(p.add(32 * G + 8 * G * 4).cast());
            let dv = _mm512_mul_ps(_mm512_set1_ps(dw[b]), da);
            if MINS {
                let sa = _mm512_loadu_ps(p.add(32 * G + 8 * G * 4 + G * 4).cast());
                sm = _mm512_add_ps(sm, _mm512_mul_ps(_mm512_set1_ps(mw[b]), sa));
            }
            for (j, aj) in acc.iter_mut().enumerate() {
                let lane = _mm512_dpbusd_epi32(
                    _mm512_loadu_si512(sp.add(j * G).cast()),
                    _mm512_set1_epi32(u4[b * 8 + j] as i32),
                    _mm512_loadu_si512(p.add(j * G * 4).cast()),
                );
                *aj = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(lane), *aj);
            }
        }
    }
    if MINS {
        _mm512_add_ps(hsum8(&acc), sm)
    } else {
        hsum8(&acc)
    }
}

/// Two weight rows against one packed group: each activation load serves both.
///
/// # Safety
/// As [`group1`], for both rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn group2<const MINS: bool>(
    gp: &[u8],
    nb: usize,
    (u4a, dwa, mwa): (&[u32], &[f32], &[f32]),
    (u4b, dwb, mwb): (&[u32], &[f32], &[f32]),
) -> (__m512, __m512) {
    let mut acc_a = [_mm512_setzero_ps(); 8];
    let mut acc_b = [_mm512_setzero_ps(); 8];
    let (mut sma, mut smb) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for b in 0..nb {
        let p = gp[b * PACK32..].as_ptr();
        // SAFETY: one packed block of PACK32 bytes starts at `p`.
        unsafe {
            let sp = p.add(32 * G).cast::<i32>();
            let da = _mm512_loadu_ps(p.add(32 * G + 8 * G * 4).cast());
            let dva = _mm512_mul_ps(_mm512_set1_ps(dwa[b]), da);
            let dvb = _mm512_mul_ps(_mm512_set1_ps(dwb[b]), da);
            if MINS {
                let sa = _mm512_loadu_ps(p.add(32 * G + 8 * G * 4 + G * 4).cast());
                sma = _mm512_add_ps(sma, _mm512_mul_ps(_mm512_set1_ps(mwa[b]), sa));
                smb = _mm512_add_ps(smb, _mm512_mul_ps(_mm512_set1_ps(mwb[b]), sa));
            }
            for j in 0..8 {
                let s0 = _mm512_loadu_si512(sp.add(j * G).cast());
                let a = _mm512_loadu_si512(p.add(j * G * 4).cast());
                let la = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(u4a[b * 8 + j] as i32), a);
                let lb = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(u4b[b * 8 + j] as i32), a);
                acc_a[j] = _mm512_fmadd_ps(dva, _mm512_cvtepi32_ps(la), acc_a[j]);
                acc_b[j] = _mm512_fmadd_ps(dvb, _mm512_cvtepi32_ps(lb), acc_b[j]);
            }
        }
    }
    if MINS {
        (
            _mm512_add_ps(hsum8(&acc_a), sma),
            _mm512_add_ps(hsum8(&acc_b), smb),
        )
    } else {
        (hsum8(&acc_a), hsum8(&acc_b))
    }
}
