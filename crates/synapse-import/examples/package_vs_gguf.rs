//! Import a GGUF file into a temporary package directory and compare: import time, package
//! size vs file size, and the time to open the model and read every tensor from the GGUF
//! directly vs from the package (which re-hashes every object it maps).
//!
//! `cargo run --release -p synapse-import --example package_vs_gguf -- MODEL.gguf`

use std::path::PathBuf;
use std::time::Instant;
use synapse_formats::gguf::GgufFile;
use synapse_import::{Destination, PackageModel, progress::Silent};

fn dir_size(p: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(p).unwrap().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            dir_size(&e.path())
        } else {
            m.len()
        };
    }
    n
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().step_by(4096).map(|&b| b as u64).sum()
}

fn main() -> anyhow::Result<()> {
    let src = PathBuf::from(
        std::env::args()
            .nth(1)
            .expect("usage: package_vs_gguf MODEL.gguf"),
    );
    let tmp = tempfile::tempdir()?;
    let out = tmp.path().join("pkg");

    let t = Instant::now();
    let r = synapse_import::import(&src, &Destination::Directory(out.clone()), &Silent)?;
    let import_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let r2 = synapse_import::import(&src, &Destination::Directory(out.clone()), &Silent)?;
    let reimport_s = t.elapsed().as_secs_f64();
    assert_eq!(r.package, r2.package);

    let t = Instant::now();
    let f = GgufFile::open(&src)?;
    let desc = synapse_model::SourceDesc::from_gguf(&f)?;
    let ir = synapse_model::build_ir(&desc)?;
    let mut a = 0;
    for w in &ir.weights {
        a += checksum(f.tensor_data(f.tensor(&w.name).expect("tensor")));
    }
    let gguf_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let pm = PackageModel::open(out.to_str().expect("utf-8 path"), tmp.path())?;
    let mut b = 0;
    for w in &pm.ir().weights {
        b += checksum(pm.tensor_bytes(&w.name)?);
    }
    let pkg_s = t.elapsed().as_secs_f64();
    assert_eq!(a, b);

    let mib = |x: u64| x as f64 / (1024.0 * 1024.0);
    println!("{}", synapse_import::summary(&r));
    println!("source file        {:.2} MiB", mib(r.source_bytes));
    println!(
        "package directory  {:.2} MiB (manifest + objects, on disk)",
        mib(dir_size(&out))
    );
    println!(
        "import             {import_s:.2} s (validate {:.2}, hash {:.2}, store {:.2}); re-import {reimport_s:.2} s",
        r.validate_s, r.hash_s, r.store_s
    );
    println!(
        "open + read all tensors: GGUF {gguf_s:.3} s, package {pkg_s:.3} s (package verifies every object)"
    );
    Ok(())
}
