//! Import: GGUF and sharded safetensors end to end, determinism, refusal before writing.

mod common;

use std::path::Path;
use synapse_cas::{Package, Store};
use synapse_formats::gguf::GgufFile;
use synapse_import::progress::Silent;
use synapse_import::{Destination, ImportError, import};

fn import_dir(src: &Path, out: &Path) -> synapse_import::ImportReport {
    import(src, &Destination::Directory(out.to_path_buf()), &Silent).unwrap()
}

#[test]
fn gguf_import_is_complete_and_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny.gguf");
    common::write_gguf(&src, common::TINY, &[]);
    let a = import_dir(&src, &tmp.path().join("a"));
    let b = import_dir(&src, &tmp.path().join("b"));
    let ma = std::fs::read(tmp.path().join("a/manifest.toml")).unwrap();
    let mb = std::fs::read(tmp.path().join("b/manifest.toml")).unwrap();
    assert_eq!(ma, mb, "manifests differ between two imports");
    assert_eq!(a.package, b.package);
    assert_eq!(a.family, "llama");

    let f = GgufFile::open(&src).unwrap();
    let pkg = Package::open_dir(&tmp.path().join("a")).unwrap();
    let m = pkg.manifest();
    assert_eq!(m.tensors.len(), f.tensors().len());
    for t in f.tensors() {
        let e = pkg.tensor(&t.name).unwrap();
        assert_eq!(e.dims, t.dims);
        assert_eq!(
            e.encoding,
            format!("ggml.{}", t.ty.name().to_ascii_lowercase())
        );
        assert_eq!(&*pkg.tensor_data(&t.name).unwrap(), f.tensor_data(t));
    }
    // The tied head is an alias, not a copy.
    assert_eq!(m.aliases.len(), 1);
    assert_eq!(m.aliases[0].name, "output.weight");
    assert_eq!(m.aliases[0].target, "token_embd.weight");
    // Source digests, license and tokenizer carried over.
    let d = synapse_cas::FileDigest::of_file(&src).unwrap();
    assert_eq!(m.sources[0].digest, d);
    assert_eq!(m.sources[0].name, "tiny.gguf");
    assert_eq!(m.license.as_ref().unwrap().name.as_deref(), Some("mit"));
    let tok = m.tokenizer.as_ref().unwrap();
    assert_eq!(tok.model, "llama");
    assert!(tok.chat_template.as_ref().unwrap().contains("messages"));
    // The metadata blob is a tensor-less GGUF with every pair of the source, in order.
    let meta = pkg.blob(m.metadata.as_ref().unwrap()).unwrap();
    let mf = GgufFile::from_bytes(meta.to_vec()).unwrap();
    assert_eq!(mf.metadata(), f.metadata());
    assert!(mf.tensors().is_empty());
    // The graph is the IR the family adapter built.
    let graph = pkg.blob(m.graph.as_ref().unwrap()).unwrap();
    let ir: serde_json::Value = serde_json::from_slice(&graph).unwrap();
    assert_eq!(ir["family"], "llama");
    // Every object verifies, and a second import into the same directory writes nothing.
    assert!(pkg.verify(|_| {}).unwrap().problems.is_empty());
    let again = import_dir(&src, &tmp.path().join("a"));
    assert_eq!(again.stats.written_bytes, 0);
    assert_eq!(again.package, a.package);
}

#[test]
fn store_import_dedups_across_packages_and_opens_by_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny.gguf");
    common::write_gguf(&src, common::TINY, &[]);
    let store = tmp.path().join("store");
    let r = import(&src, &Destination::Store(store.clone()), &Silent).unwrap();
    let hex = r.package.hex();
    let pkg = Package::open(&hex[..10], &store).unwrap();
    assert_eq!(pkg.hash(), r.package);
    // A copy of the file under another name: a new package (its sources differ) that shares
    // every object with the first.
    let src2 = tmp.path().join("renamed.gguf");
    std::fs::copy(&src, &src2).unwrap();
    let r2 = import(&src2, &Destination::Store(store.clone()), &Silent).unwrap();
    assert_ne!(r2.package, r.package);
    assert_eq!(r2.stats.written_bytes, 0);
    assert_eq!(r2.stats.deduplicated_bytes, r2.stats.bytes);
    let st = Store::open_existing(&store).unwrap().stats().unwrap();
    assert_eq!((st.packages, st.unreferenced_objects), (2, 0));
}

#[test]
fn sharded_safetensors_import() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    common::write_sharded_safetensors(&ck, common::TINY);
    let a = import_dir(&ck, &tmp.path().join("a"));
    let b = import_dir(&ck, &tmp.path().join("b"));
    assert_eq!(a.package, b.package);
    assert_eq!(
        std::fs::read(tmp.path().join("a/manifest.toml")).unwrap(),
        std::fs::read(tmp.path().join("b/manifest.toml")).unwrap()
    );
    let pkg = Package::open_dir(&tmp.path().join("a")).unwrap();
    let m = pkg.manifest();
    let roles: Vec<(&str, &str)> = m
        .sources
        .iter()
        .map(|s| (s.name.as_str(), s.role.as_str()))
        .collect();
    assert_eq!(
        roles,
        vec![
            ("model-00001-of-00002.safetensors", "safetensors"),
            ("model-00002-of-00002.safetensors", "safetensors"),
            ("config.json", "config"),
            ("tokenizer.json", "tokenizer"),
            ("tokenizer_config.json", "tokenizer-config"),
            ("model.safetensors.index.json", "safetensors-index"),
        ]
    );
    let inv = common::inventory(common::TINY);
    assert_eq!(m.tensors.len(), inv.len());
    for (_, hf, shape, _) in &inv {
        let e = pkg.tensor(hf).unwrap();
        assert_eq!(e.encoding, "ggml.bf16");
        let rev: Vec<u64> = shape.iter().rev().copied().collect();
        assert_eq!(e.dims, rev, "{hf}: dims are stored in ggml order");
    }
    assert_eq!(
        pkg.tensor("lm_head.weight").unwrap().name,
        "model.embed_tokens.weight"
    );
    let tok = m.tokenizer.as_ref().unwrap();
    assert_eq!(tok.model, "bpe");
    assert!(tok.file.is_some() && tok.config.is_some());
    assert!(tok.chat_template.as_ref().unwrap().contains("<s>"));
    let cfg = pkg.blob(m.metadata.as_ref().unwrap()).unwrap();
    assert_eq!(
        &*cfg,
        std::fs::read(ck.join("config.json")).unwrap().as_slice()
    );
    assert!(pkg.verify(|_| {}).unwrap().problems.is_empty());
}

#[test]
fn unsupported_models_are_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    // A tensor no operation uses.
    let src = tmp.path().join("extra.gguf");
    common::write_gguf(&src, common::TINY, &["blk.0.mystery.weight"]);
    let out = tmp.path().join("out");
    let err = import(&src, &Destination::Directory(out.clone()), &Silent).unwrap_err();
    assert!(matches!(err, ImportError::Model(_)), "{err}");
    assert!(err.to_string().contains("blk.0.mystery.weight"), "{err}");
    assert!(!out.exists(), "nothing may be written for a refused model");

    // An unknown architecture.
    let ck = tmp.path().join("ck");
    common::write_sharded_safetensors(&ck, common::TINY);
    let cfg = std::fs::read_to_string(ck.join("config.json")).unwrap();
    std::fs::write(
        ck.join("config.json"),
        cfg.replace("\"llama\"", "\"mamba\""),
    )
    .unwrap();
    let err = import(&ck, &Destination::Directory(out.clone()), &Silent).unwrap_err();
    assert!(err.to_string().contains("mamba"), "{err}");
    assert!(!out.exists());

    // Not a model at all.
    let junk = tmp.path().join("junk.bin");
    std::fs::write(&junk, b"not a model").unwrap();
    assert!(matches!(
        import(&junk, &Destination::Directory(out.clone()), &Silent),
        Err(ImportError::NotAModel { .. })
    ));
    assert!(!out.exists());
}

/// The reader side: a package yields the inventory, IR and bytes the source file gives.
#[test]
fn package_model_matches_the_source() {
    use synapse_formats::safetensors::SafetensorsModel;
    use synapse_import::PackageModel;
    use synapse_model::SourceDesc;

    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny.gguf");
    common::write_gguf(&src, common::TINY, &[]);
    import_dir(&src, &tmp.path().join("g"));
    let pm = PackageModel::open(tmp.path().join("g").to_str().unwrap(), tmp.path()).unwrap();
    let f = GgufFile::open(&src).unwrap();
    let desc = SourceDesc::from_gguf(&f).unwrap();
    let ir = synapse_model::build_ir(&desc).unwrap();
    assert_eq!(pm.ir(), &ir, "stored graph = IR built from the source");
    assert_eq!(pm.desc().arch, desc.arch);
    assert_eq!(pm.desc().meta, desc.meta);
    assert_eq!(pm.desc().eog_tokens, desc.eog_tokens);
    assert_eq!(pm.desc().tensors.len(), desc.tensors.len());
    for (a, b) in pm.desc().tensors.iter().zip(&desc.tensors) {
        assert_eq!(
            (&a.name, &a.shape, a.encoding, a.n_bytes),
            (&b.name, &b.shape, b.encoding, b.n_bytes)
        );
    }
    for w in &ir.weights {
        let t = f.tensor(&w.name).unwrap();
        assert_eq!(pm.tensor_bytes(&w.name).unwrap(), f.tensor_data(t));
    }
    assert_eq!(
        pm.tensor_bytes("output.weight").unwrap(),
        pm.tensor_bytes("token_embd.weight").unwrap()
    );
    assert_eq!(pm.gguf_metadata().unwrap().metadata(), f.metadata());

    let ck = tmp.path().join("ck");
    common::write_sharded_safetensors(&ck, common::TINY);
    import_dir(&ck, &tmp.path().join("s"));
    let pm = PackageModel::open(tmp.path().join("s").to_str().unwrap(), tmp.path()).unwrap();
    let m = SafetensorsModel::open(&ck).unwrap();
    let cfg = std::fs::read_to_string(ck.join("config.json")).unwrap();
    let desc = SourceDesc::from_safetensors(&cfg, &m).unwrap();
    assert_eq!(pm.ir(), &synapse_model::build_ir(&desc).unwrap());
    assert_eq!(pm.desc().meta, desc.meta);
    for t in m.tensors() {
        assert_eq!(pm.tensor_bytes(t.name).unwrap(), t.bytes);
    }
    let (tok, tok_cfg) = pm.hf_tokenizer().unwrap().unwrap();
    assert_eq!(
        &*tok,
        std::fs::read(ck.join("tokenizer.json")).unwrap().as_slice()
    );
    assert!(tok_cfg.is_some());
}

#[test]
fn gguf_package_exports_back_to_the_identical_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny.gguf");
    common::write_gguf(&src, common::TINY, &[]);
    import_dir(&src, &tmp.path().join("g"));
    let pkg = Package::open_dir(&tmp.path().join("g")).unwrap();
    let bytes = synapse_import::export_gguf(&pkg).unwrap();
    assert_eq!(bytes, std::fs::read(&src).unwrap());
    let d = synapse_cas::FileDigest::of(&bytes);
    assert_eq!(d, pkg.manifest().sources[0].digest);
}
