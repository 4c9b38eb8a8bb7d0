//! [`TernaryTlMatrix`]: BitNet's W1.58A8 by table lookup (`kernels::ternary_tl`), beside the
//! 2-bit multiply-add packing [`QuantMatrix::from_ternary_a8`] runs — the two ternary kernels
//! the BitNet issue asks to measure side by side (`examples/kbench_a8.rs`). Same inputs, same
//! exact integer sums, same output bits; 1.67 bits a weight instead of 2.

use crate::act::{ActKind, BlockQ8K, quantize_rows};

/// Bytes of a quantised input block (`d`, `qs[256]`, `bsums`).
const AK: usize = std::mem::size_of::<BlockQ8K>();
use crate::buf::AlignedBuf;
use crate::kernels::ternary_tl::{self, TILE, TlLayout};
use crate::matrix::SyncPtr;
use crate::{KernelCtx, KernelError, QuantMatrix, Result};

/// A `syn.ternary.absmean.tensor.v1` matrix packed for table lookup (5 bits per 3 trits) and
/// run as BitNet b1.58's W1.58A8, as [`QuantMatrix::from_ternary_a8`] runs it.
#[derive(Clone)]
pub struct TernaryTlMatrix {
    layout: TlLayout,
    gamma: f32,
    data: AlignedBuf,
}

impl TernaryTlMatrix {
    /// Packs a `syn.ternary.absmean.tensor.v1` matrix (`bytes` validated as
    /// [`QuantMatrix::from_ternary_a8`] does); `cols` must be a multiple of 256 (the input
    /// quantisation's block).
    pub fn from_ternary_a8(bytes: &[u8], rows: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(256) {
            return Err(KernelError::BadArgument {
                op: "TernaryTlMatrix::from_ternary_a8",
                msg: format!("cols {cols} is not a multiple of 256"),
            });
        }
        // Validation (sizes, no reserved code) as the 2-bit packing's; its matrix is not kept.
        QuantMatrix::from_ternary_a8(bytes, rows, cols)?;
        let gamma = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        // The validated codes `t + 2` of element `k` in bits `2(k mod 4)` of byte `4 + k/4`.
        let trit = |r: usize, k: usize| {
            let e = r * cols + k;
            ((bytes[4 + e / 4] >> (2 * (e % 4))) & 3) as i8 - 2
        };
        let layout = TlLayout::new(rows, cols);
        let packed = ternary_tl::pack(layout, trit);
        Ok(Self {
            layout,
            gamma,
            data: AlignedBuf::from_bytes(&packed),
        })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.layout.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.layout.cols
    }

    /// The packed bytes (read once per call).
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// Bytes of the packed weights.
    pub fn weight_bytes(&self) -> usize {
        self.data.as_bytes().len()
    }

    /// `y = W·x` for `n` rows of `x` (`n × cols`), `y` `n × rows`: each input row quantised
    /// to 8 bits as [`QuantMatrix::from_ternary_a8`] does, its tables built (split over the
    /// context's threads), then tiles of 64 weight rows over the threads.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32], ctx: &mut KernelCtx) -> Result<()> {
        let (rows, cols) = (self.layout.rows, self.layout.cols);
        if x.len() != n * cols || y.len() != n * rows {
            return Err(KernelError::BadArgument {
                op: "TernaryTlMatrix::matmul",
                msg: format!(
                    "x holds {} values and y {}, {n} rows of {cols} and {rows} expected",
                    x.len(),
                    y.len()
                ),
            });
        }
        let path = ctx.path();
        let (act, pack, pool) = ctx.parts2();
        let arb = ActKind::Q8KRow.row_bytes(cols);
        act.set_len(n * arb);
        quantize_rows(ActKind::Q8KRow, x, cols, act.as_bytes_mut());
        // Activation k of row t (zero past the row), and each row's d (block 0's) times γ.
        let a = act.as_bytes();
        let q = |t: usize, k: usize| {
            if k < cols {
                a[t * arb + (k / 256) * AK + 4 + k % 256] as i8
            } else {
                0
            }
        };
        let scale = |t: usize| {
            let b = t * arb;
            f32::from_le_bytes([a[b], a[b + 1], a[b + 2], a[b + 3]]) * self.gamma
        };
        let lb = self.layout.lut_bytes();
        let groups = 2 * self.layout.pairs;
        pack.set_len(n * lb);
        let lut_ptr = SyncPtr(pack.as_bytes_mut().as_mut_ptr());
        pool.run_rows(n * groups, 64, n * groups * 64, &|i0, i1| {
            let mut i = i0;
            while i < i1 {
                let (t, g0) = (i / groups, i % groups);
                let g1 = (g0 + (i1 - i)).min(groups);
                // SAFETY: row t's tables, groups g0..g1: chunks are disjoint.
                let lut = unsafe { std::slice::from_raw_parts_mut(lut_ptr.get().add(t * lb), lb) };
                ternary_tl::build_lut(|k| q(t, k), g0, g1, lut);
                i += g1 - g0;
            }
        });
        let luts = pack.as_bytes();
        let w = self.data.as_bytes();
        let tb = self.layout.tile_bytes();
        let yp = SyncPtr(y.as_mut_ptr());
        let layout = self.layout;
        pool.run_rows(layout.tiles, 1, 2 * rows * cols * n, &|t0, t1| {
            let mut sums = [0i32; TILE];
            for tile in t0..t1 {
                for t in 0..n {
                    // SAFETY: the context's path is supported; whole tile and tables.
                    unsafe {
                        ternary_tl::tile_dot(
                            path,
                            layout,
                            &w[tile * tb..(tile + 1) * tb],
                            &luts[t * lb..(t + 1) * lb],
                            &mut sums,
                        )
                    };
                    for (j, s) in sums.iter().enumerate() {
                        let r = tile * TILE + j;
                        if r < rows {
                            // SAFETY: output (t, r) belongs to this tile's chunk alone.
                            unsafe { *yp.get().add(t * rows + r) = *s as f32 * scale(t) };
                        }
                    }
                }
            }
        });
        Ok(())
    }
}
