//! The tiny oracle models of `fixtures/tiny/` (made by transformers and llama.cpp's own
//! converter, see fixtures/README.md): each GGUF and each safetensors checkpoint imports
//! deterministically, opens as the IR its source gives, and GGUF packages export back to the
//! converter's file byte for byte.

use std::path::{Path, PathBuf};
use synapse_cas::Package;
use synapse_import::progress::Silent;
use synapse_import::{Destination, PackageModel, import};

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny")
}

#[test]
fn every_tiny_fixture_imports_and_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let mut n = 0;
    for family in synapse_testdata::TINY_FAMILIES {
        let dir = tiny().join(family);
        let ggufs = synapse_testdata::tiny_ggufs(family)
            .iter()
            .map(|f| dir.join(f));
        for src in ggufs.chain(std::iter::once(dir.clone())) {
            let out_a = tmp.path().join(format!("{family}-{n}-a"));
            let out_b = tmp.path().join(format!("{family}-{n}-b"));
            n += 1;
            let a = import(&src, &Destination::Directory(out_a.clone()), &Silent)
                .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
            let b = import(&src, &Destination::Directory(out_b), &Silent).unwrap();
            assert_eq!(a.package, b.package, "{}", src.display());
            // Mixtral is the llama family with experts (its GGUFs say `llama`).
            let want_family = match family {
                "mixtral" => "llama",
                "bitnet-relu2" | "bitnet-w158a8" | "bitnet-packed" => "bitnet",
                f => f,
            };
            assert_eq!(a.family, want_family);
            let pkg = Package::open_dir(&out_a).unwrap();
            assert!(pkg.verify(|_| {}).unwrap().problems.is_empty());
            if src.is_file() {
                let bytes = synapse_import::export_gguf(&pkg).unwrap();
                assert_eq!(bytes, std::fs::read(&src).unwrap(), "{}", src.display());
            }
            let pm = PackageModel::from_package(pkg).unwrap();
            let (desc, ir) = if src.is_file() {
                let f = synapse_formats::gguf::GgufFile::open(&src).unwrap();
                let d = synapse_model::SourceDesc::from_gguf(&f).unwrap();
                let ir = synapse_model::build_ir(&d).unwrap();
                (d, ir)
            } else {
                let m = synapse_formats::safetensors::SafetensorsModel::open(&src).unwrap();
                let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
                let d = synapse_model::SourceDesc::from_safetensors(&cfg, &m).unwrap();
                let ir = synapse_model::build_ir(&d).unwrap();
                (d, ir)
            };
            assert_eq!(pm.ir(), &ir, "{}", src.display());
            assert_eq!(pm.desc().meta, desc.meta);
            for w in &ir.weights {
                assert_eq!(pm.tensor_bytes(&w.name).unwrap().len() as u64, w.n_bytes);
            }
        }
    }
    // 7 families × (F32, Q8_0, safetensors) + bitnet × (F32, TQ1_0, TQ2_0, safetensors) +
    // bitnet-relu2, bitnet-w158a8 and bitnet-packed × safetensors.
    assert_eq!(n, 28);
}
