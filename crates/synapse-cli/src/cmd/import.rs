//! `synapse-cli import`: a GGUF file or safetensors checkpoint → a Synapse package.

use clap::Args as ClapArgs;
use std::path::PathBuf;
use synapse_import::{Destination, progress::Bars};

/// Arguments of `import`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// A GGUF file, a safetensors checkpoint directory (`config.json` + shards), or a
    /// published model's name (`synapse-cli models`).
    source: PathBuf,
    /// Write a self-contained package directory here (`manifest.toml` + `objects/`) instead of
    /// into the store.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The store to import into (default: `$SYNAPSE_STORE`, else
    /// `${XDG_DATA_HOME:-~/.local/share}/synapse/store`).
    #[arg(long, conflicts_with = "out")]
    store: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `import`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let dest = match (args.out, args.store) {
        (Some(out), _) => Destination::Directory(out),
        (None, Some(store)) => Destination::Store(store),
        (None, None) => Destination::Store(synapse_cas::default_store_dir()),
    };
    let report = synapse_import::import(
        &super::load::source_path(&args.source)?,
        &dest,
        &Bars::new(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", synapse_import::summary(&report));
    }
    Ok(())
}
