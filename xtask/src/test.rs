//! `cargo xtask test`: the project's test command (README's "Run the tests", and what
//! `.ci/run` runs).
//!
//! 1. `bash .ci/fetch-test-data`: the three real models and llama.cpp's vocab suite into the
//!    user cache (idempotent; fast when they are already there). Skipped with `--no-fetch`.
//! 2. `cargo nextest run --workspace --locked --no-fail-fast`.
//! 3. `cargo test --workspace --doc --locked` (nextest does not run doctests).
//!
//! A failed fetch stops here; the two test steps both run, and the command fails if either did.
//! Tests whose data is absent skip locally and fail when `CI` is set (`synapse-testdata`).

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Arguments of `cargo xtask test`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Do not run `.ci/fetch-test-data` first (tests whose data is absent then skip, or fail
    /// under `CI`).
    #[arg(long)]
    no_fetch: bool,
}

/// The workspace root (the parent of this crate).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// Runs one step in the workspace root, echoing it; whether it succeeded.
fn step(program: &str, args: &[&str]) -> Result<bool> {
    eprintln!("== {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {program}: {e}"))?;
    if !status.success() {
        eprintln!("== {program} {} failed ({status})", args.join(" "));
    }
    Ok(status.success())
}

/// Fetches the test data, then runs the workspace's tests and doctests.
pub fn run(a: Args) -> Result<()> {
    if !a.no_fetch && !step("bash", &[".ci/fetch-test-data"])? {
        bail!("fetching the test data failed (.ci/fetch-test-data)");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut failed = Vec::new();
    let tests = [
        "nextest",
        "run",
        "--workspace",
        "--locked",
        "--no-fail-fast",
    ];
    let doctests = ["test", "--workspace", "--doc", "--locked"];
    for args in [&tests[..], &doctests[..]] {
        if !step(&cargo, args)? {
            failed.push(format!("cargo {}", args.join(" ")));
        }
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join("; "));
    }
    eprintln!("== all tests passed");
    Ok(())
}
