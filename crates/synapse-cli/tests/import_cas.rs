//! `synapse-cli import` and `synapse-cli cas`: crash safety (the import killed at pseudo-random
//! points, then re-run), corruption detection (a flipped byte makes `cas verify` fail naming
//! the object), determinism of the package hash.

#[path = "../../synapse-import/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

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

#[test]
fn killed_imports_leave_a_consistent_store_and_reimport_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("medium.gguf");
    common::write_gguf(&src, MEDIUM, &[]);
    let store = tmp.path().join("store");

    // Time one whole import on this machine, so the kills land inside imports whatever the
    // machine's speed (a fixed range of delays let every import finish on a quiet machine).
    let t0 = Instant::now();
    ok(&["import", p(&src), "--out", p(&tmp.path().join("timing"))]);
    let whole = t0.elapsed();

    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut interrupted = 0;
    for _ in 0..8 {
        let mut child = Command::new(BIN)
            .args(["import", p(&src), "--store", p(&store)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Somewhere between 5% and 85% of a whole import.
        let percent = 5 + (rng % 81) as u32;
        std::thread::sleep(whole * percent / 100);
        let finished = child.try_wait().unwrap().is_some();
        child.kill().ok();
        child.wait().unwrap();
        if !finished {
            interrupted += 1;
        }
        if store.join("objects").is_dir() {
            // Whatever the kill interrupted, every object and manifest present is whole.
            ok(&["cas", "verify", p(&store)]);
        }
    }
    assert!(interrupted > 0, "no kill landed during an import");

    let done = ok(&["import", p(&src), "--store", p(&store), "--json"]);
    let clean = ok(&[
        "import",
        p(&src),
        "--out",
        p(&tmp.path().join("clean")),
        "--json",
    ]);
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
