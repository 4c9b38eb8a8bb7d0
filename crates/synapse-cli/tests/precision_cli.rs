//! Budgeted precision through the command line on a tiny fixture: `importance` stores the map
//! per model (`$SYNAPSE_IMPORTANCE_DIR`), `generate --budget` / `perplexity --budget` /
//! `profile --budget` find and apply it, and every way to get it wrong is a clear error before
//! anything runs (a budget below every profile, another model's map, a malformed budget).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_synapse-cli");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SYNAPSE_IMPORTANCE_DIR", dir)
        .env("SYNAPSE_STORE", dir.join("store"))
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

fn err(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The tiny llama and qwen2 fixtures, a temporary directory, and a calibration text of 600
/// phrases over `words` distinct words in it; `None` without the fixtures.
fn setup(words: usize) -> Option<(tempfile::TempDir, PathBuf, PathBuf, PathBuf)> {
    let llama = root().join("fixtures/tiny/llama/model.q8_0.gguf");
    let qwen = root().join("fixtures/tiny/qwen2/model.q8_0.gguf");
    if !synapse_testdata::require(&llama, "tiny-model fixture") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("calibration.txt");
    let phrases: Vec<String> = (0..600)
        .map(|i| format!("word{} and more", i % words))
        .collect();
    std::fs::write(&text, phrases.join(" ")).unwrap();
    Some((dir, llama, qwen, text))
}

/// `synapse-cli importance` of `model` on `text` (small settings), stored per model or in `out`.
fn importance(dir: &Path, model: &str, text: &Path, out: Option<&Path>) {
    let o = out.map(|p| p.to_str().unwrap().to_string());
    let mut a = common::importance_args(model, text.to_str().unwrap()).to_vec();
    if let Some(o) = &o {
        a.extend(["-o", o.as_str()]);
    }
    let r = cli(dir, &a);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

/// `synapse-cli importance` of `model` on `text` measuring only `ladder`, written to `out`.
/// `generate --json` of 12 greedy tokens after "word1 and" on `model` (with `extra` flags).
fn generate12(dir: &Path, model: &str, extra: &[&str]) -> Value {
    let mut v = vec![
        "generate",
        "-m",
        model,
        "-n",
        "12",
        "--ignore-eos",
        "--json",
    ];
    v.extend_from_slice(extra);
    v.push("word1 and");
    json(&cli(dir, &v))
}

fn ladder_map(dir: &Path, model: &str, text: &Path, ladder: &str, out: &Path) -> Output {
    let mut a = common::importance_args(model, text.to_str().unwrap()).to_vec();
    a.extend(["--ladder", ladder, "-o", out.to_str().unwrap()]);
    cli(dir, &a)
}

#[test]
fn a_budget_runs_the_stored_maps_profile_and_bad_requests_are_refused() {
    let Some((dir, llama, qwen, text)) = setup(97) else {
        return;
    };
    let (m, t) = (llama.to_str().unwrap(), text.to_str().unwrap());
    let imp = |model: &str, out: Option<&Path>| importance(dir.path(), model, &text, out);
    imp(m, None);
    let stored: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(stored.len(), 1, "one stored map");

    let g = json(&cli(
        dir.path(),
        &[
            "generate", "-m", m, "--budget", "60%", "--json", "-n", "6", "hello",
        ],
    ));
    let src = json(&cli(
        dir.path(),
        &["generate", "-m", m, "--json", "-n", "6", "hello"],
    ));
    let (wb, sb) = (
        g["weight_bytes"].as_u64().unwrap(),
        g["source_weight_bytes"].as_u64().unwrap(),
    );
    assert!(wb <= sb * 60 / 100, "{wb} of {sb}");
    assert_ne!(g["profile"], src["profile"]);
    assert_eq!(src["weight_bytes"].as_u64().unwrap(), sb);

    let p = json(&cli(
        dir.path(),
        &["profile", "-m", m, "--budget", "60%", "--json"],
    ));
    assert_eq!(p["profile"], g["profile"]);
    assert_eq!(p["weight_bytes"].as_u64().unwrap(), wb);

    let ppl = json(&cli(
        dir.path(),
        &[
            "perplexity",
            "-m",
            m,
            "-f",
            t,
            "--ctx",
            "32",
            "--chunks",
            "2",
            "--budget",
            "60%",
            "--json",
        ],
    ));
    assert!(ppl["kl"].as_f64().unwrap() > 0.0);
    assert_eq!(ppl["weight_bytes"].as_u64().unwrap(), wb);
    // The first run of the profile quantized its tensors into the store's variant cache;
    // later runs of it quantize nothing.
    let (gv, pv) = (&g["variants"], &ppl["variants"]);
    let n = gv["encoded"].as_u64().unwrap();
    assert!(n > 0 && gv["reused"] == 0, "{gv}");
    assert!(pv["encoded"] == 0 && pv["reused"] == n, "{pv}");
    let nc = json(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            m,
            "--budget",
            "60%",
            "--no-variant-cache",
            "--json",
            "-n",
            "6",
            "hello",
        ],
    ));
    assert!(nc["variants"]["encoded"] == n && nc["variants"]["reused"] == 0);
    assert_eq!(nc["tokens"], g["tokens"]);
    assert_eq!(nc["profile"], g["profile"]);

    // A re-quantized file scored against its source file: the F32 GGUF is the reference here.
    let f32_model = root().join("fixtures/tiny/llama/model.f32.gguf");
    let r = f32_model.to_str().unwrap();
    let ppl_args = |reference: &str| {
        cli(
            dir.path(),
            &[
                "perplexity",
                "-m",
                m,
                "--reference",
                reference,
                "-f",
                t,
                "--ctx",
                "32",
                "--chunks",
                "2",
                "--json",
            ],
        )
    };
    let kl = json(&ppl_args(r))["kl"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.05, "Q8_0 vs F32: KL {kl}");
    assert_eq!(
        json(&ppl_args(m))["kl"].as_f64().unwrap(),
        0.0,
        "a file against itself"
    );

    let e = err(&cli(
        dir.path(),
        &["generate", "-m", m, "--budget", "1", "-n", "2", "hi"],
    ));
    assert!(e.contains("below the smallest possible total"), "{e}");
    let e = err(&cli(
        dir.path(),
        &["generate", "-m", m, "--budget", "150%", "-n", "2", "hi"],
    ));
    assert!(e.contains("percentage"), "{e}");
    if synapse_testdata::require(&qwen, "tiny-model fixture") {
        // No stored map for qwen2: the error says how to make one.
        let q = qwen.to_str().unwrap();
        let e = err(&cli(
            dir.path(),
            &["generate", "-m", q, "--budget", "60%", "-n", "2", "hi"],
        ));
        assert!(e.contains("synapse-cli importance"), "{e}");
        // llama's map given to qwen2: refused as another model's.
        let map = stored[0].path();
        let e = err(&cli(
            dir.path(),
            &[
                "generate",
                "-m",
                q,
                "--budget",
                "60%",
                "--map",
                map.to_str().unwrap(),
                "-n",
                "2",
                "hi",
            ],
        ));
        assert!(e.contains("model_fingerprint"), "{e}");
        let other = dir.path().join("qwen-map.json");
        imp(q, Some(&other));
        assert!(other.is_file());
    }

    // A package keeps its own map: `importance` on a package stores the map in it (a new
    // manifest), and `--budget` on the package finds it there, with no cached map beside.
    let pkg = dir.path().join("pkg");
    let o = cli(dir.path(), &["import", m, "--out", pkg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before = std::fs::read(pkg.join("manifest.toml")).unwrap();
    imp(pkg.to_str().unwrap(), None);
    let after = std::fs::read_to_string(pkg.join("manifest.toml")).unwrap();
    assert_ne!(before, after.as_bytes());
    assert!(after.contains("[importance"), "{after}");
    for e in std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
    {
        if e.path().extension().is_some_and(|x| x == "json") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let gp = json(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            pkg.to_str().unwrap(),
            "--budget",
            "60%",
            "--json",
            "-n",
            "6",
            "hello",
        ],
    ));
    assert!(gp["weight_bytes"].as_u64().unwrap() <= sb * 60 / 100);
    // Same model (fingerprint), and a map of the same calibration: the same profile.
    assert_eq!(gp["profile"], g["profile"]);
    assert_eq!(gp["tokens"], g["tokens"]);
    // The source GGUF has no map of its own now: the error says how to make one.
    let e = err(&cli(
        dir.path(),
        &["generate", "-m", m, "--budget", "60%", "-n", "2", "hi"],
    ));
    assert!(e.contains("synapse-cli importance"), "{e}");
}

#[test]
fn refine_saves_a_measured_profile_that_profile_file_runs() {
    let Some((dir, llama, qwen, text)) = setup(89) else {
        return;
    };
    let (m, t) = (llama.to_str().unwrap(), text.to_str().unwrap());
    importance(dir.path(), m, &text, None);
    let out = dir.path().join("refined.json");
    let o = out.to_str().unwrap();
    let refine = |budget: &str| {
        cli(
            dir.path(),
            &[
                "refine", "-m", m, "--budget", budget, "--calib", t, "--ctx", "32", "--chunks",
                "2", "--evals", "12", "-o", o, "--json",
            ],
        )
    };
    let j = json(&refine("60%"));
    let (kl, best) = (
        j["kl"].as_f64().unwrap(),
        j["select_best_kl"].as_f64().unwrap(),
    );
    assert!(kl > 0.0 && kl <= best, "{kl} vs the selector's {best}");
    assert!(j["resident_bytes"].as_u64().unwrap() <= j["budget_bytes"].as_u64().unwrap());
    let evals = j["evaluations"].as_array().unwrap();
    assert!(!evals.is_empty() && evals.len() <= 12);

    // The file runs: the bytes it says, and the KL it measured on the same chunks.
    let g = json(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            m,
            "--profile",
            o,
            "--json",
            "-n",
            "4",
            "hello",
        ],
    ));
    assert_eq!(g["weight_bytes"], j["resident_bytes"]);
    let ppl = json(&cli(
        dir.path(),
        &[
            "perplexity",
            "-m",
            m,
            "-f",
            t,
            "--ctx",
            "32",
            "--chunks",
            "2",
            "--profile",
            o,
            "--json",
        ],
    ));
    assert_eq!(ppl["kl"].as_f64().unwrap().to_bits(), kl.to_bits());
    assert_eq!(ppl["profile"], g["profile"]);

    // Another model's file, a missing file, a budget below every profile.
    let e = err(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            qwen.to_str().unwrap(),
            "--profile",
            o,
            "-n",
            "2",
            "hi",
        ],
    ));
    assert!(e.contains("was made for the model"), "{e}");
    let missing = dir.path().join("nope.json");
    let e = err(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            m,
            "--profile",
            missing.to_str().unwrap(),
            "-n",
            "2",
            "hi",
        ],
    ));
    assert!(e.contains("saved profile's file"), "{e}");
    let e = err(&refine("1"));
    assert!(e.contains("below the smallest possible total"), "{e}");
}

/// A mixture of experts (the tiny Qwen2-MoE, F32, stacked experts): `importance` measures its
/// routed expert tensors, `profile --budget` assigns them, and `generate --budget` below what
/// the routed experts take at the source runs within it.
#[test]
fn a_budget_on_a_mixture_of_experts_demotes_its_experts() {
    let Some((dir, _, _, text)) = setup(97) else {
        return;
    };
    let moe = root().join("fixtures/tiny/qwen2moe/model.f32.gguf");
    let m = moe.to_str().unwrap();
    importance(dir.path(), m, &text, None);
    let src = json(&cli(dir.path(), &["profile", "-m", m, "--json"]));
    let source_bytes = src["weight_bytes"].as_u64().unwrap();
    let experts: Vec<&Value> = src["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"].as_str().unwrap().contains("_exps"))
        .collect();
    assert_eq!(experts.len(), 6, "{src}");
    let expert_bytes: u64 = experts.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    // Less than the routed experts alone take at the source.
    let want = (expert_bytes * 9 / 10).to_string();
    let p = json(&cli(
        dir.path(),
        &["profile", "-m", m, "--budget", &want, "--json"],
    ));
    assert!(p["weight_bytes"].as_u64().unwrap() <= expert_bytes * 9 / 10);
    for t in p["tensors"].as_array().unwrap() {
        if t["name"].as_str().unwrap().contains("_exps") {
            assert_ne!(t["encoding"], "f32", "{t}");
            assert!(t["distortion"].as_f64().unwrap() > 0.0, "{t}");
        }
    }
    let g = json(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            m,
            "--budget",
            &want,
            "-n",
            "8",
            "--json",
            "word1 and",
        ],
    ));
    assert_eq!(g["profile"], p["profile"], "{g}");
    assert!(g["weight_bytes"].as_u64().unwrap() <= expert_bytes * 9 / 10);
    assert!(source_bytes > 2 * g["weight_bytes"].as_u64().unwrap());
}

/// `importance --ladder LIST` measures exactly those candidates (beside the source), a budget
/// then picks among them — a ggml type among them runs as that type — and a bad list is
/// refused before anything runs.
#[test]
fn a_chosen_ladder_is_what_the_map_measures_and_budgets_pick_from() {
    let Some((dir, llama, _, text)) = setup(97) else {
        return;
    };
    let m = llama.to_str().unwrap();
    let map = dir.path().join("ladder-map.json");
    let ladder = "syn.q8.symmetric.g64.v1,ggml.q4_0.v1";
    let r = ladder_map(dir.path(), m, &text, ladder, &map);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let doc: Value = serde_json::from_slice(&std::fs::read(&map).unwrap()).unwrap();
    let tensors = doc["tensors"].as_object().unwrap();
    assert!(!tensors.is_empty());
    for (name, t) in tensors {
        let encs: Vec<&str> = t["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["encoding"].as_str().unwrap())
            .collect();
        let source = t["source_encoding"].as_str().unwrap();
        let chosen: Vec<&str> = encs.iter().copied().filter(|e| *e != source).collect();
        // Most bits per weight first; every tiny row is whole 32-element blocks.
        assert_eq!(
            chosen,
            ["syn.q8.symmetric.g64.v1", "ggml.q4_0.v1"],
            "{name}: {encs:?}"
        );
    }
    // A budget below the source's bytes: the profile holds only the listed encodings, and the
    // ggml one among them.
    let src = json(&cli(dir.path(), &["profile", "-m", m, "--json"]));
    let want = (src["weight_bytes"].as_u64().unwrap() * 7 / 10).to_string();
    let mp = map.to_str().unwrap();
    let p = json(&cli(
        dir.path(),
        &["profile", "-m", m, "--budget", &want, "--map", mp, "--json"],
    ));
    let used: Vec<&str> = p["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["encoding"].as_str().unwrap())
        .collect();
    assert!(used.contains(&"ggml.q4_0.v1"), "{used:?}");
    for e in &used {
        assert!(
            ["syn.q8.symmetric.g64.v1", "ggml.q4_0.v1", "q8_0"].contains(e),
            "{e} was not in the ladder"
        );
    }
    let g = json(&cli(
        dir.path(),
        &[
            "generate",
            "-m",
            m,
            "--budget",
            &want,
            "--map",
            mp,
            "-n",
            "8",
            "--json",
            "word1 and",
        ],
    ));
    assert_eq!(g["profile"], p["profile"], "{g}");
    // `--ladder ggml`: ggml's types alone (the tiny model's 64-wide rows hold the 32-element
    // block types, not the K-quants' super-blocks; q8_0, the source's own size, is no saving).
    let ggml_map = dir.path().join("ggml-ladder-map.json");
    let r = ladder_map(dir.path(), m, &text, "ggml", &ggml_map);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let doc: Value = serde_json::from_slice(&std::fs::read(&ggml_map).unwrap()).unwrap();
    for (name, t) in doc["tensors"].as_object().unwrap() {
        let source = t["source_encoding"].as_str().unwrap();
        let encs: Vec<&str> = t["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["encoding"].as_str().unwrap())
            .filter(|e| *e != source)
            .collect();
        assert_eq!(
            encs,
            [
                "ggml.q5_1.v1",
                "ggml.q5_0.v1",
                "ggml.q4_1.v1",
                "ggml.q4_0.v1"
            ],
            "{name}"
        );
    }
    // Refused before any pass: an unknown ID, one named twice, an empty list.
    for bad in ["syn.q9.symmetric.g64.v1", "ggml.q4_0.v1,ggml.q4_0.v1", ","] {
        let mut a = common::importance_args(m, text.to_str().unwrap()).to_vec();
        a.extend(["--ladder", bad]);
        let e = err(&cli(dir.path(), &a));
        assert!(e.contains("--ladder"), "{bad}: {e}");
    }
    // KL weights at an encoding the ladder does not measure: refused too.
    let mut a = common::importance_args(m, text.to_str().unwrap()).to_vec();
    a.extend([
        "--ladder",
        ladder,
        "--kl-encoding",
        "syn.q3.symmetric.g64.v1",
    ]);
    let e = err(&cli(dir.path(), &a));
    assert!(e.contains("--kl-encoding"), "{e}");
}

/// The source's metadata, every key but the alignment, is in `exported`, and the export
/// records `profile` as its `synapse.profile`.
fn assert_metadata_kept(src: &Path, exported: &Path, profile: &str) {
    use synapse_formats::gguf::{GgufFile, GgufValue};
    let (s, e) = (
        GgufFile::open(src).unwrap(),
        GgufFile::open(exported).unwrap(),
    );
    for (k, v) in s.metadata() {
        if k != "general.alignment" {
            assert_eq!(e.get(k), Some(v), "{k}");
        }
    }
    assert_eq!(
        e.get("synapse.profile"),
        Some(&GgufValue::String(profile.into()))
    );
    assert_eq!(e.tensors().len(), s.tensors().len());
}

#[test]
fn a_budget_exports_a_gguf_of_the_ggml_types_its_map_measured() {
    use synapse_formats::GgmlType;
    use synapse_formats::gguf::{GgufFile, TensorType};
    let Some((dir, llama, _, text)) = setup(97) else {
        return;
    };
    let m = llama.to_str().unwrap();
    let map = dir.path().join("export-map.json");
    let ladder = "syn.q8.symmetric.g64.v1,ggml.q5_0.v1,ggml.q4_0.v1";
    let r = ladder_map(dir.path(), m, &text, ladder, &map);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    // The same map without its Synapse codec: what the export selects from.
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&map).unwrap()).unwrap();
    for t in doc["tensors"].as_object_mut().unwrap().values_mut() {
        t["options"]
            .as_array_mut()
            .unwrap()
            .retain(|o| o["encoding"].as_str().unwrap().starts_with("ggml."));
    }
    let ggml_map = dir.path().join("ggml-map.json");
    std::fs::write(&ggml_map, serde_json::to_vec(&doc).unwrap()).unwrap();
    let src = json(&cli(dir.path(), &["profile", "-m", m, "--json"]));
    let want = (src["weight_bytes"].as_u64().unwrap() * 7 / 10).to_string();
    let out = dir.path().join("exported.gguf");
    let o = out.to_str().unwrap();
    let (mp, gp) = (map.to_str().unwrap(), ggml_map.to_str().unwrap());
    let export = |map: &str, out: &str| {
        cli(
            dir.path(),
            &[
                "export-gguf",
                "-m",
                m,
                "--budget",
                &want,
                "--map",
                map,
                "-o",
                out,
            ],
        )
    };
    let e = export(mp, o);
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    // It is the ggml-only selection's profile: generate on the source with that map runs the
    // same profile, and the exported file's own tokens are that profile's tokens.
    let generate = |model: &str, extra: &[&str]| generate12(dir.path(), model, extra);
    let g = generate(m, &["--budget", &want, "--map", gp]);
    let profile = g["profile"].as_str().unwrap();
    assert_metadata_kept(&llama, &out, profile);
    let x = generate(o, &[]);
    assert_eq!(
        x["tokens"], g["tokens"],
        "the exported file runs the profile"
    );
    assert_eq!(x["prompt_tokens"], g["prompt_tokens"]);
    assert!(x["weight_bytes"].as_u64().unwrap() <= want.parse::<u64>().unwrap());
    // Every matrix in a ggml type, some of them re-encoded to Q4_0 or Q5_0.
    let f = GgufFile::open(&out).unwrap();
    let s = GgufFile::open(&llama).unwrap();
    let mut changed = 0;
    for (t, st) in f.tensors().iter().zip(s.tensors()) {
        assert_eq!((&t.name, &t.dims), (&st.name, &st.dims));
        assert!(matches!(t.ty, TensorType::Ggml(_)), "{}", t.name);
        if t.ty != st.ty {
            assert!(
                [GgmlType::Q4_0, GgmlType::Q5_0]
                    .map(TensorType::Ggml)
                    .contains(&t.ty),
                "{}: {:?}",
                t.name,
                t.ty
            );
            changed += 1;
        }
    }
    assert!(changed > 0);
    // Refused, and nothing written: a Synapse codec (no GGUF type), an existing file without
    // --force, a map that measured no ggml type.
    let bad = dir.path().join("bad.gguf");
    let b = bad.to_str().unwrap();
    let r = err(&cli(
        dir.path(),
        &[
            "export-gguf",
            "-m",
            m,
            "--profile",
            "uniform:syn.q4.symmetric.g64.v1",
            "-o",
            b,
        ],
    ));
    assert!(r.contains("Synapse codec"), "{r}");
    assert!(!bad.exists());
    let r = err(&export(mp, o));
    assert!(r.contains("exists"), "{r}");
    let syn_map = dir.path().join("syn-map.json");
    let ladder = "syn.q4.symmetric.g64.v1";
    assert!(
        ladder_map(dir.path(), m, &text, ladder, &syn_map)
            .status
            .success()
    );
    let r = err(&export(syn_map.to_str().unwrap(), b));
    assert!(r.contains("no ggml type"), "{r}");
    assert!(!bad.exists());
}

/// `export-gguf --profile uniform:ggml.<type>.v1` of SmolLM2-135M-Instruct is, tensor for
/// tensor, llama.cpp's own `llama-quantize --allow-requantize --pure` of the same file (its
/// types and sha256 from `cargo xtask requant-digests`, `fixtures/requant/`): a legacy type
/// and a K-quant (whose fallback tensors llama.cpp re-quantizes and the export leaves at the
/// source, so those only match in name and shape).
#[test]
fn uniform_ggml_exports_are_llama_cpps_requantization_tensor_for_tensor() {
    use sha2::{Digest, Sha256};
    use synapse_formats::gguf::GgufFile;
    let src = synapse_testdata::model("smollm2-135m-instruct");
    if !synapse_testdata::require(&src, "SmolLM2-135M-Instruct") {
        return;
    }
    let fx = root().join("fixtures/requant/smollm2-135m-instruct-q4_1.json");
    let doc: Value = serde_json::from_slice(&std::fs::read(fx).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s = GgufFile::open(&src).unwrap();
    for ty in ["q4_0", "q4_k"] {
        let out = dir.path().join(format!("{ty}.gguf"));
        let id = format!("uniform:ggml.{ty}.v1");
        let (m, o) = (src.to_str().unwrap(), out.to_str().unwrap());
        let e = cli(
            dir.path(),
            &[
                "export-gguf",
                "-m",
                m,
                "--profile",
                &id,
                "--no-variant-cache",
                "-o",
                o,
            ],
        );
        assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
        let p = json(&cli(
            dir.path(),
            &["profile", "-m", m, "--profile", &id, "--json"],
        ));
        assert_metadata_kept(&src, &out, p["profile"].as_str().unwrap());
        let f = GgufFile::open(&out).unwrap();
        let want = doc["types"][ty]["tensors"].as_object().unwrap();
        assert_eq!(f.tensors().len(), want.len());
        let (mut same, mut kept) = (0, 0);
        for (t, st) in f.tensors().iter().zip(s.tensors()) {
            let w = &want[t.name.as_str()];
            let sha = format!("{:x}", Sha256::digest(f.tensor_data(t)));
            if w["type"].as_str() == Some(ty) || w["type"].as_str() == Some("f32") {
                assert_eq!(
                    t.ty.to_string().to_lowercase(),
                    w["type"].as_str().unwrap(),
                    "{}",
                    t.name
                );
                assert_eq!(sha, w["sha256"].as_str().unwrap(), "{}: {ty}", t.name);
                same += 1;
            } else {
                // llama.cpp's fallback for rows that are not whole super-blocks: the export
                // keeps the source's tensor.
                assert_eq!((t.ty, f.tensor_data(t)), (st.ty, s.tensor_data(st)));
                kept += 1;
            }
        }
        eprintln!("export {id}: {same} tensors llama.cpp's bytes, {kept} kept at the source");
        if ty == "q4_0" {
            assert_eq!(kept, 0, "every tensor is llama.cpp's pure Q4_0");
        }
    }
}

/// `export-gguf` of a mixture of experts writes its re-encoded routed experts as the source
/// stores them: each stacked `ffn_*_exps` tensor its experts' matrices in expert order, in the
/// profile's ggml type. From the tiny F32 MoE GGUFs with `uniform:ggml.q8_0.v1` (four
/// families, Qwen2-MoE's shared expert among them), every stacked expert tensor is byte for
/// byte the Q8_0 that llama.cpp's own converter wrote for the same weights
/// (`model.q8_0.gguf`, made by `cargo xtask tiny-models`), every tensor keeps its name and
/// shape, and the exported file generates the profile's tokens.
#[test]
fn moe_exports_write_the_stacked_experts_in_the_profiles_type() {
    use synapse_formats::GgmlType;
    use synapse_formats::gguf::{GgufFile, TensorType};
    for fam in ["mixtral", "qwen2moe", "olmoe", "granitemoe"] {
        let src = root().join(format!("fixtures/tiny/{fam}/model.f32.gguf"));
        let conv = root().join(format!("fixtures/tiny/{fam}/model.q8_0.gguf"));
        if !synapse_testdata::require(&src, "tiny-model fixture") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("moe.gguf");
        let (s, o) = (src.to_str().unwrap(), out.to_str().unwrap());
        let profile = "uniform:ggml.q8_0.v1";
        let e = cli(
            dir.path(),
            &["export-gguf", "-m", s, "--profile", profile, "-o", o],
        );
        assert!(
            e.status.success(),
            "{fam}: {}",
            String::from_utf8_lossy(&e.stderr)
        );
        let (x, c, f) = (
            GgufFile::open(&out).unwrap(),
            GgufFile::open(&conv).unwrap(),
            GgufFile::open(&src).unwrap(),
        );
        assert_eq!(x.tensors().len(), f.tensors().len(), "{fam}");
        let mut stacks = 0;
        for (t, st) in x.tensors().iter().zip(f.tensors()) {
            assert_eq!((&t.name, &t.dims), (&st.name, &st.dims), "{fam}");
            if !t.name.contains("_exps") {
                continue;
            }
            let ct = c.tensor(&t.name).unwrap();
            assert_eq!(t.ty, TensorType::Ggml(GgmlType::Q8_0), "{fam} {}", t.name);
            assert_eq!(ct.ty, t.ty, "{fam} {}", t.name);
            assert!(
                x.tensor_data(t) == c.tensor_data(ct),
                "{fam} {}: not llama.cpp's Q8_0 of the same weights",
                t.name
            );
            stacks += 1;
        }
        assert!(stacks >= 6, "{fam}: {stacks} stacked expert tensors");
        let (a, b) = (
            generate12(dir.path(), o, &[]),
            generate12(dir.path(), s, &["--profile", profile]),
        );
        assert_eq!(
            a["tokens"], b["tokens"],
            "{fam}: the exported file runs the profile"
        );
        assert_eq!(a["weight_bytes"], b["weight_bytes"], "{fam}");
    }
}
