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
            let transcoded = pkg.manifest().tensors.iter().any(|t| t.source.is_some());
            if src.is_file() && !transcoded {
                let bytes = synapse_import::export_gguf(&pkg).unwrap();
                assert_eq!(bytes, std::fs::read(&src).unwrap(), "{}", src.display());
            } else if src.is_file() {
                // Stored ternary: the source file cannot be given back.
                let e = synapse_import::export_gguf(&pkg).unwrap_err().to_string();
                assert!(e.contains("cannot give back its source file"), "{e}");
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
            // BitNet's W1.58A8 projections (masters, packed or I2_S) are stored ternary, every
            // other tensor as the source holds it.
            // name → elements of the logical matrix
            let projections: std::collections::HashMap<&str, u64> = match ir.projection_quant {
                Some(_) => ir
                    .projections()
                    .iter()
                    .map(|l| {
                        let n = u64::from(l.in_features) * u64::from(l.out_features);
                        (ir.weight(l.weight).name.as_str(), n)
                    })
                    .collect(),
                None => Default::default(),
            };
            for w in &ir.weights {
                if let Some(&n) = projections.get(w.name.as_str()) {
                    let (encoding, bytes) = pm.transcoded(&w.name).unwrap().unwrap();
                    assert_eq!(encoding, synapse_import::TERNARY_ENCODING);
                    assert_eq!(bytes.len() as u64, 4 + n.div_ceil(4), "{}", w.name);
                    assert!(pm.tensor_bytes(&w.name).is_err());
                } else {
                    assert!(pm.transcoded(&w.name).unwrap().is_none());
                    assert_eq!(pm.tensor_bytes(&w.name).unwrap().len() as u64, w.n_bytes);
                }
            }
            let stored = pkg_stored_ternary(&out_a);
            assert_eq!(stored, projections.len(), "{}", src.display());
        }
    }
    // 7 families × (F32, Q8_0, safetensors) + bitnet × (F32, TQ1_0, TQ2_0, safetensors) +
    // bitnet-relu2, bitnet-w158a8 and bitnet-packed × safetensors + bitnet-packed's I2_S GGUF.
    assert_eq!(n, 29);
}

/// How many tensors the package at `dir` stores ternary.
fn pkg_stored_ternary(dir: &Path) -> usize {
    Package::open_dir(dir)
        .unwrap()
        .manifest()
        .tensors
        .iter()
        .filter(|t| t.encoding == synapse_import::TERNARY_ENCODING && t.source.is_some())
        .count()
}

/// BitNet's W1.58A8 projections in packages: ~2 bits a weight whatever the source held
/// (BF16 masters ternarised at import, transformers' packed `uint8`, bitnet.cpp's I2_S), the
/// option recorded in the conversion identity; the packed checkpoint and bitnet.cpp's I2_S
/// conversion of it (scale `1 / weight_scale`) store the very same ternary objects.
#[test]
fn bitnet_projections_are_stored_ternary() {
    let tmp = tempfile::tempdir().unwrap();
    let ternary_objects = |src: &Path, out: &str| {
        let out = tmp.path().join(out);
        let r = import(src, &Destination::Directory(out.clone()), &Silent)
            .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let pkg = Package::open_dir(&out).unwrap();
        let m = pkg.manifest();
        assert_eq!(
            m.conversion
                .options
                .get("bitnet-projections")
                .map(String::as_str),
            Some(synapse_import::TERNARY_ENCODING)
        );
        let mut stored = 0u64;
        let mut source = 0u64;
        let mut objects = std::collections::BTreeSet::new();
        for t in &m.tensors {
            if let Some(f) = &t.source {
                assert_eq!(t.encoding, synapse_import::TERNARY_ENCODING);
                // 2 bits a weight and the 4-byte scale.
                let n = t.dims.iter().product::<u64>();
                assert_eq!(t.size, 4 + n.div_ceil(4), "{}", t.name);
                stored += t.size;
                source += f.size;
                objects.insert(t.object);
            }
        }
        eprintln!(
            "{}: {} projections, {stored} bytes stored ternary from {source} source bytes; \
             package {} bytes",
            src.display(),
            objects.len(),
            r.stats.bytes
        );
        (objects, stored, source)
    };
    let tiny = tiny();
    let (_, stored, source) = ternary_objects(&tiny.join("bitnet-w158a8"), "w158a8");
    // BF16 masters: 16 bits a weight in the source, 2 (+ a scale per tensor) stored.
    assert!(stored * 7 < source, "{stored} of {source}");
    let (packed, stored, source) = ternary_objects(&tiny.join("bitnet-packed"), "packed");
    assert_eq!(stored, source + 4 * packed.len() as u64);
    let (i2s, _, _) = ternary_objects(&tiny.join("bitnet-packed/model.i2_s.gguf"), "i2s");
    assert_eq!(packed, i2s);
}
