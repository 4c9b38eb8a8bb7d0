//! Properties of the decoders on arbitrary bytes (proptest).

use proptest::prelude::*;
use synapse_formats::decode::{decode_f8_e4m3fn, decode_f8_e5m2, dequantize, dequantize_to_vec};
use synapse_formats::{ALL_TYPES, FormatError, GgmlType};

/// The byte holding the sign bit of every scale field of a block (f16 high byte, f32 top
/// byte, or IQ1_M's spread f16 whose sign is bit 15 of the fourth scale word).
fn scale_sign_bytes(t: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 | Q8_1 | Q1_0 | Q2_0 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S
        | IQ1_S | IQ4_NL | IQ4_XS => &[1],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[1, 3],
        Q2_K => &[81, 83],
        Q3_K => &[109],
        Q6_K => &[209],
        Q8_K => &[3],
        IQ1_M => &[55],
        TQ1_0 => &[53],
        TQ2_0 => &[65],
        _ => &[],
    }
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn any_type() -> impl Strategy<Value = GgmlType> {
    (0..ALL_TYPES.len()).prop_map(|i| ALL_TYPES[i])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any byte string: a whole number of blocks decodes to exactly that many values,
    /// anything else is a typed length error; never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(t in any_type(), bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        match dequantize_to_vec(t, &bytes) {
            Ok(v) => {
                prop_assert_eq!(bytes.len() % t.type_size(), 0);
                prop_assert_eq!(v.len(), bytes.len() / t.type_size() * t.block_size());
            }
            Err(FormatError::DecodeLength { .. }) => prop_assert!(bytes.len() % t.type_size() != 0),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// A destination of the wrong length is a typed error and is left untouched.
    #[test]
    fn wrong_destination_is_typed_error(t in any_type(), n in 1usize..4, extra in 1usize..40, shorter in any::<bool>()) {
        let src = vec![0x11u8; n * t.type_size()];
        let want = n * t.block_size();
        let len = if shorter { want.saturating_sub(extra) } else { want + extra };
        let mut dst = vec![7.0f32; len];
        let typed = matches!(dequantize(t, &src, &mut dst), Err(FormatError::DecodeLength { .. }));
        prop_assert!(typed);
        prop_assert!(dst.iter().all(|&v| v == 7.0));
    }

    /// Flipping the sign of every scale negates every output exactly: each decoder multiplies
    /// by the scale (and subtracts the min, also scaled) with IEEE's sign-symmetric rounding,
    /// so `dec(-d, -m) = -dec(d, m)` bit for bit (up to the sign of zero). Catches a sign or operand-order slip that
    /// still gives plausible magnitudes.
    #[test]
    fn negating_scales_negates_outputs(t in any_type().prop_filter("has scales", |t| !scale_sign_bytes(*t).is_empty()),
                                       blocks in 1usize..4, seed in proptest::collection::vec(any::<u8>(), 1..64)) {
        let ts = t.type_size();
        let src: Vec<u8> = (0..blocks * ts).map(|i| seed[i % seed.len()].wrapping_mul(31).wrapping_add(i as u8)).collect();
        let mut flipped = src.clone();
        for b in 0..blocks {
            for &o in scale_sign_bytes(t) {
                flipped[b * ts + o] ^= 0x80;
            }
        }
        let a = dequantize_to_vec(t, &src).unwrap();
        let b = dequantize_to_vec(t, &flipped).unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            // `a - b` with a = b = ±0 is +0 either way, so a zero may keep its sign.
            let ok = same_bits(-*x, *y) || (*x == 0.0 && *y == 0.0);
            prop_assert!(ok, "{} element {}: {} vs {}", t, i, x, y);
        }
    }

    /// FP8: the sign bit only flips the sign (both formats are sign-magnitude).
    #[test]
    fn fp8_sign_magnitude(code in 0u8..0x80) {
        let mut o = [0.0f32; 2];
        decode_f8_e4m3fn(&[code, code | 0x80], &mut o).unwrap();
        prop_assert!(same_bits(-o[0], o[1]));
        decode_f8_e5m2(&[code, code | 0x80], &mut o).unwrap();
        prop_assert!(same_bits(-o[0], o[1]));
    }
}
