//! `cargo xtask import SOURCE [--out DIR]`: the same import as `synapse-cli import` (both call
//! `synapse_import::import` and print `synapse_import::summary`), for scripted fixture work.

use anyhow::Result;
use std::path::PathBuf;
use synapse_import::{Destination, progress::Bars};

/// Arguments of `import`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A GGUF file, or a safetensors checkpoint directory.
    source: PathBuf,
    /// Write a self-contained package directory here instead of into the store.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The store to import into (default: the user store).
    #[arg(long, conflicts_with = "out")]
    store: Option<PathBuf>,
}

/// Runs the import.
pub fn run(args: Args) -> Result<()> {
    let dest = match (args.out, args.store) {
        (Some(out), _) => Destination::Directory(out),
        (None, Some(store)) => Destination::Store(store),
        (None, None) => Destination::Store(synapse_cas::default_store_dir()),
    };
    let report = synapse_import::import(&args.source, &dest, &Bars::new())?;
    println!("{}", synapse_import::summary(&report));
    Ok(())
}
