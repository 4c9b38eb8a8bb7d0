//! The default real model (Gemma 3 270M Q4_K_M), when `.ci/fetch-test-data` has put it in the
//! model cache: import → verify → export gives back the identical file (sha256 equal to the
//! source digest), and the package opens as a model with the IR built from the file.

use std::path::PathBuf;
use synapse_cas::Package;
use synapse_import::progress::Silent;
use synapse_import::{Destination, PackageModel, import};

/// Same lookup as `synapse-cli generate`: `$SYNAPSE_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/synapse/models`, else `~/.cache/synapse/models`.
fn default_model() -> Option<PathBuf> {
    let dir = if let Some(d) = std::env::var_os("SYNAPSE_MODEL_DIR") {
        PathBuf::from(d)
    } else if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        PathBuf::from(x).join("synapse/models")
    } else {
        PathBuf::from(std::env::var_os("HOME")?).join(".cache/synapse/models")
    };
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    p.is_file().then_some(p)
}

#[test]
fn default_model_imports_and_exports_identically() {
    let Some(src) = default_model() else {
        eprintln!("default model not in the model cache (run .ci/fetch-test-data); skipped");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pkg");
    let r = import(&src, &Destination::Directory(out.clone()), &Silent).unwrap();
    assert_eq!(r.family, "gemma3");
    assert_eq!(r.stats.tensors, 236);
    let pkg = Package::open_dir(&out).unwrap();
    assert!(pkg.verify(|_| {}).unwrap().problems.is_empty());
    let bytes = synapse_import::export_gguf(&pkg).unwrap();
    assert_eq!(
        synapse_cas::FileDigest::of(&bytes),
        pkg.manifest().sources[0].digest,
        "export must rebuild the source file byte for byte"
    );
    drop(bytes);
    let pm = PackageModel::from_package(pkg).unwrap();
    let f = synapse_formats::gguf::GgufFile::open(&src).unwrap();
    let ir = synapse_model::build_ir(&synapse_model::SourceDesc::from_gguf(&f).unwrap()).unwrap();
    assert_eq!(pm.ir(), &ir);
    assert_eq!(pm.ir().fingerprint, ir.fingerprint);
}
