//! Activation-awareness, the X = I identity, and the importance map's versioning and provenance.

use proptest::prelude::*;
use synapse_codecs::{Codec, relative_distortion, resolve};
use synapse_sensitivity::{
    Calibration, ImportanceMap, ImportanceMapBuilder, SensitivityError, measure_tensor,
    output_distortion,
};

fn q4g8() -> Box<dyn Codec> {
    resolve("syn.q4.symmetric.g8.v1").unwrap()
}

/// Same weights, same quantizer, different activations → different ranking.
///
/// With q4/g8, a row whose max is 7 gets scale exactly 1.0, so 7 is exact and 3.4 → 3 carries
/// all the error. Tensor A puts the error in column 1, tensor B in column 0; their weight-space
/// distortions are identical, so a magnitude-based measure cannot tell them apart.
#[test]
fn distortion_is_activation_aware() {
    let mut a = vec![0.0f32; 8];
    let mut b = vec![0.0f32; 8];
    (a[0], a[1]) = (7.0, 3.4);
    (b[0], b[1]) = (3.4, 7.0);
    let c = q4g8();
    let qa = c.decode(&c.encode(&a).unwrap(), 8).unwrap();
    let qb = c.decode(&c.encode(&b).unwrap(), 8).unwrap();
    assert_eq!(relative_distortion(&a, &qa), relative_distortion(&b, &qb));

    let calib = |lead: usize| {
        let mut x = Vec::new();
        for s in 0..16 {
            let mut v = vec![0.0f32; 8];
            v[lead] = 1.0 + s as f32 * 0.1;
            v[1 - lead] = 0.01 * (s as f32 - 8.0);
            v[2 + s % 6] = 0.5;
            x.extend(v);
        }
        Calibration::new(x, 16, 8).unwrap()
    };
    let x0 = calib(0); // activations concentrated on column 0
    let x1 = calib(1); // … on column 1
    let (a0, b0) = (
        output_distortion(&a, &qa, 1, &x0).unwrap(),
        output_distortion(&b, &qb, 1, &x0).unwrap(),
    );
    let (a1, b1) = (
        output_distortion(&a, &qa, 1, &x1).unwrap(),
        output_distortion(&b, &qb, 1, &x1).unwrap(),
    );
    assert!(
        b0 > 10.0 * a0,
        "column-0 activations: B must matter more ({b0} vs {a0})"
    );
    assert!(
        a1 > 10.0 * b1,
        "column-1 activations: A must matter more ({a1} vs {b1})"
    );
    assert_ne!(x0.hash(), x1.hash());
}

proptest! {
    /// With X = I (one unit sample per column) the output distortion is the weight-space one.
    #[test]
    fn identity_activations_give_weight_distortion(
        rows in 1usize..4, cols in 1usize..40, seed in any::<u32>(), bits in 2u32..=8
    ) {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i as f32 + seed as f32 * 0.01) * 0.7).sin()).collect();
        let mut x = vec![0.0f32; cols * cols];
        for i in 0..cols { x[i * cols + i] = 1.0; }
        let calib = Calibration::new(x, cols, cols).unwrap();
        let c = resolve(&format!("syn.q{bits}.symmetric.g8.v1")).unwrap();
        let q = c.decode_matrix(&c.encode_matrix(&w, rows, cols).unwrap(), rows, cols).unwrap();
        let out = output_distortion(&w, &q, rows, &calib).unwrap();
        let wd = relative_distortion(&w, &q);
        prop_assert!((out - wd).abs() <= 1e-12 * wd.max(1e-300), "{} vs {}", out, wd);
    }
}

fn small_map(fingerprint: &str) -> (ImportanceMap, Calibration) {
    let cols = 64;
    let x: Vec<f32> = (0..8 * cols)
        .map(|i| ((i * 31 % 97) as f32 / 48.0) - 1.0)
        .collect();
    let calib = Calibration::new(x, 8, cols).unwrap();
    let codecs: Vec<Box<dyn Codec>> = [
        "syn.q8.symmetric.g64.v1",
        "syn.q4.symmetric.g64.v1",
        "syn.ternary.absmean.g64.v1",
    ]
    .iter()
    .map(|id| resolve(id).unwrap())
    .collect();
    let refs: Vec<&dyn Codec> = codecs.iter().map(|c| c.as_ref()).collect();
    let mut b = ImportanceMapBuilder::for_calibration(fingerprint, &calib);
    for (t, name) in ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"]
        .iter()
        .enumerate()
    {
        let w: Vec<f32> = (0..4 * cols)
            .map(|i| ((i + t * 7) as f32 * 0.11).cos())
            .collect();
        let ti = measure_tensor(&w, 4, "bf16", (4 * cols * 2) as u64, &calib, &refs).unwrap();
        b.add(name, ti).unwrap();
    }
    (b.finish(), calib)
}

#[test]
fn importance_map_round_trips_through_json() {
    let (map, calib) = small_map("model-abc");
    let text = map.to_json().unwrap();
    let back = ImportanceMap::from_json(&text).unwrap();
    assert_eq!(back, map);
    back.check_applies_to("model-abc").unwrap();
    back.check_calibration(calib.hash(), 8).unwrap();
    assert_eq!(back.provenance.codec_versions.len(), 3);
    let t = &back.tensors["blk.0.attn_q.weight"];
    assert_eq!(t.options[0].encoding, "syn.q8.symmetric.g64.v1");
    assert!(
        t.options
            .windows(2)
            .all(|p| p[0].bytes > p[1].bytes && p[0].distortion <= p[1].distortion)
    );
}

#[test]
fn measure_drops_options_not_smaller_than_source() {
    let calib = Calibration::new(vec![1.0; 64], 1, 64).unwrap();
    let w = vec![0.5f32; 64];
    let q8 = resolve("syn.q8.symmetric.g64.v1").unwrap(); // 66 bytes
    let q4 = resolve("syn.q4.symmetric.g64.v1").unwrap(); // 34 bytes
    let t = measure_tensor(&w, 1, "q8_0", 66, &calib, &[q8.as_ref(), q4.as_ref()]).unwrap();
    assert_eq!(t.options.len(), 1);
    assert_eq!(t.options[0].bytes, 34);
}

#[test]
fn importance_map_refuses_mismatches() {
    let (map, calib) = small_map("model-abc");
    assert!(matches!(
        map.check_applies_to("model-xyz"),
        Err(SensitivityError::ProvenanceMismatch {
            field: "model_fingerprint",
            ..
        })
    ));
    assert!(matches!(
        map.check_calibration(calib.hash(), 9),
        Err(SensitivityError::ProvenanceMismatch {
            field: "sample_count",
            ..
        })
    ));
    assert!(matches!(
        map.check_calibration("00", 8),
        Err(SensitivityError::ProvenanceMismatch {
            field: "calibration_hash",
            ..
        })
    ));
    let text = map.to_json().unwrap();
    let v2 = text.replace("\"format_version\": 1", "\"format_version\": 2");
    assert_eq!(
        ImportanceMap::from_json(&v2),
        Err(SensitivityError::UnsupportedFormatVersion {
            found: 2,
            supported: 1
        })
    );
    // a codec version this build does not implement
    let future = text.replace("syn.q4.symmetric.g64.v1", "syn.q4.symmetric.g64.v2");
    let m = ImportanceMap::from_json(&future).unwrap();
    assert!(matches!(
        m.check_applies_to("model-abc"),
        Err(SensitivityError::ProvenanceMismatch {
            field: "codec_versions",
            ..
        })
    ));
    assert!(matches!(
        ImportanceMap::from_json("{}"),
        Err(SensitivityError::Malformed { .. })
    ));
    assert!(matches!(
        ImportanceMap::from_json(&text.replace("\"bf16\"", "\"bf16\", \"extra\": 1")),
        Err(SensitivityError::Malformed { .. })
    ));
}

#[test]
fn calibration_refuses_bad_input() {
    assert!(matches!(
        Calibration::new(vec![1.0; 5], 2, 3),
        Err(SensitivityError::ShapeMismatch { .. })
    ));
    assert_eq!(
        Calibration::new(vec![1.0, f32::NAN], 1, 2),
        Err(SensitivityError::NonFinite { index: 1 })
    );
}

/// `measure_tensor` (shared reference energy, Gram path when samples > cols) reports the same
/// distortion as `output_distortion` on each codec's decoded weights.
#[test]
fn measure_tensor_matches_output_distortion() {
    for (samples, cols) in [(4usize, 64usize), (200, 32)] {
        let x: Vec<f32> = (0..samples * cols)
            .map(|i| ((i * 7 % 23) as f32 / 11.0) - 1.0)
            .collect();
        let calib = Calibration::new(x, samples, cols).unwrap();
        let w: Vec<f32> = (0..3 * cols).map(|i| ((i as f32) * 0.37).sin()).collect();
        let codecs: Vec<Box<dyn Codec>> = ["syn.q6.symmetric.g32.v1", "syn.q3.asymmetric.g32.v1"]
            .iter()
            .map(|id| resolve(id).unwrap())
            .collect();
        let refs: Vec<&dyn Codec> = codecs.iter().map(|c| c.as_ref()).collect();
        let t = measure_tensor(&w, 3, "f32", u64::MAX, &calib, &refs).unwrap();
        for (o, c) in t.options.iter().zip(&codecs) {
            let q = c
                .decode_matrix(&c.encode_matrix(&w, 3, cols).unwrap(), 3, cols)
                .unwrap();
            let d = output_distortion(&w, &q, 3, &calib).unwrap();
            assert_eq!(o.encoding, c.id().to_string());
            assert!(
                (o.distortion - d).abs() <= 1e-12 * d,
                "{}: {} vs {}",
                o.encoding,
                o.distortion,
                d
            );
        }
    }
}
