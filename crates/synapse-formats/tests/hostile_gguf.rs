//! Hostile GGUF files: every malformed input gives a typed error — never a panic, never a
//! large allocation. A counting global allocator records the largest single allocation made
//! anywhere in this test binary; every input here is under 1 MB, so any allocation above
//! 16 MB would mean a header field sized a buffer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use synapse_formats::FormatError;
use synapse_formats::GgmlType;
use synapse_formats::gguf::{BitnetType, GgufFile, GgufValue, GgufWriter, TensorType};

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LARGEST.fetch_max(n, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

const ALLOC_LIMIT: usize = 16 << 20;

fn no_big_alloc() {
    let m = LARGEST.load(Ordering::Relaxed);
    assert!(m < ALLOC_LIMIT, "an allocation of {m} bytes happened");
}

/// A raw GGUF byte builder that can write anything, including what the writer refuses.
#[derive(Default, Clone)]
struct Raw {
    b: Vec<u8>,
}
impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw::default();
        r.b.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.b.extend_from_slice(v);
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k.as_bytes()).u32(4).u32(v)
    }
    fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.str(k.as_bytes()).u32(8).str(v.as_bytes())
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, off: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for d in dims {
            self.u64(*d);
        }
        self.u32(ty).u64(off)
    }
    fn pad(&mut self, a: usize) -> &mut Self {
        while !self.b.len().is_multiple_of(a) {
            self.b.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.b.resize(self.b.len() + n, 0);
        self
    }
    fn open(&self) -> Result<GgufFile, FormatError> {
        GgufFile::from_bytes(self.b.clone())
    }
}

/// A valid file with metadata of several kinds and three tensors; the last tensor ends
/// exactly at the end of the file (no trailing padding), so every truncation is invalid.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", GgufValue::String("llama".into()))
        .unwrap();
    w.add_metadata("llama.block_count", GgufValue::U32(2))
        .unwrap();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        GgufValue::Array(synapse_formats::gguf::GgufArray::String(
            vec!["a".into(), "bc".into(), "".into()].into(),
        )),
    )
    .unwrap();
    w.add_metadata(
        "nested",
        GgufValue::Array(synapse_formats::gguf::GgufArray::Array(vec![
            synapse_formats::gguf::GgufArray::I32(vec![1, -2]),
            synapse_formats::gguf::GgufArray::F64(vec![]),
        ])),
    )
    .unwrap();
    w.add_tensor("a", &[32, 2], GgmlType::Q8_0, vec![0x11; 68])
        .unwrap();
    w.add_tensor("b", &[3], GgmlType::F16, vec![0; 6]).unwrap();
    w.add_tensor("c", &[8], GgmlType::F32, vec![0; 32]).unwrap();
    let b = w.to_bytes().unwrap();
    assert!(GgufFile::from_bytes(b.clone()).is_ok());
    b
}

#[test]
fn truncated_at_every_byte() {
    let b = valid_file();
    for n in 0..b.len() {
        let r = GgufFile::from_bytes(b[..n].to_vec());
        assert!(r.is_err(), "truncated to {n} of {} bytes opened", b.len());
    }
    no_big_alloc();
}

#[test]
fn truncated_at_section_boundaries_says_what() {
    let b = valid_file();
    // magic | version | counts
    for (n, what) in [
        (0, "magic"),
        (2, "magic"),
        (4, "version"),
        (8, "tensor count"),
        (16, "metadata count"),
    ] {
        match GgufFile::from_bytes(b[..n].to_vec()) {
            Err(FormatError::Truncated { what: w, .. }) => assert_eq!(w, what, "at {n}"),
            other => panic!("at {n}: {other:?}"),
        }
    }
    // Right after the counts: the counts promise more than is left.
    assert!(matches!(
        GgufFile::from_bytes(b[..24].to_vec()),
        Err(FormatError::CountTooLarge { .. })
    ));
    // At the start of the data section and of each tensor: out of bounds.
    let f = GgufFile::from_bytes(b.clone()).unwrap();
    for t in f.tensors() {
        let cut = t.offset as usize;
        match GgufFile::from_bytes(b[..cut].to_vec()) {
            Err(FormatError::OutOfBounds { .. }) | Err(FormatError::Truncated { .. }) => {}
            other => panic!("cut at tensor `{}` start {cut}: {other:?}", t.name),
        }
    }
    no_big_alloc();
}

#[test]
fn versions_and_magic() {
    for v in [0u32, 1, 2, 4, 0x0300_0000] {
        let r = Raw::header(v, 0, 0).open();
        assert!(
            matches!(r, Err(FormatError::UnsupportedVersion { version }) if version == v),
            "{v}: {r:?}"
        );
    }
    let mut r = Raw::header(3, 0, 0);
    r.b[0] = b'g';
    assert!(matches!(r.open(), Err(FormatError::BadMagic { .. })));
    assert!(
        Raw::header(3, 0, 0).open().is_ok(),
        "an empty v3 file is valid"
    );
}

#[test]
fn lying_counts_and_lengths() {
    // Counts far beyond the file.
    for (nt, nkv) in [
        (u64::MAX, 0),
        (0, u64::MAX),
        (1 << 40, 0),
        (0, 1 << 40),
        (1, 1),
    ] {
        let r = Raw::header(3, nt, nkv).open();
        assert!(
            matches!(r, Err(FormatError::CountTooLarge { .. })),
            "{nt} {nkv}: {r:?}"
        );
    }
    // A key length larger than the file.
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).zeros(16);
    assert!(matches!(r.open(), Err(FormatError::CountTooLarge { .. })));
    // A string value whose length lies.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(8).u64(1 << 50).zeros(8);
    assert!(matches!(r.open(), Err(FormatError::CountTooLarge { .. })));
    // Huge array lengths for every element type.
    for ty in 0..=12u32 {
        for n in [u64::MAX, 1 << 62, 1 << 33, 100] {
            let mut r = Raw::header(3, 0, 1);
            r.str(b"arr").u32(9).u32(ty).u64(n).zeros(16);
            let e = r.open();
            assert!(
                matches!(
                    e,
                    Err(FormatError::CountTooLarge { .. }) | Err(FormatError::Truncated { .. })
                ),
                "type {ty} len {n}: {e:?}"
            );
        }
    }
    no_big_alloc();
}

#[test]
fn bad_utf8_everywhere() {
    let bad = b"ab\xff\xfe";
    let mut r = Raw::header(3, 0, 1);
    r.str(bad).u32(4).u32(1);
    assert!(
        matches!(r.open(), Err(FormatError::InvalidUtf8 { .. })),
        "key"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(8).str(bad);
    assert!(
        matches!(r.open(), Err(FormatError::InvalidUtf8 { .. })),
        "value"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(8).u64(2).str(b"ok").str(bad);
    assert!(
        matches!(r.open(), Err(FormatError::InvalidUtf8 { .. })),
        "array element"
    );
    let mut r = Raw::header(3, 1, 0);
    r.str(bad).u32(1).u64(8).u32(0).u64(0).pad(32).zeros(32);
    assert!(
        matches!(r.open(), Err(FormatError::InvalidUtf8 { .. })),
        "tensor name"
    );
}

#[test]
fn unknown_value_types_and_deep_nesting() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(13).u32(0);
    assert!(matches!(
        r.open(),
        Err(FormatError::UnknownValueType { id: 13, .. })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(99).u64(0);
    assert!(matches!(
        r.open(),
        Err(FormatError::UnknownValueType { id: 99, .. })
    ));
    // 100 levels of array-of-one-array.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"deep").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(0);
    assert!(matches!(r.open(), Err(FormatError::NestingTooDeep { .. })));
    // Within the limit it reads.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"ok").u32(9);
    for _ in 0..3 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(1).u32(7);
    let f = r.open().unwrap();
    assert!(f.get("ok").unwrap().as_array().is_some());
}

#[test]
fn duplicates() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("k", 1).kv_u32("k", 2);
    assert!(matches!(r.open(), Err(FormatError::DuplicateKey { key }) if key == "k"));
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0)
        .tensor("t", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    assert!(matches!(r.open(), Err(FormatError::DuplicateTensor { name }) if name == "t"));
}

#[test]
fn alignment_rules() {
    for (a, ok) in [
        (0u32, false),
        (48, false),
        (3, false),
        (1, true),
        (64, true),
    ] {
        let mut r = Raw::header(3, 1, 1);
        r.kv_u32("general.alignment", a).tensor("t", &[1], 0, 0);
        r.pad(64).zeros(64);
        let res = r.open();
        assert_eq!(res.is_ok(), ok, "alignment {a}: {res:?}");
        if !ok {
            assert!(matches!(res, Err(FormatError::BadAlignment { .. })));
        }
    }
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.alignment").u32(10).u64(32);
    assert!(matches!(r.open(), Err(FormatError::BadMetadata { .. })));
    // Misaligned tensor data.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1], 0, 4).pad(32).zeros(64);
    assert!(matches!(
        r.open(),
        Err(FormatError::Misaligned { offset: 4, .. })
    ));
}

#[test]
fn shapes_offsets_and_overlaps() {
    let check = |dims: &[u64], ty: u32, off: u64, data: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", dims, ty, off).pad(32).zeros(data);
        r.open()
    };
    // Element counts that overflow.
    for dims in [
        &[1u64 << 32, 1 << 32, 1 << 32][..],
        &[u64::MAX],
        &[1 << 63],
        &[3, u64::MAX / 2],
    ] {
        let r = check(dims, 0, 0, 32);
        assert!(
            matches!(r, Err(FormatError::BadShape { .. })),
            "{dims:?}: {r:?}"
        );
    }
    // Byte size overflow with an in-range element count.
    let r = check(&[1 << 61, 2], 0, 0, 32);
    assert!(
        matches!(
            r,
            Err(FormatError::BadShape { .. }) | Err(FormatError::OutOfBounds { .. })
        ),
        "{r:?}"
    );
    // Too many dims.
    assert!(matches!(
        check(&[1, 1, 1, 1, 1], 0, 0, 32),
        Err(FormatError::BadShape { .. })
    ));
    // Partial blocks: Q4_K rows must be multiples of 256.
    assert!(matches!(
        check(&[100, 2], 12, 0, 512),
        Err(FormatError::BadShape { .. })
    ));
    // Offsets past EOF, and offsets that overflow when added to the data start.
    assert!(matches!(
        check(&[8], 0, 64, 32),
        Err(FormatError::OutOfBounds { .. })
    ));
    assert!(matches!(
        check(&[8], 0, 0, 31),
        Err(FormatError::OutOfBounds { .. })
    ));
    let r = check(&[8], 0, !31, 32);
    assert!(matches!(r, Err(FormatError::OutOfBounds { .. })), "{r:?}");
    // Unknown and removed type ids name the id and the tensor.
    for id in [4u32, 5, 31, 36, 37, 38, 43, 1000, u32::MAX] {
        let r = check(&[32], id, 0, 256);
        assert!(
            matches!(&r, Err(FormatError::UnknownType { id: i, tensor }) if *i == id && tensor == "t"),
            "{id}: {r:?}"
        );
    }
    // Two tensors sharing bytes.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    assert!(matches!(r.open(), Err(FormatError::Overlap { .. })));
    no_big_alloc();
}

#[test]
fn bitnet_ids_by_provenance() {
    let file = |arch: Option<&str>, id: u32, dims: &[u64], slot: usize| {
        let mut r = Raw::header(3, 1, u64::from(arch.is_some()));
        if let Some(a) = arch {
            r.kv_str("general.architecture", a);
        }
        r.tensor("w", dims, id, 0).pad(32).zeros(slot);
        r.open()
    };
    // Not a bitnet file: 39 is MXFP4 (64 elements = 2 blocks of 17 bytes = 34 bytes).
    let f = file(Some("llama"), 39, &[64], 64).unwrap();
    assert_eq!(f.tensors()[0].ty, TensorType::Ggml(GgmlType::MXFP4));
    assert_eq!(f.tensors()[0].n_bytes, 34);
    let f = file(None, 39, &[64], 64).unwrap();
    assert_eq!(f.tensors()[0].ty, TensorType::Ggml(GgmlType::MXFP4));
    // bitnet file, slot holds exactly MXFP4 + padding: MXFP4.
    let f = file(Some("bitnet"), 39, &[64], 64).unwrap();
    assert_eq!(f.tensors()[0].ty, TensorType::Ggml(GgmlType::MXFP4));
    // bitnet file, slot does not fit MXFP4: bitnet.cpp's TL2, with a typed Unsupported.
    let f = file(Some("BitNet-b1.58"), 39, &[64], 256).unwrap();
    let t = &f.tensors()[0];
    assert_eq!(t.ty, TensorType::Bitnet(BitnetType::TL2));
    assert_eq!(t.n_bytes, 256);
    assert!(matches!(t.ty.ggml(), Err(FormatError::Unsupported { .. })));
    // 36..38 are fork types in bitnet files only.
    for (id, bt) in [
        (36, BitnetType::I2_S),
        (37, BitnetType::I8_S),
        (38, BitnetType::TL1),
    ] {
        let f = file(Some("bitnet"), id, &[128, 4], 160).unwrap();
        assert_eq!(f.tensors()[0].ty, TensorType::Bitnet(bt));
        assert!(matches!(
            f.tensors()[0].ty.ggml(),
            Err(FormatError::Unsupported { .. })
        ));
        assert!(matches!(
            file(Some("llama"), id, &[128, 4], 160),
            Err(FormatError::UnknownType { .. })
        ));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Random corruption of a valid file never panics.
    #[test]
    fn random_mutations_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut b = valid_file();
        for (i, v) in edits {
            let k = i.index(b.len());
            b[k] = v;
        }
        if do_cut {
            let n = cut.index(b.len());
            b.truncate(n);
        }
        if let Ok(f) = GgufFile::from_bytes(b) {
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
            }
        }
        no_big_alloc();
    }
}

/// The fuzz seed corpus (fuzz/corpus/gguf) holds valid files: they must keep opening.
#[test]
fn fuzz_seed_corpus_opens() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let f = GgufFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        }
        n += 1;
    }
    assert!(n >= 5, "{n} seeds in {}", dir.display());
}

/// Fuzz finding (gguf target, crash-e5c4fa98): a NaN metadata value made the harness's
/// `get(k) == Some(v)` check fail (NaN ≠ NaN). The reader was right; this pins that NaN
/// floats read back as NaN, bit for bit, and that `get` returns the file's own entry.
#[test]
fn regression_fuzz_nan_metadata_value() {
    let nan64 = f64::from_bits(0x7ff8_0000_0000_0001);
    let mut r = Raw::header(3, 0, 2);
    r.str(b"x").u32(12).bytes(&nan64.to_bits().to_le_bytes());
    r.str(b"y").u32(6).bytes(&0xffc0_0001u32.to_le_bytes());
    let f = r.open().unwrap();
    for (k, v) in f.metadata() {
        assert!(f.get(k).is_some_and(|g| std::ptr::eq(g, v)));
    }
    match f.get("x") {
        Some(GgufValue::F64(v)) => assert_eq!(v.to_bits(), nan64.to_bits()),
        other => panic!("{other:?}"),
    }
    match f.get("y") {
        Some(GgufValue::F32(v)) => assert_eq!(v.to_bits(), 0xffc0_0001),
        other => panic!("{other:?}"),
    }
}
