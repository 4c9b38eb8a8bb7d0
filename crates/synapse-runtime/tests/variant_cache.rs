//! Re-encoded tensors are quantized once: through a `VariantCache` (a CAS object store and its
//! variant index) the first build of a profile encodes and stores every tensor, a second build
//! quantizes nothing and memory-maps the stored objects, and both run bit for bit like the
//! uncached variant. A corrupt, missing or wrong-sized cached object is re-encoded and
//! replaced, never used.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use synapse_cas::{Index, ObjectId};
use synapse_codecs::EncodingId;
use synapse_runtime::importance::linears;
use synapse_runtime::precision::{Precision, apply};
use synapse_runtime::{VariantCache, VariantStats};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every cached variant's object path, by its index entry.
fn cached_objects(cache: &VariantCache) -> Vec<std::path::PathBuf> {
    Index::open(cache.store())
        .entries()
        .unwrap()
        .into_iter()
        .map(|(_, id)| cache.store().object_path(&id))
        .collect()
}

#[test]
fn second_build_quantizes_nothing_and_corrupt_objects_are_replaced() {
    let Some((model, seq)) = common::tiny_q8_model("llama") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = VariantCache::open(dir.path()).unwrap();
    let id = EncodingId::Symmetric { bits: 4, group: 64 };
    let p = Precision::Uniform(id);
    let n = linears(&model).len();

    let plain = apply(&model, &p, None).unwrap();
    assert_eq!(
        plain.variants,
        VariantStats {
            encoded: n,
            reused: 0,
            replaced: 0
        }
    );
    let want = bits(&common::alone_logits(&plain.model, &seq));

    let first = apply(&model, &p, Some(&cache)).unwrap();
    assert_eq!(first.variants.encoded, n);
    assert_eq!(first.variants.reused, 0);
    assert_eq!(bits(&common::alone_logits(&first.model, &seq)), want);
    // Tied or not, the index holds one entry per distinct (tensor bytes, encoding).
    let objects = cached_objects(&cache);
    assert!(!objects.is_empty() && objects.len() <= n);

    let second = apply(&model, &p, Some(&cache)).unwrap();
    assert_eq!(
        second.variants,
        VariantStats {
            encoded: 0,
            reused: n,
            replaced: 0
        },
        "the second build quantizes nothing"
    );
    assert_eq!(second.model.profile.hash(), first.model.profile.hash());
    assert_eq!(bits(&common::alone_logits(&second.model, &seq)), want);

    // The key is the tensor's own bytes: the id a package stores the tensor under.
    let (name, m) = linears(&model).into_iter().next().unwrap();
    let key = VariantCache::key(&m, id);
    assert_eq!(key.source, ObjectId::of(m.raw_bytes()), "{name}");
    assert_eq!(key.encoding, "syn.q4.symmetric.g64.v1");

    // A flipped byte in one cached object: re-encoded, replaced, the logits unchanged.
    let victim = &objects[0];
    let mut perms = std::fs::metadata(victim).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(victim, perms).unwrap();
    let mut bytes = std::fs::read(victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(victim, &bytes).unwrap();
    let third = apply(&model, &p, Some(&cache)).unwrap();
    assert!(third.variants.replaced >= 1, "{:?}", third.variants);
    assert_eq!(third.variants.encoded, third.variants.replaced);
    assert_eq!(third.variants.encoded + third.variants.reused, n);
    assert_eq!(bits(&common::alone_logits(&third.model, &seq)), want);
    let fourth = apply(&model, &p, Some(&cache)).unwrap();
    assert_eq!(fourth.variants.reused, n, "the replacement is cached again");

    // A missing object: the same.
    for o in cached_objects(&cache) {
        std::fs::remove_file(o).unwrap();
    }
    let fifth = apply(&model, &p, Some(&cache)).unwrap();
    assert_eq!(fifth.variants.encoded, n);
    assert!(fifth.variants.replaced >= 1);
    assert_eq!(bits(&common::alone_logits(&fifth.model, &seq)), want);
}

#[test]
fn a_valid_object_of_the_wrong_size_is_not_used() {
    let Some((model, seq)) = common::tiny_q8_model("llama") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = VariantCache::open(dir.path()).unwrap();
    let q4 = EncodingId::Symmetric { bits: 4, group: 64 };
    let all: Vec<String> = linears(&model).into_iter().map(|(n, _)| n).collect();
    let name = all[0].clone();
    let changes: BTreeMap<String, EncodingId> = [(name.clone(), q4)].into();
    let (want, _) = model.with_encodings_cached(&changes, None).unwrap();
    let want = bits(&common::alone_logits(&Arc::new(want), &seq));
    // Point the tensor's entry at an intact object of another size (a hash-valid object
    // the index should never have named): it is refused and the tensor re-encoded.
    let m = linears(&model).into_iter().next().unwrap().1.clone();
    let key = VariantCache::key(&m, q4);
    let wrong = cache
        .store()
        .session()
        .unwrap()
        .put(&[1, 2, 3, 4])
        .unwrap()
        .id;
    Index::open(cache.store()).insert(&key, wrong).unwrap();
    let (v, stats) = model.with_encodings_cached(&changes, Some(&cache)).unwrap();
    assert_eq!(
        stats,
        VariantStats {
            encoded: 1,
            reused: 0,
            replaced: 1
        }
    );
    assert_eq!(bits(&common::alone_logits(&Arc::new(v), &seq)), want);
    assert_ne!(Index::open(cache.store()).get(&key).unwrap(), Some(wrong));
}
