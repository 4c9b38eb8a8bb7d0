//! Object store: round trips, idempotence, corruption detection, concurrent writers, gc.

mod common;

use proptest::prelude::*;
use std::fs;
use synapse_cas::package::{ManifestTarget, PackageBuilder};
use synapse_cas::{CasError, ObjectId, Store, VerifyProblem};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn put_get_roundtrip_and_layout() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.session().unwrap();
    let data = pattern(100_000, 7);
    let out = s.put(&data).unwrap();
    assert!(out.written);
    assert_eq!(
        out.id,
        ObjectId::from_bytes(*blake3::hash(&data).as_bytes())
    );
    let hex = out.id.hex();
    assert!(
        dir.path()
            .join("objects")
            .join(&hex[..2])
            .join(&hex[2..])
            .is_file()
    );
    assert_eq!(&*store.get(&out.id).unwrap(), data.as_slice());
    // Idempotent: the second put writes nothing.
    let again = s.put(&data).unwrap();
    assert_eq!(again.id, out.id);
    assert!(!again.written);
    // Empty objects work too (no zero-length mmap).
    let e = s.put(&[]).unwrap();
    assert_eq!(store.get(&e.id).unwrap().len(), 0);
    // Nothing left in tmp/.
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

#[test]
fn missing_object_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let id = ObjectId::of(b"never stored");
    assert!(matches!(store.get(&id), Err(CasError::Missing { id: m, .. }) if m == id));
}

#[test]
fn flipped_byte_is_detected_and_named_then_repaired_by_put() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let data = pattern(4096, 1);
    let id = store.session().unwrap().put(&data).unwrap().id;
    let path = store.object_path(&id);
    let mut bytes = fs::read(&path).unwrap();
    bytes[1234] ^= 0x01;
    fs::write(&path, &bytes).unwrap();

    match store.get(&id) {
        Err(CasError::Corrupt {
            id: bad, actual, ..
        }) => {
            assert_eq!(bad, id);
            assert_eq!(actual, ObjectId::of(&bytes));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let report = store.verify(|_| {}).unwrap();
    assert_eq!(
        report.problems,
        vec![VerifyProblem::Corrupt {
            id,
            actual: ObjectId::of(&bytes)
        }]
    );
    assert!(report.problems[0].to_string().contains(&id.hex()));

    // Writing the same content again replaces the corrupt object.
    let out = store.session().unwrap().put(&data).unwrap();
    assert!(out.written);
    assert_eq!(&*store.get(&id).unwrap(), data.as_slice());
    assert!(store.verify(|_| {}).unwrap().problems.is_empty());
}

#[test]
fn truncated_object_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let id = store
        .session()
        .unwrap()
        .put(&pattern(10_000, 3))
        .unwrap()
        .id;
    let path = store.object_path(&id);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..5000]).unwrap();
    assert!(matches!(store.get(&id), Err(CasError::Corrupt { .. })));
}

#[test]
fn concurrent_writers_of_the_same_object_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let data = pattern(3 << 20, 9);
    let ids: Vec<ObjectId> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                let data = &data;
                scope.spawn(move || store.session().unwrap().put(data).unwrap().id)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.windows(2).all(|w| w[0] == w[1]));
    let (objects, stray) = store.list_objects().unwrap();
    assert_eq!(objects.len(), 1);
    assert!(stray.is_empty());
    assert_eq!(&*store.get(&ids[0]).unwrap(), data.as_slice());
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

#[test]
fn gc_keeps_referenced_deletes_unreferenced_and_tmp() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let keep = pattern(5000, 1);
    let drop_me = pattern(7000, 2);
    {
        let s = store.session().unwrap();
        let mut b = PackageBuilder::new("test", "test", "unit", "1");
        b.add_tensor(&s, "w", "ggml.f32", &[1250], &keep).unwrap();
        b.finish()
            .unwrap()
            .commit(&s, ManifestTarget::Store)
            .unwrap();
        s.put(&drop_me).unwrap();
    }
    fs::write(dir.path().join("tmp/999-0-0.tmp"), b"half an object").unwrap();

    let st = store.stats().unwrap();
    assert_eq!((st.objects, st.packages), (2, 1));
    assert_eq!((st.referenced_objects, st.referenced_bytes), (1, 5000));
    assert_eq!((st.unreferenced_objects, st.unreferenced_bytes), (1, 7000));
    assert_eq!(st.tmp_files, 1);

    let dry = store.gc(true).unwrap();
    assert_eq!(
        (dry.deleted_objects, dry.deleted_bytes, dry.deleted_tmp),
        (1, 7000, 1)
    );
    assert_eq!(
        store.list_objects().unwrap().0.len(),
        2,
        "dry run deletes nothing"
    );

    let report = store.gc(false).unwrap();
    assert_eq!(report, dry);
    assert!(store.get(&ObjectId::of(&keep)).is_ok());
    assert!(matches!(
        store.get(&ObjectId::of(&drop_me)),
        Err(CasError::Missing { .. })
    ));
    let st = store.stats().unwrap();
    assert_eq!(
        (st.objects, st.unreferenced_objects, st.tmp_files),
        (1, 0, 0)
    );
    assert!(store.verify(|_| {}).unwrap().problems.is_empty());
}

/// gc blocks on the store lock while a write session is open, deletes nothing meanwhile, and runs
/// once the session is dropped. "Blocked" is what the kernel reports (`/proc/locks` lists gc's
/// exclusive request as a waiter on the store's lock file), not the absence of a result within
/// some time; the 20 s deadline only stops a hang.
#[test]
fn gc_waits_for_running_writers() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let session = store.session().unwrap();
    let id = session.put(&pattern(1000, 5)).unwrap().id;
    let lock = dir.path().join("lock");
    // gc's exclusive request, blocked behind the session's shared lock.
    let gc_waiting = || {
        common::flocks(&lock).contains(&common::Flock {
            pid: std::process::id(),
            exclusive: true,
            waiting: true,
        })
    };
    // The session's shared lock, as the kernel lists it (read again for a moment if a
    // listing missed it while other processes' locks changed).
    let held = [common::Flock {
        pid: std::process::id(),
        exclusive: false,
        waiting: false,
    }];
    let mut seen = common::flocks(&lock);
    let t0 = Instant::now();
    while seen != held && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
        seen = common::flocks(&lock);
    }
    assert_eq!(seen, held);
    let released = Arc::new(AtomicBool::new(false));
    let gc_store = store.clone();
    let gc_released = released.clone();
    let h = std::thread::spawn(move || {
        let r = gc_store.gc(false).unwrap();
        (r, gc_released.load(Ordering::SeqCst))
    });
    // While the session is open (an import that has not written its manifest yet), gc waits for
    // the exclusive lock.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !gc_waiting() {
        assert!(
            !h.is_finished(),
            "gc returned while a write session was open"
        );
        assert!(
            Instant::now() < deadline,
            "gc never waited on the store lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Blocked there, it has deleted nothing: the unreferenced object is still in place.
    assert!(store.contains(&id));
    assert!(!h.is_finished());
    released.store(true, Ordering::SeqCst);
    drop(session);
    let (r, after_release) = h.join().unwrap();
    assert!(after_release, "gc returned before the session was dropped");
    assert_eq!(r.deleted_objects, 1);
    assert!(!store.contains(&id));
    assert!(common::flocks(&lock).is_empty());
}

#[test]
fn verify_reports_missing_referenced_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let s = store.session().unwrap();
    let mut b = PackageBuilder::new("test", "test", "unit", "1");
    let out = b
        .add_tensor(&s, "w", "ggml.f32", &[4], &pattern(16, 0))
        .unwrap();
    b.finish()
        .unwrap()
        .commit(&s, ManifestTarget::Directory)
        .unwrap();
    drop(s);
    fs::remove_file(store.object_path(&out.id)).unwrap();
    let report = store.verify(|_| {}).unwrap();
    assert!(matches!(&report.problems[..], [VerifyProblem::Missing { id, .. }] if *id == out.id));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn any_bytes_roundtrip(data in proptest::collection::vec(any::<u8>(), 0..20_000)) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let out = store.session().unwrap().put(&data).unwrap();
        prop_assert_eq!(out.size, data.len() as u64);
        prop_assert_eq!(&*store.get(&out.id).unwrap(), data.as_slice());
    }
}
