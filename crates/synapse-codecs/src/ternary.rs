//! BitNet b1.58 ternary codecs: `syn.ternary.absmean.g{group}.v1` and
//! `syn.ternary.absmean.tensor.v1`.
//!
//! Both use BitNet b1.58's absmean rule (Ma et al. 2024, eq. 1–3, as in the reference
//! `weight_quant`): `γ = max(mean|W|, 1e-5)`, `q = clamp(round(W/γ), −1, 1)`, `Ŵ = q·γ`. The codes
//! are the 2-bit biased codes of the symmetric family with `bits = 2`: `u = q + 2`, so
//! `01 = −1`, `10 = 0`, `11 = +1`, and `00` is reserved ([`CodecError::ReservedCode`]). Four
//! codes per byte, LSB-first.
//!
//! * **Per group** (`g64` is the BitNet member): the group layout is exactly that of
//!   `syn.q2.symmetric.g{group}.v1` (2-byte FP16 `γ` then `group/4` bytes of codes); only the
//!   encoder's scale rule differs. γ is the mean over the group's real elements, rounded to FP16,
//!   and the FP16 value is the one used to quantize. For g64: 64·2 bits of codes + 16 bits of
//!   scale = 144 bits per 64 weights = **2.25 bits/weight**. Partial groups are padded with
//!   `u = 10` (value 0).
//! * **Per tensor** (BitNet's training quantizer, for importing BF16 masters): a 4-byte
//!   little-endian f32 `γ` over the whole tensor, then the codes of all `rows·cols` elements
//!   flat and row-major (rows are *not* padded), the final byte padded with `u = 10`.
//!
//! `linear`/`dot` are addition-only: per weight they add or subtract `x_i` (or skip it); the
//! scale is applied once per group (once per row for the tensor codec).

use half::f16;

use crate::codec::{self, Codec, GroupRule, check_finite, check_len, elements};
use crate::error::{CodecError, Result};
use crate::id::EncodingId;
use crate::pack;
use crate::scale;

/// BitNet's lower clamp on the absmean scale.
pub const ABSMEAN_EPS: f64 = 1e-5;

const ZERO_CODE: u8 = 0b10;

fn absmean(xs: &[f32]) -> f64 {
    if xs.is_empty() {
        return ABSMEAN_EPS;
    }
    let s: f64 = xs.iter().map(|v| f64::from(v.abs())).sum();
    (s / xs.len() as f64).max(ABSMEAN_EPS)
}

#[inline]
fn ternary_code(x: f32, inv: f64) -> u8 {
    ((f64::from(x) * inv).round().clamp(-1.0, 1.0) as i32 + 2) as u8
}

/// Addition-only `Σ q_i x_i` for ternary codes (`01 = −1`, `10 = 0`, `11 = +1`): each `x_i` is
/// added with its sign bit flipped for −1 and masked to +0 for 0 — no multiplications.
#[inline]
fn add_only(codes: &[u8], xs: &[f32]) -> f32 {
    #[inline(always)]
    fn signed(c: u8, x: f32) -> f32 {
        let neg = u32::from(c == 1) << 31;
        let keep = 0u32.wrapping_sub(u32::from(c != 2));
        f32::from_bits((x.to_bits() ^ neg) & keep)
    }
    let mut acc = [0.0f32; 8];
    let mut cc = codes.chunks_exact(8);
    let mut xc = xs.chunks_exact(8);
    for (c, x) in (&mut cc).zip(&mut xc) {
        for l in 0..8 {
            acc[l] += signed(c[l], x[l]);
        }
    }
    let mut tail = 0.0f32;
    for (&c, &x) in cc.remainder().iter().zip(xc.remainder()) {
        tail += signed(c, x);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

fn check_codes(codes: &[u8], base: usize) -> Result<()> {
    match codes.iter().position(|&u| u == 0) {
        Some(i) => Err(CodecError::ReservedCode { index: base + i }),
        None => Ok(()),
    }
}

/// Ternary absmean with one FP16 scale per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TernaryGroup {
    group: usize,
}

impl TernaryGroup {
    /// Builds from parameters already validated by [`EncodingId::parse`].
    pub(crate) fn from_parts(group: usize) -> Self {
        TernaryGroup { group }
    }

    /// Builds the codec (group validated as the ID grammar does; 64 is BitNet's).
    pub fn new(group: usize) -> Result<Self> {
        EncodingId::parse(&EncodingId::TernaryGroup { group }.to_string())?;
        Ok(TernaryGroup { group })
    }

    fn scale_at(&self, bytes: &[u8], group_index: usize) -> Result<f32> {
        let d = scale::read_f16(bytes);
        if !d.is_finite() || d.is_sign_negative() {
            return Err(CodecError::InvalidScale { group: group_index });
        }
        Ok(d.to_f32())
    }
}

impl GroupRule for TernaryGroup {
    fn group(&self) -> usize {
        self.group
    }

    fn group_bytes(&self) -> usize {
        2 + self.group / 4
    }

    fn encode_group(
        &self,
        xs: &[f32],
        gi: usize,
        codes: &mut [u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let gamma = absmean(xs);
        let d = f16::from_f64(gamma);
        if !d.is_finite() {
            return Err(CodecError::ScaleOutOfRange {
                group: gi,
                needed: gamma,
            });
        }
        let inv = 1.0 / d.to_f64();
        codes.fill(ZERO_CODE);
        for (c, &x) in codes.iter_mut().zip(xs) {
            *c = ternary_code(x, inv);
        }
        out.extend_from_slice(&d.to_le_bytes());
        pack::pack(codes, 2, out);
        Ok(())
    }

    fn decode_group(
        &self,
        bytes: &[u8],
        out: &mut [f32],
        base: usize,
        gi: usize,
        codes: &mut [u8],
    ) -> Result<()> {
        let d = self.scale_at(bytes, gi)?;
        pack::unpack(&bytes[2..], 2, codes);
        check_codes(&codes[..out.len()], base)?;
        for (o, &u) in out.iter_mut().zip(codes.iter()) {
            *o = (i32::from(u) - 2) as f32 * d;
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
        let d = self.scale_at(bytes, gi)?;
        pack::unpack(&bytes[2..], 2, codes);
        let live = &codes[..xs.len()];
        check_codes(live, base)?;
        Ok(d * add_only(live, xs))
    }
}

impl Codec for TernaryGroup {
    fn id(&self) -> EncodingId {
        EncodingId::TernaryGroup { group: self.group }
    }

    fn matrix_size(&self, rows: usize, cols: usize) -> Result<usize> {
        codec::grouped_size(self, rows, cols)
    }

    fn encode_matrix(&self, w: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>> {
        codec::grouped_encode(self, w, rows, cols)
    }

    fn decode_matrix(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
        codec::grouped_decode(self, bytes, rows, cols)
    }

    fn decode_matrix_into(
        &self,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        out: &mut [f32],
    ) -> Result<()> {
        codec::grouped_decode_into(self, bytes, rows, cols, out)
    }

    fn linear(&self, bytes: &[u8], rows: usize, x: &[f32], y: &mut [f32]) -> Result<()> {
        codec::grouped_linear(self, bytes, rows, x, y)
    }
}

/// Ternary absmean with one f32 scale for the whole tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TernaryTensor;

impl TernaryTensor {
    /// `w` (a whole `rows × cols` tensor, row-major) ternarised as BitNet's training
    /// quantizer runs in transformers (`WeightQuant`): in f32, `s = 1 / max(mean|w|, 1e-5)`,
    /// `t = clamp(round_half_even(w·s), −1, 1)`, value `t / s` — the encoding of a
    /// W1.58A8 checkpoint's projections, whose outputs must follow transformers' arithmetic.
    /// ([`Codec::encode_matrix`] is this codec's own rule: the mean and the division in f64.)
    /// Same layout; `γ = 1 / s` is stored.
    pub fn encode_bitnet_weight_quant(w: &[f32]) -> Result<Vec<u8>> {
        check_finite(w)?;
        let sum: f64 = w.iter().map(|v| f64::from(v.abs())).sum();
        let mean = if w.is_empty() {
            0.0
        } else {
            (sum / w.len() as f64) as f32
        };
        let s = 1.0 / mean.max(ABSMEAN_EPS as f32);
        Ok(Self::pack(1.0 / s, w, |x| {
            ((x * s).round_ties_even().clamp(-1.0, 1.0) as i32 + 2) as u8
        }))
    }

    /// BitNet's offline packed projection (transformers' `pack_weights`, the layout of
    /// microsoft/bitnet-b1.58-2B-4T's release) in this codec's layout: `packed` is
    /// `[⌈rows/4⌉, cols]` bytes, output row `i·R + r` (`R = ⌈rows/4⌉`) in bits `2i` of packed
    /// row `r` as the code `t + 1`, and the weights are `t / weight_scale`; so `γ = 1 /
    /// weight_scale`. A code 3 is [`CodecError::ReservedCode`] (at its row-major element), a
    /// scale that is not finite and positive [`CodecError::InvalidScale`].
    pub fn from_bitnet_packed(
        packed: &[u8],
        weight_scale: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<u8>> {
        let n = elements(rows, cols)?;
        let r4 = rows.div_ceil(4);
        check_len("packed bytes, four rows a byte", r4 * cols, packed.len())?;
        if !(weight_scale.is_finite() && weight_scale > 0.0) {
            return Err(CodecError::InvalidScale { group: 0 });
        }
        let mut out = vec![0u8; 4 + n.div_ceil(4)];
        out[..4].copy_from_slice(&(1.0 / weight_scale).to_le_bytes());
        for r in 0..rows {
            let (i, pr) = (r / r4, r % r4);
            for (c, &b) in packed[pr * cols..(pr + 1) * cols].iter().enumerate() {
                let code = (b >> (2 * i)) & 3;
                let k = r * cols + c;
                if code == 3 {
                    return Err(CodecError::ReservedCode { index: k });
                }
                out[4 + k / 4] |= (code + 1) << (2 * (k % 4));
            }
        }
        Self::pad_zero(&mut out, n);
        Ok(out)
    }

    /// bitnet.cpp's I2_S tensor (its x86 layout: per 128 row-major elements 32 bytes, byte
    /// `m` holding element `32·g + m` in bits `6 − 2g` as the code `t + 1`; after the
    /// `rows·cols/4` code bytes the f32 scale `s`, the weights `t · s`; bytes after the scale
    /// are ignored) in this codec's layout (`γ = s`). Too few bytes or an element count that
    /// is not a multiple of 128 is [`CodecError::LengthMismatch`], a code 3
    /// [`CodecError::ReservedCode`], a scale that is not finite and non-negative
    /// [`CodecError::InvalidScale`].
    pub fn from_i2s(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
        let n = elements(rows, cols)?;
        check_len(
            "I2_S elements (whole 128-element blocks)",
            n.next_multiple_of(128),
            n,
        )?;
        if bytes.len() < n / 4 + 4 {
            return Err(CodecError::LengthMismatch {
                what: "I2_S bytes (codes and a 4-byte scale)",
                expected: n / 4 + 4,
                actual: bytes.len(),
            });
        }
        let s = f32::from_le_bytes([
            bytes[n / 4],
            bytes[n / 4 + 1],
            bytes[n / 4 + 2],
            bytes[n / 4 + 3],
        ]);
        if !(s.is_finite() && s >= 0.0) {
            return Err(CodecError::InvalidScale { group: 0 });
        }
        let mut out = vec![0u8; 4 + n / 4];
        out[..4].copy_from_slice(&s.to_le_bytes());
        for (b, block) in bytes[..n / 4].chunks_exact(32).enumerate() {
            for (m, &byte) in block.iter().enumerate() {
                for g in 0..4 {
                    let code = (byte >> (6 - 2 * g)) & 3;
                    let k = 128 * b + 32 * g + m;
                    if code == 3 {
                        return Err(CodecError::ReservedCode { index: k });
                    }
                    out[4 + k / 4] |= (code + 1) << (2 * (k % 4));
                }
            }
        }
        Ok(out)
    }

    /// The zero code in the padding after element `n` of the last byte.
    fn pad_zero(out: &mut [u8], n: usize) {
        for k in n..(out.len() - 4) * 4 {
            out[4 + k / 4] |= ZERO_CODE << (2 * (k % 4));
        }
    }

    /// The layout: `gamma` (f32 LE), then the codes `code(x)` four a byte, LSB first, the
    /// last byte padded with the zero code.
    fn pack(gamma: f32, w: &[f32], code: impl Fn(f32) -> u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + w.len().div_ceil(4));
        out.extend_from_slice(&gamma.to_le_bytes());
        for chunk in w.chunks(4) {
            let mut byte = 0u8;
            for j in 0..4 {
                byte |= chunk.get(j).map_or(ZERO_CODE, |&x| code(x)) << (2 * j);
            }
            out.push(byte);
        }
        out
    }

    fn gamma(bytes: &[u8]) -> Result<f32> {
        let g = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if !g.is_finite() || g.is_sign_negative() {
            return Err(CodecError::InvalidScale { group: 0 });
        }
        Ok(g)
    }

    /// Code of flat element `k` in the code area.
    #[inline]
    fn code(codes: &[u8], k: usize) -> u8 {
        (codes[k / 4] >> (2 * (k % 4))) & 3
    }

    fn unpack_range(codes: &[u8], start: usize, out: &mut [u8]) -> Result<()> {
        // Whole bytes through the packed fast path when the range starts on a byte boundary.
        let fast = if start.is_multiple_of(4) {
            let quads = out.len() / 4 * 4;
            let first = start / 4;
            pack::unpack(&codes[first..first + quads / 4], 2, &mut out[..quads]);
            quads
        } else {
            0
        };
        for (j, o) in out.iter_mut().enumerate().skip(fast) {
            *o = Self::code(codes, start + j);
        }
        check_codes(out, start)
    }
}

impl Codec for TernaryTensor {
    fn id(&self) -> EncodingId {
        EncodingId::TernaryTensor
    }

    fn matrix_size(&self, rows: usize, cols: usize) -> Result<usize> {
        let n = elements(rows, cols)?;
        Ok(4 + n.div_ceil(4))
    }

    fn encode_matrix(&self, w: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>> {
        check_len("matrix elements", elements(rows, cols)?, w.len())?;
        check_finite(w)?;
        let gamma = absmean(w) as f32;
        if !gamma.is_finite() {
            return Err(CodecError::ScaleOutOfRange {
                group: 0,
                needed: absmean(w),
            });
        }
        let inv = 1.0 / f64::from(gamma);
        Ok(Self::pack(gamma, w, |x| ternary_code(x, inv)))
    }

    fn decode_matrix(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
        check_len("encoded bytes", self.matrix_size(rows, cols)?, bytes.len())?;
        let gamma = Self::gamma(bytes)?;
        let codes = &bytes[4..];
        let n = elements(rows, cols)?;
        let mut out = Vec::with_capacity(n);
        for k in 0..n {
            let u = Self::code(codes, k);
            if u == 0 {
                return Err(CodecError::ReservedCode { index: k });
            }
            out.push((i32::from(u) - 2) as f32 * gamma);
        }
        Ok(out)
    }

    fn linear(&self, bytes: &[u8], rows: usize, x: &[f32], y: &mut [f32]) -> Result<()> {
        let cols = x.len();
        check_len("output rows", rows, y.len())?;
        check_len("encoded bytes", self.matrix_size(rows, cols)?, bytes.len())?;
        let gamma = Self::gamma(bytes)?;
        let codes = &bytes[4..];
        let mut buf = [0u8; 1024];
        for (r, yr) in y.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for (c, xs) in x.chunks(1024).enumerate() {
                let start = r * cols + c * 1024;
                let live = &mut buf[..xs.len()];
                Self::unpack_range(codes, start, live)?;
                acc += add_only(live, xs);
            }
            *yr = gamma * acc;
        }
        Ok(())
    }
}
