//! Precision profiles, their stable hash, and diffs between them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The encoding chosen for one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// Encoding ID (or the source encoding).
    pub encoding: String,
    /// Bytes of the tensor in that encoding.
    pub bytes: u64,
    /// Measured distortion of that encoding (0 for the source).
    pub distortion: f64,
}

/// A precision profile: tensor → encoding, with totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Tensor name → its assignment.
    pub assignments: BTreeMap<String, Assignment>,
    /// Σ bytes.
    pub total_bytes: u64,
    /// Σ distortion (the selector's objective).
    pub total_distortion: f64,
}

/// A stable 32-byte BLAKE3 hash of a profile's assignment (hex when displayed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProfileHash(pub [u8; 32]);

impl fmt::Display for ProfileHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl Profile {
    /// Hash of the assignment only (not budgets, sizes or distortions): BLAKE3 over the domain
    /// tag `synapse.profile.v1`, then for each tensor in byte-wise sorted name order, the name
    /// and the encoding, each as a u64 LE length followed by its UTF-8 bytes.
    pub fn hash(&self) -> ProfileHash {
        let mut h = blake3::Hasher::new();
        h.update(b"synapse.profile.v1");
        for (name, a) in &self.assignments {
            for s in [name.as_str(), a.encoding.as_str()] {
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
        ProfileHash(*h.finalize().as_bytes())
    }
}

/// What happened to one tensor between two profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    /// More bytes in `b` than in `a`.
    Promotion,
    /// Fewer bytes in `b` than in `a`.
    Demotion,
    /// Same size, different encoding.
    Lateral,
    /// Only in `b`.
    Added,
    /// Only in `a`.
    Removed,
}

/// One tensor's change between two profiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Tensor name.
    pub tensor: String,
    /// Encoding in `a` (None if added).
    pub from: Option<String>,
    /// Encoding in `b` (None if removed).
    pub to: Option<String>,
    /// Kind of change.
    pub kind: ChangeKind,
}

/// The exact changes from `a` to `b`, sorted by tensor name; unchanged tensors are omitted.
pub fn diff(a: &Profile, b: &Profile) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, x) in &a.assignments {
        match b.assignments.get(name) {
            None => out.push(Change {
                tensor: name.clone(),
                from: Some(x.encoding.clone()),
                to: None,
                kind: ChangeKind::Removed,
            }),
            Some(y) if y.encoding != x.encoding => out.push(Change {
                tensor: name.clone(),
                from: Some(x.encoding.clone()),
                to: Some(y.encoding.clone()),
                kind: match y.bytes.cmp(&x.bytes) {
                    std::cmp::Ordering::Greater => ChangeKind::Promotion,
                    std::cmp::Ordering::Less => ChangeKind::Demotion,
                    std::cmp::Ordering::Equal => ChangeKind::Lateral,
                },
            }),
            Some(_) => {}
        }
    }
    for (name, y) in &b.assignments {
        if !a.assignments.contains_key(name) {
            out.push(Change {
                tensor: name.clone(),
                from: None,
                to: Some(y.encoding.clone()),
                kind: ChangeKind::Added,
            });
        }
    }
    out.sort_by(|p, q| p.tensor.cmp(&q.tensor));
    out
}
