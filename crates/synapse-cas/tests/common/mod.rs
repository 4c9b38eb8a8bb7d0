//! Helpers shared by the integration tests.

use std::path::Path;

/// One `flock` on a file, as the kernel reports it in `/proc/locks` (Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flock {
    /// The process holding (or waiting for) the lock.
    pub pid: u32,
    /// Exclusive (`WRITE`) rather than shared (`READ`).
    pub exclusive: bool,
    /// A request blocked behind the holders, not a held lock.
    pub waiting: bool,
}

/// The `flock`s held on, and requested of, the file at `path` (none if it does not exist).
/// `/proc/locks` lists a held lock as `N: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<inode> 0 EOF`
/// and a blocked request as `N: -> FLOCK  ADVISORY  WRITE …`.
pub fn flocks(path: &Path) -> Vec<Flock> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let inode = meta.ino().to_string();
    std::fs::read_to_string("/proc/locks")
        .expect("/proc/locks (Linux)")
        .lines()
        .filter_map(|line| {
            let mut f: Vec<&str> = line.split_whitespace().skip(1).collect();
            let waiting = f.first() == Some(&"->");
            if waiting {
                f.remove(0);
            }
            match f[..] {
                ["FLOCK", _, mode, pid, file, ..] if file.rsplit(':').next() == Some(&inode) => {
                    Some(Flock {
                        pid: pid.parse().ok()?,
                        exclusive: mode == "WRITE",
                        waiting,
                    })
                }
                _ => None,
            }
        })
        .collect()
}
