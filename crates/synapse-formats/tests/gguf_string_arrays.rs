//! Metadata string arrays ([`GgufStrings`]): the compact form yields exactly the strings a
//! plain one-`String`-per-element decode gives (the default model's 262,144-token vocabulary
//! when present, a synthetic 300,000-entry one always), and a hostile array (a count the data
//! does not back, invalid UTF-8) fails at open with a typed error without allocating anything
//! sized by its count.
//!
//! A per-thread counting allocator measures what one `GgufFile::from_bytes` call allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use synapse_formats::FormatError;
use synapse_formats::gguf::{GgufArray, GgufFile, GgufStrings, GgufValue, GgufWriter};

struct Counting;
thread_local! {
    /// (tracking on, bytes allocated, largest single allocation) for this thread.
    static COUNT: Cell<(bool, usize, usize)> = const { Cell::new((false, 0, 0)) };
}
fn note(n: usize) {
    let _ = COUNT.try_with(|c| {
        let (on, total, max) = c.get();
        if on {
            c.set((on, total + n, max.max(n)));
        }
    });
}
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

/// Runs `f`, returning its result, the bytes it allocated and the largest allocation.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    COUNT.with(|c| c.set((true, 0, 0)));
    let r = f();
    let (_, total, max) = COUNT.with(|c| c.replace((false, 0, 0)));
    (r, total, max)
}

/// The plain decode: walks a GGUF header by hand and returns every string array as one
/// `String` per element (what the reader held before [`GgufStrings`]).
fn plain_string_arrays(b: &[u8]) -> Vec<(String, Vec<String>)> {
    struct C<'a>(&'a [u8], usize);
    impl C<'_> {
        fn take(&mut self, n: usize) -> &[u8] {
            let s = &self.0[self.1..self.1 + n];
            self.1 += n;
            s
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes(self.take(4).try_into().unwrap())
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.take(8).try_into().unwrap())
        }
        fn string(&mut self) -> String {
            let n = self.u64() as usize;
            String::from_utf8(self.take(n).to_vec()).unwrap()
        }
        fn skip(&mut self, ty: u32) {
            match ty {
                0 | 1 | 7 => self.1 += 1,
                2 | 3 => self.1 += 2,
                4..=6 => self.1 += 4,
                10..=12 => self.1 += 8,
                8 => {
                    self.string();
                }
                9 => {
                    let (elem, n) = (self.u32(), self.u64());
                    for _ in 0..n {
                        self.skip(elem);
                    }
                }
                _ => panic!("type {ty}"),
            }
        }
    }
    let mut c = C(b, 8);
    let _n_tensors = c.u64();
    let n_kv = c.u64();
    let mut out = Vec::new();
    for _ in 0..n_kv {
        let key = c.string();
        let ty = c.u32();
        if ty == 9 {
            let at = c.1;
            let (elem, n) = (c.u32(), c.u64());
            if elem == 8 {
                out.push((key, (0..n).map(|_| c.string()).collect()));
                continue;
            }
            c.1 = at;
        }
        c.skip(ty);
    }
    out
}

/// Every string array of `bytes`, compact vs plain: same keys, same strings, same order.
/// Returns each array's key and length.
fn assert_same_strings(bytes: Vec<u8>) -> Vec<(String, usize)> {
    let plain = plain_string_arrays(&bytes);
    let f = GgufFile::from_bytes(bytes).expect("opens");
    let mut seen = Vec::new();
    for (key, want) in &plain {
        let got = f.get(key).and_then(GgufValue::as_strings).expect(key);
        assert_eq!(got.len(), want.len(), "{key}");
        assert!(got.iter().eq(want.iter().map(String::as_str)), "{key}");
        assert_eq!(got.iter().len(), want.len());
        // Borrowed from the file image, and iterating needs no index: no heap of its own.
        assert_eq!(got.heap_bytes(), 0, "{key}");
        for (i, w) in want.iter().enumerate() {
            assert_eq!(got.get(i), Some(w.as_str()), "{key}[{i}]");
            assert_eq!(&got[i], w.as_str());
        }
        assert_eq!(got.get(want.len()), None);
        assert_eq!(&got.to_vec(), want);
        // Indexed: one u32 end offset per string is all it holds.
        assert_eq!(got.heap_bytes(), 4 * want.len(), "{key}");
        seen.push((key.clone(), want.len()));
    }
    seen
}

/// A deterministic synthetic vocabulary: ASCII, multi-byte, empty and long entries.
fn synthetic_vocab(n: usize) -> Vec<String> {
    let pieces = ["▁", "a", "é", "日本", "🙂", " ", "<0x0A>", "zz", "\u{0}"];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = match i % 97 {
                0 => 0,
                1 => 40,
                _ => (x % 6) as usize,
            };
            (0..k)
                .map(|j| pieces[((x >> (8 * (j % 8))) % pieces.len() as u64) as usize])
                .collect::<String>()
                + &i.to_string()[..usize::from(i % 3 == 0)]
        })
        .collect()
}

#[test]
fn synthetic_vocab_same_as_plain_decode() {
    let vocab = synthetic_vocab(300_000);
    let merges: Vec<String> = vocab
        .iter()
        .take(1000)
        .map(|t| format!("{t} {t}"))
        .collect();
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", GgufValue::String("llama".into()))
        .unwrap();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        GgufValue::Array(GgufArray::String(vocab.clone().into())),
    )
    .unwrap();
    w.add_metadata(
        "empty",
        GgufValue::Array(GgufArray::String(Vec::new().into())),
    )
    .unwrap();
    w.add_metadata(
        "nested",
        GgufValue::Array(GgufArray::Array(vec![
            GgufArray::String(merges.clone().into()),
            GgufArray::String(GgufStrings::from(&["x", ""][..])),
        ])),
    )
    .unwrap();
    w.add_metadata(
        "tokenizer.ggml.merges",
        GgufValue::Array(GgufArray::String(merges.into())),
    )
    .unwrap();
    let seen = assert_same_strings(w.to_bytes().unwrap());
    let lens: Vec<usize> = seen.iter().map(|(_, n)| *n).collect();
    assert_eq!(lens, [300_000, 0, 1000]);
}

#[test]
fn gemma3_vocab_same_as_plain_decode() {
    let path = synapse_testdata::model(synapse_testdata::DEFAULT_MODEL);
    if !synapse_testdata::require(&path, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let bytes = std::fs::read(&path).unwrap();
    // The whole metadata section (the tensor data is not needed to compare strings).
    let seen = assert_same_strings(bytes);
    assert!(
        seen.contains(&("tokenizer.ggml.tokens".to_string(), 262_144)),
        "{seen:?}"
    );
}

/// One string array whose header promises `count` strings: a first string of `first_len`
/// bytes, then `tail` (raw bytes; e.g. nothing: the data ends).
fn one_array(count: u64, first_len: usize, tail: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + first_len + tail.len());
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let key = b"tokenizer.ggml.tokens";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(&(first_len as u64).to_le_bytes());
    b.resize(b.len() + first_len, b'a');
    b.extend_from_slice(tail);
    b
}

/// Regression (peak RSS issue): the reader used to reserve `count` `String`s (24 bytes each)
/// and copy every string before noticing the data ends. A count the file size allows (1 Mi
/// strings of at least 8 bytes in 8 MiB) but the data does not back must fail fast, with
/// almost nothing allocated: at the first string the data does not hold (the second one's
/// length), with nothing allocated per count.
#[test]
fn truncated_string_array_with_a_huge_count_allocates_nothing_per_count() {
    let count = 1 << 20;
    let bytes = one_array(count, 8 << 20, &[]);
    let end = bytes.len() as u64;
    let (r, total, max) = measured(|| GgufFile::from_bytes(bytes));
    match r {
        Err(FormatError::Truncated {
            what,
            offset,
            needed,
            available,
        }) => {
            assert_eq!(what, "tokenizer.ggml.tokens");
            // The 8-byte length of the second string, at the end of the data.
            assert_eq!((offset, needed, available), (end, 8, 0));
        }
        other => panic!("{other:?}"),
    }
    // Error text and bookkeeping only; the old reader allocated 24 MiB + 8 MiB here.
    assert!(total < 64 << 10, "{total} bytes allocated (largest {max})");

    // A count no file could back: rejected before reading any string.
    for count in [u64::MAX, 1 << 40, (8 << 20) / 8 + 2] {
        let bytes = one_array(count, 8 << 20, &[]);
        let (r, total, _) = measured(|| GgufFile::from_bytes(bytes));
        assert!(
            matches!(r, Err(FormatError::CountTooLarge { count: c, .. }) if c == count),
            "{count}: {r:?}"
        );
        assert!(total < 64 << 10, "{count}: {total} bytes allocated");
    }
}

/// Invalid UTF-8 anywhere in a string array is still an error at open (it is validated while
/// the compact form is built), naming the array and the bad string's offset.
#[test]
fn invalid_utf8_in_a_string_array_fails_at_open() {
    let mut tail = Vec::new();
    for s in [&b"ok"[..], b"\xff\xfe", b"after"] {
        tail.extend_from_slice(&(s.len() as u64).to_le_bytes());
        tail.extend_from_slice(s);
    }
    let bytes = one_array(4, 3, &tail);
    // The bad string's bytes: before `after` (5 bytes) and its length (8), 2 bytes long.
    let bad_at = (bytes.len() - 5 - 8 - 2) as u64;
    let (r, total, _) = measured(|| GgufFile::from_bytes(bytes));
    match r {
        Err(FormatError::InvalidUtf8 { what, offset }) => {
            assert_eq!(what, "tokenizer.ggml.tokens");
            assert_eq!(offset, bad_at);
        }
        other => panic!("{other:?}"),
    }
    assert!(total < 64 << 10, "{total} bytes allocated");
    // The same bytes made valid open, and read back.
    let mut tail = Vec::new();
    for s in ["ok", "\u{fe}", "after"] {
        tail.extend_from_slice(&(s.len() as u64).to_le_bytes());
        tail.extend_from_slice(s.as_bytes());
    }
    let f = GgufFile::from_bytes(one_array(4, 3, &tail)).unwrap();
    let s = f
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_strings()
        .unwrap();
    assert_eq!(s.to_vec(), ["aaa", "ok", "\u{fe}", "after"]);
}

/// What the reader must say about `one_array(count, 0, tail)`: the first defect in file order,
/// found string by string, as the old one-`String`-per-element reader did.
fn expected(count: u64, tail: &[u8], base: usize) -> Result<Vec<String>, (&'static str, u64)> {
    let mut pos = 0usize;
    let mut out = vec![String::new()]; // the first string, empty
    for _ in 1..count {
        let Some(len) = tail.get(pos..pos + 8) else {
            return Err(("Truncated", (base + pos) as u64));
        };
        let len = u64::from_le_bytes(len.try_into().unwrap());
        pos += 8;
        if len > (tail.len() - pos) as u64 {
            return Err(("CountTooLarge", (base + pos - 8) as u64));
        }
        let b = &tail[pos..pos + len as usize];
        match std::str::from_utf8(b) {
            Ok(s) => out.push(s.to_string()),
            Err(_) => return Err(("InvalidUtf8", (base + pos) as u64)),
        }
        pos += len as usize;
    }
    Ok(out)
}

fn encode(strings: &[Vec<u8>], lie: Option<u64>) -> Vec<u8> {
    let mut tail = Vec::new();
    for (i, s) in strings.iter().enumerate() {
        let len = match lie {
            Some(l) if i + 1 == strings.len() => l,
            _ => s.len() as u64,
        };
        tail.extend_from_slice(&len.to_le_bytes());
        tail.extend_from_slice(s);
    }
    tail
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Any mix of short and long, valid and invalid strings, with the count or the last
    /// length lying, or the data cut: the same result as a string-by-string check (the
    /// compact form is built only after the whole array checked out), defect and offset
    /// included.
    #[test]
    fn string_array_checks_match_a_string_by_string_check(
        strings in proptest::collection::vec(
            prop_oneof![
                ".{0,6}".prop_map(String::into_bytes),
                ".{40,60}".prop_map(String::into_bytes),
                proptest::collection::vec(any::<u8>(), 0..4),
                proptest::collection::vec(any::<u8>(), 126..300),
                (".{0,3}", any::<u8>(), ".{0,3}").prop_map(|(a, b, c)| {
                    let mut v = a.into_bytes();
                    v.push(b);
                    v.extend_from_slice(c.as_bytes());
                    v
                }),
            ],
            0..24,
        ),
        extra in 0u64..3,
        lie in proptest::option::of(0u64..400),
        cut in proptest::option::of(0usize..64),
    ) {
        let mut tail = encode(&strings, lie);
        if let Some(c) = cut {
            tail.truncate(tail.len().saturating_sub(c));
        }
        let count = 1 + strings.len() as u64 + extra;
        let bytes = one_array(count, 0, &tail);
        let base = bytes.len() - tail.len();
        let r = GgufFile::from_bytes(bytes);
        // The count itself is bounded first (8 bytes a string at least).
        if count * 8 > (tail.len() + 8) as u64 {
            prop_assert!(matches!(r, Err(FormatError::CountTooLarge { .. })), "{r:?}");
            return Ok(());
        }
        match (expected(count, &tail, base), r) {
            (Ok(want), Ok(f)) => {
                let got = f.get("tokenizer.ggml.tokens").unwrap().as_strings().unwrap();
                prop_assert_eq!(got.to_vec(), want);
            }
            (Err(("InvalidUtf8", at)), Err(FormatError::InvalidUtf8 { offset, .. })) => {
                prop_assert_eq!(offset, at)
            }
            (Err(("CountTooLarge", at)), Err(FormatError::CountTooLarge { offset, .. })) => {
                prop_assert_eq!(offset, at)
            }
            (Err(("Truncated", at)), Err(FormatError::Truncated { offset, .. })) => {
                prop_assert_eq!(offset, at)
            }
            (want, got) => prop_assert!(false, "want {want:?}, got {got:?}"),
        }
    }
}
