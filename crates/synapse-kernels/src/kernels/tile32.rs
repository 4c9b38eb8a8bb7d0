//! The many-row GEMM of the 32-element block types on AVX2 and AVX-VNNI (AVX-512 CPUs take
//! [`super::tiled`]'s 16-row GEMM instead).
//!
//! The per-row kernels (`dot4_*`) unpack each weight block again for every four activation
//! rows, multiply each activation block by one weight row and sum eight lanes horizontally
//! per output. Here a tile of weight rows is unpacked once per call — per block the unsigned
//! `maddubs` operand and the signed values (or the unsigned codes and the min, for
//! Q4_1/Q5_1) — and the activations are packed eight rows a group, four bytes of each row
//! side by side (`[lane][row][4]`), as [`super::tiled`] packs sixteen: one broadcast group of
//! four weight codes against one 32-byte load gives lane `j` of a block for all eight rows.
//! A register then holds one lane of eight outputs: one product gives the eight rows'
//! `d_w·d_a`, and the horizontal sum is seven vertical adds. Each output keeps the one-row
//! float order exactly (per block `fma(d_w·d_a, lane, acc)` for each lane, `hsum_float_8`,
//! `Σ m·s` after it: ggml's `vec_dot` and llamafile's tinyBLAS alike), so which kernel a call
//! takes changes no bit.

use crate::act::BlockQ8x32;
use crate::dispatch::KernelPath;
use synapse_formats::GgmlType;

/// The 32-block encodings this GEMM unpacks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Codes {
    Q8_0,
    Q4_0,
    Q5_0,
    Iq4Nl,
    Q4_1,
    Q5_1,
}

impl Codes {
    /// The encoding of `ty`, if this GEMM takes it.
    pub(crate) fn of(ty: GgmlType) -> Option<Self> {
        Some(match ty {
            GgmlType::Q8_0 => Codes::Q8_0,
            GgmlType::Q4_0 => Codes::Q4_0,
            GgmlType::Q5_0 => Codes::Q5_0,
            GgmlType::IQ4_NL => Codes::Iq4Nl,
            GgmlType::Q4_1 => Codes::Q4_1,
            GgmlType::Q5_1 => Codes::Q5_1,
            _ => return None,
        })
    }

    /// Whether blocks carry a min (`Σ m·s` added after the lanes' sum).
    fn mins(self) -> bool {
        matches!(self, Codes::Q4_1 | Codes::Q5_1)
    }
}

/// Whether a call of `ty` with `n` activation rows takes this GEMM. Below 6 rows the per-row
/// four-row tiles, which unpack and pack nothing ahead, are as fast or faster (kbench, 1
/// thread, Zen 3, 2048×640 Q5_0/Q8_0/Q4_1: at 4 rows 207–257 µs against this GEMM's 254–400
/// µs, at 6 rows 371–526 µs against 260–317 µs). Q8_0, whose per-row kernel unpacks nothing
/// but a sign, at 7 or 8 rows (one group, its weights read in place: the 262,144 × 640 LM
/// head at 8 rows in 18.3–19.1 ms against the per-row kernel's 23.5–24.0, kbench, 2 threads,
/// alternated; at 6 rows, which cost the group as much as 8, the two were even) and from 16
/// rows (unpacked: 40–51 ms against 46–62 ms at 16 rows; at 8 rows the unpacking pass made
/// it 4–10% slower than the per-row kernel).
pub(crate) fn takes(ty: GgmlType, n: usize) -> bool {
    if ty == GgmlType::Q8_0 {
        matches!(n, 7 | 8) || n >= 16
    } else {
        n >= 6
    }
}

/// Matrix bytes from which Q8_0 with two groups of activation rows is read in place.
const DIRECT_BYTES: usize = 64 << 20;

/// Whether `path` runs this GEMM.
pub(crate) fn on(path: KernelPath) -> bool {
    matches!(path, KernelPath::Avx2 | KernelPath::AvxVnni)
}

/// 64 bytes of unpacked codes, aligned so no load splits a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Unit([u8; 64]);

thread_local! {
    /// One weight-row tile: unpacked codes, scales and mins.
    static TILE: std::cell::RefCell<(Vec<Unit>, Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Unpacked bytes a weight-row tile is sized to (L1-resident beside one packed group of
/// activation rows).
const TILE_BYTES: usize = 16 << 10;

/// Bytes of one packed (group of eight activation rows, block): the codes as
/// `[lane 0..8][row 0..8][4]` (lane `j` = elements `4j..4j + 4`), then the eight rows' `d`,
/// then their `s` (ggml's `block_q8_1::s`).
pub(crate) const PACK8: usize = 256 + 32 + 32;
/// Offset of the scales in a packed block.
pub(crate) const PACK8_D: usize = 256;
/// Offset of the sums in a packed block.
pub(crate) const PACK8_S: usize = 288;

/// Bytes [`pack`] writes for `n` activation rows of `nb` blocks.
pub(crate) fn pack_len(n: usize, nb: usize) -> usize {
    n.div_ceil(8) * nb * PACK8
}

/// Packs `n` activation rows of `nb` blocks eight rows a group (rows past `n` are zeros:
/// `d = 0`, so they add exactly 0).
pub(crate) fn pack(act: &[BlockQ8x32], n: usize, nb: usize, out: &mut [u8]) {
    for g in 0..n.div_ceil(8) {
        for b in 0..nb {
            let o = &mut out[(g * nb + b) * PACK8..(g * nb + b + 1) * PACK8];
            for c in 0..8 {
                let t = 8 * g + c;
                let blk = (t < n).then(|| &act[t * nb + b]);
                for j in 0..8 {
                    let dst = &mut o[32 * j + 4 * c..32 * j + 4 * c + 4];
                    match blk {
                        Some(x) => {
                            for (d, v) in dst.iter_mut().zip(&x.qs[4 * j..4 * j + 4]) {
                                *d = *v as u8;
                            }
                        }
                        None => dst.fill(0),
                    }
                }
                let (dv, sv) = blk.map_or((0f32, 0f32), |x| (x.d, x.s));
                o[PACK8_D + 4 * c..PACK8_D + 4 * c + 4].copy_from_slice(&dv.to_le_bytes());
                o[PACK8_S + 4 * c..PACK8_S + 4 * c + 4].copy_from_slice(&sv.to_le_bytes());
            }
        }
    }
}

/// Output rows `r0..r1` of a `ty` matrix (`nb` blocks a row, `row_bytes` apart in `w`) for the
/// `n` activation rows [`pack`]ed in `packed`: `y[t·rows + r]`.
///
/// # Safety
/// `path` is [`on`] and supported by this CPU; `ty` is one of [`Codes::of`]'s; `w` holds the
/// matrix's `rows` rows; `packed` holds `n` activation rows of `nb` blocks as [`pack`]
/// writes them; `y` is valid for `n·rows` writes, of which this call alone writes rows
/// `r0..r1`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows(
    path: KernelPath,
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
    let Some(kind) = Codes::of(ty) else {
        debug_assert!(false, "tile32 called for {ty:?}");
        return;
    };
    debug_assert!(packed.len() >= pack_len(n, nb) && r1 <= rows && w.len() >= rows * row_bytes);
    use super::x86::{avx2, avxvnni};
    // The path's two halves: unpacking a weight row, the rows of a tile against the groups.
    type Unpack = unsafe fn(Codes, *const u8, usize, usize, *mut u8, *mut f32, *mut f32);
    type Rows = unsafe fn(
        bool,
        *const u8,
        *const f32,
        *const f32,
        usize,
        usize,
        *const u8,
        usize,
        *mut f32,
        usize,
        usize,
    );
    let (unpack, tile_rows): (Unpack, Rows) = if path == KernelPath::AvxVnni {
        (avxvnni::t32_unpack, avxvnni::t32_rows)
    } else {
        (avx2::t32_unpack, avx2::t32_rows)
    };
    // Q8_0 read in place: one group, or two of a matrix streamed from DRAM, where reading
    // while multiplying beats an unpacking pass (the 262,144 × 640 LM head at 16 rows: 39–40
    // ms against 45–47; at 32 rows 78 against 82, and at 128 rows or cache-resident matrices
    // of 16+ rows unpacking won, kbench, 2 threads, alternated).
    if kind == Codes::Q8_0 && (n <= 8 || (n <= 16 && w.len() >= DIRECT_BYTES)) {
        type Direct =
            unsafe fn(*const u8, usize, usize, *const u8, usize, *mut f32, usize, usize, usize);
        let direct: Direct = if path == KernelPath::AvxVnni {
            avxvnni::t32_q8_0_direct
        } else {
            avx2::t32_q8_0_direct
        };
        // SAFETY: rows r0..r1 are inside `w`, `packed` holds the n rows' groups;
        // `y` and the rows written are the caller's contract; the CPU has the path's features.
        unsafe {
            direct(
                w.as_ptr(),
                row_bytes,
                nb,
                packed.as_ptr(),
                n,
                y,
                rows,
                r0,
                r1,
            )
        };
        return;
    }
    let rt = (TILE_BYTES / (64 * nb).max(1)).clamp(2, 16);
    let ts = ty.type_size();
    TILE.with(|cell| {
        let (codes, dw, mw) = &mut *cell.borrow_mut();
        // Grown only: matrices of other widths reuse the buffers as they are.
        if codes.len() < rt * nb {
            codes.resize(rt * nb, Unit([0; 64]));
            dw.resize(rt * nb, 0.0);
            mw.resize(rt * nb, 0.0);
        }
        let (cp, dp, mp) = (
            codes.as_mut_ptr().cast::<u8>(),
            dw.as_mut_ptr(),
            mw.as_mut_ptr(),
        );
        let mut t0 = r0;
        while t0 < r1 {
            let t1 = (t0 + rt).min(r1);
            for r in t0..t1 {
                let o = (r - t0) * nb;
                // SAFETY: row r is inside `w`; the buffers hold rt·nb units and scales, and
                // o + nb <= rt·nb; the CPU has the path's features (the caller's contract).
                unsafe {
                    let wr = w.as_ptr().add(r * row_bytes);
                    let (c, d, m) = (cp.add(64 * o), dp.add(o), mp.add(o));
                    unpack(kind, wr, ts, nb, c, d, m);
                }
            }
            // SAFETY: the tile holds t1 − t0 unpacked rows; `packed`, `y` and the rows
            // written are the caller's contract.
            unsafe {
                let (c, d, m, nt) = (cp.cast_const(), dp.cast_const(), mp.cast_const(), t1 - t0);
                tile_rows(
                    kind.mins(),
                    c,
                    d,
                    m,
                    nt,
                    nb,
                    packed.as_ptr(),
                    n,
                    y,
                    rows,
                    t0,
                );
            }
            t0 = t1;
        }
    })
}
