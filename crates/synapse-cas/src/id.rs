//! Object ids (blake3 digests) and file digests (blake3 + sha256).

use crate::error::{CasError, Result};
use std::fmt;
use std::path::Path;

/// Slices at least this long are hashed with blake3's rayon-parallel tree mode.
const PARALLEL_HASH_MIN: usize = 1 << 20;

/// The name of an object: the blake3 digest of its bytes. Displayed as `blake3:<64 hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId([u8; 32]);

impl ObjectId {
    /// The textual prefix of every id.
    pub const PREFIX: &'static str = "blake3:";

    /// Hashes `bytes` (in parallel when large).
    pub fn of(bytes: &[u8]) -> ObjectId {
        let mut h = blake3::Hasher::new();
        if bytes.len() >= PARALLEL_HASH_MIN {
            h.update_rayon(bytes);
        } else {
            h.update(bytes);
        }
        ObjectId(*h.finalize().as_bytes())
    }

    /// Wraps raw digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> ObjectId {
        ObjectId(bytes)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits, without the prefix.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses `blake3:<64 hex>` or bare `<64 hex>` (lowercase only, so that the text is canonical).
    pub fn parse(text: &str) -> Result<ObjectId> {
        let hex_part = text.strip_prefix(Self::PREFIX).unwrap_or(text);
        let bad = || CasError::BadId {
            text: text.to_string(),
        };
        if hex_part.len() != 64
            || !hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| bad())?;
        Ok(ObjectId(out))
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for ObjectId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ObjectId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ObjectId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The digests of a source file: blake3 (Synapse's key) and sha256 (what model hubs publish).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileDigest {
    /// Size in bytes.
    pub size: u64,
    /// blake3 of the whole file (written as bare hex: it names a file, not a stored object).
    #[serde(with = "bare_hex")]
    pub blake3: ObjectId,
    /// sha256 of the whole file, lowercase hex (comparable with published digests).
    pub sha256: String,
}

impl FileDigest {
    /// Digests a byte slice.
    pub fn of(bytes: &[u8]) -> FileDigest {
        use sha2::Digest as _;
        let sha = sha2::Sha256::digest(bytes);
        FileDigest {
            size: bytes.len() as u64,
            blake3: ObjectId::of(bytes),
            sha256: hex::encode(sha),
        }
    }

    /// Digests a byte slice in chunks, calling `progress` with each chunk's length.
    pub fn of_with_progress(bytes: &[u8], mut progress: impl FnMut(u64)) -> FileDigest {
        use sha2::Digest as _;
        const CHUNK: usize = 8 << 20;
        let mut b3 = blake3::Hasher::new();
        let mut sha = sha2::Sha256::new();
        for chunk in bytes.chunks(CHUNK) {
            b3.update_rayon(chunk);
            sha.update(chunk);
            progress(chunk.len() as u64);
        }
        FileDigest {
            size: bytes.len() as u64,
            blake3: ObjectId(*b3.finalize().as_bytes()),
            sha256: hex::encode(sha.finalize()),
        }
    }

    /// Digests a file through a read-only memory map, reporting progress in bytes.
    pub fn of_file_with_progress(path: &Path, progress: impl FnMut(u64)) -> Result<FileDigest> {
        let file = std::fs::File::open(path).map_err(CasError::io(path))?;
        let len = file.metadata().map_err(CasError::io(path))?.len();
        if len == 0 {
            return Ok(FileDigest::of(&[]));
        }
        // SAFETY: as in `of_file`.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(CasError::io(path))?;
        Ok(FileDigest::of_with_progress(&map, progress))
    }

    /// Digests a file through a read-only memory map.
    pub fn of_file(path: &Path) -> Result<FileDigest> {
        let file = std::fs::File::open(path).map_err(CasError::io(path))?;
        let len = file.metadata().map_err(CasError::io(path))?.len();
        if len == 0 {
            return Ok(FileDigest::of(&[]));
        }
        // SAFETY: read-only map of a file we do not modify; a concurrent truncation by another
        // process is outside the store's contract (source files are inputs, not store objects).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(CasError::io(path))?;
        Ok(FileDigest::of(&map))
    }
}

/// Serde helper: an [`ObjectId`] written as bare hex (no `blake3:` prefix).
///
/// Manifests use the prefixed form only for references to stored objects, so that gc and verify
/// can find every reference generically; digests of things that are not objects (source files,
/// conversion identity, fingerprints) are bare hex.
pub mod bare_hex {
    use super::ObjectId;

    /// Serializes as 64 hex digits.
    pub fn serialize<S: serde::Serializer>(id: &ObjectId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&id.hex())
    }

    /// Parses 64 lowercase hex digits (the prefixed form is rejected to keep the text canonical).
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectId, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        if s.starts_with(ObjectId::PREFIX) {
            return Err(serde::de::Error::custom(
                "expected bare hex, found a `blake3:` object reference",
            ));
        }
        ObjectId::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_roundtrips_through_text() {
        let id = ObjectId::of(b"hello");
        assert_eq!(
            id.to_string(),
            "blake3:ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f"
        );
        assert_eq!(ObjectId::parse(&id.to_string()).unwrap(), id);
        assert_eq!(ObjectId::parse(&id.hex()).unwrap(), id);
        assert!(ObjectId::parse("blake3:EA8F").is_err());
        assert!(ObjectId::parse(&id.hex().to_uppercase()).is_err());
    }

    #[test]
    fn parallel_and_serial_hash_agree() {
        let big: Vec<u8> = (0..3 * PARALLEL_HASH_MIN)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        assert_eq!(ObjectId::of(&big).as_bytes(), blake3::hash(&big).as_bytes());
    }

    #[test]
    fn chunked_digest_matches_one_shot() {
        let big: Vec<u8> = (0..(20 << 20) + 5).map(|i| (i % 253) as u8).collect();
        let mut seen = 0;
        let d = FileDigest::of_with_progress(&big, |n| seen += n);
        assert_eq!(seen, big.len() as u64);
        assert_eq!(d, FileDigest::of(&big));
    }

    #[test]
    fn sha256_matches_published_vector() {
        let d = FileDigest::of(b"abc");
        assert_eq!(
            d.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.size, 3);
    }
}
