//! `synapse-cli models`: the published models Synapse fetches by name, their size, and whether
//! the model cache holds them (by size; `fetch-model` verifies the digest).

use clap::Args as ClapArgs;

/// Arguments of `models`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Print JSON (`[{"name", "file", "bytes", "sha256", "cached", "path"}]`) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists [`synapse_source::KNOWN_MODELS`].
pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = synapse_source::models_dir()?;
    let rows: Vec<serde_json::Value> = synapse_source::KNOWN_MODELS
        .iter()
        .map(|(name, m)| {
            let path = dir.join(m.file_name);
            let cached = std::fs::metadata(&path).is_ok_and(|md| md.len() == m.len);
            serde_json::json!({
                "name": name, "file": m.file_name, "bytes": m.len, "sha256": m.sha256,
                "cached": cached, "path": path.display().to_string(),
            })
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("{:<30} {:>9}  {:<6}  file", "name", "MB", "cached");
    for r in &rows {
        println!(
            "{:<30} {:>9.1}  {:<6}  {}",
            r["name"].as_str().unwrap_or_default(),
            r["bytes"].as_u64().unwrap_or_default() as f64 / 1e6,
            if r["cached"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            r["path"].as_str().unwrap_or_default()
        );
    }
    println!(
        "models directory: {} ($SYNAPSE_MODEL_DIR overrides)",
        dir.display()
    );
    Ok(())
}
