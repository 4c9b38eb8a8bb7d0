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

#[test]
fn budgets_move_while_serving() {
    let model = root().join("fixtures/tiny/llama/model.q8_0.gguf");
    if !synapse_testdata::require(&model, "tiny-model fixture") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = model.to_str().unwrap();
    let text = dir.path().join("calibration.txt");
    let words: Vec<String> = (0..600)
        .map(|i| format!("word{} and more", i % 97))
        .collect();
    std::fs::write(&text, words.join(" ")).unwrap();
    let cmd = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("SYNAPSE_IMPORTANCE_DIR", dir.path())
            .env("SYNAPSE_STORE", dir.path().join("store"))
            .env_remove("SYNAPSE_MODEL");
        c
    };
    let o = cmd(&common::importance_args(m, text.to_str().unwrap()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let src = cmd(&["generate", "-m", m, "--json", "-n", "2", "hi"])
        .output()
        .unwrap();
    let src: Value = serde_json::from_slice(&src.stdout).unwrap();
    let source_profile = src["profile"].as_str().unwrap().to_string();
    let source_bytes = src["weight_bytes"].as_u64().unwrap();

    let child = cmd(&[
        "serve",
        "-m",
        m,
        "--budget",
        "50%",
        "--promotion-cooldown",
        "0",
        "--port",
        "0",
        "-np",
        "2",
        "-c",
        "256",
    ])
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (server, addr, _) = Server::started(child);

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
