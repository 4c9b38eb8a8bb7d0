//! Synapse's symmetric group codecs `syn.q{2..8}.symmetric.g64.v1` against activations
//! quantized as ggml's Q8_0 (32-element blocks, [`BlockQ8x32`]) — the integer path that runs a
//! precision profile's demoted tensors, instead of the codec's own f32 `linear`.
//!
//! Per weight row, activation row and 64-element group: the codes `u = q + 2^(b−1)` (unsigned,
//! as `vpdpbusd` wants) meet the activation codes in 16 i32 lanes of 4 consecutive products
//! each, every lane starting at `−2^(b−1)·Σ(its 4 activations)`, so a lane ends as `Σ q·a`
//! exactly; lanes 0–7 lie in the group's first activation block, 8–15 in its second. Then per
//! lane `acc = fma(float(lane), d_w·d_a, acc)` (`d_w·d_a` one rounded product), and at the end
//! the 16 lanes fold as `(acc[l] + acc[l+8])`, then `((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))`.
//! The scalar path computes exactly this, so the SIMD path (AVX-512 VBMI + VNNI: a byte
//! permute or a zero-extending load, `vpmultishiftqb` and a mask unpack the LSB-first bit
//! stream of any width) equals it bit for bit; each row's result depends only on its own
//! activations (batch invariance).
//!
//! The asymmetric codecs `syn.q{2..8}.asymmetric.g64.v1` (`x̂ = m + u·d`: an f16 scale and an
//! f16 minimum, then the unsigned codes) take the same kernels with `ASYM = true`: the lanes
//! start at 0 (`Σ u·a`) and take the same `fma(float(Σ u·a), d_w·d_a, acc)`; the minimum's
//! term does not depend on the codes, so it is one chain per row beside the lanes,
//! `m = fma(m_w, S, m)` group by group, where `S = d₀·Σ₀ + d₁·Σ₁` (each product rounded, then
//! the sum) comes from the group's two activation blocks (`Σₕ` the sum of block h's codes,
//! prepared once per activation row and shared by every weight row); the output is the
//! lanes' fold `+ m`. (The prepared `init` then holds each lane's plain activation sum, which
//! the AVX2 and NEON paths use to turn their signed lanes into `Σ u·a`.)

use half::f16;

use crate::act::BlockQ8x32;

/// Elements per group (the only group size this path takes).
pub(crate) const GROUP: usize = 64;

/// Bytes before a group's codes: the f16 scale (symmetric), or the scale and the f16 minimum
/// (asymmetric).
const fn header(asym: bool) -> usize {
    if asym { 4 } else { 2 }
}

/// Bytes of one group of `bits`-bit codes: the header, then `64·bits/8` code bytes.
pub(crate) const fn group_bytes(bits: u32, asym: bool) -> usize {
    header(asym) + GROUP * bits as usize / 8
}

/// Per activation row and group: into `init` the 16 lane starts `−2^(b−1)·Σ` of each lane's 4
/// activation codes (symmetric) or those plain sums `Σ` (asymmetric), and the lanes'
/// activation scales `[d₀ ×8, d₁ ×8]` into `da`; asymmetric, also each group's
/// `S = d₀·Σ₀ + d₁·Σ₁` into `msum` (one per group; empty when symmetric).
pub(crate) fn prepare(
    bits: u32,
    asym: bool,
    act: &[BlockQ8x32],
    init: &mut [i32],
    da: &mut [f32],
    msum: &mut [f32],
) {
    let bias = if asym { -1 } else { 1i32 << (bits - 1) };
    for (blocks, (iv, dv)) in act
        .chunks_exact(2)
        .zip(init.chunks_exact_mut(16).zip(da.chunks_exact_mut(16)))
    {
        for (h, b) in blocks.iter().enumerate() {
            for j in 0..8 {
                let s: i32 = b.qs[4 * j..4 * j + 4].iter().map(|&q| q as i32).sum();
                iv[8 * h + j] = -bias * s;
                dv[8 * h + j] = b.d;
            }
        }
    }
    if asym {
        minimum_sums(act, msum);
    }
}

/// Each group's `S = d₀·Σ₀ + d₁·Σ₁` (the asymmetric codes' minimum term, see the module docs)
/// into `msum`, one per group of `act`.
pub(crate) fn minimum_sums(act: &[BlockQ8x32], msum: &mut [f32]) {
    for (blocks, m) in act.chunks_exact(2).zip(msum.iter_mut()) {
        let sum = |b: &BlockQ8x32| b.qs.iter().map(|&q| q as i32).sum::<i32>() as f32;
        *m = blocks[0].d * sum(&blocks[0]) + blocks[1].d * sum(&blocks[1]);
    }
}

/// The signature every path of this kernel shares ([`rows_scalar`]'s contract, plus the CPU
/// features of the path chosen).
pub(crate) type RowsFn = unsafe fn(
    u32,
    &[u8],
    usize,
    usize,
    &[BlockQ8x32],
    &[i32],
    &[f32],
    &[f32],
    *mut f32,
    usize,
    usize,
    usize,
);

/// The 64 codes of one group's code area (LSB-first, `bits` each).
fn unpack(bits: u32, area: &[u8], out: &mut [u8; GROUP]) {
    let b = bits as usize;
    let mask = (1u32 << b) - 1;
    for (i, o) in out.iter_mut().enumerate() {
        let bit = b * i;
        let (byte, sh) = (bit / 8, bit % 8);
        let lo = area[byte] as u32;
        let hi = area.get(byte + 1).copied().unwrap_or(0) as u32;
        *o = (((lo | hi << 8) >> sh) & mask) as u8;
    }
}

/// The final fold of the 16 lanes (see the module docs).
fn fold(acc: &[f32; 16]) -> f32 {
    let v: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

/// Output rows `r0..r1` of `W·X` for `n` activation rows (`act`: `n·2·ng` blocks; `init`,
/// `da`, `msum`: [`prepare`] of them), written to `y[t·ystride + r]` — the reference path.
///
/// # Safety
/// `w` holds rows of `ng` groups of `bits`-bit codes (`row_bytes` each); `y` is valid for
/// writes at `t·ystride + r` (`t < n`, `r0 <= r < r1`), which this call alone writes.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_scalar<const ASYM: bool>(
    bits: u32,
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    da: &[f32],
    msum: &[f32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let gb = group_bytes(bits, ASYM);
    let hdr = header(ASYM);
    let n = act.len() / (2 * ng).max(1);
    let mut codes = [0u8; GROUP];
    for r in r0..r1 {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for t in 0..n {
            let mut acc = [0f32; 16];
            let mut m = 0f32;
            for g in 0..ng {
                let grp = &row[g * gb..(g + 1) * gb];
                let dw = f16::from_le_bytes([grp[0], grp[1]]).to_f32();
                let mw = f16::from_le_bytes([grp[2], grp[3]]).to_f32();
                unpack(bits, &grp[hdr..], &mut codes);
                let base = (t * ng + g) * 16;
                for (l, a) in acc.iter_mut().enumerate() {
                    let blk = &act[(t * ng + g) * 2 + l / 8];
                    let j = 4 * (l % 8);
                    let mut s = if ASYM { 0 } else { init[base + l] };
                    for k in 0..4 {
                        s += codes[4 * l + k] as i32 * blk.qs[j + k] as i32;
                    }
                    *a = (s as f32).mul_add(dw * da[base + l], *a);
                }
                if ASYM {
                    m = mw.mul_add(msum[t * ng + g], m);
                }
            }
            let out = if ASYM { fold(&acc) + m } else { fold(&acc) };
            // SAFETY: the caller's contract.
            unsafe { *y.add(t * ystride + r) = out };
        }
    }
}

/// The f16 at `p` (a group's scale or minimum) as the low lane of a register (exact).
///
/// # Safety
/// `p` is valid for reading 2 bytes; the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
pub(crate) unsafe fn half_at(p: *const u8) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    let h = unsafe { std::ptr::read_unaligned(p.cast::<u16>()) };
    _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32))
}

/// The fold of [`fold`] on a register of 16 lanes: `(l + l+8)`, then `(v0+v4)`… as pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
fn hsum(a: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm512_castps512_ps256(a);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    let v = _mm256_add_ps(lo, hi);
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The AVX-512 unpacking constants for `b`-bit codes ([`codes_of`]): `vpermb`'s byte index
/// (byte 8j + k of the output takes stream byte b·j + k: 8 codes of b bits are b bytes,
/// bit-aligned at qword j's start), `vpmultishiftqb`'s control (byte k of each qword takes
/// the 8 bits from bit b·k of its qword), the mask of b bits, and the load mask of a group's
/// `8·b` code bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn unpack_consts(
    b: usize,
) -> (
    std::arch::x86_64::__m512i,
    std::arch::x86_64::__m512i,
    std::arch::x86_64::__m512i,
    u64,
) {
    use std::arch::x86_64::*;
    let idx: [u8; 64] = std::array::from_fn(|i| (b * (i / 8) + i % 8).min(63) as u8);
    let ctl: [u8; 64] = std::array::from_fn(|i| (b * (i % 8)) as u8);
    let load_mask: u64 = if b == 8 { !0 } else { (1u64 << (8 * b)) - 1 };
    // SAFETY: 64 bytes each.
    let (idx, ctl) = unsafe {
        (
            _mm512_loadu_si512(idx.as_ptr().cast()),
            _mm512_loadu_si512(ctl.as_ptr().cast()),
        )
    };
    (
        idx,
        ctl,
        _mm512_set1_epi8(((1u32 << b) - 1) as u8 as i8),
        load_mask,
    )
}

/// [`rows_scalar`] on AVX-512 (F, BW, VBMI, VNNI), the same bits; up to 8 activation rows share
/// each group's unpacking, and with one activation row eight (8-bit codes: four) weight rows
/// share its loads and convert their scales together ([`decode_block`]).
///
/// # Safety
/// As [`rows_scalar`], and the CPU has AVX-512 F, BW, VL, VBMI and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_avx512<const ASYM: bool>(
    bits: u32,
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    da: &[f32],
    msum: &[f32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    use std::arch::x86_64::*;
    let b = bits as usize;
    let gb = group_bytes(bits, ASYM);
    let hdr = header(ASYM);
    let n = act.len() / (2 * ng).max(1);
    let (idx, ctl, cmask, load_mask) = unpack_consts(b);
    // SAFETY: the caller's contract; every load below stays inside a group of `w` (masked to
    // its 8·b code bytes), an activation block pair, or the prepared lane arrays.
    unsafe {
        // The group's codes, its scale `d_w` and (asymmetric) its minimum `m_w` (f16 → f32 is
        // exact: the same values as the scalar path's).
        let group = |grp: *const u8| {
            let codes = codes_of(grp.add(hdr), b, load_mask, idx, ctl, cmask);
            let dw = _mm512_broadcastss_ps(half_at(grp));
            let mw = if ASYM {
                _mm_cvtss_f32(half_at(grp.add(2)))
            } else {
                0.0
            };
            (codes, dw, mw)
        };
        // One activation row (decode): eight (then four) weight rows at a time share each
        // group's activation loads, and their accumulators are independent chains. Each
        // row's float order is the one-row path's.
        let mut r = r0;
        if n == 1 {
            let args = (bits, w, row_bytes, ng, act, init, da, msum, y);
            let k = (idx, ctl, cmask);
            r = match b {
                2 => decode_rows::<ASYM, 2>(args, r, r1, k),
                4 => decode_rows::<ASYM, 4>(args, r, r1, k),
                8 => decode_rows::<ASYM, 8>(args, r, r1, k),
                _ => decode_rows::<ASYM, 0>(args, r, r1, k),
            };
        }
        let zero = _mm512_setzero_si512();
        let r0 = r;
        let mut t0 = 0;
        while t0 < n {
            // Four activation rows per pass over the weights: at eight the loop ran at ~60%
            // of its four-row rate per row (kbench, one thread, 2048 × 2048, 8 rows: `q4`
            // 1077 → 667–787 µs, `q8` 1125 → 702 µs); each row's order is the same.
            let nt = (n - t0).min(4);
            for r in r0..r1 {
                let row = w.as_ptr().add(r * row_bytes);
                let mut acc = [_mm512_setzero_ps(); 4];
                let mut m = [_mm_setzero_ps(); 4];
                for g in 0..ng {
                    let grp = row.add(g * gb);
                    _mm_prefetch::<_MM_HINT_T1>(grp.wrapping_add(6144).cast());
                    let (codes, dw, mw) = group(grp);
                    for (k, a) in acc.iter_mut().enumerate().take(nt) {
                        let t = t0 + k;
                        let pair = act.as_ptr().add((t * ng + g) * 2);
                        let av = _mm512_inserti64x4(
                            _mm512_castsi256_si512(_mm256_loadu_si256((*pair).qs.as_ptr().cast())),
                            _mm256_loadu_si256((*pair.add(1)).qs.as_ptr().cast()),
                            1,
                        );
                        let base = (t * ng + g) * 16;
                        let iv = _mm512_loadu_si512(init.as_ptr().add(base).cast());
                        let dav = _mm512_loadu_ps(da.as_ptr().add(base));
                        let lanes = _mm512_dpbusd_epi32(if ASYM { zero } else { iv }, codes, av);
                        let d = _mm512_mul_ps(dw, dav);
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), d, *a);
                        if ASYM {
                            m[k] = _mm_fmadd_ss(
                                _mm_set_ss(mw),
                                _mm_load_ss(msum.as_ptr().add(t * ng + g)),
                                m[k],
                            );
                        }
                    }
                }
                for (k, a) in acc.iter().enumerate().take(nt) {
                    let out = if ASYM {
                        hsum(*a) + _mm_cvtss_f32(m[k])
                    } else {
                        hsum(*a)
                    };
                    *y.add((t0 + k) * ystride + r) = out;
                }
            }
            t0 += nt;
        }
    }
}

/// The records for [`rows_records`]: per group of up to 8 activation rows (`8g..`), group
/// `j`'s rows side by side — row `8g + t`'s group `j` at `8g·ng + k·j + t` (`k` the rows of
/// that 8-row group) — each record the two activation blocks' 64 codes, the lane starts
/// (`init` of [`prepare`]; zeros for asymmetric codes, whose lanes sum `u·a` from 0) and the
/// lanes' scales (`da`), every field a plain 64-byte load.
///
/// Asymmetric codes also get their rows' `msum` in the records' order in `sums` (`sums[i]`
/// for record `i`), so a group's sums for all of an 8-row group's rows are one load.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn records(
    act: &[BlockQ8x32],
    ng: usize,
    init: &[i32],
    da: &[f32],
    msum: &[f32],
    asym: bool,
    out: &mut [super::gemv32::ActRec],
    sums: &mut [f32],
) {
    let n = act.len() / (2 * ng).max(1);
    for g0 in (0..n).step_by(8) {
        let k = (n - g0).min(8);
        // Group-major, as the records lie: the stores run through memory in order.
        for j in 0..ng {
            for t in 0..k {
                let i = (g0 + t) * ng + j;
                if asym {
                    sums[g0 * ng + j * k + t] = msum[i];
                }
                let o = &mut out[g0 * ng + j * k + t];
                o.av[..32].copy_from_slice(&act[2 * i].qs);
                o.av[32..].copy_from_slice(&act[2 * i + 1].qs);
                if asym {
                    o.iv = [0; 16];
                } else {
                    o.iv.copy_from_slice(&init[16 * i..16 * i + 16]);
                }
                // `gemv32::block_x2q`'s scales: an even row's record carries its two
                // blocks' scales and the next row's (0 past the group), `[d₀ₜ, d₀ₜ, d₀ₜ₊₁,
                // d₀ₜ₊₁]` in the low two 128-bit lanes and the same of `d₁` in the high two.
                if t % 2 == 0 {
                    let (d0, d1) = (da[16 * i], da[16 * i + 8]);
                    let (e0, e1) = if t + 1 < k {
                        (da[16 * (i + ng)], da[16 * (i + ng) + 8])
                    } else {
                        (0.0, 0.0)
                    };
                    for l in 0..4 {
                        let (x, y) = if l < 2 { (d0, e0) } else { (d1, e1) };
                        o.da[4 * l..4 * l + 4].copy_from_slice(&[x, x, y, y]);
                    }
                } else {
                    o.da.copy_from_slice(&da[16 * i..16 * i + 16]);
                }
            }
        }
    }
}

/// [`rows_avx512`] for several activation rows from [`records`]: a pair of weight rows at a
/// time, each group's codes unpacked once for up to 8 activation rows and each record loaded
/// once for both weight rows, the body `gemv32`'s assembly block (every accumulator in a
/// register) — per output the one-row path's `acc = fma(lanes, d_w·d_a, acc)` per group and
/// its fold, the same bits; asymmetric codes also the minimum's chain `m = fma(m_w, S, m)`
/// per group (`S` from [`records`]' `sums`, one lane per activation row) added after the
/// fold, as the one-row path adds it.
///
/// # Safety
/// As [`rows_scalar`], with `recs` and (asymmetric codes) `sums` from [`records`] (of the same
/// `ASYM`) for `n` activation rows; the CPU has AVX-512 F, BW, VL, VBMI and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_records<const ASYM: bool>(
    bits: u32,
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    recs: &[super::gemv32::ActRec],
    msum: &[f32],
    n: usize,
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let mut t0 = 0;
    while t0 < n {
        let k = (n - t0).min(8);
        let rc = &recs[t0 * ng..(t0 + k) * ng];
        let ms = if ASYM {
            &msum[t0 * ng..(t0 + k) * ng]
        } else {
            &[][..]
        };
        // SAFETY: forwarded, for activation rows t0..t0 + k.
        unsafe {
            let yt = y.add(t0 * ystride);
            macro_rules! go {
                ($($n:literal)*) => {
                    match k {
                        $($n => records_n::<$n, ASYM>(
                            bits, w, row_bytes, ng, rc, ms, yt, ystride, r0, r1,
                        ),)*
                        _ => unreachable!("1..=8 rows"),
                    }
                };
            }
            go!(1 2 3 4 5 6 7 8);
        }
        t0 += k;
    }
}

/// [`rows_records`] for one group of `N` activation rows.
///
/// # Safety
/// As [`rows_records`], `recs` the group's `N·ng` records, `msum` (asymmetric) their `N·ng`
/// sums in the records' order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn records_n<const N: usize, const ASYM: bool>(
    bits: u32,
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    recs: &[super::gemv32::ActRec],
    msum: &[f32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    use std::arch::x86_64::*;
    let b = bits as usize;
    let gb = group_bytes(bits, ASYM);
    let hdr = header(ASYM);
    let (idx, ctl, cmask, load_mask) = unpack_consts(b);
    // SAFETY: the caller's contract; every load stays inside a group of `w` (masked to its
    // 8·b code bytes) or the records.
    unsafe {
        let mut r = r0;
        while r < r1 {
            let (rb, pa, pb) = super::gemv32::row_pair(w, row_bytes, r, r1);
            let mut acc = [[_mm512_setzero_ps(); 2]; N];
            // The minimum's chains (asymmetric): per weight row, lane t for activation row t.
            let mut m = [_mm256_setzero_ps(); 2];
            let lanes = ((1u16 << N) - 1) as u8;
            for j in 0..ng {
                let (ga, gbp) = (pa.add(j * gb), pb.add(j * gb));
                _mm_prefetch::<_MM_HINT_T1>(ga.wrapping_add(6144).cast());
                _mm_prefetch::<_MM_HINT_T1>(gbp.wrapping_add(6144).cast());
                let c = [
                    codes_of(ga.add(hdr), b, load_mask, idx, ctl, cmask),
                    codes_of(gbp.add(hdr), b, load_mask, idx, ctl, cmask),
                ];
                // `[d_a, d_b, d_a, d_b]` in every 128-bit lane (`block_x2q`'s weight scales).
                let dw = _mm_unpacklo_ps(half_at(ga), half_at(gbp));
                let w4 = _mm512_broadcast_f32x4(_mm_movelh_ps(dw, dw));
                super::gemv32::block_x2q(recs.as_ptr().add(j * N), &c, w4, &mut acc);
                if ASYM {
                    let sv = _mm256_maskz_loadu_ps(lanes, msum.as_ptr().add(j * N));
                    m[0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(half_at(ga.add(2))), sv, m[0]);
                    m[1] = _mm256_fmadd_ps(_mm256_broadcastss_ps(half_at(gbp.add(2))), sv, m[1]);
                }
            }
            let mut ms = [[0f32; 8]; 2];
            if ASYM {
                _mm256_storeu_ps(ms[0].as_mut_ptr(), m[0]);
                _mm256_storeu_ps(ms[1].as_mut_ptr(), m[1]);
            }
            for (t, a) in acc.iter().enumerate() {
                // `hsum(lanes) + m`, as the one-row path (`m` is 0 for symmetric codes).
                let out = |k: usize| {
                    if ASYM {
                        hsum(a[k]) + ms[k][t]
                    } else {
                        hsum(a[k])
                    }
                };
                *y.add(t * ystride + r) = out(0);
                if rb != r {
                    *y.add(t * ystride + rb) = out(1);
                }
            }
            r += 2;
        }
    }
}

/// A group's 64 codes of `b` bits at `area` as bytes: each qword `j` of a register given the
/// `b` bytes of codes `8j..8j+8`, then `vpmultishiftqb` (byte `k` of each qword the 8 bits
/// from bit `b·k`) and the mask of `b` bits; 8-bit codes as loaded. 2- and 4-bit codes get
/// their qwords from a zero-extending load (words or dwords to qwords), every other width
/// from the `8·b` bytes loaded (masked) and `vpermb` (byte `8j + k` takes stream byte
/// `b·j + k`) — one instruction fewer, which at 2 and 4 bits a weight is measurable (kbench,
/// one thread, 2048×640 cache-resident: `q2` 86 → 93, `q4` 85 → 97 GFLOP/s).
///
/// # Safety
/// `area` is valid for reading the `load_mask` bytes; the CPU has AVX-512 BW and VBMI.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn codes_at<const K: usize>(
    area: *const u8,
    load_mask: u64,
    idx: std::arch::x86_64::__m512i,
    ctl: std::arch::x86_64::__m512i,
    cmask: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract (`8·b` code bytes, or those the mask keeps).
    unsafe {
        let q = match K {
            2 => _mm512_cvtepu16_epi64(_mm_loadu_si128(area.cast())),
            4 => _mm512_cvtepu32_epi64(_mm256_loadu_si256(area.cast())),
            8 => return _mm512_loadu_si512(area.cast()),
            _ => _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(load_mask, area.cast())),
        };
        _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, q), cmask)
    }
}

/// [`codes_at`] for a width known only at run time.
///
/// # Safety
/// As [`codes_at`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn codes_of(
    area: *const u8,
    b: usize,
    load_mask: u64,
    idx: std::arch::x86_64::__m512i,
    ctl: std::arch::x86_64::__m512i,
    cmask: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    // SAFETY: the caller's contract.
    unsafe {
        match b {
            2 => codes_at::<2>(area, load_mask, idx, ctl, cmask),
            4 => codes_at::<4>(area, load_mask, idx, ctl, cmask),
            8 => codes_at::<8>(area, load_mask, idx, ctl, cmask),
            _ => codes_at::<0>(area, load_mask, idx, ctl, cmask),
        }
    }
}

/// [`rows_avx512`]'s arguments a decode block shares: bits, weights, row bytes, groups,
/// activations, lane starts, activation scales, the minimum's activation factors, outputs.
#[cfg(target_arch = "x86_64")]
type BlockArgs<'a> = (
    u32,
    &'a [u8],
    usize,
    usize,
    &'a [BlockQ8x32],
    &'a [i32],
    &'a [f32],
    &'a [f32],
    *mut f32,
);

/// `dword [p]` broadcast to 16 lanes, times `a` (one `vmulps` with an embedded broadcast: the
/// broadcast costs a load, not a shuffle). The product is `_mm512_mul_ps`'s.
///
/// # Safety
/// `p` is valid for reading an `f32`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mul_bcast(a: std::arch::x86_64::__m512, p: *const f32) -> std::arch::x86_64::__m512 {
    let r: std::arch::x86_64::__m512;
    // SAFETY: the caller's contract; the asm reads 4 bytes at `p` and writes only `r`.
    unsafe {
        std::arch::asm!(
            "vmulps {r}, {a}, dword ptr [{p}]{{1to16}}",
            r = lateout(zmm_reg) r,
            a = in(zmm_reg) a,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    r
}

/// The f16 at byte `off` of each of `R` (≤ 8) rows' group, as f32 (exact), in lanes `..R`:
/// the halves gathered in two 64-bit words, one `vcvtph2ps` for all.
///
/// # Safety
/// Every `rows[j] + off` is valid for reading 2 bytes; the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn halves_of<const R: usize>(
    rows: &[*const u8; R],
    off: usize,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let (mut lo, mut hi) = (0u64, 0u64);
    for (j, row) in rows.iter().enumerate() {
        // SAFETY: the caller's contract.
        let h = unsafe { std::ptr::read_unaligned(row.add(off).cast::<u16>()) } as u64;
        if j < 4 {
            lo |= h << (16 * j);
        } else {
            hi |= h << (16 * (j - 4));
        }
    }
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// Rows from `r` of [`rows_avx512`]'s one-activation-row case in [`decode_block`]s of the
/// unpacking `K` ([`codes_at`]) for as long as whole blocks fit before `r1`; returns the
/// first row left.
///
/// # Safety
/// As [`decode_block`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
unsafe fn decode_rows<const ASYM: bool, const K: usize>(
    args: BlockArgs<'_>,
    mut r: usize,
    r1: usize,
    (idx, ctl, cmask): (
        std::arch::x86_64::__m512i,
        std::arch::x86_64::__m512i,
        std::arch::x86_64::__m512i,
    ),
) -> usize {
    // SAFETY: the caller's contract.
    unsafe {
        // 8-bit codes need no unpacking: four rows are as fast (kbench: 8 rows 90–93 GF/s
        // against 4 rows' 98); every narrower code gains from eight.
        while K != 8 && r + 8 <= r1 {
            decode_block::<8, ASYM, K>(args, r, idx, ctl, cmask);
            r += 8;
        }
        while r + 4 <= r1 {
            decode_block::<4, ASYM, K>(args, r, idx, ctl, cmask);
            r += 4;
        }
    }
    r
}

/// `R` weight rows from `r` against one activation row ([`rows_avx512`]'s decode blocks): per
/// group, the activation pair, lane starts and scales loaded once for the `R` rows, the rows'
/// scales (and minimums) converted together, and per row the codes unpacked
/// ([`codes_at`]), one `vpdpbusd`, one conversion, `d_w·d_a` (a multiply
/// with the scale broadcast from memory) and one FMA — the one-row path's operations.
///
/// # Safety
/// As [`rows_avx512`] with `n == 1`, and rows `r..r + R` are inside the call's range.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
unsafe fn decode_block<const R: usize, const ASYM: bool, const K: usize>(
    (bits, w, row_bytes, ng, act, init, da, msum, y): BlockArgs<'_>,
    r: usize,
    idx: std::arch::x86_64::__m512i,
    ctl: std::arch::x86_64::__m512i,
    cmask: std::arch::x86_64::__m512i,
) {
    use std::arch::x86_64::*;
    const { assert!(R == 4 || R == 8) };
    let b = bits as usize;
    let gb = group_bytes(bits, ASYM);
    let hdr = header(ASYM);
    let load_mask: u64 = if b == 8 { !0 } else { (1u64 << (8 * b)) - 1 };
    // SAFETY: the caller's contract; every load stays inside a group of the rows (masked to
    // its 8·b code bytes), an activation block pair, or the prepared lane arrays.
    unsafe {
        let rows: [*const u8; R] = std::array::from_fn(|j| w.as_ptr().add((r + j) * row_bytes));
        let mut acc = [_mm512_setzero_ps(); R];
        // The minimum's chains, one lane per row (asymmetric).
        let mut m = _mm256_setzero_ps();
        let mut dw = [0f32; 8];
        for g in 0..ng {
            let pair = act.as_ptr().add(g * 2);
            let av = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((*pair).qs.as_ptr().cast())),
                _mm256_loadu_si256((*pair.add(1)).qs.as_ptr().cast()),
                1,
            );
            let iv = _mm512_loadu_si512(init.as_ptr().add(g * 16).cast());
            let dav = _mm512_loadu_ps(da.as_ptr().add(g * 16));
            // Asymmetric: lanes start at 0.
            let start = if ASYM { _mm512_setzero_si512() } else { iv };
            // 8-bit codes: each row's scale converted on its own measured faster (kbench
            // 99 against 90 GF/s); narrower codes: all rows' at once (72 → 85 GF/s).
            if K != 8 && ASYM {
                // Asymmetric: each row's scale and minimum together (the group's first 4
                // bytes), split by `vpmovdw` — fewer instructions than two `halves_of`
                // (kbench, asymmetric q2 at 262,144×640, one thread: 83 → 87 GF/s); the
                // symmetric scale alone stays with `halves_of` (96 against 93 this way).
                let rd = |j: usize| std::ptr::read_unaligned(rows[j % R].add(g * gb).cast::<i32>());
                let words =
                    _mm256_setr_epi32(rd(0), rd(1), rd(2), rd(3), rd(4), rd(5), rd(6), rd(7));
                let dwv = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(words));
                _mm256_storeu_ps(dw.as_mut_ptr(), dwv);
                let s = _mm256_broadcast_ss(&*msum.as_ptr().add(g));
                let mwv = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(words)));
                m = _mm256_fmadd_ps(mwv, s, m);
            } else {
                if K != 8 {
                    _mm256_storeu_ps(dw.as_mut_ptr(), halves_of::<R>(&rows, g * gb));
                }
                if ASYM {
                    let s = _mm256_broadcast_ss(&*msum.as_ptr().add(g));
                    m = _mm256_fmadd_ps(halves_of::<R>(&rows, g * gb + 2), s, m);
                }
            }
            let mut step = |j: usize| {
                let grp = rows[j].add(g * gb);
                _mm_prefetch::<_MM_HINT_T1>(grp.wrapping_add(6144).cast());
                let codes = codes_at::<K>(grp.add(hdr), load_mask, idx, ctl, cmask);
                let lanes = _mm512_dpbusd_epi32(start, codes, av);
                let d = if K == 8 {
                    _mm512_mul_ps(_mm512_broadcastss_ps(half_at(grp)), dav)
                } else {
                    mul_bcast(dav, dw.as_ptr().add(j))
                };
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), d, acc[j]);
            };
            // Unrolled by hand (constant indices keep the accumulators in registers).
            step(0);
            step(1);
            step(2);
            step(3);
            if R == 8 {
                step(4);
                step(5);
                step(6);
                step(7);
            }
        }
        let mut ms = [0f32; 8];
        _mm256_storeu_ps(ms.as_mut_ptr(), m);
        for (j, a) in acc.iter().enumerate() {
            *y.add(r + j) = if ASYM { hsum(*a) + ms[j] } else { hsum(*a) };
        }
    }
}

/// [`rows_scalar`] on AVX2 + FMA (no VBMI, no VNNI needed), the same bits. Each group's codes
/// are unpacked once for up to 4 activation rows into 32 bytes per half, in element order:
/// 2- and 4-bit codes by shifts, masks and interleaves ([`unpack_group_avx2`]); 8-bit codes by
/// one load; other widths by a byte shuffle that brings each code's two bytes into a 16-bit
/// lane, a per-lane multiply and a shift that leave the code, and `packus` of the registers
/// holding elements (0..8 | 16..24) and (8..16 | 24..32) of the half. Then per half and activation row, as ggml's
/// Q8_0 dot does, `vpmaddubsw` (codes ≤ 127 against |a| ≤ 127: pair sums below 2^15, no
/// saturation) and `vpmaddwd` by ones give the 8 four-element lanes exactly, started at the
/// prepared `init`; 8-bit codes (up to 255) go in signed instead, `q = u − 128`, as
/// `vpmaddubsw(|q|, sign(a, q))`, which is `Σ q·a` itself (no start). Then the same
/// conversion, product and FMA per lane as the scalar path.
///
/// # Safety
/// As [`rows_scalar`], and the CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_avx2<const ASYM: bool>(
    bits: u32,
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    da: &[f32],
    msum: &[f32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    use std::arch::x86_64::*;
    let gb = group_bytes(bits, ASYM);
    let hdr = header(ASYM);
    let b = bits as usize;
    let n = act.len() / (2 * ng).max(1);
    // The 8 codes of a 128-bit lane take `b` bytes from a byte boundary (8·b bits), so every
    // lane shares one pattern: code i's two bytes (`⌊b·i/8⌋`, +1) into 16-bit lane i,
    // shifted left by a per-lane multiply so its field ends at bit 15, then right by 16 − b.
    let mut shuf = [0u8; 32];
    let mut mul = [0i16; 16];
    for i in 0..8 {
        let (k, sh) = ((b * i / 8) as u8, b * i % 8);
        for lane in 0..2 {
            shuf[16 * lane + 2 * i] = k;
            shuf[16 * lane + 2 * i + 1] = k + 1;
            mul[8 * lane + i] = (1u32 << (16 - sh - b)) as u16 as i16;
        }
    }
    // A group's loads read up to 16 − b bytes past its code area; the last groups of the
    // matrix go through this zero-padded copy instead.
    let mut tail = [0u8; 8 * 8 + 16];
    // SAFETY: the caller's contract; loads stay inside `w` (or `tail`), an activation block
    // or the prepared lane arrays.
    unsafe {
        let shuf = _mm256_loadu_si256(shuf.as_ptr().cast());
        let mul = _mm256_loadu_si256(mul.as_ptr().cast());
        let right = _mm_cvtsi32_si128(16 - bits as i32);
        let ones = _mm256_set1_epi16(1);
        let flip = _mm256_set1_epi8(-128);
        let low4 = _mm256_set1_epi8(0x0f);
        let mut t0 = 0;
        while t0 < n {
            // Up to four activation rows per pass, their count a constant of the pass: with a
            // run-time count (up to 8) the 16 accumulators lived on the stack, and even one
            // row ran at half the ggml-type Q8_0 rate (kbench, AVX2, 2048 × 2048: `q8` 32
            // GFLOP/s against Q8_0's 56).
            let nt = (n - t0).min(4);
            macro_rules! pass {
                ($nt:literal) => {
            for r in r0..r1 {
                let row = r * row_bytes;
                // Every group's over-read stays inside `w` unless this is one of the last rows.
                let safe = row + row_bytes + 16 <= w.len();
                let mut acc = [[_mm256_setzero_ps(); 2]; $nt];
                let mut m = [_mm_setzero_ps(); $nt];
                for g in 0..ng {
                    let grp = row + g * gb;
                    let gp = w.as_ptr().add(grp);
                    // Decode streams the weights once: ask for them ~6 KB ahead (as the
                    // one-row ggml-type kernels do).
                    _mm_prefetch::<_MM_HINT_T1>(gp.wrapping_add(6144).cast());
                    let dw = _mm256_broadcastss_ps(half_at(gp));
                    let mw = if ASYM {
                        _mm_cvtss_f32(half_at(gp.add(2)))
                    } else {
                        0.0
                    };
                    let area = if safe || grp + hdr + 7 * b + 16 <= w.len() {
                        gp.add(hdr)
                    } else {
                        tail[..8 * b].copy_from_slice(&w[grp + hdr..grp + hdr + 8 * b]);
                        tail.as_ptr()
                    };
                    // The 32 codes of each half, in order (u8).
                    let mut codes = [_mm256_setzero_si256(); 2];
                    if b == 2 || b == 4 {
                        codes = unpack_group_avx2(b, area, low4);
                    } else {
                        for (hf, c) in codes.iter_mut().enumerate() {
                            if b == 8 {
                                *c = _mm256_loadu_si256(area.add(32 * hf).cast());
                                continue;
                            }
                            let mut ab = [_mm256_setzero_si256(); 2];
                            for (j, v) in ab.iter_mut().enumerate() {
                                let at = 4 * b * hf + b * j;
                                let lo = _mm_loadu_si128(area.add(at).cast());
                                let hi = _mm_loadu_si128(area.add(at + 2 * b).cast());
                                let x = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), shuf);
                                *v = _mm256_srl_epi16(_mm256_mullo_epi16(x, mul), right);
                            }
                            *c = _mm256_packus_epi16(ab[0], ab[1]);
                        }
                    }
                    for (k, a) in acc.iter_mut().enumerate() {
                        let t = t0 + k;
                        let base = (t * ng + g) * 16;
                        for (hf, ah) in a.iter_mut().enumerate() {
                            let blk = &act[(t * ng + g) * 2 + hf];
                            let q = _mm256_loadu_si256(blk.qs.as_ptr().cast());
                            let iv = _mm256_loadu_si256(init.as_ptr().add(base + 8 * hf).cast());
                            let lanes = if b == 8 {
                                // Σ (u − 128)·a; asymmetric lanes want Σ u·a: + 128·Σ a.
                                let sq = _mm256_xor_si256(codes[hf], flip);
                                let p = _mm256_maddubs_epi16(
                                    _mm256_abs_epi8(sq),
                                    _mm256_sign_epi8(q, sq),
                                );
                                let l = _mm256_madd_epi16(p, ones);
                                if ASYM {
                                    _mm256_add_epi32(l, _mm256_slli_epi32(iv, 7))
                                } else {
                                    l
                                }
                            } else {
                                let p = _mm256_maddubs_epi16(codes[hf], q);
                                let l = _mm256_madd_epi16(p, ones);
                                if ASYM { l } else { _mm256_add_epi32(l, iv) }
                            };
                            let dav = _mm256_loadu_ps(da.as_ptr().add(base + 8 * hf));
                            let d = _mm256_mul_ps(dw, dav);
                            *ah = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), d, *ah);
                        }
                        if ASYM {
                            m[k] = _mm_fmadd_ss(
                                _mm_set_ss(mw),
                                _mm_load_ss(msum.as_ptr().add(t * ng + g)),
                                m[k],
                            );
                        }
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    let v = _mm256_add_ps(a[0], a[1]);
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
                    let s = if ASYM { _mm_add_ss(s, m[k]) } else { s };
                    *y.add((t0 + k) * ystride + r) = _mm_cvtss_f32(s);
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
}

/// A 2- or 4-bit group's 64 codes (the LSB-first stream at `area`: 16 or 32 bytes) as two
/// registers of 32 bytes, elements 0..32 and 32..64 in order, by shifts, masks and
/// interleaves (no multiply). 2 bits: byte `j` holds codes `4j..4j+4`; the stream is read
/// into both 128-bit halves, shifted per 64-bit lane by 0/4 and 2/6 and masked, giving the
/// codes `4j + k` of every `j` for `k` = 0, 2 (one register) and 1, 3 (the other); two byte
/// and two word interleaves put `4j..4j+4` next to each other. 4 bits: byte `j` holds codes
/// `2j` (low nibble) and `2j + 1`; one byte interleave of the masked nibbles. Each leaves the
/// halves' 128-bit lanes crossed, which one lane permute per output sorts.
///
/// # Safety
/// The CPU has AVX2; `area` can be read for 16 (2 bits) or 32 (4 bits) bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn unpack_group_avx2(
    b: usize,
    area: *const u8,
    low4: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let (e1, e2) = if b == 2 {
            let three = _mm256_set1_epi8(3);
            let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(area.cast()));
            // [codes 4j | codes 4j+2] and [4j+1 | 4j+3], j = 0..16.
            let ta = _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0)), three);
            let tb = _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(6, 6, 2, 2)), three);
            // [(4j, 4j+1) j = 0..8 | (4j+2, 4j+3) j = 0..8], and j = 8..16.
            let l = _mm256_unpacklo_epi8(ta, tb);
            let h = _mm256_unpackhi_epi8(ta, tb);
            // [(4j, 4j+1) j = 0..8 | j = 8..16], and the (4j+2, 4j+3) pairs likewise.
            let p01 = _mm256_permute2x128_si256::<0x20>(l, h);
            let p23 = _mm256_permute2x128_si256::<0x31>(l, h);
            // [elements 0..16 | 32..48], [16..32 | 48..64].
            (
                _mm256_unpacklo_epi16(p01, p23),
                _mm256_unpackhi_epi16(p01, p23),
            )
        } else {
            let y = _mm256_loadu_si256(area.cast());
            let lo = _mm256_and_si256(y, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(y), low4);
            // [elements 0..16 | 32..48], [16..32 | 48..64].
            (_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi))
        };
        [
            _mm256_permute2x128_si256::<0x20>(e1, e2),
            _mm256_permute2x128_si256::<0x31>(e1, e2),
        ]
    }
}

/// [`rows_scalar`] on aarch64 NEON, the same bits (compiled in CI, not run on this
/// project's x86 machines; `tests/codecs.rs` checks it against the scalar path wherever it
/// runs). Each group's codes are unpacked once for up to 8 activation rows (4 bits: nibble
/// masks and a zip; 8 bits: a load; other widths: the scalar unpack) and entered signed,
/// `q = u − 2^(b−1)`, so each lane is `Σ q·a` itself: `vmull_s8` products (|q| ≤ 128, |a| ≤
/// 127: no i16 overflow), `vpaddlq_s16` pair sums, `vpaddq_s32` into the four-element lanes.
/// Then per lane `fma(float(lane), d_w·d_a, acc)` and the scalar path's fold.
///
/// # Safety
/// As [`rows_scalar`], and the CPU has NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_neon<const ASYM: bool>(
    bits: u32,
    w: &[u8],
    row_bytes: usize,
    ng: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    da: &[f32],
    msum: &[f32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    use std::arch::aarch64::*;
    let gb = group_bytes(bits, ASYM);
    let hdr = header(ASYM);
    let b = bits as usize;
    let n = act.len() / (2 * ng).max(1);
    let mut codes = [0u8; GROUP];
    // SAFETY: the caller's contract; loads stay inside `w`, `codes`, an activation block or
    // the prepared scale array.
    unsafe {
        let bias = vdupq_n_u8(1u8 << (bits - 1));
        let mut t0 = 0;
        while t0 < n {
            let nt = (n - t0).min(8);
            for r in r0..r1 {
                let row = &w[r * row_bytes..(r + 1) * row_bytes];
                let mut acc = [[vdupq_n_f32(0.0); 4]; 8];
                let mut m = [0f32; 8];
                for g in 0..ng {
                    let grp = &row[g * gb..(g + 1) * gb];
                    let dw = f16::from_le_bytes([grp[0], grp[1]]).to_f32();
                    let mw = f16::from_le_bytes([grp[2], grp[3]]).to_f32();
                    let area = &grp[hdr..];
                    // The 64 codes as signed bytes, in element order (4 × 16).
                    let mut q = [vdupq_n_s8(0); 4];
                    match b {
                        8 => {
                            for (j, v) in q.iter_mut().enumerate() {
                                let u = vld1q_u8(area.as_ptr().add(16 * j));
                                *v = vreinterpretq_s8_u8(vsubq_u8(u, bias));
                            }
                        }
                        4 => {
                            for h in 0..2 {
                                let x = vld1q_u8(area.as_ptr().add(16 * h));
                                let lo = vandq_u8(x, vdupq_n_u8(15));
                                let hi = vshrq_n_u8(x, 4);
                                q[2 * h] = vreinterpretq_s8_u8(vsubq_u8(vzip1q_u8(lo, hi), bias));
                                q[2 * h + 1] =
                                    vreinterpretq_s8_u8(vsubq_u8(vzip2q_u8(lo, hi), bias));
                            }
                        }
                        _ => {
                            unpack(bits, area, &mut codes);
                            for (j, v) in q.iter_mut().enumerate() {
                                let u = vld1q_u8(codes.as_ptr().add(16 * j));
                                *v = vreinterpretq_s8_u8(vsubq_u8(u, bias));
                            }
                        }
                    }
                    for (k, a) in acc.iter_mut().enumerate().take(nt) {
                        let t = t0 + k;
                        let base = (t * ng + g) * 16;
                        for (j, aj) in a.iter_mut().enumerate() {
                            // Elements 16j..16j+16: half j / 2 of the group, bytes 16·(j % 2)..
                            let blk = &act[(t * ng + g) * 2 + j / 2];
                            let x = vld1q_s8(blk.qs.as_ptr().add(16 * (j % 2)).cast());
                            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(q[j]), vget_low_s8(x)));
                            let hi = vpaddlq_s16(vmull_high_s8(q[j], x));
                            let lanes = vpaddq_s32(lo, hi);
                            let dav = vld1q_f32(da.as_ptr().add(base + 4 * j));
                            let d = vmulq_f32(vdupq_n_f32(dw), dav);
                            if ASYM {
                                // Σ (u − 2^(b−1))·a + 2^(b−1)·Σ a = Σ u·a.
                                let s = vld1q_s32(init.as_ptr().add(base + 4 * j));
                                let l = vaddq_s32(lanes, vshlq_s32(s, vdupq_n_s32(b as i32 - 1)));
                                *aj = vfmaq_f32(*aj, vcvtq_f32_s32(l), d);
                            } else {
                                *aj = vfmaq_f32(*aj, vcvtq_f32_s32(lanes), d);
                            }
                        }
                        if ASYM {
                            m[k] = mw.mul_add(msum[t * ng + g], m[k]);
                        }
                    }
                }
                for (k, a) in acc.iter().enumerate().take(nt) {
                    // v[l] = acc[l] + acc[l + 8], then ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
                    let v_lo = vaddq_f32(a[0], a[2]);
                    let v_hi = vaddq_f32(a[1], a[3]);
                    let s = vaddq_f32(v_lo, v_hi);
                    let out = (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2))
                        + (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
                    let out = if ASYM { out + m[k] } else { out };
                    *y.add((t0 + k) * ystride + r) = out;
                }
            }
            t0 += nt;
        }
    }
}

/// Whether this CPU runs [`rows_avx512`].
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    })
}
