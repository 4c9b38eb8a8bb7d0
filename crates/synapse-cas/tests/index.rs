//! The redb index: persistence, cached variants computed once, gc semantics.

use std::cell::Cell;
use std::fs;
use synapse_cas::package::{ManifestTarget, PackageBuilder};
use synapse_cas::{CasError, Index, IndexKey, ObjectId, Store};

fn key(source: ObjectId, enc: &str, v: u32) -> IndexKey {
    IndexKey {
        source,
        encoding: enc.to_string(),
        codec_version: v,
    }
}

#[test]
fn entries_persist_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = ObjectId::of(b"a");
    let b = ObjectId::of(b"b");
    Index::open(&store)
        .insert(&key(a, "syn.q4.symmetric.g64.v1", 1), b)
        .unwrap();
    // A fresh handle (as in a new process) sees it; other keys stay absent.
    let index = Index::open(&Store::open(dir.path()).unwrap());
    assert_eq!(
        index.get(&key(a, "syn.q4.symmetric.g64.v1", 1)).unwrap(),
        Some(b)
    );
    assert_eq!(
        index.get(&key(a, "syn.q4.symmetric.g64.v1", 2)).unwrap(),
        None
    );
    assert_eq!(
        index.get(&key(b, "syn.q4.symmetric.g64.v1", 1)).unwrap(),
        None
    );
    assert_eq!(index.len().unwrap(), 1);
}

#[test]
fn cached_variant_is_computed_once_and_recomputed_when_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let index = Index::open(&store);
    let s = store.session().unwrap();
    let src = s.put(b"source tensor bytes").unwrap().id;
    let k = key(src, "test.halve.v1", 1);
    let calls = Cell::new(0);
    let produce = || {
        calls.set(calls.get() + 1);
        Ok(b"encoded".to_vec())
    };
    let (id1, ran1) = s.cached_variant(&index, &k, produce).unwrap();
    let (id2, ran2) = s.cached_variant(&index, &k, produce).unwrap();
    assert_eq!((ran1, ran2, calls.get()), (true, false, 1));
    assert_eq!(id1, id2);
    assert_eq!(&*store.get(&id1).unwrap(), b"encoded");

    // Corrupt the cached object: the next lookup recomputes instead of returning bad bytes.
    let p = store.object_path(&id1);
    fs::write(&p, b"encodeD").unwrap();
    let (id3, ran3) = s.cached_variant(&index, &k, produce).unwrap();
    assert!(ran3);
    assert_eq!(id3, id1);
    assert_eq!(&*store.get(&id3).unwrap(), b"encoded");
    // An error from the producer is passed through and records nothing.
    let k2 = key(src, "test.fails.v1", 1);
    let r = s.cached_variant(&index, &k2, || Err(CasError::InvalidPackage("boom".into())));
    assert!(r.is_err());
    assert_eq!(index.get(&k2).unwrap(), None);
}

#[test]
fn gc_keeps_variants_of_live_tensors_and_prunes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let index = Index::open(&store);
    let (live_variant, dead_variant, dead_src) = {
        let s = store.session().unwrap();
        let mut b = PackageBuilder::new("test", "test", "unit", "1");
        let live = b
            .add_tensor(&s, "w", "ggml.f32", &[2], &[0u8; 8])
            .unwrap()
            .id;
        b.finish()
            .unwrap()
            .commit(&s, ManifestTarget::Store)
            .unwrap();
        let dead_src = s.put(b"a tensor of a deleted package").unwrap().id;
        let (lv, _) = s
            .cached_variant(
                &index,
                &key(live, "enc", 1),
                || Ok(b"live variant".to_vec()),
            )
            .unwrap();
        let (dv, _) = s
            .cached_variant(&index, &key(dead_src, "enc", 1), || {
                Ok(b"dead variant".to_vec())
            })
            .unwrap();
        (lv, dv, dead_src)
    };
    let st = store.stats().unwrap();
    assert_eq!(st.unreferenced_objects, 2, "dead source and its variant");
    let r = store.gc(false).unwrap();
    assert_eq!((r.deleted_objects, r.pruned_index_entries), (2, 1));
    assert!(store.get(&live_variant).is_ok());
    assert!(!store.contains(&dead_variant));
    assert!(!store.contains(&dead_src));
    assert_eq!(index.len().unwrap(), 1);
    assert_eq!(index.get(&key(dead_src, "enc", 1)).unwrap(), None);
}

#[test]
fn concurrent_index_users_queue_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let store = store.clone();
            scope.spawn(move || {
                let index = Index::open(&store);
                for i in 0..10u32 {
                    let src = ObjectId::of(&[t as u8, i as u8]);
                    index
                        .insert(&key(src, "enc", t), ObjectId::of(&[i as u8]))
                        .unwrap();
                    assert!(index.get(&key(src, "enc", t)).unwrap().is_some());
                }
            });
        }
    });
    assert_eq!(Index::open(&store).len().unwrap(), 40);
}
