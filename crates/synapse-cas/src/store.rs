//! The object store: immutable blobs on the local filesystem, named by their blake3 digest.
//!
//! Layout of a store root (a package directory made by `--out` has the same layout, plus its
//! `manifest.toml`):
//!
//! ```text
//! objects/<2 hex>/<62 hex>   one file per object, its name = blake3 of its bytes
//! tmp/                       objects being written (same filesystem, so rename is atomic)
//! packages/<64 hex>.toml     manifests of packages stored here (name = blake3 of the file)
//! manifest.toml              the package of a self-contained package directory (optional)
//! lock                       flock: shared by writers, exclusive for gc
//! index.redb, index.lock     the (source tensor, encoding, codec version) → object index
//! ```
//!
//! Crash safety: an object is written to `tmp/`, fsynced, renamed to its final name, and the
//! directory is fsynced. A crash leaves either no object or a whole one (plus garbage in `tmp/`,
//! which `gc` removes). Reads re-hash the bytes, so a corrupted object is a typed error.
//!
//! Concurrency: any number of processes may write at once. Writes are idempotent (same name,
//! same bytes) and the final rename is atomic, so two writers of one object both succeed. Every
//! writer holds a [`WriteSession`] (a shared lock on `lock`) from its first object until its
//! manifest is written; `gc` takes the lock exclusively, so it never deletes an object that a
//! running import has written but not yet referenced.

use crate::error::{CasError, Result};
use crate::id::ObjectId;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// File name of a package directory's manifest.
pub const MANIFEST_FILE: &str = "manifest.toml";
const OBJECTS_DIR: &str = "objects";
const TMP_DIR: &str = "tmp";
const PACKAGES_DIR: &str = "packages";
const LOCK_FILE: &str = "lock";

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The default user store: `$SYNAPSE_STORE`, else `${XDG_DATA_HOME:-$HOME/.local/share}/synapse/store`.
///
/// The data directory (not the cache directory) is used because packages are user data: a
/// package imported once should not disappear when caches are cleaned.
pub fn default_store_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("SYNAPSE_STORE").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            home.join(".local/share")
        });
    data.join("synapse/store")
}

/// A content-addressed object store rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// What [`WriteSession::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The object's id.
    pub id: ObjectId,
    /// Its size in bytes.
    pub size: u64,
    /// False when an intact object with this id was already present (nothing was written).
    pub written: bool,
}

/// An object's bytes: a read-only memory map (or an empty slice), and its file's path for
/// positional reads (opened per read, so that holding many objects holds no descriptors).
#[derive(Debug)]
pub struct Object {
    id: ObjectId,
    map: Option<memmap2::Mmap>,
    path: PathBuf,
}

impl Object {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// Reads `dst.len()` bytes from byte `at` of the object into `dst` through its file (a
    /// positional read: no page of the mapping is touched, so none becomes mapped). An
    /// error for a range past the end.
    pub fn read_at(&self, at: u64, dst: &mut [u8]) -> std::io::Result<()> {
        let end = at.checked_add(dst.len() as u64);
        if end.is_none_or(|e| e > self.len() as u64) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("bytes {at}..+{} of a {}-byte object", dst.len(), self.len()),
            ));
        }
        if dst.is_empty() {
            return Ok(());
        }
        use std::os::unix::fs::FileExt;
        File::open(&self.path)?.read_exact_at(dst, at)
    }

    /// Drops the mapping's resident pages (they fault back in, unchanged, when read again):
    /// after a whole-object pass such as verification, so that what stays mapped is what
    /// is used afterwards.
    pub fn release_pages(&self) {
        if let Some(m) = &self.map {
            // SAFETY: the mapping is a private read-only map of a file no code path writes
            // (see `get_unverified`); MADV_DONTNEED drops its page-table entries only, and
            // reads afterwards fault the file's bytes back in.
            unsafe {
                let _ = m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed);
            }
        }
    }
}

impl Deref for Object {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl AsRef<[u8]> for Object {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Counts and sizes of a store.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Number of objects.
    pub objects: u64,
    /// Total bytes of all objects.
    pub object_bytes: u64,
    /// Number of package manifests (roots).
    pub packages: u64,
    /// Objects referenced by at least one manifest.
    pub referenced_objects: u64,
    /// Bytes of the referenced objects.
    pub referenced_bytes: u64,
    /// Objects no manifest references (what `gc` would delete).
    pub unreferenced_objects: u64,
    /// Bytes of the unreferenced objects.
    pub unreferenced_bytes: u64,
    /// Leftover temporary files (from crashed or running writers).
    pub tmp_files: u64,
    /// Bytes of the leftover temporary files.
    pub tmp_bytes: u64,
}

/// One problem found by [`Store::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyProblem {
    /// The object's bytes hash to something else.
    Corrupt {
        /// The object's name.
        id: ObjectId,
        /// What its bytes hash to.
        actual: ObjectId,
    },
    /// A manifest references an object that is not there.
    Missing {
        /// The missing object.
        id: ObjectId,
        /// The manifest that references it.
        manifest: PathBuf,
    },
    /// A file under `objects/` whose name is not an object id.
    Stray {
        /// The file.
        path: PathBuf,
    },
    /// A manifest that cannot be read or whose name is not its hash.
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl std::fmt::Display for VerifyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerifyProblem::Corrupt { id, actual } => {
                write!(f, "corrupt object {id} (content hashes to {actual})")
            }
            VerifyProblem::Missing { id, manifest } => {
                write!(
                    f,
                    "missing object {id} (referenced by {})",
                    manifest.display()
                )
            }
            VerifyProblem::Stray { path } => write!(f, "stray file {}", path.display()),
            VerifyProblem::BadManifest { path, message } => {
                write!(f, "bad manifest {}: {message}", path.display())
            }
        }
    }
}

/// The result of [`Store::verify`].
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Objects checked.
    pub objects_checked: u64,
    /// Bytes hashed.
    pub bytes_checked: u64,
    /// Manifests checked.
    pub manifests_checked: u64,
    /// Everything found wrong (empty = the store is intact).
    pub problems: Vec<VerifyProblem>,
}

/// The result of [`Store::gc`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Objects deleted (or that would be, on a dry run).
    pub deleted_objects: u64,
    /// Their bytes.
    pub deleted_bytes: u64,
    /// Temporary files deleted.
    pub deleted_tmp: u64,
    /// Objects kept because a manifest references them.
    pub kept_objects: u64,
    /// Index entries dropped because their object was deleted or is missing.
    pub pruned_index_entries: u64,
}

/// Every object with its size (sorted by id), and the stray files found under `objects/`.
pub type ObjectListing = (Vec<(ObjectId, u64)>, Vec<PathBuf>);

/// A writer's hold on the store: a shared lock that keeps `gc` out until it is dropped.
#[derive(Debug)]
pub struct WriteSession<'s> {
    store: &'s Store,
    _lock: File,
}

/// `gc`'s exclusive hold on the store.
#[derive(Debug)]
pub struct ExclusiveLock<'s> {
    store: &'s Store,
    _lock: File,
}

impl Store {
    /// Opens the store at `root`, creating its directories if needed.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        for d in [OBJECTS_DIR, TMP_DIR, PACKAGES_DIR] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(CasError::io(&p))?;
        }
        Ok(Store { root })
    }

    /// Opens an existing store or package directory without creating anything.
    pub fn open_existing(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        let objects = root.join(OBJECTS_DIR);
        if !objects.is_dir() {
            return Err(CasError::Io {
                path: objects,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a Synapse store or package directory (no objects/)",
                ),
            });
        }
        Ok(Store { root })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the object `id` lives (whether or not it exists).
    pub fn object_path(&self, id: &ObjectId) -> PathBuf {
        let hex = id.hex();
        self.root.join(OBJECTS_DIR).join(&hex[..2]).join(&hex[2..])
    }

    /// The directory of stored package manifests.
    pub fn packages_dir(&self) -> PathBuf {
        self.root.join(PACKAGES_DIR)
    }

    /// True if an object file named `id` exists (its content is not checked).
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.object_path(id).is_file()
    }

    fn lock_file(&self) -> Result<(File, PathBuf)> {
        let path = self.root.join(LOCK_FILE);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(CasError::io(&path))?;
        Ok((f, path))
    }

    /// Starts writing: takes the shared writer lock (blocks while a `gc` runs).
    pub fn session(&self) -> Result<WriteSession<'_>> {
        let (f, path) = self.lock_file()?;
        fs4::fs_std::FileExt::lock_shared(&f).map_err(CasError::io(&path))?;
        Ok(WriteSession {
            store: self,
            _lock: f,
        })
    }

    /// Takes the exclusive lock (blocks until every writer has finished).
    pub fn lock_exclusive(&self) -> Result<ExclusiveLock<'_>> {
        let (f, path) = self.lock_file()?;
        fs4::fs_std::FileExt::lock_exclusive(&f).map_err(CasError::io(&path))?;
        Ok(ExclusiveLock {
            store: self,
            _lock: f,
        })
    }

    /// Reads an object through a memory map and checks its hash: a mismatch is
    /// [`CasError::Corrupt`], never wrong bytes.
    pub fn get(&self, id: &ObjectId) -> Result<Object> {
        let obj = self.get_unverified(id)?;
        let actual = ObjectId::of(&obj);
        if actual != *id {
            return Err(CasError::Corrupt {
                id: *id,
                actual,
                path: self.object_path(id),
            });
        }
        Ok(obj)
    }

    /// Maps an object without re-hashing it (for callers that verify later or stream).
    pub fn get_unverified(&self, id: &ObjectId) -> Result<Object> {
        let path = self.object_path(id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CasError::Missing {
                    id: *id,
                    store: self.root.clone(),
                });
            }
            Err(e) => return Err(CasError::Io { path, source: e }),
        };
        let len = file.metadata().map_err(CasError::io(&path))?.len();
        let map = if len == 0 {
            None
        } else {
            // SAFETY: objects are immutable once renamed into place: writers only ever replace
            // a name atomically with identical bytes (a new inode), gc deletes only under the
            // exclusive lock, and no code path writes into an object file. The map therefore
            // never observes a change made by Synapse.
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(CasError::io(&path))?)
        };
        Ok(Object { id: *id, map, path })
    }

    /// Checks that the object `id` exists and hashes to its name.
    pub fn verify_object(&self, id: &ObjectId) -> Result<u64> {
        let obj = self.get(id)?;
        Ok(obj.len() as u64)
    }

    /// Every object in the store with its size, sorted by id; stray files are returned apart.
    pub fn list_objects(&self) -> Result<ObjectListing> {
        let mut objects = Vec::new();
        let mut stray = Vec::new();
        let dir = self.root.join(OBJECTS_DIR);
        for shard in read_dir_sorted(&dir)? {
            if !shard.is_dir() {
                stray.push(shard);
                continue;
            }
            let prefix = shard
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            for entry in read_dir_sorted(&shard)? {
                let name = entry
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                match ObjectId::parse(&format!("{prefix}{name}")) {
                    Ok(id) if entry.is_file() => {
                        let len = fs::metadata(&entry).map_err(CasError::io(&entry))?.len();
                        objects.push((id, len));
                    }
                    _ => stray.push(entry),
                }
            }
        }
        objects.sort();
        Ok((objects, stray))
    }

    /// Paths of every manifest in the store: `packages/*.toml` and a top-level `manifest.toml`.
    pub fn manifest_paths(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let top = self.root.join(MANIFEST_FILE);
        if top.is_file() {
            out.push(top);
        }
        let pk = self.packages_dir();
        if pk.is_dir() {
            for p in read_dir_sorted(&pk)? {
                if p.extension().is_some_and(|e| e == "toml") {
                    out.push(p);
                }
            }
        }
        Ok(out)
    }

    /// The objects referenced by every manifest (the gc roots), with the manifest of each.
    ///
    /// Every `blake3:` id anywhere in a manifest counts as a reference, so a manifest written by
    /// a newer Synapse (with slots this build does not know) never loses objects to this gc.
    /// An unreadable manifest is an error: gc must not guess.
    pub fn referenced(&self) -> Result<Vec<(PathBuf, BTreeSet<ObjectId>)>> {
        let mut out = Vec::new();
        for path in self.manifest_paths()? {
            let text = fs::read_to_string(&path).map_err(CasError::io(&path))?;
            let ids =
                crate::package::referenced_ids(&text).map_err(|message| CasError::Manifest {
                    path: path.clone(),
                    message,
                })?;
            out.push((path, ids));
        }
        Ok(out)
    }

    fn tmp_files(&self) -> Result<Vec<(PathBuf, u64)>> {
        let dir = self.root.join(TMP_DIR);
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for p in read_dir_sorted(&dir)? {
            let len = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            out.push((p, len));
        }
        Ok(out)
    }

    /// Counts and sizes.
    pub fn stats(&self) -> Result<StoreStats> {
        let (objects, _) = self.list_objects()?;
        let refs = self.referenced()?;
        let mut all_refs: BTreeSet<ObjectId> =
            refs.iter().flat_map(|(_, s)| s.iter().copied()).collect();
        if crate::index::Index::exists(self) {
            // Cached variants of live tensors are kept by gc: count them as referenced too.
            let present: BTreeSet<ObjectId> = objects.iter().map(|(id, _)| *id).collect();
            let (_, kept) = crate::index::Index::open(self).retain(&all_refs, &present, true)?;
            all_refs.extend(kept);
        }
        let mut s = StoreStats {
            packages: refs.len() as u64,
            ..StoreStats::default()
        };
        for (id, len) in &objects {
            s.objects += 1;
            s.object_bytes += len;
            if all_refs.contains(id) {
                s.referenced_objects += 1;
                s.referenced_bytes += len;
            } else {
                s.unreferenced_objects += 1;
                s.unreferenced_bytes += len;
            }
        }
        for (_, len) in self.tmp_files()? {
            s.tmp_files += 1;
            s.tmp_bytes += len;
        }
        Ok(s)
    }

    /// Re-hashes every object and checks every manifest's references. `progress` is called
    /// with the size of each object after it is hashed.
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let (objects, stray) = self.list_objects()?;
        report
            .problems
            .extend(stray.into_iter().map(|path| VerifyProblem::Stray { path }));
        for (id, len) in &objects {
            match self.get(id) {
                Ok(_) => {}
                Err(CasError::Corrupt { actual, .. }) => report
                    .problems
                    .push(VerifyProblem::Corrupt { id: *id, actual }),
                Err(e) => return Err(e),
            }
            report.objects_checked += 1;
            report.bytes_checked += len;
            progress(*len);
        }
        let present: BTreeSet<ObjectId> = objects.iter().map(|(id, _)| *id).collect();
        for path in self.manifest_paths()? {
            report.manifests_checked += 1;
            let bytes = fs::read(&path).map_err(CasError::io(&path))?;
            if path.parent() == Some(self.packages_dir().as_path()) {
                let expected = format!("{}.toml", ObjectId::of(&bytes).hex());
                if path.file_name().and_then(|n| n.to_str()) != Some(expected.as_str()) {
                    report.problems.push(VerifyProblem::BadManifest {
                        path: path.clone(),
                        message: format!("its content hashes to {expected}"),
                    });
                }
            }
            let text = match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => {
                    report.problems.push(VerifyProblem::BadManifest {
                        path,
                        message: e.to_string(),
                    });
                    continue;
                }
            };
            match crate::package::referenced_ids(&text) {
                Ok(ids) => {
                    for id in ids {
                        if !present.contains(&id) {
                            report.problems.push(VerifyProblem::Missing {
                                id,
                                manifest: path.clone(),
                            });
                        }
                    }
                }
                Err(message) => report
                    .problems
                    .push(VerifyProblem::BadManifest { path, message }),
            }
        }
        Ok(report)
    }

    /// Deletes every object no manifest references, every leftover temporary file, and every
    /// index entry whose object is gone. Holds the exclusive lock throughout, so it waits for
    /// running writers and blocks new ones. With `dry_run` nothing is deleted.
    pub fn gc(&self, dry_run: bool) -> Result<GcReport> {
        let lock = self.lock_exclusive()?;
        lock.gc(dry_run)
    }
}

impl ExclusiveLock<'_> {
    /// [`Store::gc`] for a caller that already holds the exclusive lock.
    ///
    /// Roots: every object a manifest references, plus every cached variant (index entry) whose
    /// source tensor a manifest references. Index entries whose source is no longer referenced,
    /// or whose object is missing, are dropped before their objects are deleted.
    pub fn gc(&self, dry_run: bool) -> Result<GcReport> {
        let store = self.store;
        let mut report = GcReport::default();
        let mut roots: BTreeSet<ObjectId> = store
            .referenced()?
            .into_iter()
            .flat_map(|(_, s)| s)
            .collect();
        let (objects, _) = store.list_objects()?;
        if crate::index::Index::exists(store) {
            let present: BTreeSet<ObjectId> = objects.iter().map(|(id, _)| *id).collect();
            let index = crate::index::Index::open(store);
            let (pruned, kept) = index.retain(&roots, &present, dry_run)?;
            report.pruned_index_entries = pruned;
            roots.extend(kept);
        }
        for (id, len) in objects {
            if roots.contains(&id) {
                report.kept_objects += 1;
                continue;
            }
            report.deleted_objects += 1;
            report.deleted_bytes += len;
            if !dry_run {
                let p = store.object_path(&id);
                fs::remove_file(&p).map_err(CasError::io(&p))?;
            }
        }
        for (p, _) in store.tmp_files()? {
            report.deleted_tmp += 1;
            if !dry_run {
                if p.is_dir() {
                    fs::remove_dir_all(&p).map_err(CasError::io(&p))?;
                } else {
                    fs::remove_file(&p).map_err(CasError::io(&p))?;
                }
            }
        }
        if !dry_run {
            sync_dir(&store.root.join(OBJECTS_DIR))?;
        }
        Ok(report)
    }
}

impl<'s> WriteSession<'s> {
    /// The store written to.
    pub fn store(&self) -> &'s Store {
        self.store
    }

    /// Stores `bytes` and returns its id. Idempotent: if an intact object with this id exists,
    /// nothing is written; a corrupt one is replaced.
    pub fn put(&self, bytes: &[u8]) -> Result<PutOutcome> {
        let id = ObjectId::of(bytes);
        self.put_with_id(id, bytes)
    }

    /// [`put`](Self::put) for bytes whose blake3 the caller has just computed (not trusted
    /// blindly: it is the name, and every read re-hashes).
    pub fn put_with_id(&self, id: ObjectId, bytes: &[u8]) -> Result<PutOutcome> {
        let size = bytes.len() as u64;
        let dest = self.store.object_path(&id);
        if dest.is_file() {
            match self.store.get(&id) {
                Ok(_) => {
                    return Ok(PutOutcome {
                        id,
                        size,
                        written: false,
                    });
                }
                Err(CasError::Corrupt { .. }) => {
                    tracing::warn!(%id, "replacing corrupt object");
                }
                Err(CasError::Missing { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let shard = dest.parent().expect("object paths have a shard directory");
        if !shard.is_dir() {
            fs::create_dir_all(shard).map_err(CasError::io(shard))?;
            sync_dir(&self.store.root.join(OBJECTS_DIR))?;
        }
        write_atomic(&self.store.root.join(TMP_DIR), &dest, bytes)?;
        Ok(PutOutcome {
            id,
            size,
            written: true,
        })
    }

    /// Writes a small file (a manifest) atomically under the store root at `rel`.
    pub fn write_file(&self, rel: &Path, bytes: &[u8]) -> Result<PathBuf> {
        let dest = self.store.root.join(rel);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(CasError::io(parent))?;
        }
        write_atomic(&self.store.root.join(TMP_DIR), &dest, bytes)?;
        Ok(dest)
    }
}

/// temp file in `tmp_dir` → write → fsync → rename onto `dest` → fsync `dest`'s directory.
fn write_atomic(tmp_dir: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    fs::create_dir_all(tmp_dir).map_err(CasError::io(tmp_dir))?;
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = tmp_dir.join(format!("{}-{n}-{nanos}.tmp", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(CasError::io(&tmp))?;
        f.write_all(bytes).map_err(CasError::io(&tmp))?;
        f.sync_all().map_err(CasError::io(&tmp))?;
        drop(f);
        fs::rename(&tmp, dest).map_err(CasError::io(dest))?;
        if let Some(parent) = dest.parent() {
            sync_dir(parent)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// fsyncs a directory so that a rename into it is durable.
fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(CasError::io(dir))?;
    d.sync_all().map_err(CasError::io(dir))
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(CasError::io(dir))? {
        out.push(e.map_err(CasError::io(dir))?.path());
    }
    out.sort();
    Ok(out)
}
