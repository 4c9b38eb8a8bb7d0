//! `synapse-cli import` and `synapse-cli cas`: crash safety (the import killed at pseudo-random
//! points of its progress, then re-run), corruption detection (a flipped byte makes `cas verify` fail naming
//! the object), determinism of the package hash.

#[path = "../../synapse-import/tests/common/mod.rs"]
mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("SYNAPSE_STORE")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "synapse-cli {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn package_hash(import_json: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(import_json).unwrap();
    v["package"].as_str().unwrap().to_string()
}

/// A model big enough (~30 MB) that a kill lands in the middle of the import.
const MEDIUM: common::Dims = common::Dims {
    vocab: 8192,
    hidden: 512,
    ffn: 2048,
    layers: 6,
    heads: 2,
    kv_heads: 1,
};

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Objects in a store or package directory (`objects/<2 hex>/<62 hex>`; none if absent).
fn objects(root: &Path) -> usize {
    let Ok(shards) = std::fs::read_dir(root.join("objects")) else {
        return 0;
    };
    shards
        .filter_map(|s| std::fs::read_dir(s.ok()?.path()).ok())
        .map(|d| d.count())
        .sum()
}

/// Package manifests in a store (`packages/*.toml`).
fn manifests(store: &Path) -> usize {
    std::fs::read_dir(store.join("packages")).map_or(0, |d| d.count())
}

#[test]
fn killed_imports_leave_a_consistent_store_and_reimport_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("medium.gguf");
    common::write_gguf(&src, MEDIUM, &[]);
    let store = tmp.path().join("store");

    // The package a clean import gives, and how many objects it has.
    let clean_dir = tmp.path().join("clean");
    let clean = ok(&["import", p(&src), "--out", p(&clean_dir), "--json"]);
    let total = objects(&clean_dir);
    assert!(total > 20, "{total} objects");

    // Each kill lands inside an import, by what the import has done rather than after a delay:
    // once its objects in the store reach a target past what earlier imports left (it re-puts
    // those as no-ops, then writes new ones), before its manifest. The targets are spread over
    // the import, pseudo-random but reproducible, and never its last two objects (so its
    // manifest is a few writes away).
    const KILLS: usize = 8;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut targets: Vec<usize> = (0..KILLS)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            1 + (rng % (total as u64 - 2)) as usize
        })
        .collect();
    targets.sort_unstable();
    let (mut kills, mut interrupted) = (0, 0);
    for target in targets {
        // Past what the earlier kills left (a kill can land a few objects after its target).
        let target = target.max(objects(&store) + 1);
        if target > total - 2 {
            continue;
        }
        kills += 1;
        let mut child = Command::new(BIN)
            .args(["import", p(&src), "--store", p(&store)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        while objects(&store) < target {
            let exited = child.try_wait().unwrap();
            assert!(
                exited.is_none(),
                "the import ended ({exited:?}) before {target} objects"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        // Killed (not exited) and before its manifest: the kill interrupted the import.
        if status.signal() == Some(9) && manifests(&store) == 0 {
            interrupted += 1;
        }
        assert!(objects(&store) >= target);
        // Whatever the kill interrupted, every object and manifest present is whole.
        ok(&["cas", "verify", p(&store)]);
    }
    eprintln!(
        "{interrupted} of {kills} kills interrupted an import; {} of its {total} objects stored",
        objects(&store)
    );
    // Each kill is aimed inside an import; one misses only if the import writes its last
    // objects and manifest between the parent seeing the target reached and the signal.
    assert!(kills >= KILLS / 2, "only {kills} kills");
    assert!(
        2 * interrupted >= kills,
        "{interrupted} of {kills} kills interrupted an import"
    );

    let done = ok(&["import", p(&src), "--store", p(&store), "--json"]);
    assert_eq!(package_hash(&done), package_hash(&clean));
    ok(&["cas", "verify", p(&store)]);
    ok(&["cas", "gc", "--store", p(&store)]);
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&["cas", "stats", "--store", p(&store), "--json"])).unwrap();
    assert_eq!(stats["packages"], 1);
    assert_eq!(stats["tmp_files"], 0);
    assert_eq!(stats["unreferenced_objects"], 0);
    ok(&["cas", "verify", p(&store)]);
}

#[test]
fn verify_fails_naming_a_corrupt_object() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny.gguf");
    common::write_gguf(&src, common::TINY, &[]);
    let out = tmp.path().join("pkg");
    let a = package_hash(&ok(&["import", p(&src), "--out", p(&out), "--json"]));
    let b = package_hash(&ok(&[
        "import",
        p(&src),
        "--out",
        p(&tmp.path().join("pkg2")),
        "--json",
    ]));
    assert_eq!(a, b, "same source, same package hash");
    ok(&["cas", "verify", p(&out)]);

    let pkg = synapse_cas::Package::open_dir(&out).unwrap();
    let victim = pkg.tensor("blk.1.ffn_down.weight").unwrap().object;
    let path = pkg.store().object_path(&victim);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();

    let res = cli(&["cas", "verify", p(&out)]);
    assert!(!res.status.success(), "verify must fail on a flipped byte");
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        stderr.contains(&victim.hex()),
        "verify must name the object: {stderr}"
    );

    // A missing object is reported too.
    std::fs::remove_file(&path).unwrap();
    let res = cli(&["cas", "verify", p(&out)]);
    assert!(!res.status.success());
    assert!(String::from_utf8_lossy(&res.stderr).contains("missing"));
}
