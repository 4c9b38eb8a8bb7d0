//! GgufWriter → GgufFile round trip over arbitrary metadata (every value type, nested arrays)
//! and tensors (every upstream type, 0–4 dims, several alignments).

use proptest::prelude::*;
use synapse_formats::gguf::{GgufArray, GgufFile, GgufValue, GgufWriter, TensorType};
use synapse_formats::{ALL_TYPES, GgmlType};

fn f32s() -> impl Strategy<Value = f32> {
    use proptest::num::f32::*;
    NORMAL | SUBNORMAL | ZERO | INFINITE | NEGATIVE
}

fn f64s() -> impl Strategy<Value = f64> {
    use proptest::num::f64::*;
    NORMAL | SUBNORMAL | ZERO | INFINITE | NEGATIVE
}

fn leaf_array() -> impl Strategy<Value = GgufArray> {
    use proptest::collection::vec as v;
    prop_oneof![
        v(any::<u8>(), 0..6).prop_map(GgufArray::U8),
        v(any::<i8>(), 0..6).prop_map(GgufArray::I8),
        v(any::<u16>(), 0..6).prop_map(GgufArray::U16),
        v(any::<i16>(), 0..6).prop_map(GgufArray::I16),
        v(any::<u32>(), 0..6).prop_map(GgufArray::U32),
        v(any::<i32>(), 0..6).prop_map(GgufArray::I32),
        v(f32s(), 0..6).prop_map(GgufArray::F32),
        v(any::<bool>(), 0..6).prop_map(GgufArray::Bool),
        v(".{0,8}", 0..6).prop_map(|s| GgufArray::String(s.into())),
        v(any::<u64>(), 0..6).prop_map(GgufArray::U64),
        v(any::<i64>(), 0..6).prop_map(GgufArray::I64),
        v(f64s(), 0..6).prop_map(GgufArray::F64),
    ]
}

fn array() -> impl Strategy<Value = GgufArray> {
    leaf_array().prop_recursive(3, 24, 4, |inner| {
        proptest::collection::vec(inner, 0..4).prop_map(GgufArray::Array)
    })
}

fn value() -> impl Strategy<Value = GgufValue> {
    prop_oneof![
        any::<u8>().prop_map(GgufValue::U8),
        any::<i8>().prop_map(GgufValue::I8),
        any::<u16>().prop_map(GgufValue::U16),
        any::<i16>().prop_map(GgufValue::I16),
        any::<u32>().prop_map(GgufValue::U32),
        any::<i32>().prop_map(GgufValue::I32),
        f32s().prop_map(GgufValue::F32),
        any::<bool>().prop_map(GgufValue::Bool),
        ".{0,16}".prop_map(GgufValue::String),
        array().prop_map(GgufValue::Array),
        any::<u64>().prop_map(GgufValue::U64),
        any::<i64>().prop_map(GgufValue::I64),
        f64s().prop_map(GgufValue::F64),
    ]
}

/// (type, dims in ggml order) with ne0 a whole number of blocks.
fn tensor_spec() -> impl Strategy<Value = (GgmlType, Vec<u64>)> {
    (
        prop::sample::select(ALL_TYPES),
        1u64..3,
        proptest::collection::vec(0u64..4, 0..4),
    )
        .prop_map(|(t, blocks, mut rest)| {
            let mut dims = vec![blocks * t.block_size() as u64];
            dims.append(&mut rest);
            (t, dims)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn write_then_read_is_identity(
        kvs in proptest::collection::btree_map("[a-z.]{1,12}", value(), 0..8),
        specs in proptest::collection::vec(tensor_spec(), 0..5),
        align_pow in 0u32..9,
        seed in any::<u8>(),
    ) {
        let mut w = GgufWriter::new();
        w.set_alignment(1 << align_pow).unwrap();
        let mut want_md: Vec<(String, GgufValue)> = Vec::new();
        if 1u32 << align_pow != 32 {
            want_md.push(("general.alignment".into(), GgufValue::U32(1 << align_pow)));
        }
        for (k, v) in &kvs {
            if k == "general.alignment" { continue; }
            w.add_metadata(k.clone(), v.clone()).unwrap();
            want_md.push((k.clone(), v.clone()));
        }
        let mut datas = Vec::new();
        for (i, (t, dims)) in specs.iter().enumerate() {
            let n: u64 = dims.iter().product();
            let bytes = t.bytes_for(n).unwrap() as usize;
            let data: Vec<u8> = (0..bytes).map(|j| (j as u8).wrapping_mul(seed).wrapping_add(i as u8)).collect();
            w.add_tensor(format!("t{i}"), dims, *t, data.clone()).unwrap();
            datas.push(data);
        }
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        prop_assert_eq!(f.version(), 3);
        prop_assert_eq!(f.alignment(), 1u64 << align_pow);
        prop_assert_eq!(f.metadata(), &want_md[..]);
        for (k, v) in &want_md {
            prop_assert_eq!(f.get(k), Some(v));
        }
        prop_assert_eq!(f.tensors().len(), specs.len());
        for (i, ((t, dims), data)) in specs.iter().zip(&datas).enumerate() {
            let info = f.tensor(&format!("t{i}")).unwrap();
            prop_assert_eq!(info.ty, TensorType::Ggml(*t));
            prop_assert_eq!(&info.dims, dims);
            prop_assert_eq!(info.offset % f.alignment(), 0);
            prop_assert_eq!(f.tensor_data(info), &data[..]);
        }
        // Re-writing what was read gives the same bytes.
        let mut w2 = GgufWriter::new();
        for (k, v) in f.metadata() {
            w2.add_metadata(k.clone(), v.clone()).unwrap();
        }
        for t in f.tensors() {
            w2.add_tensor(t.name.clone(), &t.dims, t.ty, f.tensor_data(t).to_vec()).unwrap();
        }
        prop_assert_eq!(w2.to_bytes().unwrap(), bytes);
    }
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let mut w = GgufWriter::new();
    assert!(
        w.add_tensor("a", &[32], GgmlType::Q4_0, vec![0; 17])
            .is_err()
    );
    assert!(
        w.add_tensor("a", &[16], GgmlType::Q4_0, vec![0; 18])
            .is_err()
    );
    assert!(
        w.add_tensor("a", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4])
            .is_err()
    );
    w.add_tensor("a", &[32], GgmlType::Q4_0, vec![0; 18])
        .unwrap();
    assert!(
        w.add_tensor("a", &[32], GgmlType::Q4_0, vec![0; 18])
            .is_err()
    );
    assert!(w.set_alignment(48).is_err());
    assert!(
        w.add_metadata("general.alignment", GgufValue::U64(64))
            .is_err()
    );
    w.add_metadata("k", GgufValue::Bool(true)).unwrap();
    assert!(w.add_metadata("k", GgufValue::Bool(false)).is_err());
}
