//! Properties, golden bytes and error paths of every codec family.

use proptest::prelude::*;
use synapse_codecs::{
    Codec, CodecError, EncodingId, PrecisionCandidates, codec_for, relative_distortion, resolve,
};

fn sym(bits: u32, group: usize) -> Box<dyn Codec> {
    codec_for(EncodingId::Symmetric { bits, group })
}

fn asym(bits: u32, group: usize) -> Box<dyn Codec> {
    codec_for(EncodingId::Asymmetric { bits, group })
}

/// FP16 scale of group `g` when every group starts with it (symmetric and ternary layouts).
fn scale_of(bytes: &[u8], group_bytes: usize, g: usize) -> f64 {
    let o = g * group_bytes;
    half::f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f64()
}

const GROUPS: [usize; 5] = [8, 24, 64, 256, 1024];

fn values(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        prop::collection::vec(-1.0f32..1.0, 1..max_len),
        prop::collection::vec(-1000.0f32..1000.0, 1..max_len),
        prop::collection::vec(-1e-3f32..1e-3, 1..max_len),
        // exact small integers hit rounding ties and exactly representable maxima
        prop::collection::vec((-16i32..=16).prop_map(|v| v as f32 * 0.5), 1..max_len),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `|x − x̂| ≤ d/2` with the stored (FP16-rounded) scale, every width and several groups.
    #[test]
    fn symmetric_error_within_half_scale(bits in 2u32..=8, gi in 0usize..GROUPS.len(), x in values(2100)) {
        let group = GROUPS[gi];
        let codec = sym(bits, group);
        let enc = codec.encode(&x).unwrap();
        let back = codec.decode(&enc, x.len()).unwrap();
        let gb = 2 + group * bits as usize / 8;
        for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
            let d = scale_of(&enc, gb, i / group);
            let err = (f64::from(a) - f64::from(b)).abs();
            prop_assert!(err <= d / 2.0, "bits {} group {} i {} x {} x̂ {} d {}", bits, group, i, a, b, d);
        }
    }

    /// Asymmetric: `|x − x̂| ≤ d/2` up to the one f32 rounding of `m + u·d`.
    #[test]
    fn asymmetric_error_within_half_scale(bits in 2u32..=8, gi in 0usize..GROUPS.len(), x in values(2100)) {
        let group = GROUPS[gi];
        let codec = asym(bits, group);
        let enc = codec.encode(&x).unwrap();
        let back = codec.decode(&enc, x.len()).unwrap();
        let gb = 4 + group * bits as usize / 8;
        for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
            let d = scale_of(&enc, gb, i / group);
            let err = (f64::from(a) - f64::from(b)).abs();
            let slack = f64::from(b.abs().max(a.abs())) * f64::from(f32::EPSILON);
            prop_assert!(err <= d / 2.0 + slack, "bits {} group {} i {} x {} x̂ {} d {}", bits, group, i, a, b, d);
        }
    }

    /// Data condition: at least 512 values drawn uniformly from [-1, 1) (a continuous
    /// distribution without atoms). The squared rounding error then averages ≈ d²/12 with a
    /// step d that shrinks by ≥ 2× per added bit, while the sampling noise of a 512-value mean
    /// is a few percent, so the measured distortion falls strictly with every added bit.
    /// (On data exactly representable at both widths — e.g. all values in {−a, 0, a} — both
    /// distortions are zero and the claim is "≤", which is why the condition is stated.)
    #[test]
    fn more_bits_strictly_lower_distortion(x in prop::collection::vec(-1.0f32..1.0, 512..1024), gi in 1usize..4) {
        let group = GROUPS[gi];
        let mut last = f64::INFINITY;
        for bits in 2u32..=8 {
            let c = sym(bits, group);
            let back = c.decode(&c.encode(&x).unwrap(), x.len()).unwrap();
            let dist = relative_distortion(&x, &back);
            prop_assert!(dist < last, "bits {} group {}: {} !< {}", bits, group, dist, last);
            last = dist;
        }
        let mut last = f64::INFINITY;
        for bits in 2u32..=8 {
            let c = asym(bits, group);
            let back = c.decode(&c.encode(&x).unwrap(), x.len()).unwrap();
            let dist = relative_distortion(&x, &back);
            prop_assert!(dist < last, "asym bits {} group {}: {} !< {}", bits, group, dist, last);
            last = dist;
        }
    }

    /// `linear` equals decode-then-matvec for every family. The reference is computed in f64
    /// from the decoded f32 weights (exact); `linear` sums in f32 in a different order, so by
    /// the standard bound |fl(Σ aᵢ) − Σ aᵢ| ≤ γₙ Σ|aᵢ| (γₙ ≈ n·ε) the difference is at most
    /// ≈ n·ε times the magnitude of the summed terms. For the asymmetric family the terms are
    /// `d·u·x` and `m·x` separately, whose magnitudes are bounded by 3·max|w|·|x|.
    #[test]
    fn linear_matches_decode_then_dot(
        member in 0usize..7,
        bits in 2u32..=8,
        gi in 0usize..GROUPS.len(),
        rows in 1usize..5,
        cols in 1usize..300,
        seed in any::<u64>(),
    ) {
        let group = GROUPS[gi];
        let id = match member {
            0 | 1 => EncodingId::Symmetric { bits, group },
            2 | 3 => EncodingId::Asymmetric { bits, group },
            4 => EncodingId::TernaryGroup { group },
            5 => EncodingId::TernaryGroup { group: 64 },
            _ => EncodingId::TernaryTensor,
        };
        let codec = codec_for(id);
        let mut s = seed | 1;
        let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 };
        let w: Vec<f32> = (0..rows * cols).map(|_| next() * 3.0).collect();
        let x: Vec<f32> = (0..cols).map(|_| next()).collect();
        let enc = codec.encode_matrix(&w, rows, cols).unwrap();
        prop_assert_eq!(enc.len(), codec.matrix_size(rows, cols).unwrap());
        let wd = codec.decode_matrix(&enc, rows, cols).unwrap();
        let mut y = vec![0.0f32; rows];
        codec.linear(&enc, rows, &x, &mut y).unwrap();
        for r in 0..rows {
            let row = &wd[r * cols..(r + 1) * cols];
            let exact: f64 = row.iter().zip(&x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
            let wmax = w[r * cols..(r + 1) * cols].iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let mag: f64 = row.iter().zip(&x).map(|(&a, &b)| {
                let t = f64::from(a.abs()) * f64::from(b.abs());
                if member == 2 || member == 3 { t + 3.0 * f64::from(wmax) * f64::from(b.abs()) } else { t }
            }).sum();
            let tol = 2.0 * (cols as f64 + 4.0) * f64::from(f32::EPSILON) * mag + 1e-30;
            prop_assert!((f64::from(y[r]) - exact).abs() <= tol, "{} row {}: {} vs {} (tol {})", id, r, y[r], exact, tol);
            if rows == 1 {
                prop_assert_eq!(codec.dot(&enc, &x).unwrap(), y[0]);
            }
        }
    }

    /// Encoded sizes: `encoded_size(n)` is exactly what `encode` writes, decode accepts exactly
    /// that length and nothing else.
    #[test]
    fn sizes_round_trip(member in 0usize..4, bits in 2u32..=8, gi in 0usize..GROUPS.len(), n in 0usize..2100) {
        let group = GROUPS[gi];
        let id = match member {
            0 => EncodingId::Symmetric { bits, group },
            1 => EncodingId::Asymmetric { bits, group },
            2 => EncodingId::TernaryGroup { group },
            _ => EncodingId::TernaryTensor,
        };
        let codec = codec_for(id);
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let enc = codec.encode(&x).unwrap();
        prop_assert_eq!(enc.len(), codec.encoded_size(n).unwrap());
        let expected = match id {
            EncodingId::Symmetric { .. } => n.div_ceil(group) * (2 + group * bits as usize / 8),
            EncodingId::Asymmetric { .. } => n.div_ceil(group) * (4 + group * bits as usize / 8),
            EncodingId::TernaryGroup { .. } => n.div_ceil(group) * (2 + group / 4),
            EncodingId::TernaryTensor => 4 + n.div_ceil(4),
            EncodingId::Ggml(_) => unreachable!("not drawn here: tests/ggml_oracle.rs"),
        };
        prop_assert_eq!(enc.len(), expected);
        prop_assert_eq!(codec.decode(&enc, n).unwrap().len(), n);
        let mut longer = enc.clone();
        longer.push(0);
        let is_len_err = matches!(codec.decode(&longer, n), Err(CodecError::LengthMismatch { .. }));
        prop_assert!(is_len_err);
        // IDs round-trip through their canonical string.
        prop_assert_eq!(EncodingId::parse(&id.to_string()).unwrap(), id);
    }
}

// ---------------------------------------------------------------- golden bytes (docs/formats.md)

#[test]
fn golden_q4_symmetric_g64() {
    // 8 values in a 64-group: the scale 8/7 rounds *down* to 0x3C92 in FP16, so the encoder steps
    // up to 0x3C93 (1.1435546875) to keep 8.0 inside ±7 codes; 56 padding codes are 8 (value 0).
    let x = [-8.0f32, -4.0, -1.0, 0.0, 0.5, 1.0, 4.0, 8.0];
    let enc = resolve("syn.q4.symmetric.g64.v1")
        .unwrap()
        .encode(&x)
        .unwrap();
    let mut expected = vec![0x93, 0x3C, 0x51, 0x87, 0x98, 0xFB];
    expected.extend(std::iter::repeat_n(0x88, 28));
    assert_eq!(enc, expected);
    let back = resolve("syn.q4.symmetric.g64.v1")
        .unwrap()
        .decode(&enc, 8)
        .unwrap();
    let d = 1.143_554_7_f32;
    assert_eq!(
        back,
        vec![-7.0 * d, -3.0 * d, -d, 0.0, 0.0, d, 3.0 * d, 7.0 * d]
    );
}

#[test]
fn golden_q3_symmetric_g8_codes_straddle_bytes() {
    let x = [-3.0f32, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 0.4];
    let enc = resolve("syn.q3.symmetric.g8.v1")
        .unwrap()
        .encode(&x)
        .unwrap();
    assert_eq!(enc, vec![0x00, 0x3C, 0xD1, 0x58, 0x9F]);
}

#[test]
fn golden_q4_asymmetric_g8() {
    let x = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
    let enc = resolve("syn.q4.asymmetric.g8.v1")
        .unwrap()
        .encode(&x)
        .unwrap();
    assert_eq!(enc, vec![0x78, 0x37, 0x00, 0x00, 0x20, 0x64, 0xB9, 0xFD]);
}

#[test]
fn golden_ternary_absmean_g64() {
    let x = [0.5f32, -0.2, 0.05, -1.0, 0.0, 0.3, 0.1, -0.4];
    let enc = resolve("syn.ternary.absmean.g64.v1")
        .unwrap()
        .encode(&x)
        .unwrap();
    let mut expected = vec![0x1A, 0x35, 0x67, 0x6E];
    expected.extend(std::iter::repeat_n(0xAA, 14));
    assert_eq!(enc, expected);
    assert_eq!(
        enc.len() * 8,
        144,
        "2.25 bits per weight for a full 64-group"
    );
}

#[test]
fn golden_ternary_absmean_tensor() {
    let x = [0.5f32, -0.25, 0.0, -1.0, 0.75, 0.125, 0.25, -0.125];
    let enc = resolve("syn.ternary.absmean.tensor.v1")
        .unwrap()
        .encode_matrix(&x, 2, 4)
        .unwrap();
    assert_eq!(enc, vec![0x00, 0x00, 0xC0, 0x3E, 0x67, 0xBB]);
}

#[test]
fn zero_group_stores_zero_scale_and_zero_codes() {
    let x = [0.0f32; 64];
    let enc = sym(4, 64).encode(&x).unwrap();
    assert_eq!(&enc[..2], &[0, 0]);
    assert!(enc[2..].iter().all(|&b| b == 0x88));
    assert_eq!(sym(4, 64).decode(&enc, 64).unwrap(), vec![0.0; 64]);
    // a zero group next to a non-zero one keeps its own zero scale
    let mut y = vec![0.0f32; 64];
    y.extend((0..64).map(|i| i as f32));
    let enc = sym(4, 64).encode(&y).unwrap();
    assert_eq!(&enc[..2], &[0, 0]);
    assert_ne!(&enc[34..36], &[0, 0]);
    let a = asym(3, 64).encode(&x).unwrap();
    assert_eq!(asym(3, 64).decode(&a, 64).unwrap(), vec![0.0; 64]);
    // ternary: BitNet's eps clamp gives γ = f16(1e-5) and every code 0
    let t = resolve("syn.ternary.absmean.g64.v1").unwrap();
    let e = t.encode(&x).unwrap();
    assert!(e[2..].iter().all(|&b| b == 0xAA));
    assert_eq!(t.decode(&e, 64).unwrap(), vec![0.0; 64]);
}

#[test]
fn last_partial_group_is_padded_with_the_zero_code() {
    for bits in 2u32..=8 {
        let codec = sym(bits, 64);
        let x: Vec<f32> = (0..70).map(|i| i as f32 - 35.0).collect();
        let enc = codec.encode(&x).unwrap();
        let gb = 2 + 64 * bits as usize / 8;
        assert_eq!(enc.len(), 2 * gb);
        // unpack the second group's codes LSB-first and check padding codes 6..64
        let area = &enc[gb + 2..];
        let code = |i: usize| -> u32 {
            let bit = i * bits as usize;
            let word =
                u32::from(area[bit / 8]) | (u32::from(*area.get(bit / 8 + 1).unwrap_or(&0)) << 8);
            (word >> (bit % 8)) & ((1 << bits) - 1)
        };
        for i in 6..64 {
            assert_eq!(code(i), 1 << (bits - 1), "bits {bits} pad {i}");
        }
        let back = codec.decode(&enc, 70).unwrap();
        assert_eq!(back.len(), 70);
    }
    // the padding does not leak into linear
    let codec = sym(4, 64);
    let w: Vec<f32> = (0..70).map(|i| (i as f32).cos()).collect();
    let enc = codec.encode(&w).unwrap();
    let x = vec![1.0f32; 70];
    let dot = codec.dot(&enc, &x).unwrap();
    let sum: f32 = codec.decode(&enc, 70).unwrap().iter().sum();
    assert!((dot - sum).abs() < 1e-4);
}

#[test]
fn reserved_code_is_never_emitted_and_refused_on_decode() {
    for bits in 2u32..=8 {
        let codec = sym(bits, 8);
        // the most negative value sits exactly at -qmax·d, never below
        let x = [-1.0f32, 1.0, -0.999, 0.5, -0.5, 0.0, -1.0, 0.25];
        let mut enc = codec.encode(&x).unwrap();
        let area = enc[2..].to_vec();
        // no code is 0 anywhere
        for i in 0..8 {
            let bit = i * bits as usize;
            let word =
                u32::from(area[bit / 8]) | (u32::from(*area.get(bit / 8 + 1).unwrap_or(&0)) << 8);
            assert_ne!((word >> (bit % 8)) & ((1 << bits) - 1), 0);
        }
        // clear element 3's code → reserved
        let bit = 3 * bits as usize;
        for b in bit..bit + bits as usize {
            enc[2 + b / 8] &= !(1 << (b % 8));
        }
        assert_eq!(
            codec.decode(&enc, 8),
            Err(CodecError::ReservedCode { index: 3 })
        );
        assert_eq!(
            codec.dot(&enc, &[1.0; 8]),
            Err(CodecError::ReservedCode { index: 3 })
        );
    }
    let t = resolve("syn.ternary.absmean.tensor.v1").unwrap();
    let mut e = t.encode(&[1.0, -1.0, 0.0, 0.5, 0.25]).unwrap();
    e[5] &= !0b11; // element 4 → 00
    assert_eq!(t.decode(&e, 5), Err(CodecError::ReservedCode { index: 4 }));
    assert_eq!(
        t.dot(&e, &[1.0; 5]),
        Err(CodecError::ReservedCode { index: 4 })
    );
}

#[test]
fn non_finite_input_and_bad_scales_are_typed_errors() {
    for id in [
        "syn.q4.symmetric.g64.v1",
        "syn.q5.asymmetric.g32.v1",
        "syn.ternary.absmean.g64.v1",
        "syn.ternary.absmean.tensor.v1",
    ] {
        let c = resolve(id).unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let x = [0.0f32, 1.0, bad, 2.0];
            assert!(
                matches!(c.encode(&x), Err(CodecError::NonFinite { index: 2, .. })),
                "{id}"
            );
        }
    }
    // too large for an FP16 scale
    assert!(matches!(
        sym(2, 8).encode(&[1e6]),
        Err(CodecError::ScaleOutOfRange { .. })
    ));
    assert!(matches!(
        asym(4, 8).encode(&[-1e6, 0.0]),
        Err(CodecError::ScaleOutOfRange { .. })
    ));
    // a negative or NaN stored scale is refused
    let mut enc = sym(4, 8).encode(&[1.0; 8]).unwrap();
    enc[1] |= 0x80;
    assert_eq!(
        sym(4, 8).decode(&enc, 8),
        Err(CodecError::InvalidScale { group: 0 })
    );
    enc[0] = 0xFF;
    enc[1] = 0x7F;
    assert_eq!(
        sym(4, 8).decode(&enc, 8),
        Err(CodecError::InvalidScale { group: 0 })
    );
}

#[test]
fn registry_parses_and_refuses() {
    for id in [
        "syn.q2.symmetric.g8.v1",
        "syn.q4.symmetric.g64.v1",
        "syn.q8.symmetric.g1024.v1",
        "syn.q3.asymmetric.g40.v1",
        "syn.ternary.absmean.g64.v1",
        "syn.ternary.absmean.tensor.v1",
    ] {
        let c = resolve(id).unwrap();
        assert_eq!(c.id().to_string(), id);
    }
    for id in [
        "syn.q1.symmetric.g64.v1",
        "syn.q9.symmetric.g64.v1",
        "syn.q4.symmetric.g12.v1",
        "syn.q4.symmetric.g0.v1",
        "syn.q4.symmetric.g1032.v1",
        "syn.q04.symmetric.g64.v1",
        "syn.q4.symmetric.g064.v1",
        "syn.q4.symmetric.g64.v2",
        "syn.q4.asymmetric.g2048.v1",
        "syn.ternary.absmean.g7.v1",
    ] {
        assert!(
            matches!(resolve(id), Err(CodecError::InvalidEncoding { .. })),
            "{id}"
        );
    }
    for id in [
        "",
        "q4_0",
        "syn.q4.symmetric.v1",
        "syn.q4.skew.g64.v1",
        "gguf.q4.symmetric.g64.v1",
        "syn.ternary.absmax.g64.v1",
        "syn.q4.symmetric.g64",
    ] {
        assert!(
            matches!(resolve(id), Err(CodecError::UnknownEncoding { .. })),
            "{id}"
        );
    }
    assert_eq!(
        EncodingId::parse("syn.ternary.absmean.g64.v1")
            .unwrap()
            .bits_per_weight(),
        2.25
    );
}

#[test]
fn ternary_follows_bitnet_absmean_rule() {
    // Reference: BitNet b1.58 weight_quant, per tensor: s = 1/max(mean|W|, 1e-5); round(W·s).clamp(-1,1)/s
    let w: Vec<f32> = (0..300)
        .map(|i| ((i * 7919) % 601) as f32 / 300.0 - 1.0)
        .collect();
    let mean = w.iter().map(|v| f64::from(v.abs())).sum::<f64>() / w.len() as f64;
    let gamma = mean.max(1e-5) as f32;
    let t = resolve("syn.ternary.absmean.tensor.v1").unwrap();
    let back = t
        .decode_matrix(&t.encode_matrix(&w, 3, 100).unwrap(), 3, 100)
        .unwrap();
    for (&a, &b) in w.iter().zip(&back) {
        let q = (f64::from(a) / f64::from(gamma)).round().clamp(-1.0, 1.0) as f32;
        assert_eq!(b, q * gamma);
    }
}

#[test]
fn candidates_drop_large_options_and_keep_the_better_of_equal_sizes() {
    let w: Vec<f32> = (0..4096).map(|i| ((i as f32) * 0.013).sin()).collect();
    let q8 = sym(8, 64);
    let q4 = sym(4, 64);
    let a3 = asym(3, 32); // (4 + 12) bytes per 32 = 4 + 24 per 64 … not the same size as q4/g64
    let s4b = sym(4, 128);
    let t = resolve("syn.ternary.absmean.g64.v1").unwrap();
    let q2 = sym(2, 64); // same layout size as ternary g64
    let codecs: Vec<&dyn Codec> = vec![
        q8.as_ref(),
        q4.as_ref(),
        a3.as_ref(),
        s4b.as_ref(),
        t.as_ref(),
        q2.as_ref(),
    ];
    // source: 4096 × BF16 = 8192 bytes; q8/g64 is 4096 + 128 = 4224 bytes: kept. A source of
    // 4224 bytes drops q8 (not smaller).
    let c = PrecisionCandidates::measure(&w, 64, 64, 4224, &codecs).unwrap();
    assert!(c.candidates.iter().all(|o| o.bytes < 4224));
    assert!(!c.candidates.iter().any(|o| o.encoding == q8.id()));
    // q2 and ternary g64 have equal size: one is kept, the lower-distortion one
    let same: Vec<_> = c
        .candidates
        .iter()
        .filter(|o| o.bytes == q2.encoded_size(4096).unwrap())
        .collect();
    assert_eq!(same.len(), 1);
    let d = |codec: &dyn Codec| {
        relative_distortion(&w, &codec.decode(&codec.encode(&w).unwrap(), 4096).unwrap())
    };
    assert_eq!(same[0].distortion, d(q2.as_ref()).min(d(t.as_ref())));
    assert!(c.candidates.windows(2).all(|p| p[0].bytes < p[1].bytes));
}

/// Every member of the grouped families (every width 2–8, every group 8, 16, …, 1024), on one
/// deterministic vector of 1100 values (so most groups end partial): the exact size, the ID
/// round trip, each element within the codec's own error of its group (from the stored
/// scale), and `dot` equal to decode-then-dot up to f32 rounding, hence within the codec's
/// error of `w·x`. Two activation vectors: an independent one, and one correlated with `w`
/// (`w·x` = 251; every member's decode-then-dot is then at least 24 and over 60 times its
/// rounding bound, so a `dot` that returns 0 fails on every member).
#[test]
fn every_width_and_group_member() {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let w: Vec<f32> = (0..1100)
        .map(|i| next() * if i % 97 == 0 { 40.0 } else { 1.0 })
        .collect();
    let independent: Vec<f32> = (0..1100).map(|_| next()).collect();
    let correlated: Vec<f32> = w
        .iter()
        .map(|&v| 0.5 * v.clamp(-1.0, 1.0) + 0.5 * next())
        .collect();
    let u = f64::from(f32::EPSILON) / 2.0;
    let mut members = 0;
    for group in (8..=1024).step_by(8) {
        let mut ids = vec![EncodingId::TernaryGroup { group }];
        for bits in 2..=8 {
            ids.push(EncodingId::Symmetric { bits, group });
            ids.push(EncodingId::Asymmetric { bits, group });
        }
        for id in ids {
            members += 1;
            assert_eq!(EncodingId::parse(&id.to_string()).unwrap(), id);
            let c = codec_for(id);
            let enc = c.encode(&w).unwrap();
            assert_eq!(enc.len(), c.encoded_size(w.len()).unwrap(), "{id}");
            let back = c.decode(&enc, w.len()).unwrap();
            let (header, bits) = match id {
                EncodingId::Symmetric { bits, .. } => (2, bits as usize),
                EncodingId::Asymmetric { bits, .. } => (4, bits as usize),
                _ => (2, 2),
            };
            let gb = header + group * bits / 8;
            // Per element, from its group's stored scale d (and minimum m): `err`, the codec's
            // error bound, and `term`, the magnitude of what `dot` sums for it: |x̂| (x̂ = q·d,
            // one exact product; a ternary code adds ±x and scales by d), or for the
            // asymmetric `d·Σu·x + m·Σx`, whose two parts can cancel, |u·d| + |m|.
            let (mut err, mut term) = (Vec::new(), Vec::new());
            for (i, (&a, &b)) in w.iter().zip(&back).enumerate() {
                let d = scale_of(&enc, gb, i / group);
                let (a, b) = (f64::from(a), f64::from(b));
                let e = match id {
                    // BitNet's clamp to ±1: |w − x̂| ≤ d/2 up to |w| = 1.5·d, |w| − d beyond.
                    EncodingId::TernaryGroup { .. } => (d / 2.0).max(a.abs() - d),
                    // The asymmetric x̂ = m + u·d is one f32 rounding off.
                    _ => d / 2.0,
                } + a.abs().max(b.abs()) * 2.0 * u;
                assert!(
                    (a - b).abs() <= e,
                    "{id} at {i}: {a} decoded as {b} (bound {e})"
                );
                err.push(e);
                term.push(match id {
                    EncodingId::Asymmetric { .. } => {
                        let o = (i / group) * gb + 2;
                        let m = half::f16::from_le_bytes([enc[o], enc[o + 1]])
                            .to_f64()
                            .abs();
                        (b.abs() + m) * (1.0 + 2.0 * u) + m
                    }
                    _ => b.abs(),
                });
            }
            // Rounding: every term passes through at most `chain` f32 roundings (its product,
            // the adds within its group, the group's scale and minimum, the adds across groups),
            // so the dot is off by at most chain·u·Σ term_i·|x_i|.
            let chain = group.min(w.len()) + w.len().div_ceil(group) + 16;
            for x in [&independent, &correlated] {
                let weighted = |a: &[f64]| -> f64 {
                    a.iter().zip(x).map(|(a, &b)| a * f64::from(b).abs()).sum()
                };
                let exact: f64 = back
                    .iter()
                    .zip(x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let exact_w: f64 = w
                    .iter()
                    .zip(x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let tol = chain as f64 * u * weighted(&term);
                let y = f64::from(c.dot(&enc, x).unwrap());
                assert!(
                    (y - exact).abs() <= tol,
                    "{id}: dot {y} vs decode-then-dot {exact} (rounding bound {tol})"
                );
                let codec_err = weighted(&err);
                assert!(
                    (y - exact_w).abs() <= codec_err + tol,
                    "{id}: dot {y} vs w·x {exact_w} (codec error bound {codec_err} + {tol})"
                );
            }
        }
    }
    assert_eq!(members, 128 * 15);
}

/// `decode_matrix_into` writes exactly what `decode_matrix` returns, for every family, and
/// refuses an output of the wrong length.
#[test]
fn decode_into_equals_decode() {
    let rows = 3;
    let cols = 200;
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0)
        .collect();
    let ids = [
        EncodingId::Symmetric { bits: 4, group: 64 },
        EncodingId::Symmetric { bits: 7, group: 24 },
        EncodingId::Asymmetric { bits: 3, group: 64 },
        EncodingId::TernaryGroup { group: 64 },
        EncodingId::TernaryTensor,
    ];
    for id in ids {
        let c = codec_for(id);
        let enc = c.encode_matrix(&w, rows, cols).unwrap();
        let want = c.decode_matrix(&enc, rows, cols).unwrap();
        let mut got = vec![f32::NAN; rows * cols];
        c.decode_matrix_into(&enc, rows, cols, &mut got).unwrap();
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{id}"
        );
        let mut short = vec![0.0f32; rows * cols - 1];
        assert!(
            c.decode_matrix_into(&enc, rows, cols, &mut short).is_err(),
            "{id}"
        );
    }
}
