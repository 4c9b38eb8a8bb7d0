//! The index: (source tensor hash, encoding id, codec version) → object, in a `redb` database.
//!
//! It is how an encoded tensor (a cached precision variant) is found again across sessions and
//! restarts: the source tensor's object id plus the encoding that produced the variant name the
//! variant's object. Values are object ids only; the bytes live in the object store.
//!
//! Crash safety comes from redb: every write transaction commits with `Durability::Immediate`
//! (a copy-on-write B-tree whose new root is published by a checksummed commit slot after an
//! fsync), so a crash mid-write leaves the previous committed state, which redb recovers on the
//! next open. The write order makes dangling entries impossible: the object is fsynced and
//! renamed into place *before* the transaction that names it commits.
//!
//! Concurrency: redb holds an exclusive OS lock on an open database, so a long-lived handle
//! would lock other processes out. Instead each operation takes an exclusive `fs4` lock on
//! `index.lock` (blocking, so processes queue instead of failing), opens the database, runs one
//! transaction and closes it. Index operations are rare (one per tensor per encoding), so the
//! open cost (a few hundred microseconds) does not matter.

use crate::error::{CasError, Result};
use crate::id::ObjectId;
use crate::store::{Object, Store, WriteSession};
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;

const DB_FILE: &str = "index.redb";
const LOCK_FILE: &str = "index.lock";

/// Key: (source object id bytes, encoding id, codec version) → object id bytes.
const VARIANTS: TableDefinition<(&[u8], &str, u32), &[u8]> = TableDefinition::new("variants");

/// One index key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IndexKey {
    /// The object id of the source tensor (its bytes in the source encoding).
    pub source: ObjectId,
    /// The encoding id, e.g. `syn.q4.symmetric.g64.v1`.
    pub encoding: String,
    /// The codec's version: bump it when the encoder's output changes.
    pub codec_version: u32,
}

/// The store's index (opened per operation; see the module docs).
#[derive(Debug, Clone)]
pub struct Index {
    db: PathBuf,
    lock: PathBuf,
}

impl Index {
    /// The index of `store` (nothing is opened or created until the first operation).
    pub fn open(store: &Store) -> Index {
        Index {
            db: store.root().join(DB_FILE),
            lock: store.root().join(LOCK_FILE),
        }
    }

    /// True if the store has an index database.
    pub fn exists(store: &Store) -> bool {
        store.root().join(DB_FILE).is_file()
    }

    fn err(&self, e: impl std::fmt::Display) -> CasError {
        CasError::Index {
            path: self.db.clone(),
            message: e.to_string(),
        }
    }

    /// Runs `f` on the opened database while holding the index lock.
    fn with_db<T>(&self, f: impl FnOnce(&redb::Database) -> Result<T>) -> Result<T> {
        let lock: File = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&self.lock)
            .map_err(CasError::io(&self.lock))?;
        fs4::fs_std::FileExt::lock_exclusive(&lock).map_err(CasError::io(&self.lock))?;
        let db = redb::Database::create(&self.db).map_err(|e| self.err(e))?;
        let out = f(&db);
        drop(db);
        drop(lock);
        out
    }

    /// Looks a key up.
    pub fn get(&self, key: &IndexKey) -> Result<Option<ObjectId>> {
        if !self.db.is_file() {
            return Ok(None);
        }
        self.with_db(|db| {
            let tx = db.begin_read().map_err(|e| self.err(e))?;
            let table = match tx.open_table(VARIANTS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(self.err(e)),
            };
            let k = (
                key.source.as_bytes().as_slice(),
                key.encoding.as_str(),
                key.codec_version,
            );
            match table.get(k).map_err(|e| self.err(e))? {
                Some(v) => Ok(Some(self.decode_value(v.value())?)),
                None => Ok(None),
            }
        })
    }

    fn decode_value(&self, v: &[u8]) -> Result<ObjectId> {
        let arr: [u8; 32] = v
            .try_into()
            .map_err(|_| self.err(format!("index value of {} bytes, expected 32", v.len())))?;
        Ok(ObjectId::from_bytes(arr))
    }

    /// Records `key → object` durably (one transaction for all of `entries`).
    pub fn insert_many(&self, entries: &[(IndexKey, ObjectId)]) -> Result<()> {
        self.with_db(|db| {
            let tx = db.begin_write().map_err(|e| self.err(e))?;
            {
                let mut table = tx.open_table(VARIANTS).map_err(|e| self.err(e))?;
                for (key, id) in entries {
                    let k = (
                        key.source.as_bytes().as_slice(),
                        key.encoding.as_str(),
                        key.codec_version,
                    );
                    table
                        .insert(k, id.as_bytes().as_slice())
                        .map_err(|e| self.err(e))?;
                }
            }
            tx.commit().map_err(|e| self.err(e))
        })
    }

    /// Records one entry.
    pub fn insert(&self, key: &IndexKey, object: ObjectId) -> Result<()> {
        self.insert_many(&[(key.clone(), object)])
    }

    /// Every entry, sorted by key.
    pub fn entries(&self) -> Result<Vec<(IndexKey, ObjectId)>> {
        if !self.db.is_file() {
            return Ok(Vec::new());
        }
        self.with_db(|db| {
            let tx = db.begin_read().map_err(|e| self.err(e))?;
            let table = match tx.open_table(VARIANTS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(self.err(e)),
            };
            let mut out = Vec::new();
            for row in table.iter().map_err(|e| self.err(e))? {
                let (k, v) = row.map_err(|e| self.err(e))?;
                let (src, enc, ver) = k.value();
                let src: [u8; 32] = src
                    .try_into()
                    .map_err(|_| self.err("index key with a source id that is not 32 bytes"))?;
                out.push((
                    IndexKey {
                        source: ObjectId::from_bytes(src),
                        encoding: enc.to_string(),
                        codec_version: ver,
                    },
                    self.decode_value(v.value())?,
                ));
            }
            Ok(out)
        })
    }

    /// Number of entries.
    pub fn len(&self) -> Result<u64> {
        if !self.db.is_file() {
            return Ok(0);
        }
        self.with_db(|db| {
            let tx = db.begin_read().map_err(|e| self.err(e))?;
            match tx.open_table(VARIANTS) {
                Ok(t) => t.len().map_err(|e| self.err(e)),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(self.err(e)),
            }
        })
    }

    /// True if the index has no entries.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Removes the entries whose source is not in `live_sources` or whose object is not in
    /// `present`; returns how many (on a dry run, how many would be removed).
    pub(crate) fn retain(
        &self,
        live_sources: &BTreeSet<ObjectId>,
        present: &BTreeSet<ObjectId>,
        dry_run: bool,
    ) -> Result<(u64, BTreeSet<ObjectId>)> {
        let entries = self.entries()?;
        let mut doomed = Vec::new();
        let mut kept = BTreeSet::new();
        for (k, v) in entries {
            if live_sources.contains(&k.source) && present.contains(&v) {
                kept.insert(v);
            } else {
                doomed.push(k);
            }
        }
        if !dry_run && !doomed.is_empty() {
            self.with_db(|db| {
                let tx = db.begin_write().map_err(|e| self.err(e))?;
                {
                    let mut table = tx.open_table(VARIANTS).map_err(|e| self.err(e))?;
                    for k in &doomed {
                        table
                            .remove((
                                k.source.as_bytes().as_slice(),
                                k.encoding.as_str(),
                                k.codec_version,
                            ))
                            .map_err(|e| self.err(e))?;
                    }
                }
                tx.commit().map_err(|e| self.err(e))
            })?;
        }
        Ok((doomed.len() as u64, kept))
    }
}

/// How [`WriteSession::cached_variant_with`] found its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VariantLookup {
    /// `produce` ran (a miss, or a cached object that was unusable).
    pub produced: bool,
    /// A cached object was corrupt, missing or refused by `accept`, and replaced.
    pub replaced: bool,
}

impl WriteSession<'_> {
    /// Returns the cached encoding of a source tensor, computing and storing it on a miss.
    ///
    /// This is how an on-the-fly quantization is done once and reused across sessions and
    /// restarts: on a hit the object is verified (a corrupt or missing cached object is
    /// recomputed); on a miss `produce` runs, its bytes are stored, and only then is the index
    /// entry committed. Returns the object id and whether `produce` ran.
    pub fn cached_variant(
        &self,
        index: &Index,
        key: &IndexKey,
        produce: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<(ObjectId, bool)> {
        let (id, l) = self.cached_variant_with(index, key, |o| Some(o.id()), produce)?;
        Ok((id, l.produced))
    }

    /// [`Self::cached_variant`] that hands the verified, memory-mapped object to `accept`,
    /// which turns it into what the caller uses or refuses it (`None`: e.g. bytes that do not
    /// decode at the expected size); a refused cached object is recomputed and replaced like a
    /// corrupt one. A freshly produced object that `accept` refuses is an error.
    pub fn cached_variant_with<T, E: From<CasError>>(
        &self,
        index: &Index,
        key: &IndexKey,
        accept: impl Fn(Object) -> Option<T>,
        produce: impl FnOnce() -> std::result::Result<Vec<u8>, E>,
    ) -> std::result::Result<(T, VariantLookup), E> {
        let mut replaced = false;
        if let Some(id) = index.get(key)? {
            match self.store().get(&id) {
                Ok(o) => match accept(o) {
                    Some(t) => {
                        return Ok((
                            t,
                            VariantLookup {
                                produced: false,
                                replaced: false,
                            },
                        ));
                    }
                    None => {
                        tracing::warn!(%id, encoding = %key.encoding, "cached variant refused; recomputing");
                    }
                },
                Err(CasError::Corrupt { .. } | CasError::Missing { .. }) => {
                    tracing::warn!(%id, encoding = %key.encoding, "cached variant unusable; recomputing");
                }
                Err(e) => return Err(e.into()),
            }
            replaced = true;
        }
        let bytes = produce()?;
        let out = self.put(&bytes)?;
        drop(bytes);
        // Just written (or found intact) under this id by `put`.
        let obj = self.store().get_unverified(&out.id)?;
        let t = accept(obj).ok_or_else(|| {
            CasError::InvalidPackage(format!(
                "the freshly encoded {} variant {} was refused",
                key.encoding, out.id
            ))
        })?;
        // The object is durable before the entry naming it commits.
        index.insert(key, out.id)?;
        Ok((
            t,
            VariantLookup {
                produced: true,
                replaced,
            },
        ))
    }
}
