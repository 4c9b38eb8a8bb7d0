//! Crash safety and multi-process writers.
//!
//! The test binary re-executes itself as a child process (running the ignored `child` test with
//! `SYNAPSE_CAS_CHILD` set). Children build packages and index entries and print an event line
//! when each write starts (a tensor, a cached variant with its index entry, a manifest) and
//! when it has returned. The parent kills a child with SIGKILL inside a write, at a chosen place
//! in its sequence of writes (not after a delay): after the chosen "write starts" line, as soon
//! as it sees the write in progress in the store, either an object's or manifest's temporary
//! file in `tmp/` or the child holding the index lock for a variant's entry (`/proc/locks`).
//! After each kill it checks that the store is consistent: no corrupt or missing objects, every
//! manifest whole, every index entry pointing to an intact object. From the child's last event
//! and the store's `tmp/` it knows whether the kill cut that write short, and it asserts that
//! kills did. Re-running the interrupted builds then gives the package hashes a clean store
//! gives.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use synapse_cas::package::{ManifestTarget, PackageBuilder};
use synapse_cas::{Index, IndexKey, ObjectId, Package, Store};

const CHILD_ENV: &str = "SYNAPSE_CAS_CHILD";
/// The prefix of the children's event lines on stdout (the test harness prints there too).
const EVENT: &str = "@cas-event";
/// Tensors per package; each is one object write and one cached variant (object + index entry).
const TENSORS: u32 = 6;
/// Writes per [`build_round`]: the tensors, their variants and the manifest.
const WRITES_PER_ROUND: u32 = 2 * TENSORS + 1;

/// The size of the first tensor of each round (and of its variant), at least: big enough that
/// copying its bytes takes a while (milliseconds), so that a kill can land in the middle.
const BIG: u64 = 4 << 20;

/// Deterministic tensors of varied sizes: the first of each round 4 to 5 MiB, the others up to
/// 256 KiB.
fn tensor(round: u32, i: u32) -> Vec<u8> {
    let vary = ((i * 7919 + round * 104_729) % (1 << 18)) as usize;
    let n = if i == 0 {
        BIG as usize + 4 * vary
    } else {
        1000 + vary
    };
    let seed = (round * 31 + i) as u8;
    (0..n).map(|k| (k as u8).wrapping_mul(13) ^ seed).collect()
}

/// One package build; `round` picks the content. Also records one cached variant per tensor.
/// `event(started, what, bytes)` is called just before each write starts (`true`) and after it
/// has returned (`false`); `bytes` is the size of the object written (0 for the manifest).
fn build_round(
    store: &Store,
    round: u32,
    target: ManifestTarget,
    event: &mut dyn FnMut(bool, &str, usize),
) -> ObjectId {
    let s = store.session().unwrap();
    let index = Index::open(store);
    let mut b = PackageBuilder::new("test", "test", "crash-test", "1");
    b.option("round", round.to_string());
    for i in 0..TENSORS {
        let data = tensor(round, i);
        let what = format!("tensor{i}");
        event(true, &what, data.len());
        let out = b
            .add_tensor(&s, &format!("t{i}"), "ggml.i8", &[1], &data)
            .unwrap();
        event(false, &what, data.len());
        let key = IndexKey {
            source: out.id,
            encoding: "test.rev.v1".into(),
            codec_version: 1,
        };
        let what = format!("variant{i}");
        let n = data.len();
        s.cached_variant(&index, &key, || {
            let mut v = data;
            v.reverse();
            event(true, &what, n);
            Ok(v)
        })
        .unwrap();
        event(false, &what, n);
    }
    let built = b.finish().unwrap();
    event(true, "manifest", 0);
    built.commit(&s, target).unwrap();
    event(false, "manifest", 0);
    built.hash
}

fn quiet(_: bool, _: &str, _: usize) {}

/// Not a test on its own: the body of the child processes. Builds rounds `SYNAPSE_CAS_FIRST`
/// to `SYNAPSE_CAS_FIRST + SYNAPSE_CAS_ROUNDS - 1`, printing `@cas-event start|end <round> <what> <bytes>`
/// around every write.
#[test]
#[ignore = "child process body, run by the other tests"]
fn child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let var = |name: &str| -> u32 { std::env::var(name).unwrap().parse().unwrap() };
    let store = Store::open(root).unwrap();
    let first = var("SYNAPSE_CAS_FIRST");
    for round in first..first + var("SYNAPSE_CAS_ROUNDS") {
        // println! flushes at each newline, so the parent sees each line before what follows.
        build_round(
            &store,
            round,
            ManifestTarget::Store,
            &mut |started, what, bytes| {
                let kind = if started { "start" } else { "end" };
                println!("{EVENT} {kind} {round} {what} {bytes}");
            },
        );
    }
}

fn spawn_child(root: &Path, first: u32, rounds: u32, stdout: Stdio) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, root)
        .env("SYNAPSE_CAS_FIRST", first.to_string())
        .env("SYNAPSE_CAS_ROUNDS", rounds.to_string())
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// One `@cas-event` line of a child.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    /// A write starts (else: it has returned).
    started: bool,
    round: u32,
    /// `tensor<i>`, `variant<i>` or `manifest`.
    what: String,
    /// The size of the object written (0: the manifest).
    bytes: u64,
}

/// Parses a line of the child's stdout. The first event shares its line with the harness's
/// `test child ... `.
fn parse_event(line: &str) -> Option<Event> {
    let mut f = line[line.find(EVENT)? + EVENT.len()..].split_whitespace();
    Some(Event {
        started: f.next()? == "start",
        round: f.next()?.parse().ok()?,
        what: f.next()?.to_string(),
        bytes: f.next()?.parse().ok()?,
    })
}

/// Which stage of a write a kill is aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aim {
    /// A big object's bytes being copied into its temporary file in `tmp/` (the file is
    /// shorter than the object).
    Bytes,
    /// An object or manifest being written and not yet renamed into place: the child has a
    /// temporary file in `tmp/` (mostly its fsync).
    File,
    /// A cached variant's index entry being committed: the child holds the index lock (which an
    /// index update holds around its redb transaction) after its variant's write started.
    Index,
}

/// What one kill interrupted.
#[derive(Debug)]
struct Kill {
    aim: Aim,
    /// The child's last event.
    last: Event,
    /// Writes that ended while the parent watched for the stage aimed at (it was not seen in
    /// them).
    missed: usize,
    /// It died in the write it was seen in, at the stage aimed at: for [`Aim::Bytes`] and
    /// [`Aim::File`] its temporary file is left in `tmp/` (shorter than the object for
    /// `Bytes`); for [`Aim::Index`] it died before reporting that write done.
    cut: bool,
}

/// The sizes of the temporary files of the process `pid` in the store's `tmp/` (write_atomic
/// names them `<pid>-<counter>-<nanos>.tmp`); a file is there from its creation to its rename.
fn temp_files(store: &Store, pid: u32) -> Vec<u64> {
    let prefix = format!("{pid}-");
    let mut out = Vec::new();
    for e in std::fs::read_dir(store.root().join("tmp")).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            // Gone between the listing and the stat: renamed into place.
            if let Ok(m) = e.metadata() {
                out.push(m.len());
            }
        }
    }
    out
}

/// Whether the process `pid` holds the store's index lock.
fn holds_index_lock(store: &Store, pid: u32) -> bool {
    common::flocks(&store.root().join("index.lock"))
        .iter()
        .any(|l| l.pid == pid && !l.waiting)
}

/// Whether the child `pid`, whose last event received is `ev`, is seen at the stage `aim` of
/// that write.
fn at_stage(store: &Store, pid: u32, ev: &Event, aim: Aim) -> bool {
    ev.started
        && match aim {
            // Only the big objects: the copy of a small one is over before a kill could land.
            Aim::Bytes => {
                ev.bytes >= BIG && temp_files(store, pid).iter().any(|&len| len < ev.bytes)
            }
            Aim::File => !temp_files(store, pid).is_empty(),
            // A variant's index lock is taken for its lookup before its write starts and for
            // its entry after its object is in place: after the start, it is the entry.
            Aim::Index => ev.what.starts_with("variant") && holds_index_lock(store, pid),
        }
}

/// Runs a child that builds `rounds` rounds from `first` and SIGKILLs it inside a write: once it
/// has reported that its `at`-th write (from 1) starts, as soon as it is seen at the stage `aim`
/// of a write (that one, or a later one if it ends first).
fn kill_during_write(store: &Store, first: u32, rounds: u32, at: u32, aim: Aim) -> Kill {
    let mut child = spawn_child(store.root(), first, rounds, Stdio::piped());
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if let Some(ev) = parse_event(&line.unwrap()) {
                let _ = tx.send(ev);
            }
        }
    });
    let mut events: Vec<Event> = Vec::new();
    let mut starts = 0;
    while starts < at {
        let ev = rx
            .recv()
            .expect("the child ended before the write to kill it at");
        starts += ev.started as u32;
        events.push(ev);
    }
    let watched_from = events.len() - 1;
    // Moves the events the reader has forwarded into `events`; false once the child's stdout
    // has closed (it has exited).
    let drain = |events: &mut Vec<Event>| loop {
        match rx.try_recv() {
            Ok(ev) => events.push(ev),
            Err(mpsc::TryRecvError::Empty) => return true,
            Err(mpsc::TryRecvError::Disconnected) => return false,
        }
    };
    // Watch the store until the write in progress is at the stage aimed at. What is seen in the
    // store belongs to the last event only if no later event arrived meanwhile (the child prints
    // an event before it starts the write).
    let seen = loop {
        let n = events.len();
        let ev = events.last().unwrap().clone();
        if at_stage(store, pid, &ev, aim) && drain(&mut events) && events.len() == n {
            break ev;
        }
        assert!(
            drain(&mut events),
            "the child finished and no write of it was seen at {aim:?}: {events:?}"
        );
        std::thread::yield_now();
    };
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the child was not killed: {status}"
    );
    // What it printed up to its death.
    reader.join().unwrap();
    drain(&mut events);
    let last = events.last().cloned().unwrap();
    let left = temp_files(store, pid);
    assert!(
        last.started || left.is_empty(),
        "a temporary file outside any write: {events:?}"
    );
    let cut = last == seen
        && match aim {
            Aim::Bytes => left.iter().any(|&len| len < last.bytes),
            Aim::File => !left.is_empty(),
            Aim::Index => true,
        };
    let missed = events[watched_from..].iter().filter(|e| !e.started).count();
    Kill {
        aim,
        last,
        missed,
        cut,
    }
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

/// xorshift: reproducible "random" kill points without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn killed_writers_leave_a_consistent_store() {
    const AIMS: [Aim; 3] = [Aim::Bytes, Aim::File, Aim::Index];
    const KILLS: usize = 9;
    // Rounds per child: kills target a write of the first two; the others are a reserve for a
    // child whose targeted write, and those after it, all end before they are seen at the stage
    // aimed at (a loaded machine may not run the parent during a whole copy). A child is killed
    // at the first write seen, so the reserve costs nothing otherwise.
    const ROUNDS: u32 = 12;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut rng = std::env::var("SYNAPSE_CAS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15u64);
    let mut kills = Vec::new();
    for k in 0..KILLS {
        // Each child writes new content (rounds no other child builds), so its writes are real
        // writes, not the no-op of an object already present.
        let at = 1 + (next(&mut rng) % u64::from(2 * WRITES_PER_ROUND)) as u32;
        let aim = AIMS[k % AIMS.len()];
        let kill = kill_during_write(&store, k as u32 * ROUNDS, ROUNDS, at, aim);
        assert_consistent(&store);
        kills.push(kill);
    }
    let missed: usize = kills.iter().map(|k| k.missed).sum();
    eprintln!("{KILLS} kills ({missed} writes ended before they were seen): {kills:#?}");
    // The kills did cut writes midway at each stage: each kill is aimed at one, and misses it
    // only if the write moves on between the parent seeing it and the signal.
    for aim in AIMS {
        let aimed = kills.iter().filter(|k| k.aim == aim).count();
        let cut = kills.iter().filter(|k| k.aim == aim && k.cut).count();
        assert!(
            2 * cut >= aimed,
            "{cut} of {aimed} {aim:?} kills cut their write"
        );
    }
    // Re-running the interrupted work completes it with the hashes a clean store gets.
    let clean = tempfile::tempdir().unwrap();
    let clean_store = Store::open(clean.path()).unwrap();
    for k in &kills {
        let round = k.last.round;
        let expected = build_round(&clean_store, round, ManifestTarget::Store, &mut quiet);
        let got = build_round(&store, round, ManifestTarget::Store, &mut quiet);
        assert_eq!(got, expected, "the round of {k:?}");
    }
    assert_consistent(&store);
    let gc = store.gc(false).unwrap();
    let torn = kills
        .iter()
        .filter(|k| k.aim != Aim::Index && k.cut)
        .count();
    assert!(gc.deleted_tmp as usize >= torn, "{gc:?}");
    assert_eq!(store.stats().unwrap().tmp_files, 0);
    assert_eq!(store.stats().unwrap().unreferenced_objects, 0, "{gc:?}");
    assert_consistent(&store);
}

#[test]
fn several_processes_write_the_same_objects_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..4)
        .map(|_| spawn_child(dir.path(), 0, 5, Stdio::null()))
        .collect();
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
