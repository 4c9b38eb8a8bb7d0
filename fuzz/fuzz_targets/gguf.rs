//! Fuzzes the GGUF reader: any input must give `Ok` or a typed error, never a panic, and an
//! accepted file's tensor views must be exactly as long as their infos say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use synapse_formats::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_bytes(data.to_vec()) {
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
            assert!(t.offset + t.n_bytes <= f.file_len());
            assert_eq!(f.tensor(&t.name), Some(t));
            let _ = t.ty.ggml();
        }
        for (k, v) in f.metadata() {
            // Same entry (by address: NaN values are not equal to themselves).
            assert!(f.get(k).is_some_and(|g| std::ptr::eq(g, v)));
            let _ = (v.as_u64(), v.as_i64(), v.as_f32(), v.as_str());
            // String arrays are indexed in place over the file image: every element readable.
            if let Some(s) = v.as_strings() {
                assert_eq!(s.iter().count(), s.len());
                assert!(s.iter().zip(0..).all(|(x, i)| s.get(i) == Some(x)));
                assert_eq!(s.get(s.len()), None);
            }
        }
        let _ = f.architecture();
    }
});
