//! One activation row against a 32-block matrix (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL) on
//! AVX-512 VNNI: two weight rows per 512-bit register, one in each 256-bit half.
//!
//! The float order is ggml's `vec_dot` for these types, per row: 8 i32 lanes per block (4
//! consecutive products each), `acc = fma(d_w·d_a, lane, acc)`, `hsum_float_8` at the end —
//! the same bits as the per-row kernels; for Q4_1/Q5_1 (unsigned codes, ggml's `_q8_1` dots)
//! also the per-row `Σ m·s`, each product rounded then added in block order, added to the
//! lane sum last. What changes is the instruction count: every
//! `vpdpbusd`, conversion and FMA serves two rows, the activation block is broadcast to both
//! halves, and the weight codes enter biased (unsigned, as `vpdpbusd` wants), the bias times
//! each lane's activation sum being the lane's starting value (exact integers). Decode of the
//! small per-layer matrices was compute-bound on the per-block instruction count (Q5_0
//! streamed at ~0.65× the rate of the bandwidth-bound LM head).
//!
//! One to three activation rows (decode of one to three sessions) run [`rows_few`]: two
//! weight-row pairs a pass, and each pair's scales from two 32-bit loads, one conversion and
//! one multiply by the activation block's `[d, s, d, s]` (kbench, one thread, Q4_1 1536 × 576
//! one row 32.0 → 25.4 µs, Q8_0 25.1 → 21.6, Q5_0 31.3 → 27.7, Q4_0 28.6 → 24.9).
//!
//! IQ4_NL (values looked up, + 128) has two orders: `vec_dot`'s for one-row calls (even and
//! odd blocks in separate accumulators added before the horizontal sum, an odd last block's
//! integer sum added after it as `fma(d_a·d_w, Σ, sum)`), and llamafile tinyBLAS's one
//! accumulator from two rows, which is the other types' order.

use std::arch::x86_64::*;

use crate::act::BlockQ8x32;
use synapse_formats::GgmlType;

/// Whether a call of `n` activation rows of `cols` elements takes this kernel (in groups of up
/// to 8 rows) rather than the tiled GEMM; both sum in ggml's per-row order, so the bits are the
/// same. Below 16 rows always; up to 31 while the activations stay small (`n·cols` ≤ 20,480
/// bytes of codes, re-read for every weight-row pair). Measured (kbench, 2 threads, median µs):
/// the 262,144 × 640 Q8_0 LM head 16 rows 32.5 → 27.7 ms, 24 rows 46 → 41.6 ms; Q8_0 1024 × 640
/// 162 → 126 µs at 16 rows; but Q5_0 640 × 2048 219 → 261 µs at 16 rows (its 64-block rows
/// outgrow L1), hence the size bound.
pub(crate) fn takes(n: usize, cols: usize) -> bool {
    n < super::tiled::G || (n < 32 && n * cols <= 20_480)
}

/// The types this kernel handles: the 32-block types of the tiled GEMM.
pub(crate) fn supports(ty: GgmlType) -> bool {
    super::tiled::supports32(ty)
}

/// One activation block as [`block_x2q`] reads it, every field a plain 64-byte load: its
/// codes in both 256-bit halves, its lanes' starting values ([`prepare`]) twice and its
/// scales (see `da`). A broadcast from memory costs this Zen 4 a third of the
/// multiply slot that `vpdpbusd`, `vmulps` and FMA share (a micro-benchmark: 0.36 against
/// 0.27 ns per `vpdpbusd`), a plain load nothing; a 512-bit load takes both load ports for a
/// cycle, so each field is loaded once per activation row and block.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ActRec {
    /// The block's codes, twice (the codecs' records: their group's two blocks).
    pub(crate) av: [i8; 64],
    /// The lanes' starting values, twice.
    pub(crate) iv: [i32; 16],
    /// An even row `t`'s record: its scale and row `t + 1`'s as [`block_x2q`] multiplies
    /// them — [`prepare`]: `[d_t, d_t, d_{t+1}, d_{t+1}]` in every 128-bit lane; the codecs'
    /// records: the same of the group's first block in the low two lanes, of its second
    /// block in the high two. An odd row's: its scale(s), unused.
    pub(crate) da: [f32; 16],
}

/// Weight-row pairs a one-activation-row pass of [`rows_few`] reads.
const FEW_P: usize = 2;

/// Activation rows per pass over the weights (one accumulator pair each).
const GROUP: usize = 8;

/// What [`prepare`] writes for `n` activation rows of `nb` blocks: (records, `s` values, lane
/// starts).
pub(crate) fn prepared_len(n: usize, nb: usize) -> (usize, usize, usize) {
    let r = recorded_rows(n);
    (r * nb, r.div_ceil(GROUP) * GROUP * nb, 8 * n * nb)
}

/// Fewest activation rows of a group that the assembly kernel ([`block_x2q`]) runs.
const ASM_ROWS: usize = 4;

/// The activation rows of `n` that get [`ActRec`]s: every group of at least [`ASM_ROWS`] (the
/// groups of [`GROUP`] first, then the rest).
fn recorded_rows(n: usize) -> usize {
    if n % GROUP >= ASM_ROWS {
        n
    } else {
        n / GROUP * GROUP
    }
}

/// Each block's 8 lane starting values `−128·Σ(4 codes)` (`init`, row `t`'s block `b` at
/// `8·(t·nb + b)`), which take off the weight codes' + 128 (`Σ(c + 128)·a = Σc·a + 128·Σa`,
/// exact integers), and the blocks of every group of at least [`ASM_ROWS`] rows as
/// [`ActRec`]s (`rec`), block-major inside a group: row `g0 + t` of the group of `k` rows from
/// `g0` has block `b` at record `g0·nb + k·b + t` (a block's records side by side, at constant
/// offsets from one pointer), and those groups' `s` (ggml's `block_q8_1::s`, for Q4_1 and
/// Q5_1) eight to a block: group `g0`'s row `t`, block `b` at `sv[g0·nb + 8b + t]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI (the plans that take this kernel run there); the
/// slices as [`prepared_len`] says.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn prepare(
    act: &[BlockQ8x32],
    nb: usize,
    rec: &mut [ActRec],
    sv: &mut [f32],
    init: &mut [i32],
) {
    let n = act.len() / nb.max(1);
    // `vpdpbusd` of the bytes 128 (unsigned) and the codes: 128·Σ(4 codes) per lane, exact.
    let bias = _mm256_set1_epi8(-128);
    for (a, o) in act.iter().zip(init.chunks_exact_mut(8)) {
        // SAFETY: 32 codes in; 8 lanes out.
        unsafe {
            let q = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, q);
            _mm256_storeu_si256(
                o.as_mut_ptr().cast(),
                _mm256_sub_epi32(_mm256_setzero_si256(), s),
            );
        }
    }
    let nr = recorded_rows(n);
    for g0 in (0..nr).step_by(GROUP) {
        let k = (nr - g0).min(GROUP);
        // Block-major, as the records lie: the stores run through memory in order.
        for b in 0..nb {
            for t in 0..k {
                let i = (g0 + t) * nb + b;
                let o = &mut rec[g0 * nb + b * k + t];
                // An even row's record carries its scale and the next row's (0 past the
                // group) as `[d_t, d_t, d_t+1, d_t+1]` in every 128-bit lane: one multiply
                // by `spread_w4` gives both rows' `d_w·d_a` for both weight-row pairs
                // (`block_x2q`).
                let d0 = act[i].d;
                let d1 = match t % 2 {
                    0 if t + 1 < k => act[i + nb].d,
                    0 => 0.0,
                    _ => d0,
                };
                // SAFETY: the record is 64-byte aligned; 32 codes and 8 lane starts in.
                unsafe {
                    let q = _mm256_loadu_si256(act[i].qs.as_ptr().cast());
                    _mm512_store_si512(o.av.as_mut_ptr().cast(), _mm512_broadcast_i64x4(q));
                    let iv = _mm256_loadu_si256(init.as_ptr().add(8 * i).cast());
                    _mm512_store_si512(o.iv.as_mut_ptr().cast(), _mm512_broadcast_i64x4(iv));
                    let da = _mm512_broadcast_f32x4(_mm_set_ps(d1, d1, d0, d0));
                    _mm512_store_ps(o.da.as_mut_ptr(), da);
                }
                sv[g0 * nb + 8 * b + t] = act[i].s;
            }
        }
    }
}

/// [`prepare`] in plain code: the reference its test compares with.
#[cfg(test)]
fn prepare_scalar(
    act: &[BlockQ8x32],
    nb: usize,
    rec: &mut [ActRec],
    sv: &mut [f32],
    init: &mut [i32],
) {
    let n = act.len() / nb.max(1);
    for (a, o) in act.iter().zip(init.chunks_exact_mut(8)) {
        for (j, v) in o.iter_mut().enumerate() {
            *v = -128
                * a.qs[4 * j..4 * j + 4]
                    .iter()
                    .map(|&q| q as i32)
                    .sum::<i32>();
        }
    }
    let nr = recorded_rows(n);
    for g0 in (0..nr).step_by(GROUP) {
        let k = (nr - g0).min(GROUP);
        for t in 0..k {
            for b in 0..nb {
                let i = (g0 + t) * nb + b;
                let o = &mut rec[g0 * nb + b * k + t];
                o.av[..32].copy_from_slice(&act[i].qs);
                o.av[32..].copy_from_slice(&act[i].qs);
                o.iv[..8].copy_from_slice(&init[8 * i..8 * i + 8]);
                o.iv[8..].copy_from_slice(&init[8 * i..8 * i + 8]);
                // An even row's record carries its scale and the next row's (0 past the
                // group) as `[d_t, d_t, d_t+1, d_t+1]` in every 128-bit lane: one multiply
                // by `spread_w4` gives both rows' `d_w·d_a` for both weight-row pairs
                // (`block_x2q`).
                o.da = if t % 2 == 0 {
                    let d1 = if t + 1 < k { act[i + nb].d } else { 0.0 };
                    let d0 = act[i].d;
                    [
                        d0, d0, d1, d1, d0, d0, d1, d1, d0, d0, d1, d1, d0, d0, d1, d1,
                    ]
                } else {
                    [act[i].d; 16]
                };
                sv[g0 * nb + 8 * b + t] = act[i].s;
            }
        }
    }
}

/// Bytes ahead of the current block to prefetch (each row is streamed once). Measured on the
/// 178 MB Q8_0 LM head against a plain streaming read of the same bytes right after each call
/// (`kbench_ggml --stream-ns 1`): 1536 B ahead reached 0.70–0.73 of it, 3–12 KB 0.84–0.87,
/// and 6 KB into L2 (`T1`, not `T0`) 0.88–0.89.
const PREFETCH: usize = 6144;

/// How far ahead the pair-per-register GEMVs (here and `gemvk`) prefetch: [`PREFETCH`], and at
/// least the next pair's rows — a pair reads rows r and r + 1 side by side, so a distance
/// shorter than two rows would only touch data already streaming.
pub(crate) fn prefetch_dist(row_bytes: usize) -> usize {
    PREFETCH.max(2 * row_bytes)
}

/// The pair of weight rows starting at `r` (of `r0..r1`): `(rb, row r, row rb)`, `rb = r` for
/// an odd last row (both halves then compute it; the kernels store it once).
#[inline]
pub(crate) fn row_pair(
    w: &[u8],
    row_bytes: usize,
    r: usize,
    r1: usize,
) -> (usize, *const u8, *const u8) {
    let rb = if r + 1 < r1 { r + 1 } else { r };
    (
        rb,
        w[r * row_bytes..].as_ptr(),
        w[rb * row_bytes..].as_ptr(),
    )
}

/// `P` weight-row pairs from `r` (of `r0..r1`), each `(row a, row b, a's bytes, b's bytes)`
/// ([`row_pair`]; the last pair of the range may be one row twice), how many there are, and
/// the row after them. Fewer rows left than `P` pairs: the last pair fills the rest again
/// (computed twice, its results stored once).
type Pair = (usize, usize, *const u8, *const u8);
#[inline]
fn pairs<const P: usize>(
    w: &[u8],
    row_bytes: usize,
    r: usize,
    r1: usize,
) -> ([Pair; P], usize, usize) {
    let mut pr = [(
        0usize,
        0usize,
        std::ptr::null::<u8>(),
        std::ptr::null::<u8>(),
    ); P];
    let mut np = 0;
    let mut rr = r;
    while np < P && rr < r1 {
        let (rb, pa, pb) = row_pair(w, row_bytes, rr, r1);
        pr[np] = (rr, rb, pa, pb);
        np += 1;
        rr += 2;
    }
    for k in np..P {
        pr[k] = pr[np - 1];
    }
    (pr, np, rr)
}

/// Two blocks' codes (rows `a` and `b`) as unsigned bytes, each weight's integer value + 128
/// (Q4_1 and Q5_1: their unsigned code + 128), block `a` in the low half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn codes<const T: u8>(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY (all arms): `a` and `b` point at whole blocks of the type.
    unsafe {
        match T {
            Q8 => {
                let lo = _mm256_loadu_si256(a.add(2).cast());
                let hi = _mm256_loadu_si256(b.add(2).cast());
                _mm512_xor_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                    _mm512_set1_epi8(-128),
                )
            }
            _ => {
                let qs = match T {
                    Q5 => 6,
                    Q41 => 4,
                    Q51 => 8,
                    _ => 2,
                };
                let t = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128(a.add(qs).cast())),
                    _mm_loadu_si128(b.add(qs).cast()),
                    1,
                );
                // [qs_a, qs_a, qs_b, qs_b] in 128-bit lanes, the odd ones shifted by 4: low
                // nibbles are elements 0..16 of a block, high nibbles 16..32.
                let z = _mm512_castsi256_si512(t);
                let z = _mm512_shuffle_i64x2(z, z, 0b0101_0000);
                let sh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
                let nib = _mm512_and_si512(_mm512_srlv_epi64(z, sh), _mm512_set1_epi8(15));
                // Each type's value + 128 for a nibble (before the fifth bit).
                let base: u8 = match T {
                    IQ => {
                        // IQ4_NL: the nibbles looked up in `kvalues_iq4nl + 128`.
                        let t = _mm512_broadcast_i32x4(_mm_loadu_si128(
                            super::decode::KVALUES_IQ4NL_BIASED.as_ptr().cast(),
                        ));
                        return _mm512_shuffle_epi8(t, nib);
                    }
                    Q5 => 112,
                    Q41 | Q51 => 128,
                    _ => 120,
                };
                let v = _mm512_add_epi8(nib, _mm512_set1_epi8(base as i8));
                if T == Q5 || T == Q51 {
                    let qh = if T == Q5 { 2 } else { 4 };
                    let qa = std::ptr::read_unaligned(a.add(qh).cast::<u32>()) as u64;
                    let qb = std::ptr::read_unaligned(b.add(qh).cast::<u32>()) as u64;
                    _mm512_mask_add_epi8(v, qa | (qb << 32), v, _mm512_set1_epi8(16))
                } else {
                    v
                }
            }
        }
    }
}

/// The block types' tags of the const-generic kernel bodies (here and in `gemv32_avx2`).
pub(crate) const Q8: u8 = 0;
pub(crate) const Q5: u8 = 1;
pub(crate) const Q4: u8 = 2;
pub(crate) const Q41: u8 = 3;
pub(crate) const Q51: u8 = 4;
const IQ: u8 = 5;

/// Both rows' block scales `[d_a, d_b]` in lanes 0 and 1 (one `vcvtph2ps`; AVX2-level
/// instructions only, so the AVX2 kernels share it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dpair(a: *const u8, b: *const u8) -> __m128 {
    // SAFETY: both point at a block's f16 scale.
    unsafe {
        let bits = std::ptr::read_unaligned(a.cast::<u16>()) as u32
            | (std::ptr::read_unaligned(b.cast::<u16>()) as u32) << 16;
        let x: __m128;
        // `vmovd` in asm (see the x86 kernels' `f16`): no false dependency on an accumulator.
        std::arch::asm!(
            "vmovd {x}, {b:e}",
            "vcvtph2ps {x}, {x}",
            b = in(reg) bits,
            x = out(xmm_reg) x,
            options(pure, nomem, nostack),
        );
        x
    }
}

/// `d_w·d_a` of both rows as one register: row `a` in the low 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn spread(dw: __m128, da: f32) -> __m512 {
    let d = _mm_mul_ps(dw, _mm_set1_ps(da));
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d))
}

/// `hsum_float_8`: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// `hsum_float_8` of each half of a paired register: (row `a`, row `b`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn halves(v: __m512) -> (f32, f32) {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    (hsum8(_mm512_castps512_ps256(v)), hsum8(hi))
}

/// Both rows' scales spread to their halves: `[d_a ×8, d_b ×8]` (one permute per block,
/// shared by every activation row: `d_w·d_a` is then one multiply per row, the same product
/// as [`spread`]'s).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn spread_w(dw: __m128) -> __m512 {
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(dw))
}

/// Two weight-row pairs' block scales (`d0 = [d_a0, d_b0, ..]`, `d1 = [d_a1, d_b1, ..]`) as
/// [`block_x2q`] multiplies them: `[d_a0, d_a1, d_a0, d_a1]` in the two low 128-bit lanes,
/// `[d_b0, d_b1, d_b0, d_b1]` in the two high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn spread_w4(d0: __m128, d1: __m128) -> __m512 {
    // [d_a0, d_a1, d_b0, d_b1]
    let x = _mm_unpacklo_ps(d0, d1);
    let idx = _mm512_set_epi32(3, 2, 3, 2, 3, 2, 3, 2, 1, 0, 1, 0, 1, 0, 1, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(x))
}

/// One block of `N` (1..=8) activation rows (records at `p`, consecutive) against two
/// weight-register operands `c` (here two weight-row pairs, one row per 256-bit half; the
/// codecs: two weight rows, a group's two blocks per half): `acc[t][k] = fma(d_w·d_a,
/// cvt(dpbusd(iv_t, c[k], av_t)), acc[t][k])`, each activation row's body in assembly
/// (LLVM spilled accumulators and hoisted the loads of the intrinsics loop). For each two
/// activation rows `t`, `t + 1` one multiply of the weight scales `w4` ([`spread_w4`];
/// the codecs: `[d_a, d_b, d_a, d_b]` everywhere) by record `t`'s scales (see
/// [`ActRec::da`]) gives `q`, whose 128-bit lanes hold every `d_w·d_a` of both rows; each
/// FMA's scale is then one in-lane `vpermilps` of `q` by an immediate — the same products,
/// so the same bits, as a multiply per activation row and operand, which took the multiply
/// slot `vpdpbusd` and FMA also need (kbench, 2048 × 640 Q8_0, 8 rows, one thread: 156–160
/// → 143–148 µs).
///
/// # Safety
/// `p` points at `N` consecutive [`ActRec`]s ([`prepare`]'s); the CPU has AVX-512 F and VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn block_x2q<const N: usize, const P: usize>(
    p: *const ActRec,
    c: &[__m512i; P],
    w4: __m512,
    acc: &mut [[__m512; P]; N],
) {
    // The assembly reads the fields at fixed offsets.
    const _: () = assert!(std::mem::size_of::<ActRec>() == 192);
    debug_assert!(P == 2);
    let mut q = _mm512_setzero_ps();
    for (t, at) in acc.iter_mut().enumerate() {
        // SAFETY: record t is readable (caller); its scales at +128.
        unsafe {
            if t % 2 == 0 {
                q = _mm512_mul_ps(w4, _mm512_load_ps((*p.add(t)).da.as_ptr()));
            }
        }
        let (_l0, _l1, _p0, _p1, _av): (__m512i, __m512i, __m512, __m512, __m512i);
        // SAFETY: record t is readable (caller); registers otherwise. Its fields: codes at
        // +0, lane starts at +64. Row t's products sit at elements 2·(t % 2) (pair 0) and
        // 2·(t % 2) + 1 (pair 1) of every 128-bit lane of `q`.
        unsafe {
            macro_rules! body {
                ($s0:literal, $s1:literal) => {
                    std::arch::asm!(
                        "vmovdqa64 {av}, zmmword ptr [{p}]",
                        "vmovdqa64 {l0}, zmmword ptr [{p} + 64]",
                        "vmovdqa64 {l1}, {l0}",
                        "vpdpbusd {l0}, {c0}, {av}",
                        "vpdpbusd {l1}, {c1}, {av}",
                        concat!("vpermilps {p0}, {q}, ", $s0),
                        concat!("vpermilps {p1}, {q}, ", $s1),
                        "vcvtdq2ps {l0}, {l0}",
                        "vcvtdq2ps {l1}, {l1}",
                        "vfmadd231ps {a0}, {p0}, {l0}",
                        "vfmadd231ps {a1}, {p1}, {l1}",
                        p = in(reg) p.add(t),
                        c0 = in(zmm_reg) c[0],
                        c1 = in(zmm_reg) c[1],
                        q = in(zmm_reg) q,
                        a0 = inout(zmm_reg) at[0],
                        a1 = inout(zmm_reg) at[1],
                        l0 = out(zmm_reg) _l0,
                        l1 = out(zmm_reg) _l1,
                        p0 = out(zmm_reg) _p0,
                        p1 = out(zmm_reg) _p1,
                        av = out(zmm_reg) _av,
                        options(nostack, preserves_flags, readonly),
                    )
                };
            }
            if t % 2 == 0 {
                body!("0x00", "0x55");
            } else {
                body!("0xaa", "0xff");
            }
        }
    }
}

/// `N` activation rows (`act`/`init` row `t` at `t·nb` blocks; `rec` ([`prepare`]) only
/// for the assembly kernel, block `b` of row `t` at `N·b + t`) against weight rows
/// `r0..r1`, `P` pairs of weight rows (2·P rows) at a time: each pair's codes are unpacked
/// once for all `N` activation rows, and each activation block is loaded once for all `P`
/// pairs. Two uses: four to eight rows through the assembly body ([`block_x2q`]), and
/// IQ4_NL's one-row order (`SPLIT`) at any row count; one to three rows of every other call
/// run [`rows_few`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_impl<const T: u8, const N: usize, const P: usize, const SPLIT: bool>(
    ts: usize,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    rec: &[ActRec],
    sv: &[f32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    // Either the assembly body (from four rows, two pairs a pass) or IQ4_NL's one-row order
    // (its own accumulators; no minimums). One to three rows otherwise run `rows_few`.
    const { assert!(SPLIT || (N >= ASM_ROWS && P == 2)) };
    const { assert!(!SPLIT || T == IQ) };
    let dist = prefetch_dist(row_bytes);
    let mins = T == Q41 || T == Q51;
    let asm = !SPLIT;
    let mut r = r0;
    while r < r1 {
        let (pr, np, rr) = pairs::<P>(w, row_bytes, r, r1);
        // SAFETY: every pair's rows are < rows; N rows of nb blocks of activations and lane
        // starts (caller); the outputs t·ystride + row are this call's.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); P]; N];
            // SPLIT (IQ4_NL's one-row order): odd blocks into their own accumulators, and
            // an odd last block's lanes summed as integers (rows a and b of pair k), with
            // its `d_w` pair, to add after the horizontal sum.
            let mut acc_odd = [[_mm512_setzero_ps(); P]; N];
            let mut tail = [[(0i32, 0i32); P]; N];
            let mut tail_dw = [_mm_setzero_ps(); P];
            for b in 0..nb {
                let last_odd = SPLIT && nb % 2 == 1 && b == nb - 1;
                let mut c = [_mm512_setzero_si512(); P];
                let mut dw = [_mm512_setzero_ps(); P];
                let mut dp = [_mm_setzero_ps(); P];
                for k in 0..P {
                    let (_, _, pa, pb) = pr[k];
                    let (wa, wb) = (pa.add(b * ts), pb.add(b * ts));
                    _mm_prefetch::<_MM_HINT_T1>(wa.wrapping_add(dist).cast());
                    _mm_prefetch::<_MM_HINT_T1>(wb.wrapping_add(dist).cast());
                    c[k] = codes::<T>(wa, wb);
                    if last_odd {
                        tail_dw[k] = dpair(wa, wb);
                    }
                    if asm {
                        dp[k] = dpair(wa, wb);
                    } else {
                        dw[k] = spread_w(dpair(wa, wb));
                    }
                }
                if asm {
                    // The body below in assembly over the records (the minimums' terms
                    // after the blocks).
                    let w4 = spread_w4(dp[0], dp[P - 1]);
                    block_x2q(rec.as_ptr().add(b * N), &c, w4, &mut acc);
                    continue;
                }
                for (t, at) in acc.iter_mut().enumerate() {
                    let ab = act.get_unchecked(t * nb + b);
                    let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.qs.as_ptr().cast()));
                    let iv = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        init.as_ptr().add(8 * (t * nb + b)).cast(),
                    ));
                    let da = _mm512_set1_ps(ab.d);
                    for k in 0..P {
                        let lane = _mm512_dpbusd_epi32(iv, c[k], av);
                        if last_odd {
                            let lo = _mm512_reduce_add_epi32(_mm512_maskz_mov_epi32(0x00ff, lane));
                            let hi = _mm512_reduce_add_epi32(_mm512_maskz_mov_epi32(0xff00, lane));
                            tail[t][k] = (lo, hi);
                            continue;
                        }
                        let tgt = if SPLIT && b % 2 == 1 {
                            &mut acc_odd[t][k]
                        } else {
                            &mut at[k]
                        };
                        *tgt = _mm512_fmadd_ps(
                            _mm512_mul_ps(dw[k], da),
                            _mm512_cvtepi32_ps(lane),
                            *tgt,
                        );
                    }
                }
            }
            // Q4_1/Q5_1 beside the assembly: each row's `Σ m·s` for all N rows at once
            // (rows a and b of pair k; each product rounded, then added in block order).
            let mut smo = [[[0f32; 8]; 2]; P];
            if mins {
                let mut smv = [[_mm256_setzero_ps(); 2]; P];
                for b in 0..nb {
                    let s8 = _mm256_loadu_ps(sv.as_ptr().add(8 * b));
                    for (k, sk) in smv.iter_mut().enumerate() {
                        let (_, _, pa, pb) = pr[k];
                        let m = dpair(pa.add(b * ts + 2), pb.add(b * ts + 2));
                        let (ma, mb) = (
                            _mm256_broadcastss_ps(m),
                            _mm256_broadcastss_ps(_mm_movehdup_ps(m)),
                        );
                        sk[0] = _mm256_add_ps(sk[0], _mm256_mul_ps(ma, s8));
                        sk[1] = _mm256_add_ps(sk[1], _mm256_mul_ps(mb, s8));
                    }
                }
                for (o, sk) in smo.iter_mut().zip(&smv) {
                    _mm256_storeu_ps(o[0].as_mut_ptr(), sk[0]);
                    _mm256_storeu_ps(o[1].as_mut_ptr(), sk[1]);
                }
            }
            for (t, at) in acc.iter().enumerate() {
                for k in 0..np {
                    let (ra, rb, _, _) = pr[k];
                    let (mut ya, mut yb) = if SPLIT {
                        halves(_mm512_add_ps(at[k], acc_odd[t][k]))
                    } else {
                        halves(at[k])
                    };
                    if SPLIT && nb % 2 == 1 {
                        // The odd last block: `fma(d_a·d_w, Σ, sum)` per row.
                        let da = act.get_unchecked(t * nb + nb - 1).d;
                        let mut dwp = [0f32; 4];
                        _mm_storeu_ps(dwp.as_mut_ptr(), tail_dw[k]);
                        let (sa, sb) = tail[t][k];
                        ya = (da * dwp[0]).mul_add(sa as f32, ya);
                        yb = (da * dwp[1]).mul_add(sb as f32, yb);
                    }
                    if mins {
                        ya += smo[k][0][t];
                        yb += smo[k][1][t];
                    }
                    store_pair(y.add(t * ystride), ra, rb, ya, yb);
                }
            }
        }
        r = rr;
    }
}

/// A weight-row pair's two results: `y[ra]`, and `y[rb]` when it is another row (an odd
/// last row is computed as a pair with itself).
///
/// # Safety
/// `y` is valid for writes at `ra` and `rb`.
#[inline]
unsafe fn store_pair(y: *mut f32, ra: usize, rb: usize, ya: f32, yb: f32) {
    // SAFETY: the caller's contract.
    unsafe {
        *y.add(ra) = ya;
        if rb != ra {
            *y.add(rb) = yb;
        }
    }
}

/// Both rows' first four bytes as f32 from f16: `[x0_a, x1_a, x0_b, x1_b]` — a block's scale
/// `d` in lanes 0 and 2, and for Q4_1/Q5_1 its minimum `m` in lanes 1 and 3 (for the other
/// types lanes 1 and 3 are code bytes read as f16, never used). Two loads and one conversion.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scales4(a: *const u8, b: *const u8) -> __m128 {
    // SAFETY: both point at a whole block (≥ 18 bytes).
    unsafe {
        let x = _mm_cvtsi32_si128(std::ptr::read_unaligned(a.cast::<i32>()));
        let x = _mm_insert_epi32::<1>(x, std::ptr::read_unaligned(b.cast::<i32>()));
        _mm_cvtph_ps(x)
    }
}

/// [`rows_impl`] for one to three activation rows outside IQ4_NL's one-row order (decode of
/// one to three sessions): `P` weight-row pairs a pass share each activation block's loads,
/// and a block's scales cost one multiply — the weight rows' `[d_a, m_a, d_b, m_b]`
/// ([`scales4`]) times the activation block's `[d, s, d, s]` (one 64-bit broadcast of
/// `BlockQ8x32::d` and `s`, which lie side by side) gives both rows' `d_w·d_a` and, for
/// Q4_1/Q5_1, both `m·s` terms at once. The same products, sums and order as `rows_impl`,
/// so the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_few<const T: u8, const N: usize, const P: usize>(
    ts: usize,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    act: &[BlockQ8x32],
    init: &[i32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let dist = prefetch_dist(row_bytes);
    let mins = T == Q41 || T == Q51;
    // Lane 0's product to the low half, lane 2's to the high half.
    let idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut r = r0;
    while r < r1 {
        let (pr, np, rr) = pairs::<P>(w, row_bytes, r, r1);
        // SAFETY: every pair's rows are < rows; N rows of nb blocks of activations and lane
        // starts (caller); the outputs t·ystride + row are this call's.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); P]; N];
            // Q4_1/Q5_1: rows a and b's `Σ m·s` in lanes 1 and 3.
            let mut sm = [[_mm_setzero_ps(); P]; N];
            for b in 0..nb {
                let mut c = [_mm512_setzero_si512(); P];
                let mut s4 = [_mm_setzero_ps(); P];
                for k in 0..P {
                    let (_, _, pa, pb) = pr[k];
                    let (wa, wb) = (pa.add(b * ts), pb.add(b * ts));
                    _mm_prefetch::<_MM_HINT_T1>(wa.wrapping_add(dist).cast());
                    _mm_prefetch::<_MM_HINT_T1>(wb.wrapping_add(dist).cast());
                    c[k] = codes::<T>(wa, wb);
                    s4[k] = scales4(wa, wb);
                }
                for t in 0..N {
                    let ab = act.get_unchecked(t * nb + b);
                    let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.qs.as_ptr().cast()));
                    let iv = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        init.as_ptr().add(8 * (t * nb + b)).cast(),
                    ));
                    // [d, s, d, s]
                    let ds = _mm_castpd_ps(_mm_loaddup_pd((&raw const ab.d).cast::<f64>()));
                    for k in 0..P {
                        let p = _mm_mul_ps(s4[k], ds);
                        if mins {
                            sm[t][k] = _mm_add_ps(sm[t][k], p);
                        }
                        let dd = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(p));
                        let lane = _mm512_dpbusd_epi32(iv, c[k], av);
                        acc[t][k] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lane), acc[t][k]);
                    }
                }
            }
            for t in 0..N {
                for k in 0..np {
                    let (ra, rb, _, _) = pr[k];
                    let (mut ya, mut yb) = halves(acc[t][k]);
                    if mins {
                        let mut m = [0f32; 4];
                        _mm_storeu_ps(m.as_mut_ptr(), sm[t][k]);
                        ya += m[1];
                        yb += m[3];
                    }
                    store_pair(y.add(t * ystride), ra, rb, ya, yb);
                }
            }
        }
        r = rr;
    }
}

/// Output rows `r0..r1` of `W·X` for `n` activation rows (`act`: `n·nb` blocks, row `t` at
/// `t·nb`; `rec`, `sv` and `init` from [`prepare`] over all of them), written to `y[t·ystride + r]`, each
/// row in the order of a one-row call when `one_row_order` (only IQ4_NL's differs).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, VNNI, FMA and F16C; `w` holds the rows (`row_bytes` each)
/// of `nb` blocks of `ty`; `act.len() == n·nb`, `rec`, `sv` and `init` as [`prepared_len`] says; `y` is valid for
/// writes at `t·ystride + r` (`t < n`, `r0 <= r < r1`), which this call alone writes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    ty: GgmlType,
    one_row_order: bool,
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    act: &[BlockQ8x32],
    rec: &[ActRec],
    sv: &[f32],
    init: &[i32],
    y: *mut f32,
    ystride: usize,
    r0: usize,
    r1: usize,
) {
    let ts = ty.type_size();
    let n = act.len() / nb.max(1);
    // Activation rows in groups of up to 8 (one accumulator each).
    let mut t0 = 0;
    while t0 < n {
        let k = (n - t0).min(GROUP);
        let (a, i) = (
            &act[t0 * nb..(t0 + k) * nb],
            &init[8 * t0 * nb..8 * (t0 + k) * nb],
        );
        // The group's records, if it has them.
        let (rc, sc): (&[ActRec], &[f32]) = if k >= ASM_ROWS {
            (
                &rec[t0 * nb..(t0 + k) * nb],
                &sv[t0 * nb..(t0 + GROUP) * nb],
            )
        } else {
            (&[], &[])
        };
        // SAFETY: forwarded contract, for activation rows t0..t0 + k.
        unsafe {
            let yt = y.add(t0 * ystride);
            // One to three rows: `rows_few`; from four, the assembly body two pairs a pass.
            // IQ4_NL's one-row order (`split`): `rows_impl`'s own accumulators, one pair a
            // pass below four rows.
            macro_rules! imp {
                ($t:ident, $n:literal, $p:literal, $s:literal) => {
                    rows_impl::<$t, $n, $p, $s>(
                        ts, w, row_bytes, nb, a, i, rc, sc, yt, ystride, r0, r1,
                    )
                };
            }
            macro_rules! go {
                ($t:ident) => {
                    match k {
                        1 => rows_few::<$t, 1, FEW_P>(
                            ts, w, row_bytes, nb, a, i, yt, ystride, r0, r1,
                        ),
                        2 => rows_few::<$t, 2, 2>(ts, w, row_bytes, nb, a, i, yt, ystride, r0, r1),
                        3 => rows_few::<$t, 3, 2>(ts, w, row_bytes, nb, a, i, yt, ystride, r0, r1),
                        4 => imp!($t, 4, 2, false),
                        5 => imp!($t, 5, 2, false),
                        6 => imp!($t, 6, 2, false),
                        7 => imp!($t, 7, 2, false),
                        8 => imp!($t, 8, 2, false),
                        _ => unreachable!("1..=8 rows"),
                    }
                };
                ($t:ident, split) => {
                    match k {
                        1 => imp!($t, 1, 1, true),
                        2 => imp!($t, 2, 1, true),
                        3 => imp!($t, 3, 1, true),
                        4 => imp!($t, 4, 2, true),
                        5 => imp!($t, 5, 2, true),
                        6 => imp!($t, 6, 2, true),
                        7 => imp!($t, 7, 2, true),
                        8 => imp!($t, 8, 2, true),
                        _ => unreachable!("1..=8 rows"),
                    }
                };
            }
            match ty {
                GgmlType::Q8_0 => go!(Q8),
                GgmlType::Q5_0 => go!(Q5),
                GgmlType::Q4_1 => go!(Q41),
                GgmlType::Q5_1 => go!(Q51),
                // IQ4_NL: ggml's `vec_dot` (even and odd blocks apart) for one-row calls,
                // tinyBLAS's one accumulator from two rows.
                GgmlType::IQ4_NL if one_row_order => go!(IQ, split),
                GgmlType::IQ4_NL => go!(IQ),
                _ => go!(Q4),
            }
        }
        t0 += k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`prepare`] writes what the plain code does, for every row count a call takes.
    #[test]
    fn prepare_equals_the_plain_code() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        {
            return;
        }
        let nb = 5;
        let mut st = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            st
        };
        for n in 1..=17 {
            let act: Vec<BlockQ8x32> = (0..n * nb)
                .map(|_| {
                    let mut b: BlockQ8x32 = bytemuck::Zeroable::zeroed();
                    b.qs = std::array::from_fn(|_| next() as i8);
                    b.d = (next() % 1000) as f32 / 997.0 - 0.4;
                    b.s = (next() % 1000) as f32 / 13.0;
                    b
                })
                .collect();
            let (nr, ns, ni) = prepared_len(n, nb);
            let zero: ActRec = bytemuck::Zeroable::zeroed();
            let (mut r1, mut s1, mut i1) = (vec![zero; nr], vec![0f32; ns], vec![0i32; ni]);
            let (mut r2, mut s2, mut i2) = (r1.clone(), s1.clone(), i1.clone());
            // SAFETY: checked above; lengths from prepared_len.
            unsafe { prepare(&act, nb, &mut r1, &mut s1, &mut i1) };
            prepare_scalar(&act, nb, &mut r2, &mut s2, &mut i2);
            assert_eq!(i1, i2, "n={n}");
            assert_eq!(s1, s2, "n={n}");
            assert_eq!(
                bytemuck::cast_slice::<ActRec, u8>(&r1),
                bytemuck::cast_slice::<ActRec, u8>(&r2),
                "n={n}"
            );
        }
    }
}
