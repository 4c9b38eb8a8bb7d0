//! The published ternary packings transcoded into `syn.ternary.absmean.tensor.v1`:
//! transformers' offline packed BitNet weights and bitnet.cpp's I2_S, element for element,
//! with their refusals as typed errors.

use synapse_codecs::ternary::TernaryTensor;
use synapse_codecs::{Codec, CodecError};

/// bitnet.cpp's I2_S layout (its `quantize_i2_s`, x86: 128-element blocks of 32 bytes,
/// element `32·g + m` in bits `6 − 2g` of byte `m`, the f32 scale after the codes and 32
/// bytes of tail) in the codec's, decoded by the codec to `t · s`, and the refusals.
#[test]
fn i2s_transcodes_to_the_codec_layout() {
    let (rows, cols) = (2usize, 128usize);
    let n = rows * cols;
    let t: Vec<i8> = (0..n).map(|k| ((k * 5 + 1) % 3) as i8 - 1).collect();
    let mut bytes = vec![0u8; n / 4 + 32];
    for (k, &v) in t.iter().enumerate() {
        let (b, j) = (k / 128, k % 128);
        bytes[32 * b + j % 32] |= ((v + 1) as u8) << (6 - 2 * (j / 32));
    }
    bytes[n / 4..n / 4 + 4].copy_from_slice(&0.75f32.to_le_bytes());
    let out = TernaryTensor::from_i2s(&bytes, rows, cols).unwrap();
    assert_eq!(f32::from_le_bytes(out[..4].try_into().unwrap()), 0.75);
    let w = TernaryTensor.decode_matrix(&out, rows, cols).unwrap();
    for (k, &v) in t.iter().enumerate() {
        assert_eq!(w[k], f32::from(v) * 0.75, "element {k}");
    }
    // Element 32·3 + 5 of block 0 holds code 3.
    let mut bad = bytes.clone();
    bad[5] |= 0b0000_0011;
    assert_eq!(
        TernaryTensor::from_i2s(&bad, rows, cols),
        Err(CodecError::ReservedCode { index: 96 + 5 })
    );
    for s in [f32::NAN, -1.0, f32::INFINITY] {
        let mut bad = bytes.clone();
        bad[n / 4..n / 4 + 4].copy_from_slice(&s.to_le_bytes());
        assert_eq!(
            TernaryTensor::from_i2s(&bad, rows, cols),
            Err(CodecError::InvalidScale { group: 0 }),
            "scale {s}"
        );
    }
    assert!(matches!(
        TernaryTensor::from_i2s(&bytes[..n / 4 + 3], rows, cols),
        Err(CodecError::LengthMismatch { .. })
    ));
    assert!(matches!(
        TernaryTensor::from_i2s(&bytes, rows, 100),
        Err(CodecError::LengthMismatch { .. })
    ));
    assert!(matches!(
        TernaryTensor::from_i2s(&bytes, usize::MAX, 128),
        Err(CodecError::SizeOverflow { .. })
    ));
}

/// transformers' `pack_weights` layout in the codec's: a 6-row matrix (packed rows 2: rows
/// 0–1 in bits 0, 2–3 in bits 2, 4–5 in bits 4), decoded to `t / weight_scale`, and the
/// refusals.
#[test]
fn packed_bitnet_weights_transcode_to_the_codec_layout() {
    let (rows, cols) = (6usize, 3usize);
    let t: Vec<i8> = (0..rows * cols).map(|k| ((k * 7) % 3) as i8 - 1).collect();
    let r4 = rows.div_ceil(4);
    let mut packed = vec![0u8; r4 * cols];
    for r in 0..rows {
        for c in 0..cols {
            packed[(r % r4) * cols + c] |= ((t[r * cols + c] + 1) as u8) << (2 * (r / r4));
        }
    }
    let out = TernaryTensor::from_bitnet_packed(&packed, 4.0, rows, cols).unwrap();
    assert_eq!(f32::from_le_bytes(out[..4].try_into().unwrap()), 0.25);
    assert_eq!(out.len(), TernaryTensor.matrix_size(rows, cols).unwrap());
    let w = TernaryTensor.decode_matrix(&out, rows, cols).unwrap();
    for (k, &v) in t.iter().enumerate() {
        assert_eq!(w[k], f32::from(v) * 0.25, "element {k}");
    }
    // The last byte's padding holds the zero code.
    assert_eq!(out[4 + 4] >> 4, 0b1010);
    // Packed row 0, column 1 (row 0 in bits 0): element 1.
    let mut bad = packed.clone();
    bad[1] |= 3;
    assert_eq!(
        TernaryTensor::from_bitnet_packed(&bad, 4.0, rows, cols),
        Err(CodecError::ReservedCode { index: 1 })
    );
    for s in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(
            TernaryTensor::from_bitnet_packed(&packed, s, rows, cols),
            Err(CodecError::InvalidScale { group: 0 }),
            "scale {s}"
        );
    }
    assert!(matches!(
        TernaryTensor::from_bitnet_packed(&packed[1..], 4.0, rows, cols),
        Err(CodecError::LengthMismatch { .. })
    ));
}
