//! Budgets that follow the memory the machine has free (`serve --budget free`): a thread reads
//! what the operating system can still give this process every few seconds and hands the
//! [`BudgetDriver`] the weight budget that leaves a reserve free, so precision comes back when
//! memory frees (another process exits, a container's limit is raised) and goes when it is
//! taken — through the controller's hysteresis and cooldown, so an oscillating reading does
//! not flap.
//!
//! What the process may still take ([`MemoryReading::free`]): the kernel's `MemAvailable`
//! less this process's own file-backed resident pages (mapped weights are page cache, which
//! `MemAvailable` counts as reclaimable — they must not be counted twice), and no more than
//! the memory cgroup's limit leaves (cgroup v2 `memory.max − memory.current`, v1
//! `memory.limit_in_bytes − memory.usage_in_bytes`, each less its inactive file cache, on
//! this cgroup and every ancestor).
//!
//! The weight budget ([`follow_budget`]): the weights resident now, plus that free memory,
//! less the reserve, less the KV cache the engine's slots may still open (every slot's KV is
//! counted as the engine's own from the start — a session ending frees its KV for the next
//! one, not for weights) and the compute scratch, capped (the source's bytes, or what
//! `--memory` leaves) and never below the smallest profile. A reading is skipped while the
//! engine still runs sessions on a profile it has left: their weights are resident beside
//! the new ones until those sessions end, and counting them would undo the change.
//!
//! Invariants: the budget is a function of one reading and the engine's counters (tested
//! without a machine whose memory moves, by feeding readings); the follower changes nothing
//! but the budget, and every change goes through the controller's policy.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{BudgetDriver, Transition};
use crate::error::Result;

/// What the operating system reports this process may still take, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    /// `/proc/meminfo`'s `MemAvailable`.
    pub available: u64,
    /// This process's file-backed resident pages (`/proc/self/status` `RssFile`).
    pub own_file_rss: u64,
    /// What the memory cgroups this process is in leave (the least over the hierarchy);
    /// `None` without a limit.
    pub cgroup_room: Option<u64>,
}

impl MemoryReading {
    /// The machine's own report, read now (Linux; elsewhere an error).
    pub fn read() -> std::io::Result<Self> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let available = meminfo_field(&meminfo, "MemAvailable:").ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "/proc/meminfo has no MemAvailable",
            )
        })?;
        let status = std::fs::read_to_string("/proc/self/status")?;
        let own_file_rss = meminfo_field(&status, "RssFile:").unwrap_or(0);
        let cgroup_room = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|c| {
                cgroup_room(&c, Path::new("/sys/fs/cgroup"), |p| {
                    std::fs::read_to_string(p).ok()
                })
            });
        Ok(MemoryReading {
            available,
            own_file_rss,
            cgroup_room,
        })
    }

    /// Bytes this process may still take: `available − own_file_rss`, within the cgroups'
    /// room.
    pub fn free(&self) -> u64 {
        let m = self.available.saturating_sub(self.own_file_rss);
        self.cgroup_room.map_or(m, |c| c.min(m))
    }
}

/// A `Name:   N kB` field of `/proc/meminfo` or `/proc/self/status`, in bytes.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let mut it = line[name.len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// What the memory cgroups of `proc_self_cgroup` (the text of `/proc/self/cgroup`) leave,
/// the least over the process's cgroup and its ancestors, under `root` (`/sys/fs/cgroup`);
/// files are read through `read`. `None` when no cgroup sets a limit (or none is readable).
pub fn cgroup_room(
    proc_self_cgroup: &str,
    root: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let num = |p: PathBuf| -> Option<u64> { read(&p)?.trim().parse().ok() };
    let stat = |dir: &Path, key: &str| -> u64 {
        read(&dir.join("memory.stat"))
            .and_then(|s| {
                s.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == key).then(|| v.trim().parse().ok()).flatten()
                })
            })
            .unwrap_or(0)
    };
    // Limits at or above this are "no limit" (v1 writes 2^63 rounded down to a page).
    const UNLIMITED: u64 = 1 << 62;
    let mut best: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        // v2: `0::/path`; v1: `N:memory:/path` (possibly beside other controllers).
        let (base, v2) = if controllers.is_empty() {
            (root.to_path_buf(), true)
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), false)
        } else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let mut dir = if rel.is_empty() {
            base.clone()
        } else {
            base.join(rel)
        };
        loop {
            let (limit, usage, inactive) = if v2 {
                let limit = read(&dir.join("memory.max")).and_then(|s| {
                    let s = s.trim();
                    if s == "max" {
                        Some(u64::MAX)
                    } else {
                        s.parse().ok()
                    }
                });
                (
                    limit,
                    num(dir.join("memory.current")),
                    stat(&dir, "inactive_file"),
                )
            } else {
                (
                    num(dir.join("memory.limit_in_bytes")),
                    num(dir.join("memory.usage_in_bytes")),
                    stat(&dir, "total_inactive_file"),
                )
            };
            if let (Some(limit), Some(usage)) = (limit, usage)
                && limit < UNLIMITED
            {
                let room = limit.saturating_sub(usage.saturating_sub(inactive));
                best = Some(best.map_or(room, |b| b.min(room)));
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
    }
    best
}

/// How a budget follows free memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowPolicy {
    /// Bytes left free for everything else on the machine, and for the engine's compute
    /// scratch.
    pub reserve: u64,
    /// The largest budget (the source's weight bytes, or what `--memory` leaves the weights).
    pub cap: u64,
    /// Time between readings.
    pub interval: Duration,
}

/// The engine's side of a reading: what its weights and KV take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Resident weight bytes under the current profile.
    pub weights: u64,
    /// KV bytes of every slot (what the slots may hold).
    pub kv_total: u64,
    /// KV bytes of the slots open now (allocated, so inside the reading already).
    pub kv_open: u64,
}

/// The weight budget for `free` bytes (see the module docs): `weights + free − reserve −
/// (kv_total − kv_open)`, at most `policy.cap`, at least `minimum`.
pub fn follow_budget(free: u64, demand: &Demand, policy: &FollowPolicy, minimum: u64) -> u64 {
    let kv_to_come = demand.kv_total.saturating_sub(demand.kv_open);
    (demand.weights + free)
        .saturating_sub(policy.reserve)
        .saturating_sub(kv_to_come)
        .min(policy.cap)
        .max(minimum)
}

/// What one reading did.
#[derive(Debug)]
pub enum FollowOutcome {
    /// Sessions still run on a profile the engine has left; nothing read.
    Settling,
    /// The budget was handed to the controller: `Some` when the profile changed.
    Applied {
        /// The budget in bytes.
        budget: u64,
        /// Whether that budget is the smallest profile's because less is free.
        pressed: bool,
        /// The change, if any.
        transition: Option<Transition>,
    },
}

/// What the follower last saw and did (for `/metrics` and the precision route).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowStatus {
    /// Readings taken.
    pub readings: u64,
    /// Bytes free at the last reading.
    pub free: u64,
    /// The budget the last reading gave.
    pub budget: u64,
    /// Profile changes the follower made.
    pub changes: u64,
    /// Whether the last budget was held at the smallest profile for lack of memory.
    pub pressed: bool,
    /// The last error (a failed reading or build), if the last reading failed.
    pub error: Option<String>,
}

impl BudgetDriver {
    /// One reading: the budget for `reading` under `policy`, handed to the controller now
    /// (skipped while sessions run on a profile the engine has left).
    pub fn follow_step(
        &self,
        policy: &FollowPolicy,
        reading: &MemoryReading,
    ) -> Result<FollowOutcome> {
        let stats = self.engine.stats();
        if stats.retired_profiles > 0 {
            return Ok(FollowOutcome::Settling);
        }
        let (weights, minimum) = {
            let c = self.lock()?;
            (c.resident_bytes(), c.minimum_bytes())
        };
        let demand = Demand {
            weights,
            kv_total: stats.kv_budget_bytes,
            kv_open: stats.kv_bytes,
        };
        let free = reading.free();
        let budget = follow_budget(free, &demand, policy, minimum);
        let pressed = follow_budget(free, &demand, policy, 0) < minimum;
        let transition = self.set_budget(crate::precision::Budget::Bytes(budget))?;
        let mut st = self.follow_status();
        st.readings += 1;
        st.free = free;
        st.budget = budget;
        st.pressed = pressed;
        st.error = None;
        st.changes += u64::from(transition.is_some());
        self.set_follow_status(st);
        Ok(FollowOutcome::Applied {
            budget,
            pressed,
            transition,
        })
    }

    /// Starts following free memory: a thread that takes a reading from `probe` every
    /// `policy.interval` and applies it ([`BudgetDriver::follow_step`]); it stops when the
    /// returned handle is dropped.
    pub fn follow_memory(
        self: &Arc<Self>,
        policy: FollowPolicy,
        mut probe: impl FnMut() -> std::io::Result<MemoryReading> + Send + 'static,
    ) -> MemoryFollower {
        self.set_follow_status(FollowStatus::default());
        let (stop, rx) = mpsc::channel::<()>();
        let driver = self.clone();
        let thread = std::thread::Builder::new()
            .name("synapse-memory-follower".into())
            .spawn(move || {
                let mut next = Instant::now();
                loop {
                    let wait = next.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    next = Instant::now() + policy.interval;
                    let outcome = probe()
                        .map_err(|e| format!("reading free memory: {e}"))
                        .and_then(|r| driver.follow_step(&policy, &r).map_err(|e| e.to_string()));
                    match outcome {
                        Ok(FollowOutcome::Applied {
                            budget,
                            pressed,
                            transition: Some(t),
                        }) => tracing::info!(
                            budget,
                            pressed,
                            direction = ?t.direction,
                            tensors = t.changes.len(),
                            weight_bytes = t.resident_bytes,
                            "precision follows free memory"
                        ),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "following free memory");
                            let mut st = driver.follow_status();
                            st.error = Some(e);
                            driver.set_follow_status(st);
                        }
                    }
                }
            })
            .expect("spawning a thread");
        MemoryFollower {
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
        }
    }
}

/// A running memory follower ([`BudgetDriver::follow_memory`]); dropping it stops the thread.
#[derive(Debug)]
pub struct MemoryFollower {
    stop: Mutex<Option<mpsc::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl MemoryFollower {
    /// Stops the thread and waits for it (a reading in progress finishes first).
    pub fn stop(&self) {
        if let Ok(mut s) = self.stop.lock() {
            s.take();
        }
        let t = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for MemoryFollower {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn meminfo_and_status_fields_in_bytes() {
        let meminfo =
            "MemTotal:       24683784 kB\nMemFree:        1000 kB\nMemAvailable:   24218608 kB\n";
        assert_eq!(
            meminfo_field(meminfo, "MemAvailable:"),
            Some(24218608 * 1024)
        );
        assert_eq!(meminfo_field(meminfo, "MemTotal:"), Some(24683784 * 1024));
        assert_eq!(meminfo_field(meminfo, "SwapFree:"), None);
        let status = "Name:\tx\nRssAnon:\t     156 kB\nRssFile:\t    2028 kB\n";
        assert_eq!(meminfo_field(status, "RssFile:"), Some(2028 * 1024));
        assert_eq!(meminfo_field("RssFile:\t12 MB\n", "RssFile:"), None);
        assert_eq!(meminfo_field("RssFile:\tlots kB\n", "RssFile:"), None);
    }

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: BTreeMap<PathBuf, String> = entries
            .iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect();
        move |p: &Path| m.get(p).cloned()
    }

    #[test]
    fn cgroup_v2_room_is_the_least_over_the_hierarchy() {
        let read = files(&[
            ("/cg/a/b/memory.max", "1000000\n"),
            ("/cg/a/b/memory.current", "600000\n"),
            (
                "/cg/a/b/memory.stat",
                "anon 1\ninactive_file 100000\nactive_file 5\n",
            ),
            ("/cg/a/memory.max", "max\n"),
            ("/cg/a/memory.current", "9\n"),
            ("/cg/memory.max", "800000\n"),
            ("/cg/memory.current", "650000\n"),
        ]);
        // b: 1,000,000 − (600,000 − 100,000) = 500,000; a: no limit; root: 150,000.
        assert_eq!(
            cgroup_room("0::/a/b\n", Path::new("/cg"), &read),
            Some(150_000)
        );
        // Only `b` set: its room.
        let read = files(&[
            ("/cg/a/b/memory.max", "1000000\n"),
            ("/cg/a/b/memory.current", "600000\n"),
        ]);
        assert_eq!(
            cgroup_room("0::/a/b\n", Path::new("/cg"), &read),
            Some(400_000)
        );
        // No limit anywhere, or nothing readable.
        let read = files(&[("/cg/memory.max", "max\n"), ("/cg/memory.current", "1\n")]);
        assert_eq!(cgroup_room("0::/\n", Path::new("/cg"), &read), None);
        assert_eq!(cgroup_room("0::/x\n", Path::new("/cg"), files(&[])), None);
        // Usage above the limit: no room.
        let read = files(&[("/cg/memory.max", "10\n"), ("/cg/memory.current", "20\n")]);
        assert_eq!(cgroup_room("0::/\n", Path::new("/cg"), &read), Some(0));
    }

    #[test]
    fn cgroup_v1_memory_controller_only() {
        let read = files(&[
            ("/cg/memory/p/q/memory.limit_in_bytes", "2000000\n"),
            ("/cg/memory/p/q/memory.usage_in_bytes", "1500000\n"),
            (
                "/cg/memory/p/q/memory.stat",
                "cache 9\ntotal_inactive_file 500000\n",
            ),
            (
                "/cg/memory/p/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/cg/memory/p/memory.usage_in_bytes", "1\n"),
            ("/cg/cpu/p/q/memory.limit_in_bytes", "1\n"),
        ]);
        let text = "9:name=systemd:/\n4:memory:/p/q\n1:cpu:/p/q\n0::/\n";
        // q: 2,000,000 − (1,500,000 − 500,000); p unlimited; the v2 line finds nothing.
        assert_eq!(cgroup_room(text, Path::new("/cg"), &read), Some(1_000_000));
        assert_eq!(
            cgroup_room("4:cpu,memory:/p/q\n", Path::new("/cg"), &read),
            Some(1_000_000)
        );
        assert_eq!(
            cgroup_room("garbage\n\n::\n", Path::new("/cg"), &read),
            None
        );
    }

    #[test]
    fn free_memory_excludes_own_mapped_pages_and_respects_the_cgroup() {
        let r = MemoryReading {
            available: 1000,
            own_file_rss: 300,
            cgroup_room: None,
        };
        assert_eq!(r.free(), 700);
        assert_eq!(
            MemoryReading {
                cgroup_room: Some(500),
                ..r
            }
            .free(),
            500
        );
        assert_eq!(
            MemoryReading {
                cgroup_room: Some(900),
                ..r
            }
            .free(),
            700
        );
        assert_eq!(
            MemoryReading {
                own_file_rss: 2000,
                ..r
            }
            .free(),
            0
        );
    }

    #[test]
    fn the_machines_own_reading_is_plausible() {
        let Ok(r) = MemoryReading::read() else {
            return; // not Linux
        };
        let total = meminfo_field(
            &std::fs::read_to_string("/proc/meminfo").unwrap(),
            "MemTotal:",
        )
        .unwrap();
        assert!(r.available > 0 && r.available <= total, "{r:?} of {total}");
        assert!(r.free() <= r.available);
    }

    #[test]
    fn the_budget_keeps_the_reserve_and_the_kv_to_come() {
        let p = FollowPolicy {
            reserve: 100,
            cap: 10_000,
            interval: Duration::from_secs(1),
        };
        let d = Demand {
            weights: 1000,
            kv_total: 400,
            kv_open: 100,
        };
        // 1000 + 2000 − 100 − 300.
        assert_eq!(follow_budget(2000, &d, &p, 500), 2600);
        // Capped, and floored at the smallest profile.
        assert_eq!(follow_budget(50_000, &d, &p, 500), 10_000);
        assert_eq!(follow_budget(0, &d, &p, 800), 800);
        // A session opening its slot moves bytes from "to come" into the reading: the same
        // budget once the reading has them.
        let opened = Demand { kv_open: 400, ..d };
        assert_eq!(follow_budget(2000 - 300, &opened, &p, 500), 2600);
    }
}
