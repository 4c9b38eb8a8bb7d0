//! `generate --memory`: one budget over what generation holds. On a synthetic mixture of
//! experts the routed experts page within what the rest leaves (the same tokens as without a
//! budget, peak RSS above the process's start within the budget, the paging counters in
//! `--json`); a budget too small to run the model is a clear error before generation; the
//! default (dense) model runs within a budget that fits it.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use synapse_testdata::synthetic_moe::{MoeShape, write};

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env_remove("SYNAPSE_MODEL")
        .output()
        .unwrap()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(s.lines().last().unwrap()).unwrap()
}

fn generate(model: &Path, memory: Option<&str>) -> Output {
    let m = model.to_str().unwrap();
    let mut a = vec![
        "generate",
        "--model",
        m,
        "-n",
        "24",
        "--ignore-eos",
        "--json",
        "--ctx",
        "256",
    ];
    if let Some(b) = memory {
        a.extend(["--memory", b]);
    }
    a.push("The quick brown fox jumps over the lazy dog");
    cli(&a)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

#[test]
fn moe_experts_page_within_the_budget_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let shape = MoeShape::small();
    let path = tmp.path().join(shape.file_name());
    write(&shape, &path).unwrap();
    let free = json(&generate(&path, None));
    assert!(free["memory"].is_null());
    // A generous budget shows the ledger: the fixed parts and the experts' bytes.
    let big = json(&generate(&path, Some("4G")));
    let m = &big["memory"];
    assert_eq!(big["tokens"], free["tokens"]);
    let fixed = u(&m["loaded"]) + u(&m["weights_outside_experts"]) + u(&m["kv"]) + u(&m["scratch"]);
    let experts = u(&m["experts_total"]);
    assert_eq!(u(&m["experts_budget"]), experts);
    // Every expert fits: nothing pages (they stay pages of the mapping).
    assert!(m["paging"].is_null());
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    assert!(used <= fixed + experts, "peak RSS rose {used} B");
    for quarters in [2u64, 1] {
        let budget = fixed + experts * quarters / 4;
        let o = json(&generate(&path, Some(&budget.to_string())));
        let m = &o["memory"];
        assert_eq!(
            o["tokens"], free["tokens"],
            "{quarters}/4 of the experts: other tokens"
        );
        let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
        eprintln!(
            "{quarters}/4 of the experts: budget {:.1} MB, peak RSS above start {:.1} MB, \
             experts held {:.1} of {:.1} MB, hit rate {:.3}, {} misses, {} evictions",
            budget as f64 / 1e6,
            used as f64 / 1e6,
            u(&m["experts_held"]) as f64 / 1e6,
            experts as f64 / 1e6,
            m["paging"]["hit_rate"].as_f64().unwrap(),
            m["paging"]["misses"],
            m["paging"]["evictions"]
        );
        assert!(
            used <= budget,
            "peak RSS rose {used} B over a {budget} B budget"
        );
        assert!(u(&m["experts_held"]) <= u(&m["experts_budget"]));
        assert!(u(&m["paging"]["evictions"]) > 0);
    }
    // Too small for one expert beside the rest: refused before generation.
    let o = generate(&path, Some(&fixed.to_string()));
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "generated before refusing");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("cannot run this model"), "{e}");
    assert!(e.contains("routed experts"), "{e}");
    // Nonsense sizes are refused too.
    let o = generate(&path, Some("lots"));
    assert!(!o.status.success());
}

#[test]
fn the_default_model_runs_within_a_budget_that_fits_it() {
    let model = synapse_testdata::default_model();
    if !synapse_testdata::require(&model, "the default model (Gemma 3 270M Q4_K_M)") {
        return;
    }
    let free = json(&generate(&model, None));
    let o = json(&generate(&model, Some("1G")));
    assert_eq!(o["tokens"], free["tokens"]);
    let m = &o["memory"];
    let used = u(&m["peak_rss"]) - u(&m["baseline_rss"]);
    eprintln!(
        "Gemma 3 270M under 1 GB: peak RSS above start {:.1} MB (weights {:.1}, KV {:.1}, \
         scratch {:.1}, loading {:.1})",
        used as f64 / 1e6,
        u(&m["weights_outside_experts"]) as f64 / 1e6,
        u(&m["kv"]) as f64 / 1e6,
        u(&m["scratch"]) as f64 / 1e6,
        u(&m["loaded"]) as f64 / 1e6
    );
    assert!(used <= u(&m["budget"]));
    // A budget below its weights: refused, a dense model's weights do not page yet.
    let o = generate(&model, Some("100M"));
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("cannot run this model"), "{e}");
}
