//! `cargo xtask tiny-models`: tiny random-weight models of every family (transformers →
//! safetensors → GGUF F32/Q8_0, BitNet's F32/TQ1_0/TQ2_0, via llama.cpp's
//! `convert_hf_to_gguf.py`; the [`HF_ONLY`] families have no llama.cpp graph, so no GGUF)
//! with transformers' and llama.cpp's logits for fixed token sequences. Regenerates
//! `fixtures/tiny/` (format: `fixtures/README.md`).
//!
//! The work is done by `xtask/py/tiny_models.py` in the oracle venv (needs torch, transformers,
//! safetensors, sentencepiece, and llama-cpp-python unless every family made is in [`HF_ONLY`]).

use crate::{oracle_env, parity_fixtures::run_py};
use anyhow::{Result, bail};
use std::ffi::OsStr;
use std::path::PathBuf;

/// The families the generator can make (folder names under `fixtures/tiny/`).
pub const FAMILIES: [&str; 15] = [
    "llama",
    "qwen2",
    "gemma3",
    "olmoe",
    "granitemoe",
    "qwen2moe",
    "mixtral",
    "bitnet",
    "bitnet-relu2",
    "bitnet-w158a8",
    "olmoe-clip",
    "bitnet-packed",
    "olmoe-k",
    "olmoe-norm",
    "qwen2moe-norm",
];

/// The families llama.cpp has no graph for: transformers is their only oracle (no GGUFs, so
/// neither llama.cpp's converter nor llama-cpp-python is needed to make them). OLMoE with
/// `clip_qkv` (llama.cpp's converter drops the clamp); OLMoE and Qwen2-MoE with
/// `norm_topk_prob` (llama.cpp's graphs never renormalise their top-k weights).
pub const HF_ONLY: &[&str] = &[
    "bitnet-relu2",
    "bitnet-w158a8",
    "olmoe-clip",
    "bitnet-packed",
    "olmoe-norm",
    "qwen2moe-norm",
];

/// The families made when none are named: those whose fixtures are committed (all).
pub const COMMITTED: &[&str] = &FAMILIES;

/// Arguments of `tiny-models`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The llama.cpp source tree holding `convert_hf_to_gguf.py` and `gguf-py/` (default:
    /// `$SYNAPSE_LLAMA_CPP_DIR`, else `<venv>/../llama_cpp_python-0.3.36/vendor/llama.cpp`).
    #[arg(long, env = "SYNAPSE_LLAMA_CPP_DIR")]
    llama_cpp_dir: Option<PathBuf>,
    /// Output folder (default: `fixtures/tiny`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Families to make (default: all, llama qwen2 gemma3 olmoe granitemoe qwen2moe mixtral
    /// bitnet bitnet-relu2 bitnet-w158a8 olmoe-clip bitnet-packed olmoe-k olmoe-norm
    /// qwen2moe-norm).
    families: Vec<String>,
}

/// Regenerates the tiny-model fixtures.
pub fn run(args: Args) -> Result<()> {
    let llama_dir = args.llama_cpp_dir.unwrap_or_else(|| {
        oracle_env::venv_dir()
            .parent()
            .map(|p| p.join("llama_cpp_python-0.3.36/vendor/llama.cpp"))
            .unwrap_or_default()
    });
    let hf_only =
        !args.families.is_empty() && args.families.iter().all(|f| HF_ONLY.contains(&f.as_str()));
    if !hf_only && !llama_dir.join("convert_hf_to_gguf.py").is_file() {
        bail!(
            "no convert_hf_to_gguf.py in {}: unpack the llama-cpp-python 0.3.36 sdist \
             (`pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`) and pass \
             --llama-cpp-dir <sdist>/vendor/llama.cpp",
            llama_dir.display()
        );
    }
    for f in &args.families {
        if !FAMILIES.contains(&f.as_str()) {
            bail!("unknown family {f}; known: {}", FAMILIES.join(", "));
        }
    }
    let out = args
        .out
        .unwrap_or_else(|| oracle_env::repo_root().join("fixtures/tiny"));
    println!(
        "tiny-models: converting with {} -> {}",
        llama_dir.display(),
        out.display()
    );
    let mut argv: Vec<&OsStr> = vec![llama_dir.as_os_str(), out.as_os_str()];
    if args.families.is_empty() {
        argv.extend(COMMITTED.iter().map(OsStr::new));
    } else {
        argv.extend(args.families.iter().map(OsStr::new));
    }
    run_py("tiny_models.py", &argv, &[])
}

#[cfg(test)]
mod tests {
    //! Integrity of the committed `fixtures/tiny/` (what the runtime's family tests rely on).

    use super::{COMMITTED, HF_ONLY};
    use crate::oracle_env::repo_root;
    use serde_json::Value;

    fn read_f32(path: &std::path::Path) -> Vec<f32> {
        std::fs::read(path)
            .expect("logits file")
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn argmax(row: &[f32]) -> usize {
        let mut best = 0;
        for (i, v) in row.iter().enumerate() {
            if *v > row[best] {
                best = i;
            }
        }
        best
    }

    #[test]
    fn committed_families_are_consistent() {
        for fam in COMMITTED {
            let dir = repo_root().join("fixtures/tiny").join(fam);
            let o: Value = serde_json::from_slice(
                &std::fs::read(dir.join("oracle.json")).expect("oracle.json"),
            )
            .expect("JSON");
            let n_vocab = o["n_vocab"].as_u64().expect("n_vocab") as usize;
            let lens: Vec<usize> = o["sequence_lengths"]
                .as_array()
                .expect("lengths")
                .iter()
                .map(|x| x.as_u64().expect("len") as usize)
                .collect();
            let rows: usize = lens.iter().sum();
            let hf = read_f32(&dir.join("logits.hf.f32"));
            assert_eq!(hf.len(), rows * n_vocab, "{fam}");
            // transformers' first greedy token after sequence 0 is the argmax of its last row
            let last0 = &hf[(lens[0] - 1) * n_vocab..lens[0] * n_vocab];
            let g0 = o["hf"]["greedy_after_seq0"][0].as_u64().expect("greedy") as usize;
            assert_eq!(argmax(last0), g0, "{fam}");
            let ggufs = o["gguf"].as_object().expect("gguf");
            assert!(
                ggufs.is_empty() == HF_ONLY.contains(fam),
                "{fam}: GGUFs {:?}",
                ggufs.keys()
            );
            // Files checked at generation and then not kept (olmoe-k's 8 MB safetensors and F32
            // GGUF).
            let pruned: Vec<&str> = o["pruned"].as_array().map_or(Vec::new(), |a| {
                a.iter().filter_map(|v| v.as_str()).collect()
            });
            for (ot, g) in ggufs {
                if pruned.contains(&g["file"].as_str().unwrap_or("")) {
                    continue;
                }
                let bytes =
                    std::fs::read(dir.join(g["file"].as_str().expect("file"))).expect("gguf");
                assert_eq!(&bytes[..4], b"GGUF", "{fam} {ot}");
                let lg = read_f32(&dir.join(g["logits_file"].as_str().expect("logits")));
                assert_eq!(lg.len(), hf.len(), "{fam} {ot}");
                let max_abs = lg
                    .iter()
                    .zip(&hf)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                let recorded = g["vs_hf"]["max_abs"].as_f64().expect("max_abs") as f32;
                assert!(
                    (max_abs - recorded).abs() <= 1e-6 * recorded.max(1.0),
                    "{fam} {ot}"
                );
            }
            assert!(
                pruned.contains(&"model.safetensors") || dir.join("model.safetensors").is_file(),
                "{fam}"
            );
            assert!(dir.join("tokenizer.model").is_file(), "{fam}");
        }
    }
}
