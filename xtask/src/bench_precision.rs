//! `cargo xtask bench-precision`: what budgeted precision buys on a real model, on the held-out
//! evaluation text (`cargo xtask text-corpus`). For every uniform profile `uniform:ENC` it runs
//! `synapse-cli perplexity --json` (perplexity and mean KL divergence from the source), then the
//! importance-driven profile at the same resident weight bytes (`--budget <those bytes>`, from
//! the model's stored importance map: `synapse-cli importance --calib calibration.txt`), and
//! for each profile the decode speed and the greedy agreement with the source over 64 tokens
//! (`synapse-cli generate --json` on a prompt from the evaluation text). Beside them,
//! llama.cpp's own re-quantization of the same GGUF (`--llama-quants`: `llama_model_quantize`
//! with `allow_requantize`, through llama-cpp-python in the oracle venv; `xtask/py/requant.py`),
//! without and with an importance matrix of the calibration text (`synapse-cli importance
//! --imatrix-only`: per linear the mean x² of each input column, the data llama.cpp's imatrix
//! tool hands the quantizer), each scored by Synapse against the source GGUF (`perplexity
//! --reference`; Synapse runs every ggml type with llama.cpp's bits), and the importance-driven
//! profile at each of their sizes. Prints one markdown table: the README's.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Arguments of `bench-precision`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model (a published name such as `smollm2-135m-instruct`, or a path; default: the
    /// default model).
    #[arg(long)]
    model: Option<String>,
    /// Uniform encodings to compare against (each also gives the budget of one importance-driven
    /// profile).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "syn.q8.symmetric.g64.v1,syn.q6.symmetric.g64.v1,syn.q5.symmetric.g64.v1,syn.q4.symmetric.g64.v1,syn.q3.symmetric.g64.v1"
    )]
    encodings: Vec<String>,
    /// Chunks of 512 tokens scored.
    #[arg(long, default_value_t = 4)]
    chunks: usize,
    /// Tokens generated for the speed and agreement columns.
    #[arg(long, default_value_t = 64)]
    n_gen: usize,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// llama.cpp re-quantizations to compare (llama_ftype suffixes; empty: none).
    #[arg(long, value_delimiter = ',', default_value = "Q4_K_M,Q3_K_M,Q2_K")]
    llama_quants: Vec<String>,
    /// Also refine each importance-driven profile by measurement (`synapse-cli refine
    /// --evals N` on the calibration text; its file under `<target>/refined/`) and add its row
    /// (0: no refined rows).
    #[arg(long, default_value_t = 0)]
    refine: usize,
    /// Use this synapse-cli binary instead of building one.
    #[arg(long)]
    synapse_bin: Option<PathBuf>,
    /// Also write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Row {
    profile: String,
    weight_bytes: u64,
    ppl: f64,
    kl: Option<f64>,
    decode_tok_s: f64,
    agree: usize,
}

/// Generated token ids of a `generate --json` object.
fn tokens(j: &serde_json::Value) -> Vec<u64> {
    j["tokens"]
        .as_array()
        .map(|v| v.iter().filter_map(|t| t.as_u64()).collect())
        .unwrap_or_default()
}

impl Row {
    /// The row as a line of the markdown table (printed as soon as it is measured).
    fn print(&self) {
        println!(
            "| {} | {} | {:.4} | {} | {:.1} | {} |",
            self.profile,
            self.weight_bytes,
            self.ppl,
            self.kl.map_or("—".into(), |k| format!("{k:.5}")),
            self.decode_tok_s,
            self.agree
        );
    }

    /// A row from `perplexity --json` (`p`) and `generate --json` (`g`): the agreement is the
    /// length of the prefix `g` shares with the source's tokens.
    fn of(profile: String, p: &serde_json::Value, g: &serde_json::Value, src: &[u64]) -> Row {
        Row {
            profile,
            weight_bytes: p["weight_bytes"].as_u64().unwrap_or(0),
            ppl: p["ppl"].as_f64().unwrap_or(f64::NAN),
            kl: p["kl"].as_f64(),
            decode_tok_s: g["timings"]["decode_tok_s"].as_f64().unwrap_or(f64::NAN),
            agree: tokens(g)
                .iter()
                .zip(src)
                .take_while(|(x, y)| x == y)
                .count(),
        }
    }
}

fn run_json(cmd: &mut Command) -> Result<serde_json::Value> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s = String::from_utf8(out.stdout)?;
    let line = s.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("parsing the JSON of {cmd:?}: {line}"))
}

/// Runs `bench-precision`.
pub fn run(a: Args) -> Result<()> {
    let bin = match &a.synapse_bin {
        Some(b) => b.clone(),
        None => {
            let st = Command::new(env!("CARGO"))
                .args(["build", "--release", "-p", "synapse-cli"])
                .status()
                .context("cargo build --release -p synapse-cli")?;
            if !st.success() {
                bail!("building synapse-cli failed ({st})");
            }
            crate::bench_vs_llama::target_dir().join("release/synapse-cli")
        }
    };
    let text = crate::text_corpus::corpus_dir();
    let eval = text.join("evaluation.txt");
    if !eval.is_file() {
        bail!("{} missing: run `cargo xtask text-corpus`", eval.display());
    }
    // A prompt of ~100 words from the evaluation text, for speed and agreement.
    let body = std::fs::read_to_string(&eval)?;
    let prompt: String = body
        .split_whitespace()
        .skip(500)
        .take(100)
        .collect::<Vec<_>>()
        .join(" ");
    let base = |sub: &str| {
        let mut c = Command::new(&bin);
        c.arg(sub).arg("--threads").arg(a.threads.to_string());
        if let Some(m) = &a.model {
            c.arg("--model").arg(m);
        }
        c
    };
    let ppl = |extra: &[String]| -> Result<serde_json::Value> {
        let mut c = base("perplexity");
        c.arg("-f")
            .arg(&eval)
            .arg("--chunks")
            .arg(a.chunks.to_string())
            .arg("--json")
            .args(extra);
        run_json(&mut c)
    };
    let gen_ = |extra: &[String]| -> Result<serde_json::Value> {
        let mut c = base("generate");
        c.arg(&prompt)
            .arg("-n")
            .arg(a.n_gen.to_string())
            .arg("--ignore-eos")
            .arg("--json")
            .args(extra);
        run_json(&mut c)
    };
    // `synapse-cli refine` for a budget: the saved profile's path.
    let refined = |wb: u64| -> Result<String> {
        let dir = crate::bench_vs_llama::target_dir().join("refined");
        std::fs::create_dir_all(&dir)?;
        let name = a.model.as_deref().unwrap_or("default").replace('/', "_");
        let out = dir.join(format!("{name}-{wb}.json"));
        eprintln!("bench-precision: refine {wb} -> {} ...", out.display());
        let mut c = base("refine");
        c.arg("--budget")
            .arg(wb.to_string())
            .arg("--calib")
            .arg(text.join("calibration.txt"))
            .arg("--evals")
            .arg(a.refine.to_string())
            .arg("-o")
            .arg(&out)
            .arg("--json");
        let j = run_json(&mut c)?;
        eprintln!(
            "bench-precision: refined KL on calibration text {} (the selector's {}), {} measurements",
            j["kl"],
            j["select_best_kl"],
            j["evaluations"].as_array().map_or(0, Vec::len)
        );
        Ok(out.to_string_lossy().into_owned())
    };
    if a.llama_quants.iter().any(|q| !q.is_empty()) {
        // Fail now, not after the Synapse rows, when the oracle venv is missing.
        crate::oracle_env::python()?;
    }
    println!(
        "| profile | weight bytes | perplexity | KL vs source | decode tok/s | greedy agreement (of {}) |",
        a.n_gen
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let src_gen = gen_(&[])?;
    let src_tokens = tokens(&src_gen);
    let mut rows = Vec::new();
    let measure = |rows: &mut Vec<Row>, label: String, extra: Vec<String>| -> Result<u64> {
        eprintln!("bench-precision: {label} ...");
        let p = ppl(&extra)?;
        let g = if extra.is_empty() {
            src_gen.clone()
        } else {
            gen_(&extra)?
        };
        let r = Row::of(label, &p, &g, &src_tokens);
        let wb = r.weight_bytes;
        r.print();
        rows.push(r);
        Ok(wb)
    };
    let source_bytes = measure(&mut rows, "source".into(), vec![])?;
    for enc in &a.encodings {
        let wb = measure(
            &mut rows,
            format!("uniform:{enc}"),
            vec!["--profile".into(), format!("uniform:{enc}")],
        )?;
        if wb >= source_bytes {
            eprintln!("bench-precision: {enc} is not smaller than the source; no budget row");
            continue;
        }
        measure(
            &mut rows,
            format!("budget {wb} (importance)"),
            vec!["--budget".into(), wb.to_string()],
        )?;
        if a.refine > 0 {
            let file = refined(wb)?;
            measure(
                &mut rows,
                format!("budget {wb} (importance, refined)"),
                vec!["--profile".into(), file],
            )?;
        }
    }
    if !a.llama_quants.iter().all(|q| q.is_empty()) {
        let src = {
            let mut c = Command::new(&bin);
            c.arg("fetch-model");
            if let Some(m) = &a.model {
                c.arg(m);
            }
            let out = c.output().context("synapse-cli fetch-model")?;
            if !out.status.success() {
                bail!(
                    "fetch-model failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            PathBuf::from(String::from_utf8(out.stdout)?.trim())
        };
        let dir = crate::bench_vs_llama::target_dir().join("requant");
        std::fs::create_dir_all(&dir)?;
        let stem = src
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let im = dir.join(format!("{stem}.imatrix.json"));
        let mut c = base("importance");
        c.arg("--calib")
            .arg(text.join("calibration.txt"))
            .arg("--imatrix-only")
            .arg("--imatrix-out")
            .arg(&im);
        let st = c
            .status()
            .context("synapse-cli importance --imatrix-only")?;
        if !st.success() {
            bail!("computing the imatrix failed ({st})");
        }
        for q in a.llama_quants.iter().filter(|q| !q.is_empty()) {
            for with_im in [false, true] {
                let tag = if with_im { "+imatrix" } else { "" };
                let dst = dir.join(format!("{stem}.{q}{tag}.gguf"));
                let mut args: Vec<&std::ffi::OsStr> =
                    vec![src.as_os_str(), dst.as_os_str(), q.as_ref()];
                if with_im {
                    args.push(im.as_os_str());
                }
                crate::parity_fixtures::run_py("requant.py", &args, &[])?;
                let file = dst.to_string_lossy().into_owned();
                let reference = src.to_string_lossy().into_owned();
                // Score the re-quantized file against the source: `--model` is the file.
                let label = format!("llama.cpp {q}{tag}");
                eprintln!("bench-precision: {label} ...");
                let mut c = Command::new(&bin);
                c.arg("perplexity")
                    .args(["--threads", &a.threads.to_string()])
                    .args(["--model", &file, "--reference", &reference])
                    .arg("-f")
                    .arg(&eval)
                    .args(["--chunks", &a.chunks.to_string(), "--json"]);
                let p = run_json(&mut c)?;
                let mut g = Command::new(&bin);
                g.arg("generate")
                    .args(["--threads", &a.threads.to_string(), "--model", &file])
                    .arg(&prompt)
                    .args(["-n", &a.n_gen.to_string(), "--ignore-eos", "--json"]);
                let g = run_json(&mut g)?;
                let r = Row::of(label, &p, &g, &src_tokens);
                let wb = r.weight_bytes;
                r.print();
                rows.push(r);
                if with_im && wb < source_bytes {
                    measure(
                        &mut rows,
                        format!("budget {wb} (importance)"),
                        vec!["--budget".into(), wb.to_string()],
                    )?;
                }
            }
        }
    }
    eprintln!(
        "bench-precision: source {source_bytes} weight bytes; {} rows",
        rows.len()
    );
    if let Some(p) = &a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "profile": r.profile, "weight_bytes": r.weight_bytes, "ppl": r.ppl,
                    "kl": r.kl, "decode_tok_s": r.decode_tok_s, "agree": r.agree,
                })
            })
            .collect();
        std::fs::write(p, serde_json::to_string_pretty(&v)? + "\n")?;
    }
    Ok(())
}
