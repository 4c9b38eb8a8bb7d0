//! The `Codec` trait every encoding implements, and the row/group driver they share.
//!
//! A *matrix encoding* of a row-major `rows × cols` matrix is, for the grouped families, the
//! concatenation of each row's encoding: groups never straddle rows, so `linear` can walk a row
//! without looking at its neighbours, and a vector is simply a 1-row matrix. The per-tensor
//! ternary codec stores its one scale once, followed by the codes of the whole flat tensor.

use std::fmt;

use crate::error::{CodecError, Result};
use crate::id::{EncodingId, MAX_GROUP};

/// An encoding: encode, decode, exact size, and `linear`/`dot` straight from the encoded bytes.
pub trait Codec: Send + Sync + fmt::Debug {
    /// The ID of this codec (its `Display` is the canonical string).
    fn id(&self) -> EncodingId;

    /// Exact bytes of the encoding of a `rows × cols` matrix.
    fn matrix_size(&self, rows: usize, cols: usize) -> Result<usize>;

    /// Encodes a row-major `rows × cols` matrix. Non-finite values are refused.
    fn encode_matrix(&self, w: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>>;

    /// Decodes a matrix encoding back to row-major f32 (`rows · cols` values).
    fn decode_matrix(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>>;

    /// [`Codec::decode_matrix`] into `out` (`rows · cols` values). The grouped codecs decode
    /// without allocating (an embedding row looked up every decode step).
    fn decode_matrix_into(
        &self,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let v = self.decode_matrix(bytes, rows, cols)?;
        check_len("decode output", v.len(), out.len())?;
        out.copy_from_slice(&v);
        Ok(())
    }

    /// `y = W x` for the encoded `rows × x.len()` matrix `W`, without materialising `W`.
    fn linear(&self, bytes: &[u8], rows: usize, x: &[f32], y: &mut [f32]) -> Result<()>;

    /// Exact bytes of the encoding of an `n`-element vector.
    fn encoded_size(&self, n: usize) -> Result<usize> {
        self.matrix_size(1, n)
    }

    /// Encodes a vector (a 1-row matrix).
    fn encode(&self, x: &[f32]) -> Result<Vec<u8>> {
        self.encode_matrix(x, 1, x.len())
    }

    /// Decodes an `n`-element vector.
    fn decode(&self, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
        self.decode_matrix(bytes, 1, n)
    }

    /// The dot product of an encoded vector with `x` (of the same length).
    fn dot(&self, bytes: &[u8], x: &[f32]) -> Result<f32> {
        let mut y = [0.0f32];
        self.linear(bytes, 1, x, &mut y)?;
        Ok(y[0])
    }
}

/// Refuses NaN and infinities with the index of the first one.
pub(crate) fn check_finite(w: &[f32]) -> Result<()> {
    match w.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(CodecError::NonFinite {
            index,
            value: w[index],
        }),
        None => Ok(()),
    }
}

/// Checks `actual == expected`.
pub(crate) fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(CodecError::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

/// `rows · cols` with overflow reported as a typed error.
pub(crate) fn elements(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or(CodecError::SizeOverflow {
        elements: usize::MAX,
    })
}

/// One group of a grouped family: a fixed-size header (scales) followed by packed codes.
pub(crate) trait GroupRule: Send + Sync {
    /// Elements per group.
    fn group(&self) -> usize;
    /// Bytes per group (header plus codes).
    fn group_bytes(&self) -> usize;
    /// Appends the encoding of one group; `xs.len() ≤ group()`, the rest is padding. `codes` is
    /// scratch space of `group()` bytes.
    fn encode_group(
        &self,
        xs: &[f32],
        gi: usize,
        codes: &mut [u8],
        out: &mut Vec<u8>,
    ) -> Result<()>;
    /// Decodes the first `out.len()` elements of one group. `base` is the flat index of the
    /// group's first element (for error reports); `codes` is scratch of `group()` bytes.
    fn decode_group(
        &self,
        bytes: &[u8],
        out: &mut [f32],
        base: usize,
        gi: usize,
        codes: &mut [u8],
    ) -> Result<()>;
    /// `Σ x̂_i · xs_i` over the first `xs.len()` elements of one group (`codes`: scratch).
    fn dot_group(
        &self,
        bytes: &[u8],
        xs: &[f32],
        base: usize,
        gi: usize,
        codes: &mut [u8],
    ) -> Result<f32>;
}

/// Bytes of one row of `cols` elements.
pub(crate) fn row_bytes<R: GroupRule>(rule: &R, cols: usize) -> Result<usize> {
    cols.div_ceil(rule.group())
        .checked_mul(rule.group_bytes())
        .ok_or(CodecError::SizeOverflow { elements: cols })
}

pub(crate) fn grouped_size<R: GroupRule>(rule: &R, rows: usize, cols: usize) -> Result<usize> {
    row_bytes(rule, cols)?
        .checked_mul(rows)
        .ok_or(CodecError::SizeOverflow {
            elements: usize::MAX,
        })
}

pub(crate) fn grouped_encode<R: GroupRule>(
    rule: &R,
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<Vec<u8>> {
    check_len("matrix elements", elements(rows, cols)?, w.len())?;
    check_finite(w)?;
    let mut out = Vec::with_capacity(grouped_size(rule, rows, cols)?);
    if cols == 0 {
        return Ok(out);
    }
    // Stack scratch for one group's codes: no heap allocation in encode, decode or linear.
    let mut scratch_buf = [0u8; MAX_GROUP];
    let scratch = &mut scratch_buf[..rule.group()];
    for row in w.chunks_exact(cols) {
        for (g, xs) in row.chunks(rule.group()).enumerate() {
            rule.encode_group(xs, g, scratch, &mut out)?;
        }
    }
    Ok(out)
}

pub(crate) fn grouped_decode<R: GroupRule>(
    rule: &R,
    bytes: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>> {
    let n = elements(rows, cols)?;
    check_len(
        "encoded bytes",
        grouped_size(rule, rows, cols)?,
        bytes.len(),
    )?;
    let mut out = vec![0.0f32; n];
    grouped_decode_into(rule, bytes, rows, cols, &mut out)?;
    Ok(out)
}

pub(crate) fn grouped_decode_into<R: GroupRule>(
    rule: &R,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len(
        "encoded bytes",
        grouped_size(rule, rows, cols)?,
        bytes.len(),
    )?;
    check_len("decode output", elements(rows, cols)?, out.len())?;
    if cols == 0 {
        return Ok(());
    }
    let rb = row_bytes(rule, cols)?;
    let groups_per_row = cols.div_ceil(rule.group());
    // Stack scratch for one group's codes: no heap allocation in encode, decode or linear.
    let mut scratch_buf = [0u8; MAX_GROUP];
    let scratch = &mut scratch_buf[..rule.group()];
    for (r, (orow, brow)) in out
        .chunks_exact_mut(cols)
        .zip(bytes.chunks_exact(rb))
        .enumerate()
    {
        for (g, (o, b)) in orow
            .chunks_mut(rule.group())
            .zip(brow.chunks_exact(rule.group_bytes()))
            .enumerate()
        {
            rule.decode_group(
                b,
                o,
                r * cols + g * rule.group(),
                r * groups_per_row + g,
                scratch,
            )?;
        }
    }
    Ok(())
}

pub(crate) fn grouped_linear<R: GroupRule>(
    rule: &R,
    bytes: &[u8],
    rows: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let cols = x.len();
    check_len("output rows", rows, y.len())?;
    check_len(
        "encoded bytes",
        grouped_size(rule, rows, cols)?,
        bytes.len(),
    )?;
    if cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let rb = row_bytes(rule, cols)?;
    let groups_per_row = cols.div_ceil(rule.group());
    // Stack scratch for one group's codes: no heap allocation in encode, decode or linear.
    let mut scratch_buf = [0u8; MAX_GROUP];
    let scratch = &mut scratch_buf[..rule.group()];
    for (r, (yr, brow)) in y.iter_mut().zip(bytes.chunks_exact(rb)).enumerate() {
        let mut acc = 0.0f32;
        for (g, (xs, b)) in x
            .chunks(rule.group())
            .zip(brow.chunks_exact(rule.group_bytes()))
            .enumerate()
        {
            acc += rule.dot_group(
                b,
                xs,
                r * cols + g * rule.group(),
                r * groups_per_row + g,
                scratch,
            )?;
        }
        *yr = acc;
    }
    Ok(())
}

/// Eight-lane dot product of small integer codes (minus `bias`) with `xs`.
#[inline]
pub(crate) fn dot_codes(codes: &[u8], bias: f32, xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut cc = codes.chunks_exact(8);
    let mut xc = xs.chunks_exact(8);
    for (c, x) in (&mut cc).zip(&mut xc) {
        for l in 0..8 {
            acc[l] += (f32::from(c[l]) - bias) * x[l];
        }
    }
    let mut tail = 0.0f32;
    for (c, x) in cc.remainder().iter().zip(xc.remainder()) {
        tail += (f32::from(*c) - bias) * x;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}
