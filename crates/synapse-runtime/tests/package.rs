//! A Synapse package loads as the same model as its source: for every tiny fixture (the
//! transformers-made safetensors checkpoint, llama.cpp's F32 and Q8_0 GGUF conversions), the
//! model loaded from its imported package directory has the same IR fingerprint and weight
//! bytes, and gives bit-identical logits at every position of the oracle sequences.

mod common;

use std::sync::Arc;

use synapse_import::progress::Silent;
use synapse_import::{Destination, PackageModel, import};
use synapse_runtime::{Executor, KvCache, KvDtype, Model};

/// Logits for every position of every sequence, as bits.
fn logits(model: Model, seqs: &[Vec<u32>]) -> Vec<u32> {
    let model = Arc::new(model);
    let mut exec = Executor::new(model.clone(), 1).unwrap();
    let mut out = Vec::new();
    for s in seqs {
        let mut kv = KvCache::new(&model, KvDtype::F32, 1, 128, 64).unwrap();
        kv.open(0).unwrap();
        let rows = common::all_logit_rows(s);
        out.extend(
            exec.forward(&mut kv, &rows)
                .unwrap()
                .iter()
                .map(|x| x.to_bits()),
        );
    }
    out
}

#[test]
fn packages_load_as_their_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for family in synapse_testdata::TINY_FAMILIES {
        let dir = common::workspace_root().join("fixtures/tiny").join(family);
        if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
            return;
        }
        let seqs = common::tiny_sequences(&dir);
        let ggufs = synapse_testdata::tiny_ggufs(family)
            .iter()
            .map(|f| dir.join(f));
        for src in std::iter::once(dir.clone()).chain(ggufs) {
            let out = tmp.path().join(format!("{family}-{checked}"));
            checked += 1;
            import(&src, &Destination::Directory(out.clone()), &Silent).unwrap();
            let from_src = Model::load(&src).unwrap();
            // Through `Model::load` on the directory, and through an opened `PackageModel`.
            let from_dir = Model::load(&out).unwrap();
            let pm = PackageModel::open_dir(&out).unwrap();
            let from_pm = Model::load_package(&pm).unwrap();
            drop(pm);
            for m in [&from_dir, &from_pm] {
                assert_eq!(
                    m.ir.fingerprint,
                    from_src.ir.fingerprint,
                    "{}",
                    src.display()
                );
                assert_eq!(m.weight_bytes(), from_src.weight_bytes());
                assert_eq!(m.gelu_f16_table, from_src.gelu_f16_table);
            }
            let want = logits(from_src, &seqs);
            assert!(!want.is_empty());
            assert_eq!(logits(from_dir, &seqs), want, "{}", src.display());
            assert_eq!(logits(from_pm, &seqs), want, "{}", src.display());
        }
    }
    assert_eq!(checked, 29);
}

#[test]
fn a_corrupt_package_object_fails_to_load() {
    let dir = common::workspace_root().join("fixtures/tiny/llama");
    if !common::require(&dir.join("model.q8_0.gguf"), "tiny-model fixture") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pkg");
    import(
        &dir.join("model.q8_0.gguf"),
        &Destination::Directory(out.clone()),
        &Silent,
    )
    .unwrap();
    // Flip one byte of the largest object (a weight tensor).
    let mut biggest = (0, std::path::PathBuf::new());
    for shard in std::fs::read_dir(out.join("objects")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            let n = std::fs::metadata(&p).unwrap().len();
            if n > biggest.0 {
                biggest = (n, p);
            }
        }
    }
    let mut bytes = std::fs::read(&biggest.1).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    let mut perm = std::fs::metadata(&biggest.1).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&biggest.1, perm).unwrap();
    std::fs::write(&biggest.1, bytes).unwrap();
    let err = Model::load(&out).unwrap_err().to_string();
    assert!(err.contains("corrupt"), "{err}");
}

/// A package's BitNet projections are stored ternary (`syn.ternary.absmean.tensor.v1`): a
/// stored object whose codes are not ternary (the reserved code 0, under a valid hash: a
/// package written wrong, not corrupted on disk) and a stored encoding this build does not
/// run are typed errors at load, never numbers.
#[test]
fn a_package_with_bad_ternary_projections_fails_to_load() {
    let dir = common::workspace_root().join("fixtures/tiny/bitnet-w158a8");
    if !common::require(&dir.join("oracle.json"), "tiny-model fixture") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pkg");
    import(&dir, &Destination::Directory(out.clone()), &Silent).unwrap();
    let manifest_path = out.join("manifest.toml");
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    let good = synapse_cas::Manifest::parse(&text, &manifest_path).unwrap();
    let i = good
        .tensors
        .iter()
        .position(|t| t.source.is_some())
        .expect("a ternary projection");
    assert_eq!(good.tensors[i].encoding, synapse_import::TERNARY_ENCODING);
    let store = synapse_cas::Store::open(&out).unwrap();
    let mut bytes = store.get(&good.tensors[i].object).unwrap().to_vec();
    bytes[4] &= !0b11; // element 0: code 0
    let session = store.session().unwrap();
    let bad_object = session.put(&bytes).unwrap().id;
    drop(session);
    let write = |m: &synapse_cas::Manifest| {
        std::fs::write(&manifest_path, m.to_toml().unwrap()).unwrap();
    };

    let mut m = good.clone();
    m.tensors[i].object = bad_object;
    write(&m);
    let err = Model::load(&out).unwrap_err().to_string();
    assert!(err.contains("reserved code"), "{err}");

    let mut m = good.clone();
    m.tensors[i].encoding = "syn.q4.symmetric.g64.v1".into();
    write(&m);
    let err = Model::load(&out).unwrap_err().to_string();
    assert!(err.contains("which this build cannot read"), "{err}");

    write(&good);
    Model::load(&out).unwrap();
}
