//! BitNet's W1.58A8 by table lookup (TL, in the manner of bitnet.cpp's TL2): the trits in
//! groups of three along K, each group one of 27 values stored as a sign bit and a 4-bit
//! magnitude index (value `v = 9(t₀+1) + 3(t₁+1) + (t₂+1)`; `m = v` for `v ≤ 13`, else
//! `m = 26 − v` and the sign set, since negating the three trits maps `v` to `26 − v`) — 5 bits
//! per 3 weights, 1.67 bits a weight against the 2-bit packing's 2.0. Per activation row and
//! group, a table of the 14 sums `Σ tᵢ·qᵢ` (`|sum| ≤ 384`: 16 bits, kept as a low-byte and a
//! high-byte table of 16 entries each) replaces the multiplications: a byte shuffle looks up
//! 64 rows' sums at once.
//!
//! Layout ([`TlLayout`]): rows in tiles of [`TILE`] (64; the last padded with zero trits),
//! groups in pairs (K padded with zero trits to a multiple of 6). Per tile and group pair
//! [`PAIR_BYTES`] (80) bytes: 64 bytes of indices — byte `j` holds row `j`'s `m` of the
//! pair's first group in its low nibble, of its second group in its high nibble — then per
//! group two `u32` sign masks `sA, sB` in the lane order of `unpacklo/unpackhi_epi8` (lane
//! `8c + e` of A is row `16c + e`, of B row `16c + 8 + e`, `c` the 128-bit lane).
//!
//! Each output is the exact integer `Σ t·q` (16-bit partial sums widened every
//! [`FLUSH_PAIRS`] pairs, before they can overflow), times `d_a · γ` — the bits of
//! `ternary_i8` and of the scalar path here.

/// Rows a tile holds.
pub(crate) const TILE: usize = 64;
/// Bytes of one tile's group pair: 64 index bytes, then `[sA₀, sB₀, sA₁, sB₁]` as `u32`.
pub(crate) const PAIR_BYTES: usize = 80;
/// Group pairs summed in 16 bits before widening: `2 · 32 · 384 = 24,576 < 32,768`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const FLUSH_PAIRS: usize = 32;
/// Bytes of one group's tables: 16 low bytes, then 16 high bytes.
pub(crate) const LUT_BYTES: usize = 32;

/// Shape of a TL-packed matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TlLayout {
    /// Output rows.
    pub rows: usize,
    /// Input columns (K).
    pub cols: usize,
    /// Group pairs per row (`⌈⌈K/3⌉/2⌉`).
    pub pairs: usize,
    /// Tiles of [`TILE`] rows.
    pub tiles: usize,
}

impl TlLayout {
    pub(crate) fn new(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            pairs: cols.div_ceil(3).div_ceil(2),
            tiles: rows.div_ceil(TILE),
        }
    }

    /// Bytes of one tile.
    pub(crate) fn tile_bytes(&self) -> usize {
        self.pairs * PAIR_BYTES
    }

    /// Bytes of the packed matrix.
    pub(crate) fn bytes(&self) -> usize {
        self.tiles * self.tile_bytes()
    }

    /// Bytes of one activation row's tables.
    pub(crate) fn lut_bytes(&self) -> usize {
        2 * self.pairs * LUT_BYTES
    }
}

/// Row `j` of a tile as (B accumulator?, lane).
fn lane_of(j: usize) -> (bool, usize) {
    let (c, e) = (j / 16, j % 16);
    if e < 8 {
        (false, 8 * c + e)
    } else {
        (true, 8 * c + e - 8)
    }
}

/// Packs `rows × cols` trits (`trit(r, k)` in −1..=1) into the TL layout.
pub(crate) fn pack(layout: TlLayout, trit: impl Fn(usize, usize) -> i8) -> Vec<u8> {
    let mut out = vec![0u8; layout.bytes()];
    let t = |r: usize, k: usize| {
        if r < layout.rows && k < layout.cols {
            trit(r, k)
        } else {
            0
        }
    };
    for tile in 0..layout.tiles {
        for p in 0..layout.pairs {
            let base = tile * layout.tile_bytes() + p * PAIR_BYTES;
            for j in 0..TILE {
                let r = tile * TILE + j;
                for g in 0..2 {
                    let k0 = 3 * (2 * p + g);
                    let v =
                        (9 * (t(r, k0) + 1) + 3 * (t(r, k0 + 1) + 1) + (t(r, k0 + 2) + 1)) as u8;
                    let (m, neg) = if v <= 13 { (v, false) } else { (26 - v, true) };
                    out[base + j] |= m << (4 * g);
                    if neg {
                        let (b, lane) = lane_of(j);
                        let w = base + 64 + 8 * g + 4 * b as usize + lane / 8;
                        out[w] |= 1 << (lane % 8);
                    }
                }
            }
        }
    }
    out
}

/// The trits of magnitude index `m` (0..=13).
fn trits_of(m: usize) -> [i32; 3] {
    [
        (m / 9) as i32 - 1,
        ((m / 3) % 3) as i32 - 1,
        (m % 3) as i32 - 1,
    ]
}

/// Tables of groups `g0..g1` of one activation row (`q(k)`: its `k`-th quantised activation,
/// zero past the row's end) into `lut` (the row's tables: group `g` at `g · LUT_BYTES`).
pub(crate) fn build_lut(q: impl Fn(usize) -> i8, g0: usize, g1: usize, lut: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::KernelPath::Avx512Vnni.is_supported() {
        // SAFETY: AVX-512 F/BW/VL checked just above.
        unsafe { x86::build_lut(q, g0, g1, lut) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::KernelPath::Avx2.is_supported() {
        // SAFETY: AVX2 checked just above.
        unsafe { x86_avx2::build_lut(q, g0, g1, lut) };
        return;
    }
    build_lut_scalar(q, g0, g1, lut)
}

fn build_lut_scalar(q: impl Fn(usize) -> i8, g0: usize, g1: usize, lut: &mut [u8]) {
    let a = |k: usize| q(k) as i32;
    for g in g0..g1 {
        let out = &mut lut[g * LUT_BYTES..(g + 1) * LUT_BYTES];
        for m in 0..16 {
            let s = if m < 14 {
                let t = trits_of(m);
                t[0] * a(3 * g) + t[1] * a(3 * g + 1) + t[2] * a(3 * g + 2)
            } else {
                0
            };
            out[m] = s as u8;
            out[16 + m] = (s >> 8) as u8;
        }
    }
}

/// `Σ t·q` of the 64 rows of `tile` (its bytes) against one row's tables, scalar.
pub(crate) fn tile_scalar(layout: TlLayout, tile: &[u8], lut: &[u8], out: &mut [i32; TILE]) {
    out.fill(0);
    for p in 0..layout.pairs {
        let b = &tile[p * PAIR_BYTES..(p + 1) * PAIR_BYTES];
        for g in 0..2 {
            let t = &lut[(2 * p + g) * LUT_BYTES..];
            for (j, o) in out.iter_mut().enumerate() {
                let m = ((b[j] >> (4 * g)) & 15) as usize;
                let s = i16::from_le_bytes([t[m], t[16 + m]]) as i32;
                let (bb, lane) = lane_of(j);
                let neg = b[64 + 8 * g + 4 * bb as usize + lane / 8] >> (lane % 8) & 1 == 1;
                *o += if neg { -s } else { s };
            }
        }
    }
}

/// `Σ t·q` of one tile on the best path there is.
///
/// # Safety
/// `path` is supported by the CPU; `tile` and `lut` are whole (as [`TlLayout`] sizes them).
pub(crate) unsafe fn tile_dot(
    path: crate::dispatch::KernelPath,
    layout: TlLayout,
    tile: &[u8],
    lut: &[u8],
    out: &mut [i32; TILE],
) {
    debug_assert!(tile.len() >= layout.tile_bytes() && lut.len() >= layout.lut_bytes());
    #[cfg(target_arch = "x86_64")]
    match path {
        crate::dispatch::KernelPath::Avx512Vnni => {
            // SAFETY: the path is supported (caller); sizes checked above.
            unsafe { x86::tile(layout.pairs, tile.as_ptr(), lut.as_ptr(), out) };
            return;
        }
        crate::dispatch::KernelPath::Avx2 | crate::dispatch::KernelPath::AvxVnni => {
            // SAFETY: both paths include AVX2 (caller: supported); sizes checked above.
            unsafe { x86_avx2::tile(layout.pairs, tile.as_ptr(), lut.as_ptr(), out) };
            return;
        }
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if path == crate::dispatch::KernelPath::Neon {
        // SAFETY: the path is supported (caller); sizes checked above.
        unsafe { neon::tile(layout.pairs, tile.as_ptr(), lut.as_ptr(), out) };
        return;
    }
    let _ = path;
    tile_scalar(layout, tile, lut, out)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{FLUSH_PAIRS, LUT_BYTES, PAIR_BYTES, TILE};
    use std::arch::x86_64::*;

    /// Bytes ahead the tile's stream is prefetched (into L2, as the 2-bit kernel does).
    const PREFETCH: usize = 6144;

    /// The trits of magnitude `m` (lanes 0..16, 0 for 14 and 15) as i16, per position.
    pub(super) fn trit_vectors() -> [[i16; 16]; 3] {
        let mut t = [[0i16; 16]; 3];
        for m in 0..14 {
            for (ti, v) in t.iter_mut().zip(super::trits_of(m)) {
                ti[m] = v as i16;
            }
        }
        t
    }

    /// [`super::build_lut_scalar`] two groups a register: 16 sums each as i16, then their low and
    /// high bytes.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn build_lut(q: impl Fn(usize) -> i8, g0: usize, g1: usize, lut: &mut [u8]) {
        let t = trit_vectors();
        let tv: [__m512i; 3] = std::array::from_fn(|i| {
            // SAFETY: 16 i16 read from a local array.
            let h = unsafe { _mm256_loadu_si256(t[i].as_ptr().cast()) };
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(h), h)
        });
        let a = |k: usize| q(k) as i16;
        let mut g = g0;
        while g < g1 {
            let two = g + 1 < g1;
            let av: [__m512i; 3] = std::array::from_fn(|i| {
                let lo = _mm256_set1_epi16(a(3 * g + i));
                let hi = _mm256_set1_epi16(if two { a(3 * (g + 1) + i) } else { 0 });
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
            });
            let s = _mm512_add_epi16(
                _mm512_add_epi16(
                    _mm512_mullo_epi16(tv[0], av[0]),
                    _mm512_mullo_epi16(tv[1], av[1]),
                ),
                _mm512_mullo_epi16(tv[2], av[2]),
            );
            // Low bytes of groups g, g + 1, then high bytes.
            let lo = _mm512_cvtepi16_epi8(s);
            let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(s));
            let n = if two { 2 } else { 1 };
            let out = &mut lut[g * LUT_BYTES..(g + n) * LUT_BYTES];
            let mut l = [0u8; 32];
            let mut h = [0u8; 32];
            // SAFETY: 32 bytes each to local arrays.
            unsafe {
                _mm256_storeu_si256(l.as_mut_ptr().cast(), lo);
                _mm256_storeu_si256(h.as_mut_ptr().cast(), hi);
            }
            for k in 0..n {
                out[k * LUT_BYTES..k * LUT_BYTES + 16].copy_from_slice(&l[16 * k..16 * k + 16]);
                out[k * LUT_BYTES + 16..(k + 1) * LUT_BYTES]
                    .copy_from_slice(&h[16 * k..16 * k + 16]);
            }
            g += 2;
        }
    }

    /// One tile against one row's tables: per group two `vpshufb` (low, high bytes of the 64
    /// rows' sums), `unpack{lo,hi}_epi8` to i16 lanes, the negative ones negated under the
    /// sign mask, added in 16 bits; widened to i32 every [`FLUSH_PAIRS`] pairs.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn tile(pairs: usize, w: *const u8, lut: *const u8, out: &mut [i32; TILE]) {
        let m4 = _mm512_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        // A's lanes 0..16 and 16..32, then B's.
        let mut wide = [_mm512_setzero_si512(); 4];
        let mut p = 0;
        while p < pairs {
            let end = (p + FLUSH_PAIRS).min(pairs);
            let (mut acc_a, mut acc_b) = (zero, zero);
            for pp in p..end {
                // SAFETY: pair pp of the tile and groups 2pp, 2pp + 1 of the tables (caller).
                unsafe {
                    let b = w.add(pp * PAIR_BYTES);
                    // 80 bytes a pair: two lines, or every fifth line would go unfetched.
                    _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(PREFETCH + 64).cast());
                    let q = _mm512_loadu_si512(b.cast());
                    let idx = [
                        _mm512_and_si512(q, m4),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4),
                    ];
                    for (g, ix) in idx.into_iter().enumerate() {
                        let t = lut.add((2 * pp + g) * LUT_BYTES);
                        let tl = _mm512_broadcast_i32x4(_mm_loadu_si128(t.cast()));
                        let th = _mm512_broadcast_i32x4(_mm_loadu_si128(t.add(16).cast()));
                        let (l, h) = (_mm512_shuffle_epi8(tl, ix), _mm512_shuffle_epi8(th, ix));
                        let (va, vb) = (_mm512_unpacklo_epi8(l, h), _mm512_unpackhi_epi8(l, h));
                        let sa = std::ptr::read_unaligned(b.add(64 + 8 * g).cast::<u32>());
                        let sb = std::ptr::read_unaligned(b.add(68 + 8 * g).cast::<u32>());
                        acc_a = _mm512_add_epi16(acc_a, _mm512_mask_sub_epi16(va, sa, zero, va));
                        acc_b = _mm512_add_epi16(acc_b, _mm512_mask_sub_epi16(vb, sb, zero, vb));
                    }
                }
            }
            let widen = |v: __m512i, hi: bool| {
                _mm512_cvtepi16_epi32(if hi {
                    _mm512_extracti64x4_epi64::<1>(v)
                } else {
                    _mm512_castsi512_si256(v)
                })
            };
            wide[0] = _mm512_add_epi32(wide[0], widen(acc_a, false));
            wide[1] = _mm512_add_epi32(wide[1], widen(acc_a, true));
            wide[2] = _mm512_add_epi32(wide[2], widen(acc_b, false));
            wide[3] = _mm512_add_epi32(wide[3], widen(acc_b, true));
            p = end;
        }
        let mut lanes = [[0i32; 16]; 4];
        for (l, v) in lanes.iter_mut().zip(wide) {
            // SAFETY: 16 i32 to a local array.
            unsafe { _mm512_storeu_si512(l.as_mut_ptr().cast(), v) };
        }
        for (j, o) in out.iter_mut().enumerate() {
            let (b, lane) = super::lane_of(j);
            *o = lanes[2 * b as usize + lane / 16][lane % 16];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_avx2 {
    use super::{FLUSH_PAIRS, LUT_BYTES, PAIR_BYTES, TILE};
    use std::arch::x86_64::*;

    /// Bytes ahead the tile's stream is prefetched (into L2, as the AVX-512 kernel does).
    const PREFETCH: usize = 6144;

    /// [`super::build_lut_scalar`] a group a register: the 16 sums as i16 (`Σ tᵢ·qᵢ` by three
    /// `vpmullw`), then a byte shuffle and a qword permute put their 16 low bytes and 16 high
    /// bytes in the group's table order.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn build_lut(q: impl Fn(usize) -> i8, g0: usize, g1: usize, lut: &mut [u8]) {
        let t = super::x86::trit_vectors();
        // SAFETY: 16 i16 read from local arrays.
        let tv: [__m256i; 3] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_si256(t[i].as_ptr().cast()) });
        // Per 128-bit lane: the low bytes of its 8 sums, then their high bytes.
        let split = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3,
            5, 7, 9, 11, 13, 15,
        );
        for g in g0..g1 {
            let a = |i: usize| _mm256_set1_epi16(q(3 * g + i) as i16);
            let s = _mm256_add_epi16(
                _mm256_add_epi16(
                    _mm256_mullo_epi16(tv[0], a(0)),
                    _mm256_mullo_epi16(tv[1], a(1)),
                ),
                _mm256_mullo_epi16(tv[2], a(2)),
            );
            // [lo 0..8, hi 0..8 | lo 8..16, hi 8..16] → [lo 0..16 | hi 0..16].
            let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(s, split));
            let out = &mut lut[g * LUT_BYTES..(g + 1) * LUT_BYTES];
            // SAFETY: 32 bytes into the group's 32-byte table.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), b) };
        }
    }

    /// One tile against one row's tables with 256-bit registers: rows 0..32 and 32..64 in
    /// two index registers; per group and register two `vpshufb` (the sums' low and high
    /// bytes), `unpack{lo,hi}_epi8` to i16 lanes, each half of the sign masks broadcast and
    /// expanded to lanes (`and` with the lane's bit, `cmpeq`) and applied as `(v ^ m) − m`,
    /// added in 16 bits; widened to i32 every [`FLUSH_PAIRS`] pairs.
    ///
    /// Register `h` (rows `32h..32h + 32`), 128-bit lane `c`: `unpacklo` holds rows
    /// `32h + 16c + e`, `unpackhi` rows `32h + 16c + 8 + e` (`e` < 8) — lanes `16h + 8c + e`
    /// of the layout's A and B masks, so each takes bits `16h..16h + 16` of them.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn tile(pairs: usize, w: *const u8, lut: *const u8, out: &mut [i32; TILE]) {
        let m4 = _mm256_set1_epi8(15);
        let zero = _mm256_setzero_si256();
        let bit = _mm256_setr_epi16(
            1,
            2,
            4,
            8,
            16,
            32,
            64,
            128,
            256,
            512,
            1024,
            2048,
            4096,
            8192,
            16384,
            i16::MIN,
        );
        // [A rows 32h.., B rows 32h..] per register h, as i16 lanes, then widened.
        let mut wide = [zero; 8];
        let mut p = 0;
        while p < pairs {
            let end = (p + FLUSH_PAIRS).min(pairs);
            let mut acc = [zero; 4];
            for pp in p..end {
                // SAFETY: pair pp of the tile and groups 2pp, 2pp + 1 of the tables (caller).
                unsafe {
                    let b = w.add(pp * PAIR_BYTES);
                    // 80 bytes a pair: two lines, or every fifth line would go unfetched.
                    _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(PREFETCH + 64).cast());
                    let q = [
                        _mm256_loadu_si256(b.cast()),
                        _mm256_loadu_si256(b.add(32).cast()),
                    ];
                    for g in 0..2 {
                        let t = lut.add((2 * pp + g) * LUT_BYTES);
                        let tl = _mm256_broadcastsi128_si256(_mm_loadu_si128(t.cast()));
                        let th = _mm256_broadcastsi128_si256(_mm_loadu_si128(t.add(16).cast()));
                        for (h, qh) in q.iter().enumerate() {
                            let ix = if g == 0 {
                                _mm256_and_si256(*qh, m4)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16::<4>(*qh), m4)
                            };
                            let (l, hb) =
                                (_mm256_shuffle_epi8(tl, ix), _mm256_shuffle_epi8(th, ix));
                            let v = [_mm256_unpacklo_epi8(l, hb), _mm256_unpackhi_epi8(l, hb)];
                            for (ab, vv) in v.into_iter().enumerate() {
                                let at = b.add(64 + 8 * g + 4 * ab + 2 * h).cast::<i16>();
                                let sm = _mm256_set1_epi16(std::ptr::read_unaligned(at));
                                let m = _mm256_cmpeq_epi16(_mm256_and_si256(sm, bit), bit);
                                let neg = _mm256_sub_epi16(_mm256_xor_si256(vv, m), m);
                                acc[2 * h + ab] = _mm256_add_epi16(acc[2 * h + ab], neg);
                            }
                        }
                    }
                }
            }
            for (k, a) in acc.into_iter().enumerate() {
                let lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a));
                let hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(a));
                wide[2 * k] = _mm256_add_epi32(wide[2 * k], lo);
                wide[2 * k + 1] = _mm256_add_epi32(wide[2 * k + 1], hi);
            }
            p = end;
        }
        // wide[2k + c], k = 2h + ab: lane e is row 32h + 16c + 8ab + e.
        for (i, v) in wide.into_iter().enumerate() {
            let (k, c) = (i / 2, i % 2);
            let (h, ab) = (k / 2, k % 2);
            let mut lanes = [0i32; 8];
            // SAFETY: 8 i32 to a local array.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
            let r0 = 32 * h + 16 * c + 8 * ab;
            out[r0..r0 + 8].copy_from_slice(&lanes);
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{FLUSH_PAIRS, LUT_BYTES, PAIR_BYTES, TILE};
    use std::arch::aarch64::*;

    /// One tile against one row's tables with 128-bit registers: rows `16c..16c + 16` in
    /// index register `c`; per group `tbl` looks up the sums' low and high bytes, `zip1`/`zip2`
    /// make i16 lanes (rows `16c + e` and `16c + 8 + e`: lanes `8c + e` of the layout's A and
    /// B masks, byte `c` of each), the sign byte expanded to lanes (`cmtst` with the lane's
    /// bit) negates as `(v ^ m) − m`; added in 16 bits, widened to i32 every
    /// [`FLUSH_PAIRS`] pairs. The same integers as the scalar path.
    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn tile(pairs: usize, w: *const u8, lut: *const u8, out: &mut [i32; TILE]) {
        // SAFETY: the caller's contract (whole tile and tables); local arrays otherwise.
        unsafe {
            let m4 = vdupq_n_u8(15);
            let bits: [u16; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
            let bit = vld1q_u16(bits.as_ptr());
            // [c][A, B] as i32 halves: lanes e < 4 and 4..8.
            let mut wide = [[[vdupq_n_s32(0); 2]; 2]; 4];
            let mut p = 0;
            while p < pairs {
                let end = (p + FLUSH_PAIRS).min(pairs);
                let mut acc = [[vdupq_n_s16(0); 2]; 4];
                for pp in p..end {
                    let b = w.add(pp * PAIR_BYTES);
                    let q: [uint8x16_t; 4] = std::array::from_fn(|c| vld1q_u8(b.add(16 * c)));
                    for g in 0..2 {
                        let t = lut.add((2 * pp + g) * LUT_BYTES);
                        let (tl, th) = (vld1q_u8(t), vld1q_u8(t.add(16)));
                        for (c, qc) in q.iter().enumerate() {
                            let ix = if g == 0 {
                                vandq_u8(*qc, m4)
                            } else {
                                vshrq_n_u8::<4>(*qc)
                            };
                            let (l, h) = (vqtbl1q_u8(tl, ix), vqtbl1q_u8(th, ix));
                            let v = [
                                vreinterpretq_s16_u8(vzip1q_u8(l, h)),
                                vreinterpretq_s16_u8(vzip2q_u8(l, h)),
                            ];
                            for (ab, vv) in v.into_iter().enumerate() {
                                let sb = *b.add(64 + 8 * g + 4 * ab + c) as u16;
                                let m = vreinterpretq_s16_u16(vtstq_u16(vdupq_n_u16(sb), bit));
                                let neg = vsubq_s16(veorq_s16(vv, m), m);
                                acc[c][ab] = vaddq_s16(acc[c][ab], neg);
                            }
                        }
                    }
                }
                for c in 0..4 {
                    for ab in 0..2 {
                        let a = acc[c][ab];
                        wide[c][ab][0] = vaddw_s16(wide[c][ab][0], vget_low_s16(a));
                        wide[c][ab][1] = vaddw_high_s16(wide[c][ab][1], a);
                    }
                }
                p = end;
            }
            for c in 0..4 {
                for ab in 0..2 {
                    let r0 = 16 * c + 8 * ab;
                    vst1q_s32(out[r0..].as_mut_ptr(), wide[c][ab][0]);
                    vst1q_s32(out[r0 + 4..].as_mut_ptr(), wide[c][ab][1]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Both paths give `Σ t·q` exactly, for shapes with ragged tiles and groups and extreme
    /// activations (±127, −128), against a plain integer dot.
    #[test]
    fn tiles_sum_exactly() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for (rows, cols) in [
            (64usize, 6usize),
            (70, 256),
            (130, 2560),
            (64, 1000),
            (3, 7),
        ] {
            let trits: Vec<i8> = (0..rows * cols)
                .map(|_| rng.random_range(-1i8..=1))
                .collect();
            let layout = TlLayout::new(rows, cols);
            let w = pack(layout, |r, k| trits[r * cols + k]);
            for q in [
                (0..cols).map(|_| rng.random::<i8>()).collect::<Vec<i8>>(),
                vec![-128i8; cols],
                vec![127i8; cols],
            ] {
                let qk = |k: usize| q.get(k).copied().unwrap_or(0);
                let mut lut = vec![0u8; layout.lut_bytes()];
                build_lut(qk, 0, 2 * layout.pairs, &mut lut);
                let mut lut_s = vec![0u8; layout.lut_bytes()];
                build_lut_scalar(qk, 0, 2 * layout.pairs, &mut lut_s);
                assert_eq!(lut, lut_s, "tables {rows}x{cols}");
                for tile in 0..layout.tiles {
                    let tb = &w[tile * layout.tile_bytes()..(tile + 1) * layout.tile_bytes()];
                    let mut s = [0i32; TILE];
                    tile_scalar(layout, tb, &lut, &mut s);
                    let mut v = [0i32; TILE];
                    let path = crate::dispatch::KernelPath::best_supported();
                    // SAFETY: the best supported path; whole tile and tables.
                    unsafe { tile_dot(path, layout, tb, &lut, &mut v) };
                    for j in 0..TILE {
                        let r = tile * TILE + j;
                        let want: i32 = if r < rows {
                            (0..cols)
                                .map(|k| trits[r * cols + k] as i32 * q[k] as i32)
                                .sum()
                        } else {
                            0
                        };
                        assert_eq!(s[j], want, "scalar {rows}x{cols} row {r}");
                        assert_eq!(v[j], want, "{} {rows}x{cols} row {r}", path.name());
                    }
                }
            }
        }
    }
}
