//! `syn.q{bits}.symmetric.g{group}.v1`: one FP16 scale per group, symmetric biased codes.
//!
//! Layout of one group (`2 + group·bits/8` bytes):
//!
//! | offset | size | content |
//! |---|---|---|
//! | 0 | 2 | scale `d`, IEEE-754 binary16, little-endian, `+0` or positive finite |
//! | 2 | `group·bits/8` | `group` codes of `bits` bits, packed LSB-first (see [`crate::pack`]) |
//!
//! A code `u` stores `q = u − 2^(bits−1)`; the encoder emits `q ∈ [−qmax, qmax]` with
//! `qmax = 2^(bits−1) − 1`, so `u ∈ [1, 2^bits − 1]`. The code `u = 0` (the most negative `q`)
//! is reserved: no encoder emits it and decoding it is [`CodecError::ReservedCode`]. The value
//! is `x̂ = q · d`.
//!
//! Scale rule: `d` is the smallest FP16 with `d · qmax ≥ max|x|` (so after FP16 rounding every
//! element is still inside the code range), `q = round_half_away(x / d)`. This guarantees
//! `|x − x̂| ≤ d/2` exactly. An all-zero group stores `d = +0` and every code `u = 2^(bits−1)`.
//! A last partial group is padded to `group` elements with `u = 2^(bits−1)` (value 0); decoders
//! ignore padding codes.

use half::f16;

use crate::codec::{self, Codec, GroupRule, dot_codes};
use crate::error::{CodecError, Result};
use crate::id::EncodingId;
use crate::pack;
use crate::scale;

/// The symmetric group codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symmetric {
    bits: u32,
    group: usize,
}

impl Symmetric {
    /// Builds from parameters already validated by [`EncodingId::parse`].
    pub(crate) fn from_parts(bits: u32, group: usize) -> Self {
        Symmetric { bits, group }
    }

    /// Builds the codec, validating `bits` and `group` as the ID grammar does.
    pub fn new(bits: u32, group: usize) -> Result<Self> {
        EncodingId::symmetric(bits, group)?;
        Ok(Symmetric { bits, group })
    }

    /// Largest code magnitude `2^(bits−1) − 1`.
    pub fn qmax(&self) -> i32 {
        (1 << (self.bits - 1)) - 1
    }

    fn bias(&self) -> u8 {
        1 << (self.bits - 1)
    }

    fn scale_at(&self, bytes: &[u8], group_index: usize) -> Result<f32> {
        let d = scale::read_f16(bytes);
        if !d.is_finite() || d.is_sign_negative() {
            return Err(CodecError::InvalidScale { group: group_index });
        }
        Ok(d.to_f32())
    }

    /// Unpacks a group's codes into `codes` and returns the first `n`, refusing reserved ones.
    fn live_codes<'a>(
        &self,
        bytes: &[u8],
        codes: &'a mut [u8],
        n: usize,
        base: usize,
    ) -> Result<&'a [u8]> {
        pack::unpack(&bytes[2..], self.bits, codes);
        let codes: &'a [u8] = codes;
        let live = &codes[..n];
        if let Some(i) = live.iter().position(|&u| u == 0) {
            return Err(CodecError::ReservedCode { index: base + i });
        }
        Ok(live)
    }
}

impl GroupRule for Symmetric {
    fn group(&self) -> usize {
        self.group
    }

    fn group_bytes(&self) -> usize {
        2 + self.group * self.bits as usize / 8
    }

    fn encode_group(
        &self,
        xs: &[f32],
        gi: usize,
        codes: &mut [u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let qmax = self.qmax();
        codes.fill(self.bias());
        let d = if amax == 0.0 {
            f16::ZERO
        } else {
            let d = scale::smallest_covering(f64::from(amax), f64::from(qmax), gi)?;
            let inv = 1.0 / d.to_f64();
            let bias = i32::from(self.bias());
            for (c, &x) in codes.iter_mut().zip(xs) {
                let q = (f64::from(x) * inv)
                    .round()
                    .clamp(-f64::from(qmax), f64::from(qmax)) as i32;
                *c = (q + bias) as u8;
            }
            d
        };
        out.extend_from_slice(&d.to_le_bytes());
        pack::pack(codes, self.bits, out);
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
        let live = self.live_codes(bytes, codes, out.len(), base)?;
        let bias = i32::from(self.bias());
        for (o, &u) in out.iter_mut().zip(live) {
            *o = (i32::from(u) - bias) as f32 * d;
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
        let live = self.live_codes(bytes, codes, xs.len(), base)?;
        Ok(d * dot_codes(live, f32::from(self.bias()), xs))
    }
}

impl Codec for Symmetric {
    fn id(&self) -> EncodingId {
        EncodingId::Symmetric {
            bits: self.bits,
            group: self.group,
        }
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
