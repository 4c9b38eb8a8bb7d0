//! `synapse-cli types`: the ggml type table Synapse knows.

use clap::Args as ClapArgs;

/// Arguments of `types`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Prints every known ggml type with its block geometry.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rows: Vec<_> = synapse_formats::ALL_TYPES
        .iter()
        .map(|t| {
            serde_json::json!({"id": t.id(), "name": t.name(), "block_size": t.block_size(), "type_size": t.type_size()})
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{:>4}  {:<8} {:>6} {:>6}", "id", "name", "block", "bytes");
        for t in synapse_formats::ALL_TYPES {
            println!(
                "{:>4}  {:<8} {:>6} {:>6}",
                t.id(),
                t.name(),
                t.block_size(),
                t.type_size()
            );
        }
    }
    Ok(())
}
