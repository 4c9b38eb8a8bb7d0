//! Crash safety and multi-process writers.
//!
//! The test binary re-executes itself as a child process (running the ignored `child` test with
//! `SYNAPSE_CAS_CHILD` set). Children build packages and index entries in a loop; the parent
//! kills them with SIGKILL at pseudo-random moments, then checks that the store is consistent:
//! no corrupt or missing objects, every manifest whole, every index entry pointing to an intact
//! object. Re-running the build then gives the package hash a clean store gives.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use synapse_cas::package::{ManifestTarget, PackageBuilder};
use synapse_cas::{Index, IndexKey, ObjectId, Package, Store};

const CHILD_ENV: &str = "SYNAPSE_CAS_CHILD";

/// Deterministic tensors of varied sizes (up to ~1.5 MiB, so kills land mid-write).
fn tensor(round: u32, i: u32) -> Vec<u8> {
    let n = 1000 + ((i * 7919 + round * 104_729) % 1_500_000) as usize;
    let seed = (round * 31 + i) as u8;
    (0..n).map(|k| (k as u8).wrapping_mul(13) ^ seed).collect()
}

/// One package build; `round` picks the content. Also records one cached variant per tensor.
fn build_round(store: &Store, round: u32, target: ManifestTarget) -> ObjectId {
    let s = store.session().unwrap();
    let index = Index::open(store);
    let mut b = PackageBuilder::new("test", "test", "crash-test", "1");
    b.option("round", round.to_string());
    for i in 0..6 {
        let out = b
            .add_tensor(&s, &format!("t{i}"), "ggml.i8", &[1], &tensor(round, i))
            .unwrap();
        let key = IndexKey {
            source: out.id,
            encoding: "test.rev.v1".into(),
            codec_version: 1,
        };
        s.cached_variant(&index, &key, || {
            let mut v = tensor(round, i);
            v.reverse();
            Ok(v)
        })
        .unwrap();
    }
    let built = b.finish().unwrap();
    built.commit(&s, target).unwrap();
    built.hash
}

/// Not a test on its own: the body of the child processes.
#[test]
#[ignore = "child process body, run by the other tests"]
fn child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = Store::open(root).unwrap();
    let rounds: u32 = std::env::var("SYNAPSE_CAS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1000);
    for round in 0..rounds {
        build_round(&store, round % 5, ManifestTarget::Store);
    }
}

fn spawn_child(root: &Path, rounds: u32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, root)
        .env("SYNAPSE_CAS_ROUNDS", rounds.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The consistency invariant after any crash.
fn assert_consistent(store: &Store) {
    let report = store.verify(|_| {}).unwrap();
    assert!(
        report.problems.is_empty(),
        "problems after a crash: {:?}",
        report.problems
    );
    for path in store.manifest_paths().unwrap() {
        let pkg = Package::open_manifest(store.clone(), &path).unwrap();
        assert!(pkg.verify(|_| {}).unwrap().problems.is_empty());
    }
    for (key, id) in Index::open(store).entries().unwrap() {
        assert!(store.get(&id).is_ok(), "index entry {key:?} → {id} dangles");
    }
}

/// xorshift: reproducible "random" kill times without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn killed_writers_leave_a_consistent_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut rng = std::env::var("SYNAPSE_CAS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15u64);
    let mut torn_writes = 0;
    for _ in 0..10 {
        let mut child = spawn_child(dir.path(), 1000);
        std::thread::sleep(Duration::from_millis(20 + next(&mut rng) % 400));
        child.kill().unwrap();
        child.wait().unwrap();
        torn_writes += store.stats().unwrap().tmp_files;
        assert_consistent(&store);
    }
    // The children did get work done between kills (so the kills hit a writing process).
    assert!(store.stats().unwrap().objects > 0);
    eprintln!("leftover temp files seen after kills: {torn_writes}");
    // Re-running the interrupted work completes it with the hashes a clean store gets.
    let clean = tempfile::tempdir().unwrap();
    let clean_store = Store::open(clean.path()).unwrap();
    for round in 0..5 {
        let expected = build_round(&clean_store, round, ManifestTarget::Store);
        assert_eq!(build_round(&store, round, ManifestTarget::Store), expected);
    }
    assert_consistent(&store);
    let gc = store.gc(false).unwrap();
    assert_eq!(store.stats().unwrap().tmp_files, 0);
    assert_eq!(store.stats().unwrap().unreferenced_objects, 0, "{gc:?}");
    assert_consistent(&store);
}

#[test]
fn several_processes_write_the_same_objects_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..4).map(|_| spawn_child(dir.path(), 5)).collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a concurrent writer failed");
    }
    let store = Store::open(dir.path()).unwrap();
    assert_consistent(&store);
    let st = store.stats().unwrap();
    assert_eq!(st.packages, 5);
    assert_eq!(st.tmp_files, 0);
    assert_eq!(Index::open(&store).len().unwrap(), 30);
}
