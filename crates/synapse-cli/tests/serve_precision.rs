//! `synapse-cli serve --budget` under budgets that change while it serves: the process is
//! started on a tiny model with a stored importance map, and `POST /v1/precision` moves the
//! budget — a larger one promotes (here with no cooldown), a smaller one demotes, an
//! impossible one is a 400 that changes nothing; `/v1/models` and `/metrics` follow the
//! profile, and completions keep working across the changes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Server, http};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf()
}

/// The tiny model, a directory holding its importance map and store, and the source's
/// profile hash and weight bytes (`None`, skipped locally, without the fixture).
struct Setup {
    model: PathBuf,
    dir: tempfile::TempDir,
    source_profile: String,
    source_bytes: u64,
}

impl Setup {
    fn new() -> Option<Self> {
        let model = root().join("fixtures/tiny/llama/model.q8_0.gguf");
        if !synapse_testdata::require(&model, "tiny-model fixture") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let m = model.to_str().unwrap();
        let text = dir.path().join("calibration.txt");
        let words: Vec<String> = (0..600)
            .map(|i| format!("word{} and more", i % 97))
            .collect();
        std::fs::write(&text, words.join(" ")).unwrap();
        let mut s = Setup {
            model: model.clone(),
            dir,
            source_profile: String::new(),
            source_bytes: 0,
        };
        let o = s
            .cmd(&common::importance_args(m, text.to_str().unwrap()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let src = s
            .cmd(&["generate", "-m", m, "--json", "-n", "2", "hi"])
            .output()
            .unwrap();
        let src: Value = serde_json::from_slice(&src.stdout).unwrap();
        s.source_profile = src["profile"].as_str().unwrap().to_string();
        s.source_bytes = src["weight_bytes"].as_u64().unwrap();
        Some(s)
    }

    /// `serve` on the tiny model (2 slots, 256 positions, any port) with `extra` flags.
    fn serve(&self, extra: &[&str]) -> (Server, String) {
        let m = self.model.to_str().unwrap();
        let mut args = vec!["serve", "-m", m, "--port", "0", "-np", "2", "-c", "256"];
        args.extend_from_slice(extra);
        let child = self.cmd(&args).stderr(Stdio::piped()).spawn().unwrap();
        let (server, addr, _) = Server::started(child);
        (server, addr)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("SYNAPSE_IMPORTANCE_DIR", self.dir.path())
            .env("SYNAPSE_STORE", self.dir.path().join("store"))
            .env_remove("SYNAPSE_MODEL");
        c
    }
}

#[test]
fn budgets_move_while_serving() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let (source_profile, source_bytes) = (setup.source_profile.clone(), setup.source_bytes);

    let (server, addr) = setup.serve(&["--budget", "50%", "--promotion-cooldown", "0"]);

    let models = |addr: &str| http(addr, "GET", "/v1/models", "").1["data"][0]["meta"].clone();
    let m0 = models(&addr);
    let start_profile = m0["profile"].as_str().unwrap().to_string();
    assert_ne!(start_profile, source_profile);
    assert!(m0["weight_bytes"].as_u64().unwrap() <= source_bytes / 2);
    let complete = |addr: &str| {
        let (st, v) = http(
            addr,
            "POST",
            "/v1/completions",
            r#"{"prompt": "word1 and", "max_tokens": 4, "temperature": 0}"#,
        );
        assert_eq!(st, 200, "{v}");
    };
    complete(&addr);

    // The whole source fits: promoted to the source itself.
    let (st, up) = http(&addr, "POST", "/v1/precision", r#"{"budget": "100%"}"#);
    assert_eq!(st, 200, "{up}");
    assert_eq!(up["changed"], true);
    assert_eq!(up["direction"], "promote");
    assert_eq!(up["profile"], source_profile.as_str());
    assert!(!up["changes"].as_array().unwrap().is_empty());
    assert_eq!(models(&addr)["profile"], source_profile.as_str());
    let (_, metrics) = http(&addr, "GET", "/metrics", "");
    let metrics = metrics.as_str().map(str::to_string).unwrap_or_default();
    assert!(
        metrics.contains(&format!("profile=\"{source_profile}\"")),
        "{metrics}"
    );
    complete(&addr);
    // Same budget again: nothing to do.
    let (_, same) = http(
        &addr,
        "POST",
        "/v1/precision",
        &format!("{{\"budget\": {source_bytes}}}"),
    );
    assert_eq!(same["changed"], false, "{same}");
    // Smaller: demoted at once, back to where it started.
    let (st, down) = http(&addr, "POST", "/v1/precision", r#"{"budget": "50%"}"#);
    assert_eq!(st, 200, "{down}");
    assert_eq!(down["direction"], "demote");
    assert_eq!(down["profile"], start_profile.as_str());
    complete(&addr);
    // Impossible or malformed: a 400, nothing changes.
    for body in [
        r#"{"budget": 1}"#,
        r#"{"budget": "150%"}"#,
        r#"{"budget": []}"#,
        "{}",
    ] {
        let (st, e) = http(&addr, "POST", "/v1/precision", body);
        assert_eq!(st, 400, "{body}: {e}");
        assert!(e["error"]["message"].is_string(), "{e}");
    }
    assert_eq!(models(&addr)["profile"], start_profile.as_str());
    drop(server);
}

/// `serve --budget free`: the budget follows the machine's free memory (here, with gigabytes
/// free, the whole source of a tiny model); `/v1/models` and `/metrics` show the follower's
/// readings; a budget posted by hand is refused (the follower owns it); a reserve larger than
/// the machine is a clear error before serving, and `generate --budget free` is refused.
#[test]
fn the_budget_follows_free_memory_while_serving() {
    let Some(setup) = Setup::new() else {
        return;
    };
    let m = setup.model.to_str().unwrap();
    let (server, addr) = setup.serve(&["--budget", "free", "--free-interval", "0.1"]);
    let models = |addr: &str| http(addr, "GET", "/v1/models", "").1["data"][0]["meta"].clone();
    let t0 = std::time::Instant::now();
    let meta = loop {
        let meta = models(&addr);
        if meta["budget_follows_free_memory"]["readings"].as_u64() >= Some(1) {
            break meta;
        }
        assert!(t0.elapsed().as_secs() < 60, "no reading: {meta}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let f = &meta["budget_follows_free_memory"];
    assert_eq!(meta["profile"], setup.source_profile.as_str(), "{meta}");
    assert_eq!(
        f["budget_bytes"].as_u64(),
        Some(setup.source_bytes),
        "{meta}"
    );
    assert!(f["free_bytes"].as_u64().unwrap() > 0, "{meta}");
    assert_eq!(f["pressed"], false);
    assert!(f["error"].is_null(), "{meta}");
    let (_, metrics) = http(&addr, "GET", "/metrics", "");
    let metrics = metrics.as_str().map(str::to_string).unwrap_or_default();
    for g in [
        "synapse_memory_free_bytes",
        "synapse_precision_budget_bytes",
        "synapse_memory_readings_total",
    ] {
        assert!(metrics.contains(g), "{g}: {metrics}");
    }
    assert!(
        metrics.contains(&format!(
            "synapse_precision_budget_bytes {}",
            setup.source_bytes
        )),
        "{metrics}"
    );
    let (st, e) = http(&addr, "POST", "/v1/precision", r#"{"budget": "50%"}"#);
    assert_eq!(st, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("follows free memory"),
        "{e}"
    );
    let (st, v) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "word1 and", "max_tokens": 4, "temperature": 0}"#,
    );
    assert_eq!(st, 200, "{v}");
    drop(server);

    // More reserved than any machine has: refused before serving.
    let o = setup
        .cmd(&[
            "serve",
            "-m",
            m,
            "--budget",
            "free",
            "--free-reserve",
            "1000T",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--budget free") && err.contains("no room"),
        "{err}"
    );
    let o = setup
        .cmd(&["generate", "-m", m, "--budget", "free", "-n", "2", "hi"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("serve"), "{err}");
}
