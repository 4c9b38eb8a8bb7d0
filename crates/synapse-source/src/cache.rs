//! Where models live: `$SYNAPSE_MODEL_DIR`, else `$XDG_CACHE_HOME/synapse/models`, else
//! `~/.cache/synapse/models`.

use std::path::PathBuf;

use crate::error::{Result, SourceError};
use crate::pypi::GEMMA3_270M_Q4_K_M;

/// Environment variable overriding the models directory.
pub const MODEL_DIR_ENV: &str = "SYNAPSE_MODEL_DIR";

/// The directory models are stored in (not created here).
pub fn models_dir() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var(MODEL_DIR_ENV) {
        return Ok(PathBuf::from(d));
    }
    let cache = match var("XDG_CACHE_HOME") {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(var("HOME").ok_or(SourceError::NoCacheDir)?).join(".cache"),
    };
    Ok(cache.join("synapse").join("models"))
}

/// Where the default model (Gemma 3 270M Q4_K_M) is, or will be after [`crate::fetch_default`].
pub fn default_model_path() -> Result<PathBuf> {
    Ok(models_dir()?.join(GEMMA3_270M_Q4_K_M.file_name))
}
