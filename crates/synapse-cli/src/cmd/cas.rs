//! `synapse-cli cas stats | verify | gc`: the content-addressed store.

use anyhow::bail;
use clap::{Args as ClapArgs, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use synapse_cas::{Package, Store};

/// Arguments of `cas`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: CasCommand,
}

#[derive(Subcommand, Debug)]
enum CasCommand {
    /// Object and package counts and sizes.
    Stats {
        /// Store or package directory (default: the user store).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every object of a package directory or store; exits non-zero naming each
    /// corrupt or missing object.
    Verify {
        /// Package directory or store (default: the user store).
        dir: Option<PathBuf>,
    },
    /// Rebuild the source GGUF file of a GGUF-sourced package (byte-identical to the source
    /// when it was written in the usual layout; checked against the manifest's sha256).
    Export {
        /// Package directory or package hash (prefix) in the store.
        package: String,
        /// Output GGUF file.
        #[arg(long)]
        gguf: PathBuf,
        /// The store holding the package (default: the user store).
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// Delete objects no package references, and leftover temporary files.
    Gc {
        /// Store or package directory (default: the user store).
        #[arg(long)]
        store: Option<PathBuf>,
        /// Only report what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// Runs `cas`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        CasCommand::Stats { store, json } => {
            let root = store.unwrap_or_else(synapse_cas::default_store_dir);
            let store = Store::open_existing(&root)?;
            let s = store.stats()?;
            let index = synapse_cas::Index::open(&store).len()?;
            if json {
                let mut v = serde_json::to_value(&s)?;
                v["index_entries"] = index.into();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("store        {}", root.display());
                println!("packages     {}", s.packages);
                println!("objects      {} ({})", s.objects, mib(s.object_bytes));
                println!(
                    "referenced   {} ({})",
                    s.referenced_objects,
                    mib(s.referenced_bytes)
                );
                println!(
                    "unreferenced {} ({}) — removed by `cas gc`",
                    s.unreferenced_objects,
                    mib(s.unreferenced_bytes)
                );
                println!("temp files   {} ({})", s.tmp_files, mib(s.tmp_bytes));
                println!("index        {index} entries");
            }
            Ok(())
        }
        CasCommand::Verify { dir } => {
            let root = dir.unwrap_or_else(synapse_cas::default_store_dir);
            let store = Store::open_existing(&root)?;
            let total = store.stats()?.object_bytes;
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "  verify [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            let mut report = store.verify(|n| bar.inc(n))?;
            bar.finish_and_clear();
            // A package directory: also check its manifest parses and its objects are whole.
            if root.join(synapse_cas::store::MANIFEST_FILE).is_file() {
                match Package::open_dir(&root) {
                    Ok(p) => {
                        for pr in p.verify(|_| {})?.problems {
                            if !report.problems.contains(&pr) {
                                report.problems.push(pr);
                            }
                        }
                    }
                    Err(e) => bail!("{}: {e}", root.display()),
                }
            }
            for p in &report.problems {
                eprintln!("error: {p}");
            }
            println!(
                "checked {} objects ({}) and {} manifest(s) in {}: {} problem(s)",
                report.objects_checked,
                mib(report.bytes_checked),
                report.manifests_checked,
                root.display(),
                report.problems.len()
            );
            if !report.problems.is_empty() {
                bail!(
                    "{} corrupt, missing or stray item(s)",
                    report.problems.len()
                );
            }
            Ok(())
        }
        CasCommand::Export {
            package,
            gguf,
            store,
        } => {
            let root = store.unwrap_or_else(synapse_cas::default_store_dir);
            let pkg = Package::open(&package, &root)?;
            let bytes = synapse_import::export_gguf(&pkg)?;
            let digest = synapse_cas::FileDigest::of(&bytes);
            std::fs::write(&gguf, &bytes)?;
            let same = pkg
                .manifest()
                .sources
                .iter()
                .any(|s| s.role == "gguf" && s.digest == digest);
            println!(
                "wrote {} ({}), sha256 {} — {}",
                gguf.display(),
                mib(digest.size),
                digest.sha256,
                if same {
                    "identical to the source file"
                } else {
                    "differs from the source file's digest (same tensors and metadata)"
                }
            );
            Ok(())
        }
        CasCommand::Gc { store, dry_run } => {
            let root = store.unwrap_or_else(synapse_cas::default_store_dir);
            let store = Store::open_existing(&root)?;
            let r = store.gc(dry_run)?;
            let verb = if dry_run { "would delete" } else { "deleted" };
            println!(
                "{verb} {} objects ({}), {} temp files, {} index entries; kept {} objects",
                r.deleted_objects,
                mib(r.deleted_bytes),
                r.deleted_tmp,
                r.pruned_index_entries,
                r.kept_objects
            );
            Ok(())
        }
    }
}
