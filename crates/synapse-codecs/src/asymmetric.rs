//! `syn.q{bits}.asymmetric.g{group}.v1`: FP16 scale and FP16 minimum per group, unsigned codes.
//!
//! Layout of one group (`4 + group·bits/8` bytes):
//!
//! | offset | size | content |
//! |---|---|---|
//! | 0 | 2 | scale `d`, binary16 LE, `+0` or positive finite |
//! | 2 | 2 | minimum `m`, binary16 LE, finite |
//! | 4 | `group·bits/8` | `group` codes `u ∈ [0, 2^bits − 1]`, packed LSB-first |
//!
//! The value is `x̂ = m + u·d` (computed in f32). Every code is valid (an affine range has no
//! symmetric "most negative" code to reserve). Rule: `m` is the largest FP16 `≤ min x`; `d` the
//! smallest FP16 with `d·(2^bits − 1) ≥ max x − m`; `u = round_half_away((x − m)/d)`. So
//! `|x − x̂| ≤ d/2` up to the one f32 rounding of `m + u·d`. A last partial group is padded with
//! `u = 0`; decoders ignore padding codes.

use half::f16;

use crate::codec::{self, Codec, GroupRule, dot_codes};
use crate::error::{CodecError, Result};
use crate::id::EncodingId;
use crate::pack;
use crate::scale;

/// The asymmetric (zero-point) group codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asymmetric {
    bits: u32,
    group: usize,
}

impl Asymmetric {
    /// Builds from parameters already validated by [`EncodingId::parse`].
    pub(crate) fn from_parts(bits: u32, group: usize) -> Self {
        Asymmetric { bits, group }
    }

    /// Builds the codec, validating `bits` and `group` as the ID grammar does.
    pub fn new(bits: u32, group: usize) -> Result<Self> {
        EncodingId::asymmetric(bits, group)?;
        Ok(Asymmetric { bits, group })
    }

    fn umax(&self) -> u32 {
        (1 << self.bits) - 1
    }

    fn header(&self, bytes: &[u8], group_index: usize) -> Result<(f32, f32)> {
        let d = scale::read_f16(bytes);
        let m = scale::read_f16(&bytes[2..]);
        if !d.is_finite() || d.is_sign_negative() || !m.is_finite() {
            return Err(CodecError::InvalidScale { group: group_index });
        }
        Ok((d.to_f32(), m.to_f32()))
    }
}

impl GroupRule for Asymmetric {
    fn group(&self) -> usize {
        self.group
    }

    fn group_bytes(&self) -> usize {
        4 + self.group * self.bits as usize / 8
    }

    fn encode_group(
        &self,
        xs: &[f32],
        gi: usize,
        codes: &mut [u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let (mn, mx) = xs
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        codes.fill(0);
        let (d, m) = if xs.is_empty() {
            (f16::ZERO, f16::ZERO)
        } else {
            let m = scale::floor_f16(f64::from(mn), gi)?;
            let span = f64::from(mx) - m.to_f64();
            let umax = f64::from(self.umax());
            let d = if span == 0.0 {
                f16::ZERO
            } else {
                scale::smallest_covering(span, umax, gi)?
            };
            if d.to_f64() > 0.0 {
                let inv = 1.0 / d.to_f64();
                let mf = m.to_f64();
                for (c, &x) in codes.iter_mut().zip(xs) {
                    *c = ((f64::from(x) - mf) * inv).round().clamp(0.0, umax) as u8;
                }
            }
            (d, m)
        };
        out.extend_from_slice(&d.to_le_bytes());
        out.extend_from_slice(&m.to_le_bytes());
        pack::pack(codes, self.bits, out);
        Ok(())
    }

    fn decode_group(
        &self,
        bytes: &[u8],
        out: &mut [f32],
        _base: usize,
        gi: usize,
        codes: &mut [u8],
    ) -> Result<()> {
        let (d, m) = self.header(bytes, gi)?;
        pack::unpack(&bytes[4..], self.bits, codes);
        for (o, &u) in out.iter_mut().zip(codes.iter()) {
            *o = f32::from(u) * d + m;
        }
        Ok(())
    }

    fn dot_group(
        &self,
        bytes: &[u8],
        xs: &[f32],
        _base: usize,
        gi: usize,
        codes: &mut [u8],
    ) -> Result<f32> {
        let (d, m) = self.header(bytes, gi)?;
        pack::unpack(&bytes[4..], self.bits, codes);
        let sum_x: f32 = xs.iter().sum();
        Ok(d * dot_codes(&codes[..xs.len()], 0.0, xs) + m * sum_x)
    }
}

impl Codec for Asymmetric {
    fn id(&self) -> EncodingId {
        EncodingId::Asymmetric {
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
