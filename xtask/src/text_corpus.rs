//! `cargo xtask text-corpus`: the calibration and held-out evaluation text, from a package the
//! registries serve: Debian's `python3.11-doc` (the Python documentation's reStructuredText
//! sources, `_sources/**/*.rst.txt`: ~500 documents, ~11 MB of English prose and examples,
//! under the PSF license). Downloaded with `apt-get download` (no root needed), unpacked with
//! `dpkg-deb -x`, split by document with `synapse_sensitivity::corpus::split` (one in four
//! held out, by a hash of the document's path), and written to
//! `${XDG_CACHE_HOME:-~/.cache}/synapse/text/python3.11-doc/`: `calibration.txt`,
//! `evaluation.txt` and `manifest.json` (package version, the .deb's BLAKE3, every document's
//! name per part, each part's content hash). Rerunning gives the same files.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use synapse_sensitivity::corpus::{self, Document};

/// The Debian package the text comes from.
pub const PACKAGE: &str = "python3.11-doc";

/// Arguments of `cargo xtask text-corpus`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output folder (default: `${XDG_CACHE_HOME:-~/.cache}/synapse/text/python3.11-doc`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Use this already downloaded .deb instead of `apt-get download`.
    #[arg(long)]
    deb: Option<PathBuf>,
}

/// The default output folder.
pub fn corpus_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache")
        });
    cache.join("synapse").join("text").join(PACKAGE)
}

fn run_cmd(c: &mut Command, what: &str) -> Result<()> {
    let out = c.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Every `*.rst.txt` under `dir`, as documents named by their path relative to `root`.
fn collect(root: &Path, dir: &Path, out: &mut Vec<Document>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        if e.file_type()?.is_dir() {
            collect(root, &p, out)?;
        } else if p.to_string_lossy().ends_with(".rst.txt") {
            let bytes = std::fs::read(&p)?;
            let Ok(text) = String::from_utf8(bytes) else {
                continue;
            };
            let name = p.strip_prefix(root)?.to_string_lossy().replace('\\', "/");
            out.push(Document { name, text });
        }
    }
    Ok(())
}

/// Fetches, splits and writes the corpus.
pub fn run(a: Args) -> Result<()> {
    let out = a.out.unwrap_or_else(corpus_dir);
    std::fs::create_dir_all(&out)?;
    let work = out.join(".work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let deb = match a.deb {
        Some(d) => d,
        None => {
            println!("text-corpus: apt-get download {PACKAGE}");
            let dl = || {
                run_cmd(
                    Command::new("apt-get")
                        .args(["download", PACKAGE])
                        .current_dir(&work),
                    "apt-get download",
                )
            };
            if let Err(e) = dl() {
                // A machine without package lists yet: fetch them once and retry.
                println!("text-corpus: {e:#}; apt-get update, then again");
                run_cmd(Command::new("apt-get").arg("update"), "apt-get update")?;
                dl()?;
            }
            std::fs::read_dir(&work)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|x| x == "deb"))
                .context("apt-get download left no .deb")?
        }
    };
    let deb_bytes = std::fs::read(&deb).with_context(|| format!("reading {}", deb.display()))?;
    let deb_hash = blake3::hash(&deb_bytes).to_hex().to_string();
    let version = deb
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('_').nth(1))
        .unwrap_or("?")
        .to_string();
    let tree = work.join("tree");
    run_cmd(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree),
        "dpkg-deb -x",
    )?;
    let root = tree.join("usr/share/doc/python3.11/html/_sources");
    let mut docs = Vec::new();
    collect(&root, &root, &mut docs)?;
    if docs.len() < 100 {
        bail!(
            "{} holds {} .rst.txt documents, expected hundreds",
            deb.display(),
            docs.len()
        );
    }
    let s = corpus::split(docs);
    let (ch, eh) = (
        corpus::part_hash(&s.calibration),
        corpus::part_hash(&s.evaluation),
    );
    let (ct, et) = (
        corpus::joined(&s.calibration),
        corpus::joined(&s.evaluation),
    );
    std::fs::write(out.join("calibration.txt"), &ct)?;
    std::fs::write(out.join("evaluation.txt"), &et)?;
    let names = |d: &[Document]| d.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
    let manifest = serde_json::json!({
        "package": PACKAGE,
        "version": version,
        "deb_blake3": deb_hash,
        "license": "PSF-2.0 (the Python documentation)",
        "split": format!("by document: blake3(name)[0] % {} == 0 held out", corpus::EVAL_ONE_IN),
        "calibration": { "documents": names(&s.calibration), "bytes": ct.len(), "blake3": ch },
        "evaluation": { "documents": names(&s.evaluation), "bytes": et.len(), "blake3": eh },
    });
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    let _ = std::fs::remove_dir_all(&work);
    println!(
        "text-corpus: {PACKAGE} {version}: calibration {} documents ({:.1} MB, {}), evaluation {} documents ({:.1} MB, {}) in {}",
        s.calibration.len(),
        ct.len() as f64 / 1e6,
        &ch[..12],
        s.evaluation.len(),
        et.len() as f64 / 1e6,
        &eh[..12],
        out.display()
    );
    Ok(())
}
