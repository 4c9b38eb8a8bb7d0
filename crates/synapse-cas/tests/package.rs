//! Packages: determinism, aliases, opening, validation, corruption detection.

use std::fs;
use std::path::Path;
use synapse_cas::package::{
    License, ManifestTarget, PackageBuilder, TokenizerInfo, referenced_ids,
};
use synapse_cas::{CasError, FileDigest, Manifest, ObjectId, Package, Store, VerifyProblem};

fn weights(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(17).wrapping_add(seed))
        .collect()
}

/// Builds the same small package into `root` (as a store or as a package directory).
fn build(root: &Path, target: ManifestTarget) -> synapse_cas::BuiltPackage {
    let store = Store::open(root).unwrap();
    let s = store.session().unwrap();
    let mut b = PackageBuilder::new("gemma3", "gemma3", "synapse-import", "0.1.0");
    b.name("tiny test model");
    b.option("tensors", "source-encoding");
    b.source("model.gguf", "gguf", FileDigest::of(b"pretend gguf file"));
    b.license(License {
        name: Some("gemma".into()),
        link: None,
        from: "gguf:general.license".into(),
        text: None,
    });
    b.tokenizer(TokenizerInfo {
        model: "llama".into(),
        source: "metadata".into(),
        file: None,
        config: None,
        chat_template: Some("{% for m in messages %}{{ m.content }}\n{% endfor %}".into()),
    });
    b.graph(&s, br#"{"layers":2}"#, "application/json").unwrap();
    b.metadata(
        &s,
        br#"{"general.architecture":"gemma3"}"#,
        "application/json",
    )
    .unwrap();
    b.add_tensor(
        &s,
        "token_embd.weight",
        "ggml.q8_0",
        &[32, 16],
        &weights(1, 544),
    )
    .unwrap();
    b.add_tensor(
        &s,
        "blk.0.attn_q.weight",
        "ggml.f16",
        &[32, 32],
        &weights(2, 2048),
    )
    .unwrap();
    // Same bytes as another tensor: stored once by content.
    b.add_tensor(
        &s,
        "blk.1.attn_q.weight",
        "ggml.f16",
        &[32, 32],
        &weights(2, 2048),
    )
    .unwrap();
    b.alias("output.weight", "token_embd.weight").unwrap();
    let built = b.finish().unwrap();
    built.commit(&s, target).unwrap();
    built
}

#[test]
fn same_source_gives_byte_identical_manifests_and_hash() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let pa = build(a.path(), ManifestTarget::Directory);
    let pb = build(b.path(), ManifestTarget::Directory);
    assert_eq!(pa.bytes, pb.bytes);
    assert_eq!(pa.hash, pb.hash);
    let on_disk = fs::read(a.path().join("manifest.toml")).unwrap();
    assert_eq!(on_disk, pa.bytes);
    assert_eq!(ObjectId::of(&on_disk), pa.hash);
    // Re-importing into the same place is a no-op that writes nothing new.
    let again = build(a.path(), ManifestTarget::Directory);
    assert_eq!(again.hash, pa.hash);
    assert_eq!(again.stats.written_bytes, 0);
}

#[test]
fn identity_changes_with_options_and_sources_but_fingerprint_follows_content() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let s = store.session().unwrap();
    let make = |opt: &str, src: &[u8]| {
        let mut b = PackageBuilder::new("f", "a", "c", "1");
        b.option("o", opt);
        b.source("m", "gguf", FileDigest::of(src));
        b.add_tensor(&s, "w", "ggml.f32", &[1], &[0, 0, 128, 63])
            .unwrap();
        b.finish().unwrap().manifest
    };
    let m1 = make("x", b"1");
    let m2 = make("y", b"1");
    let m3 = make("x", b"2");
    assert_ne!(m1.conversion.identity, m2.conversion.identity);
    assert_ne!(m1.conversion.identity, m3.conversion.identity);
    assert_eq!(m1.model.fingerprint, m2.model.fingerprint);
    assert_eq!(m1.model.fingerprint, m3.model.fingerprint);
}

#[test]
fn stats_count_dedup_and_aliases() {
    let d = tempfile::tempdir().unwrap();
    let p = build(d.path(), ManifestTarget::Directory);
    assert_eq!(p.stats.tensors, 3);
    assert_eq!(p.stats.aliases, 1);
    assert_eq!(p.stats.alias_bytes, 544);
    assert_eq!(p.stats.deduplicated_bytes, 2048);
    assert_eq!(p.stats.bytes, 544 + 2048 * 2 + 12 + 33);
    assert_eq!(p.stats.written_bytes, p.stats.bytes - 2048);
}

#[test]
fn open_dir_and_by_hash_resolve_aliases_and_read_tensors() {
    let d = tempfile::tempdir().unwrap();
    let built = build(d.path(), ManifestTarget::Directory);
    let pkg = Package::open_dir(d.path()).unwrap();
    assert_eq!(pkg.hash(), built.hash);
    assert_eq!(
        &*pkg.tensor_data("output.weight").unwrap(),
        weights(1, 544).as_slice()
    );
    assert_eq!(
        pkg.tensor("output.weight").unwrap().name,
        "token_embd.weight"
    );
    assert_eq!(pkg.tensor_names().count(), 4);
    assert!(matches!(
        pkg.tensor_data("nope"),
        Err(CasError::NoSuchTensor(_))
    ));
    let t = pkg.manifest().tokenizer.as_ref().unwrap();
    assert!(t.chat_template.as_ref().unwrap().contains("messages"));

    let store_dir = tempfile::tempdir().unwrap();
    let built2 = build(store_dir.path(), ManifestTarget::Store);
    let hex = built2.hash.hex();
    let by_hash = Package::open(&hex[..12], store_dir.path()).unwrap();
    assert_eq!(by_hash.hash(), built2.hash);
    let by_dir = Package::open(d.path().to_str().unwrap(), store_dir.path()).unwrap();
    assert_eq!(by_dir.hash(), built.hash);
    assert!(matches!(
        Package::open("0123456789ab", store_dir.path()),
        Err(CasError::PackageNotFound { .. })
    ));
}

#[test]
fn package_verify_names_a_flipped_object() {
    let d = tempfile::tempdir().unwrap();
    build(d.path(), ManifestTarget::Directory);
    let pkg = Package::open_dir(d.path()).unwrap();
    assert!(pkg.verify(|_| {}).unwrap().problems.is_empty());
    let victim = pkg.tensor("blk.0.attn_q.weight").unwrap().object;
    let path = pkg.store().object_path(&victim);
    let mut bytes = fs::read(&path).unwrap();
    bytes[100] ^= 0x80;
    fs::write(&path, &bytes).unwrap();
    let report = pkg.verify(|_| {}).unwrap();
    assert_eq!(report.problems.len(), 1);
    assert!(matches!(report.problems[0], VerifyProblem::Corrupt { id, .. } if id == victim));
    assert!(matches!(
        pkg.tensor_data("blk.1.attn_q.weight"),
        Err(CasError::Corrupt { id, .. }) if id == victim
    ));
}

#[test]
fn manifest_rejects_newer_versions_and_inconsistencies() {
    let d = tempfile::tempdir().unwrap();
    let built = build(d.path(), ManifestTarget::Directory);
    let text = String::from_utf8(built.bytes.clone()).unwrap();
    let newer = text.replace("format_version = 1", "format_version = 99");
    assert!(matches!(
        Manifest::parse(&newer, Path::new("m")),
        Err(CasError::UnsupportedVersion {
            found: 99,
            supported: 1
        })
    ));
    let broken = text.replace("target = \"token_embd.weight\"", "target = \"missing\"");
    assert!(matches!(
        Manifest::parse(&broken, Path::new("m")),
        Err(CasError::Manifest { .. })
    ));
    assert!(Manifest::parse("format = \"other\"", Path::new("m")).is_err());
    assert_eq!(
        Manifest::parse(&text, Path::new("m")).unwrap(),
        built.manifest
    );
}

#[test]
fn references_are_exactly_the_prefixed_ids() {
    let d = tempfile::tempdir().unwrap();
    let built = build(d.path(), ManifestTarget::Directory);
    let text = String::from_utf8(built.bytes.clone()).unwrap();
    let refs = referenced_ids(&text).unwrap();
    // 2 blobs + 2 distinct tensor objects (one shared by content); the source digest is bare hex.
    assert_eq!(refs.len(), 4);
    assert!(!refs.contains(&built.manifest.sources[0].digest.blake3));
    let mut with_future_slot = text.clone();
    let extra = ObjectId::of(b"future");
    with_future_slot.push_str(&format!("\n[future_slot]\nthing = \"{extra}\"\n"));
    assert!(referenced_ids(&with_future_slot).unwrap().contains(&extra));
}

#[test]
fn builder_refuses_duplicates_and_dangling_aliases() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let s = store.session().unwrap();
    let mut b = PackageBuilder::new("f", "a", "c", "1");
    b.add_tensor(&s, "w", "ggml.f32", &[1], &[0; 4]).unwrap();
    assert!(b.add_tensor(&s, "w", "ggml.f32", &[1], &[0; 4]).is_err());
    assert!(b.alias("x", "missing").is_err());
    b.alias("x", "w").unwrap();
    assert!(b.alias("x", "w").is_err());
    assert!(b.alias("w", "w").is_err());
}

#[test]
fn an_importance_map_is_stored_in_the_package_and_survives_gc() {
    let cal: std::collections::BTreeMap<String, String> =
        [("calibration_hash".to_string(), "ab12".to_string())].into();
    // A package directory: its manifest is rewritten in place.
    let d = tempfile::tempdir().unwrap();
    let built = build(d.path(), ManifestTarget::Directory);
    let pkg = Package::open_dir(d.path()).unwrap();
    assert!(pkg.importance_map().unwrap().is_none());
    let with = pkg.with_importance(br#"{"map":1}"#, cal.clone()).unwrap();
    assert_ne!(with.hash(), built.hash);
    assert_eq!(
        with.manifest().model.fingerprint,
        built.manifest.model.fingerprint
    );
    let again = Package::open_dir(d.path()).unwrap();
    assert_eq!(again.hash(), with.hash());
    assert_eq!(&*again.importance_map().unwrap().unwrap(), br#"{"map":1}"#);
    assert_eq!(
        again.manifest().importance.as_ref().unwrap().calibration,
        cal
    );
    // A newer map replaces it.
    let newer = again.with_importance(br#"{"map":2}"#, cal.clone()).unwrap();
    let reread = Package::open_dir(d.path()).unwrap();
    assert_eq!(reread.hash(), newer.hash());
    assert_eq!(&*reread.importance_map().unwrap().unwrap(), br#"{"map":2}"#);

    // In a store: a new manifest beside the old one; gc keeps the map of the live one.
    let s = tempfile::tempdir().unwrap();
    let b2 = build(s.path(), ManifestTarget::Store);
    let old = Package::open(&b2.hash.hex(), s.path()).unwrap();
    let new = old.with_importance(br#"{"map":3}"#, cal).unwrap();
    assert_ne!(new.hash(), old.hash());
    assert!(
        Package::open(&b2.hash.hex(), s.path()).is_ok(),
        "the old one stays"
    );
    let opened = Package::open(&new.hash().hex(), s.path()).unwrap();
    assert_eq!(&*opened.importance_map().unwrap().unwrap(), br#"{"map":3}"#);
    let store = Store::open(s.path()).unwrap();
    store.gc(false).unwrap();
    assert_eq!(&*opened.importance_map().unwrap().unwrap(), br#"{"map":3}"#);
    // A flipped byte in the map object: an error, never other bytes.
    let obj = &opened.manifest().importance.as_ref().unwrap().map.object;
    let path = store.object_path(obj);
    let mut perms = fs::metadata(&path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    fs::set_permissions(&path, perms).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[0] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        opened.importance_map(),
        Err(CasError::Corrupt { .. })
    ));
}
