//! `synapse-cli profile`: the precision profile `--budget` (or `--profile`) selects for a model,
//! tensor by tensor, without running it.

use std::collections::BTreeMap;
use std::sync::Arc;

use clap::Args as ClapArgs;

use super::load::{ModelArgs, PrecisionArgs};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Print one JSON object (tensor → encoding, bytes, predicted distortion).
    #[arg(long)]
    json: bool,
}

/// Runs `profile`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let (model, _) = a.model.load()?;
    let model = Arc::new(model);
    let prepared = a
        .precision
        .apply(&model, a.model.model.as_deref(), a.model.store.as_deref())?;
    let applied = &prepared.applied;
    let m = &applied.model;
    let mut rows = Vec::new();
    // Every tensor a profile can assign: the linears, then the routed experts' tensors.
    let bytes = synapse_runtime::precision::assignable(m);
    let names = synapse_runtime::importance::linears(m)
        .into_iter()
        .map(|(n, _)| n)
        .chain(synapse_runtime::importance::expert_tensors(m));
    for name in names {
        let enc = m.profile.encoding(&name).unwrap_or("f32").to_string();
        let d = applied
            .profile
            .as_ref()
            .and_then(|p| p.assignments.get(&name))
            .map(|x| x.distortion);
        let b = bytes.get(&name).copied().unwrap_or(0);
        rows.push((name, enc, b, d));
    }
    if a.json {
        let j = serde_json::json!({
            "profile": m.profile.hash(),
            "weight_bytes": m.weight_bytes(),
            "source_weight_bytes": model.weight_bytes(),
            "predicted_distortion": applied.profile.as_ref().map(|p| p.total_distortion),
            "tensors": rows.iter().map(|(n, e, b, d)| serde_json::json!({
                "name": n, "encoding": e, "bytes": b, "distortion": d,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string(&j)?);
        return Ok(());
    }
    let mut by_enc: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for (name, enc, bytes, d) in &rows {
        println!(
            "{name:<32} {enc:<28} {bytes:>10}{}",
            d.map_or(String::new(), |d| format!("  {d:.3e}"))
        );
        let e = by_enc.entry(enc).or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    for (enc, (n, b)) in by_enc {
        println!("# {enc}: {n} tensors, {b} bytes");
    }
    println!(
        "# profile {}: {} weight bytes of the source's {}",
        m.profile.hash(),
        m.weight_bytes(),
        model.weight_bytes()
    );
    Ok(())
}
