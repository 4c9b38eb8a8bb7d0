//! `synapse-cli fetch-model [NAME]`: fetches (once) and verifies a published model (default:
//! the default model), prints its path.

use clap::Args as ClapArgs;

/// Arguments of `fetch-model`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Which model: `gemma-3-270m` (the default), `qwen2.5-coder-0.5b-instruct`,
    /// `smollm2-135m-instruct`.
    #[arg(default_value = "gemma-3-270m")]
    name: String,
    /// Print JSON (`{"path", "sha256", "bytes"}`) instead of the bare path.
    #[arg(long)]
    json: bool,
    /// Directory to store models in (default: $SYNAPSE_MODEL_DIR, else the user cache).
    #[arg(long, env = "SYNAPSE_MODEL_DIR")]
    dir: Option<std::path::PathBuf>,
}

/// Fetches the model if it is absent or corrupt, then prints its path.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(&model) = synapse_source::known_model(&args.name) else {
        let names: Vec<&str> = synapse_source::KNOWN_MODELS.iter().map(|m| m.0).collect();
        anyhow::bail!("unknown model {:?}: one of {}", args.name, names.join(", "));
    };
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
