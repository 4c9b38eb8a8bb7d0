//! `cargo xtask parity-fixtures`: llama.cpp's greedy outputs on the real models, the oracle side
//! of the runtime parity tests. Regenerates `fixtures/parity/` (format: `fixtures/README.md`).
//!
//! The work is done by `xtask/py/parity_fixtures.py` in the oracle venv (llama-cpp-python); this
//! module finds the model and the interpreter and runs it.

use crate::oracle_env;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Arguments of `parity-fixtures`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The models (names of [`REAL_MODELS`]; default: all of them), each read from the model
    /// cache (`synapse-cli fetch-model NAME` puts it there).
    pub models: Vec<String>,
    /// Output folder (default: `fixtures/parity`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The real models with parity fixtures: (name as `synapse-cli fetch-model` knows it, file
/// name in the model cache, fixture stem).
pub const REAL_MODELS: &[(&str, &str, &str)] = &[
    ("gemma-3-270m", DEFAULT_MODEL_FILE, "gemma3-270m-q4_k_m"),
    (
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
    ),
    (
        "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct-q4_1",
    ),
];

/// File name of the default real model (Gemma 3 270M Q4_K_M).
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The folder holding downloaded models: `$SYNAPSE_MODEL_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/synapse/models`.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SYNAPSE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache")
        });
    cache.join("synapse").join("models")
}

/// `--model` if given (a path, or a name of [`REAL_MODELS`] in [`model_dir`]), else the default
/// model in [`model_dir`]; errors if the file is missing.
pub fn resolve_model(model: Option<&Path>) -> Result<PathBuf> {
    let p = match model {
        Some(p) => match REAL_MODELS.iter().find(|m| Path::new(m.0) == p) {
            Some(m) if !p.exists() => model_dir().join(m.1),
            _ => p.to_path_buf(),
        },
        None => model_dir().join(DEFAULT_MODEL_FILE),
    };
    if !p.is_file() {
        bail!(
            "model not found at {}: pass --model PATH or set SYNAPSE_MODEL_DIR to the folder holding {}",
            p.display(),
            DEFAULT_MODEL_FILE
        );
    }
    Ok(p)
}

/// Runs `xtask/py/<script>` with the oracle venv's interpreter; fails if it fails.
pub fn run_py(script: &str, args: &[&std::ffi::OsStr], envs: &[(&str, &Path)]) -> Result<()> {
    let py = oracle_env::python()?;
    let path = oracle_env::repo_root().join("xtask/py").join(script);
    let mut cmd = Command::new(&py);
    cmd.arg(&path).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let status = cmd
        .status()
        .with_context(|| format!("spawning {} {}", py.display(), path.display()))?;
    if !status.success() {
        bail!("{} failed with {status}", path.display());
    }
    Ok(())
}

/// Runs `xtask/py/<script> OUT` for a fixture folder: `out`, else `<repo>/<default_out>`.
pub fn run_fixture_script(
    what: &str,
    script: &str,
    out: Option<PathBuf>,
    default_out: &str,
) -> Result<()> {
    let out = out.unwrap_or_else(|| oracle_env::repo_root().join(default_out));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!("{what} -> {}", out.display());
    run_py(script, &[out.as_os_str()], &[])
}

/// Regenerates the parity fixtures.
pub fn run(args: Args) -> Result<()> {
    let out = args
        .out
        .unwrap_or_else(|| oracle_env::repo_root().join("fixtures/parity"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let chosen: Vec<&(&str, &str, &str)> = if args.models.is_empty() {
        REAL_MODELS.iter().collect()
    } else {
        args.models
            .iter()
            .map(|n| {
                REAL_MODELS.iter().find(|m| m.0 == n).with_context(|| {
                    let names: Vec<&str> = REAL_MODELS.iter().map(|m| m.0).collect();
                    format!("unknown model {n:?}: one of {names:?}")
                })
            })
            .collect::<Result<_>>()?
    };
    for (name, file, stem) in chosen {
        let model = model_dir().join(file);
        if !model.is_file() {
            bail!(
                "{name}: not found at {} (`synapse-cli fetch-model {name}` fetches it)",
                model.display()
            );
        }
        println!(
            "parity-fixtures: llama.cpp on {} -> {}/{stem}.json",
            model.display(),
            out.display()
        );
        run_py(
            "parity_fixtures.py",
            &[
                model.as_os_str(),
                out.as_os_str(),
                std::ffi::OsStr::new(stem),
            ],
            &[],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Integrity of the committed `fixtures/parity/` (what the runtime's parity tests rely on).

    use crate::oracle_env::repo_root;
    use serde_json::Value;

    fn load(stem: &str) -> Value {
        let p = repo_root().join(format!("fixtures/parity/{stem}.json"));
        serde_json::from_slice(&std::fs::read(&p).expect("fixture present")).expect("valid JSON")
    }

    fn f32s(v: &Value) -> Vec<f32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    }

    fn ids(v: &Value) -> Vec<u64> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect()
    }

    #[test]
    fn prompts_are_consistent() {
        for (_, _, stem) in super::REAL_MODELS {
            prompts_consistent(stem);
        }
        // Pinned: llama.cpp's (llama-cpp-python 0.3.36) greedy continuation of "The capital of
        // France is" on Gemma 3 270M Q4_K_M — " the capital of the country" — first recorded by
        // the generator, which refuses to write a fixture that does not start with it.
        let reference = ids(&load("gemma3-270m-q4_k_m")["prompts"][0]["greedy_ids"]);
        assert_eq!(&reference[..5], &[506, 5279, 529, 506, 2891]);
    }

    fn prompts_consistent(stem: &str) {
        let d = load(stem);
        let n_gen = d["settings"]["n_gen"].as_u64().expect("n_gen") as usize;
        let prompts = d["prompts"].as_array().expect("prompts");
        assert!(prompts.len() >= 16, "{stem}");
        assert!(
            prompts.iter().any(|p| p["chat_messages"].is_array()),
            "{stem}: a chat prompt"
        );
        for p in prompts {
            let name = p["name"].as_str().expect("name");
            let greedy = ids(&p["greedy_ids"]);
            let steps = p["step_top_ids"].as_array().expect("step_top_ids");
            let eog = p["stopped_at_eog"].as_bool() == Some(true);
            assert_eq!(steps.len(), greedy.len() - eog as usize, "{stem} {name}");
            for (s, st) in steps.iter().enumerate() {
                let top = f32s(&p["step_top_values"][s]);
                assert_eq!(ids(st).len(), 8, "{stem} {name}");
                assert!(top.windows(2).all(|w| w[0] >= w[1]), "{name}: descending");
                if s + 1 < greedy.len() {
                    assert_eq!(ids(st)[0], greedy[s + 1], "{stem} {name}: step {s} argmax");
                }
            }
            let margins = f32s(&p["margins"]);
            assert_eq!(greedy.len(), margins.len(), "{name}");
            assert_eq!(greedy.len(), ids(&p["runner_up_ids"]).len(), "{name}");
            if p["stopped_at_eog"].as_bool() != Some(true) {
                assert_eq!(greedy.len(), n_gen, "{name}");
            }
            assert!(margins.iter().all(|m| *m >= 0.0), "{name}");
            let top_ids = ids(&p["last_logits_top_ids"]);
            let top = f32s(&p["last_logits_top_values"]);
            assert_eq!(top_ids.len(), 256);
            assert_eq!(top.len(), 256);
            assert!(top.windows(2).all(|w| w[0] >= w[1]), "{name}: descending");
            assert_eq!(
                top_ids[0], greedy[0],
                "{name}: greedy step 0 is the top logit"
            );
            assert!(
                (top[0] - top[1] - margins[0]).abs() < 1e-4,
                "{name}: margin 0"
            );
        }
    }

    #[test]
    fn full_logits_match_the_json() {
        for (_, _, stem) in super::REAL_MODELS {
            full_logits(stem);
        }
    }

    fn full_logits(stem: &str) {
        let d = load(stem);
        let n_vocab = d["model"]["n_vocab"].as_u64().expect("n_vocab") as usize;
        let mut seen = 0;
        for p in d["prompts"].as_array().expect("prompts") {
            let Some(file) = p["full_logits_file"].as_str() else {
                continue;
            };
            seen += 1;
            let bytes = std::fs::read(repo_root().join("fixtures/parity").join(file)).expect(file);
            assert_eq!(bytes.len(), n_vocab * 4, "{file}");
            let lg: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let mut order: Vec<usize> = (0..n_vocab).collect();
            order.sort_by(|&a, &b| lg[b].total_cmp(&lg[a]).then(a.cmp(&b)));
            let top_ids = ids(&p["last_logits_top_ids"]);
            let top = f32s(&p["last_logits_top_values"]);
            for k in 0..top_ids.len() {
                assert_eq!(order[k] as u64, top_ids[k], "{file} rank {k}");
                assert_eq!(lg[order[k]], top[k], "{file} rank {k}");
            }
        }
        assert_eq!(seen, 2);
    }
}
