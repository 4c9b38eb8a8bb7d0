//! ggml's block types as target encodings: the legacy `ggml.q8_0.v1`, `ggml.q5_1.v1`,
//! `ggml.q5_0.v1`, `ggml.q4_1.v1`, `ggml.q4_0.v1` (32 elements a block) and the K-quants
//! `ggml.q6_k.v1`, `ggml.q5_k.v1`, `ggml.q4_k.v1` (256-element super-blocks, see
//! [`crate::ggml_k`]) — ggml's own byte layout (`block_q4_0` and friends in `ggml-common.h`),
//! encoded as ggml's reference quantizers (`quantize_row_q4_0_ref` …, what
//! `ggml_quantize_chunk` runs without an importance matrix) encode, bit for bit, and decoded
//! as ggml dequantizes. A matrix in one of them runs on the kernels' ggml paths, and a
//! profile of them is what llama.cpp itself can run. (Q3_K and Q2_K are left out: the
//! kernels run them in scalar code only.)
//!
//! Blocks (little-endian; `d`, `m` FP16):
//!
//! | type | bytes | layout | element `j` |
//! |---|---:|---|---|
//! | q8_0 | 34 | `d`, 32 × i8 `q` | `q_j · d` |
//! | q5_1 | 24 | `d`, `m`, u32 `qh`, 16 × u8 `qs` | `(lo_j ∣ hi_j ≪ 4) · d + m` |
//! | q5_0 | 22 | `d`, u32 `qh`, 16 × u8 `qs` | `((lo_j ∣ hi_j ≪ 4) − 16) · d` |
//! | q4_1 | 20 | `d`, `m`, 16 × u8 `qs` | `lo_j · d + m` |
//! | q4_0 | 18 | `d`, 16 × u8 `qs` | `(lo_j − 8) · d` |
//!
//! where for `j < 16` `lo_j` is the low nibble of `qs[j]` and for `j ≥ 16` the high nibble of
//! `qs[j − 16]`, and `hi_j` is bit `j` of `qh`. Rows must hold whole blocks (a multiple of 32
//! elements, 256 for the K-quants), as ggml requires. A stored scale or minimum that is NaN or infinite is refused
//! (a negative `d` is ggml's normal case for q4_0/q5_0: the value of largest magnitude maps to
//! code 0).

use half::f16;

use crate::codec::{self, Codec, GroupRule, check_finite, check_len, elements};
use crate::error::{CodecError, Result};
use crate::ggml_k::{self, QK_K};
use crate::id::EncodingId;

/// Elements per ggml legacy block.
pub const BLOCK: usize = 32;

/// One of ggml's block types with a SIMD kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlBlock {
    /// `block_q8_0`: 8-bit codes, one scale.
    Q8_0,
    /// `block_q5_1`: 5-bit codes, scale and minimum.
    Q5_1,
    /// `block_q5_0`: 5-bit codes, one scale.
    Q5_0,
    /// `block_q4_1`: 4-bit codes, scale and minimum.
    Q4_1,
    /// `block_q4_0`: 4-bit codes, one scale.
    Q4_0,
    /// `block_q6_K`: 6-bit codes, 16 8-bit sub-block scales, one FP16 scale.
    Q6K,
    /// `block_q5_K`: 5-bit codes, 8 6-bit sub-block scales and minimums, FP16 scale and minimum.
    Q5K,
    /// `block_q4_K`: 4-bit codes, 8 6-bit sub-block scales and minimums, FP16 scale and minimum.
    Q4K,
}

impl GgmlBlock {
    /// Every type, from most to fewest bits per weight (at equal bits the legacy type first).
    pub const ALL: [GgmlBlock; 8] = [
        GgmlBlock::Q8_0,
        GgmlBlock::Q6K,
        GgmlBlock::Q5_1,
        GgmlBlock::Q5_0,
        GgmlBlock::Q5K,
        GgmlBlock::Q4_1,
        GgmlBlock::Q4_0,
        GgmlBlock::Q4K,
    ];

    /// ggml's name (`q4_0`), as in the encoding ID `ggml.q4_0.v1`.
    pub fn name(self) -> &'static str {
        match self {
            GgmlBlock::Q8_0 => "q8_0",
            GgmlBlock::Q5_1 => "q5_1",
            GgmlBlock::Q5_0 => "q5_0",
            GgmlBlock::Q4_1 => "q4_1",
            GgmlBlock::Q4_0 => "q4_0",
            GgmlBlock::Q6K => "q6_k",
            GgmlBlock::Q5K => "q5_k",
            GgmlBlock::Q4K => "q4_k",
        }
    }

    /// The type named `name` (`q4_0`), if it is one of these.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlBlock::Q8_0 => 34,
            GgmlBlock::Q5_1 => 24,
            GgmlBlock::Q5_0 => 22,
            GgmlBlock::Q4_1 => 20,
            GgmlBlock::Q4_0 => 18,
            GgmlBlock::Q6K => 210,
            GgmlBlock::Q5K => 176,
            GgmlBlock::Q4K => 144,
        }
    }

    /// Elements of one block: 32, or 256 for the K-quants.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlBlock::Q6K | GgmlBlock::Q5K | GgmlBlock::Q4K => QK_K,
            _ => BLOCK,
        }
    }

    /// Stored bits per weight (`8 · block bytes / block elements`).
    pub fn bits_per_weight(self) -> f64 {
        (8 * self.block_bytes()) as f64 / self.block_elems() as f64
    }
}

/// The codec of one ggml block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlLegacy {
    ty: GgmlBlock,
}

impl GgmlLegacy {
    /// The codec of `ty`.
    pub fn new(ty: GgmlBlock) -> Self {
        GgmlLegacy { ty }
    }

    /// Its ggml type.
    pub fn block(&self) -> GgmlBlock {
        self.ty
    }

    fn check_cols(&self, cols: usize) -> Result<()> {
        let block = self.ty.block_elems();
        if cols.is_multiple_of(block) {
            Ok(())
        } else {
            Err(CodecError::PartialBlock {
                id: self.id().to_string(),
                cols,
                block,
            })
        }
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// The FP16 at byte `at` of group `gi`'s bytes; a NaN or infinite one is refused.
pub(crate) fn read_f16(b: &[u8], at: usize, gi: usize) -> Result<f32> {
    let v = f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    if v.is_finite() {
        Ok(v)
    } else {
        Err(CodecError::InvalidScale { group: gi })
    }
}

/// The value of largest magnitude (the first such, keeping its sign), as ggml's q4_0/q5_0
/// quantizers find it.
fn signed_max(xs: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xs {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(xs: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xs {
        min = min.min(v);
        max = max.max(v);
    }
    (min, max)
}

/// C's `(int8_t)` / `(uint8_t)` of a value known to lie in `[0, 32)`: truncation.
fn trunc(v: f32) -> u8 {
    v as u8
}

/// A block's codes `q(x_j)` appended in ggml's layout: for 5-bit codes the fifth bits first
/// (`qh`, bit `j` of element `j`), then the low nibbles, element `j` and `j + 16` sharing byte
/// `j`.
fn pack(xs: &[f32], q: impl Fn(f32) -> u8, five: bool, out: &mut Vec<u8>) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let (a, b) = (q(xs[j]), q(xs[16 + j]));
        qs[j] = (a & 0x0F) | ((b & 0x0F) << 4);
        qh |= u32::from((a & 0x10) >> 4) << j;
        qh |= u32::from((b & 0x10) >> 4) << (j + 16);
    }
    if five {
        out.extend_from_slice(&qh.to_le_bytes());
    }
    out.extend_from_slice(&qs);
}

impl GroupRule for GgmlLegacy {
    fn group(&self) -> usize {
        self.ty.block_elems()
    }

    fn group_bytes(&self) -> usize {
        self.ty.block_bytes()
    }

    fn encode_group(
        &self,
        xs: &[f32],
        _gi: usize,
        _codes: &mut [u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        // Whole blocks only (checked by the caller).
        debug_assert_eq!(xs.len(), self.ty.block_elems());
        let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
        match self.ty {
            GgmlBlock::Q8_0 => {
                let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = inv(d);
                out.extend_from_slice(&f16_bytes(d));
                out.extend(xs.iter().map(|&v| (v * id).round() as i8 as u8));
            }
            GgmlBlock::Q4_0 | GgmlBlock::Q5_0 => {
                let five = self.ty == GgmlBlock::Q5_0;
                let (neg, top, half) = if five {
                    (-16.0, 31u8, 16.5f32)
                } else {
                    (-8.0, 15u8, 8.5f32)
                };
                let d = signed_max(xs) / neg;
                let id = inv(d);
                out.extend_from_slice(&f16_bytes(d));
                pack(xs, |v| trunc(v * id + half).min(top), five, out);
            }
            GgmlBlock::Q4_1 | GgmlBlock::Q5_1 => {
                let five = self.ty == GgmlBlock::Q5_1;
                let (min, max) = min_max(xs);
                let d = (max - min) / if five { 31.0 } else { 15.0 };
                let id = inv(d);
                out.extend_from_slice(&f16_bytes(d));
                out.extend_from_slice(&f16_bytes(min));
                let q = |v: f32| {
                    let c = trunc((v - min) * id + 0.5);
                    // q4_1 clamps as ggml does; q5_1's codes need no clamp there.
                    if five { c } else { c.min(15) }
                };
                pack(xs, q, five, out);
            }
            GgmlBlock::Q6K => ggml_k::encode_q6k(xs, out),
            GgmlBlock::Q5K | GgmlBlock::Q4K => {
                ggml_k::encode_q45k(xs, self.ty == GgmlBlock::Q5K, out)
            }
        }
        Ok(())
    }

    fn decode_group(
        &self,
        b: &[u8],
        out: &mut [f32],
        _base: usize,
        gi: usize,
        _codes: &mut [u8],
    ) -> Result<()> {
        match self.ty {
            GgmlBlock::Q6K => return ggml_k::decode_q6k(b, out, gi),
            GgmlBlock::Q5K | GgmlBlock::Q4K => {
                return ggml_k::decode_q45k(b, self.ty == GgmlBlock::Q5K, out, gi);
            }
            _ => {}
        }
        let d = read_f16(b, 0, gi)?;
        match self.ty {
            GgmlBlock::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                    *o = f32::from(q as i8) * d;
                }
            }
            GgmlBlock::Q4_0 | GgmlBlock::Q5_0 | GgmlBlock::Q4_1 | GgmlBlock::Q5_1 => {
                let (affine, five) = match self.ty {
                    GgmlBlock::Q4_0 => (false, false),
                    GgmlBlock::Q5_0 => (false, true),
                    GgmlBlock::Q4_1 => (true, false),
                    _ => (true, true),
                };
                let m = if affine { read_f16(b, 2, gi)? } else { 0.0 };
                let mut at = if affine { 4 } else { 2 };
                let qh = if five {
                    let v = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                    at += 4;
                    v
                } else {
                    0
                };
                let qs = &b[at..at + 16];
                for (j, o) in out.iter_mut().enumerate() {
                    let lo = if j < 16 {
                        qs[j] & 0x0F
                    } else {
                        qs[j - 16] >> 4
                    };
                    let hi = ((qh >> j) & 1) as u8;
                    let q = i32::from(lo | (hi << 4));
                    *o = if affine {
                        q as f32 * d + m
                    } else {
                        (q - if five { 16 } else { 8 }) as f32 * d
                    };
                }
            }
            GgmlBlock::Q6K | GgmlBlock::Q5K | GgmlBlock::Q4K => unreachable!("decoded above"),
        }
        Ok(())
    }

    fn dot_group(
        &self,
        bytes: &[u8],
        xs: &[f32],
        base: usize,
        gi: usize,
        codes: &mut [u8],
    ) -> Result<f32> {
        let mut w = [0.0f32; QK_K];
        self.decode_group(bytes, &mut w[..xs.len()], base, gi, codes)?;
        let mut acc = [0.0f32; 8];
        for (c, x) in w.chunks_exact(8).zip(xs.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += c[l] * x[l];
            }
        }
        Ok(((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])))
    }
}

impl Codec for GgmlLegacy {
    fn id(&self) -> EncodingId {
        EncodingId::Ggml(self.ty)
    }

    fn matrix_size(&self, rows: usize, cols: usize) -> Result<usize> {
        self.check_cols(cols)?;
        codec::grouped_size(self, rows, cols)
    }

    fn encode_matrix(&self, w: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>> {
        self.check_cols(cols)?;
        check_len("matrix elements", elements(rows, cols)?, w.len())?;
        check_finite(w)?;
        codec::grouped_encode(self, w, rows, cols)
    }

    fn decode_matrix(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
        self.check_cols(cols)?;
        codec::grouped_decode(self, bytes, rows, cols)
    }

    fn decode_matrix_into(
        &self,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_cols(cols)?;
        codec::grouped_decode_into(self, bytes, rows, cols, out)
    }

    fn linear(&self, bytes: &[u8], rows: usize, x: &[f32], y: &mut [f32]) -> Result<()> {
        self.check_cols(x.len())?;
        codec::grouped_linear(self, bytes, rows, x, y)
    }
}
