//! Fuzzes the safetensors reader: `Ok` or a typed error, never a panic; accepted entries tile
//! the data section and their views have the announced length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use synapse_formats::safetensors::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = SafetensorsFile::from_bytes(data.to_vec()) {
        let mut covered = 0u64;
        for e in f.entries() {
            assert_eq!(f.data(e).len() as u64, e.n_bytes);
            assert_eq!(f.entry(&e.name).map(|x| x.offset), Some(e.offset));
            covered += e.n_bytes;
        }
        assert!(covered <= data.len() as u64);
    }
});
