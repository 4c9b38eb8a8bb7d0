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
    // One read with a large buffer: the kernel lists every lock in one pass (a file read in
    // small chunks is listed pass by pass, and a lock taken or dropped elsewhere between two
    // passes can shift a line out of both).
    let mut f = std::fs::File::open("/proc/locks").expect("/proc/locks (Linux)");
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0;
    loop {
        use std::io::Read;
        match f.read(&mut buf[n..]).expect("reading /proc/locks") {
            0 => break,
            k => n += k,
        }
        if n == buf.len() {
            buf.resize(2 * n, 0);
        }
    }
    String::from_utf8_lossy(&buf[..n])
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
