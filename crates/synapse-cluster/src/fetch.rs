//! Packages fetched from peers: a worker started with a package hash its store does not
//! hold (or holds only in part) fetches the manifest and the missing objects from the
//! workers already registered, over the same gRPC transport (`Fetch`), and verifies each
//! by its hash before it is written into the store.
//!
//! The manifest is named by the package hash (blake3 of the manifest's bytes) and every
//! object by its id (blake3 of its bytes), so a peer cannot hand over anything else: a
//! mismatch is refused and the next peer asked. What is written goes through the store's
//! atomic writes, so an interrupted fetch leaves whole objects or none, and the next start
//! fetches only what is still missing. A peer answers from its own store and re-hashes
//! each object as it reads it (a corrupt copy is never served).

use std::path::Path;
use std::time::{Duration, Instant};

use synapse_cas::{ObjectId, Package, Store};

use crate::error::{ClusterError, Result};
use crate::membership::{self, Keys};
use crate::proto;
use crate::proto::worker_client::WorkerClient;

/// Bytes per chunk on the wire.
pub const CHUNK: usize = 1 << 20;

/// The largest object or manifest a peer may announce (a bound on what a fetch allocates).
pub const MAX_BYTES: u64 = 1 << 38;

/// What a fetch did.
#[derive(Debug, Clone, Default)]
pub struct FetchReport {
    /// The package hash.
    pub package: String,
    /// Whether the manifest came from a peer (else it was in the store).
    pub manifest_fetched: bool,
    /// Objects the package references.
    pub objects: usize,
    /// Objects fetched (the others were in the store).
    pub fetched: usize,
    /// Bytes fetched.
    pub bytes: u64,
    /// Peers that served something.
    pub peers: Vec<String>,
    /// Seconds taken.
    pub seconds: f64,
}

/// The package hash `query` names, if it is a whole one (64 hex digits, `blake3:` optional).
pub fn full_hash(query: &str) -> Option<ObjectId> {
    let q = query.strip_prefix(ObjectId::PREFIX).unwrap_or(query);
    (q.len() == 64 && q.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| ObjectId::parse(q).ok())
        .flatten()
}

/// Objects of package `hash` that `store_dir` lacks (every one, when it lacks the manifest).
pub fn missing(hash: &ObjectId, store_dir: &Path) -> Result<Option<usize>> {
    let Ok(store) = Store::open_existing(store_dir) else {
        return Ok(None);
    };
    let Ok(p) = Package::open_in_store(&store, &hash.hex()) else {
        return Ok(None);
    };
    Ok(Some(
        p.manifest()
            .objects()
            .iter()
            .filter(|id| !store.contains(id))
            .count(),
    ))
}

/// Reads what `req` asks for from the store at `store_dir` (verified), for a peer.
pub fn read_local(store_dir: &Path, req: &proto::FetchRequest) -> Result<Vec<u8>> {
    let store = Store::open_existing(store_dir)?;
    match (req.package.is_empty(), req.object.is_empty()) {
        (false, true) => {
            let id = full_hash(&req.package).ok_or_else(|| ClusterError::Invalid {
                what: "fetch request",
                reason: format!("{:?} is not a whole package hash", req.package),
            })?;
            let path = store.packages_dir().join(format!("{}.toml", id.hex()));
            let bytes = std::fs::read(&path)?;
            if ObjectId::of(&bytes) != id {
                return Err(ClusterError::Invalid {
                    what: "stored manifest",
                    reason: format!("{} does not hash to its name", path.display()),
                });
            }
            Ok(bytes)
        }
        (true, false) => {
            let raw: [u8; 32] =
                req.object
                    .as_slice()
                    .try_into()
                    .map_err(|_| ClusterError::Invalid {
                        what: "fetch request",
                        reason: format!("an object id of {} bytes", req.object.len()),
                    })?;
            let o = store.get(&ObjectId::from_bytes(raw))?;
            Ok(o.to_vec())
        }
        _ => Err(ClusterError::Invalid {
            what: "fetch request",
            reason: "name exactly one of a package and an object".into(),
        }),
    }
}

/// Fetches what `req` asks for from the peer at `addr`: its bytes, their announced size
/// checked (nothing past [`MAX_BYTES`] is accepted or allocated).
async fn get(clients: &mut Clients, addr: &str, req: proto::FetchRequest) -> Result<Vec<u8>> {
    let c = match clients.entry(addr.to_string()) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let channel = tonic::transport::Endpoint::from_shared(addr.to_string())?
                .connect_timeout(Duration::from_secs(3))
                .connect()
                .await?;
            v.insert(WorkerClient::new(channel).max_decoding_message_size(2 * CHUNK + 1024))
        }
    };
    let mut s = c.fetch(req).await?.into_inner();
    let mut out: Vec<u8> = Vec::new();
    let mut total = None;
    while let Some(ch) = s.message().await? {
        let t = *total.get_or_insert(ch.total);
        if t != ch.total || t > MAX_BYTES || out.len() as u64 + ch.data.len() as u64 > t {
            return Err(ClusterError::Invalid {
                what: "fetch reply",
                reason: format!(
                    "announced {} bytes (limit {MAX_BYTES}), then {} more after {}",
                    ch.total,
                    ch.data.len(),
                    out.len()
                ),
            });
        }
        if out.is_empty() {
            out.reserve(t.min(64 << 20) as usize);
        }
        out.extend_from_slice(&ch.data);
    }
    if total.is_some_and(|t| t != out.len() as u64) {
        return Err(ClusterError::Invalid {
            what: "fetch reply",
            reason: format!("{} of {:?} bytes arrived", out.len(), total),
        });
    }
    Ok(out)
}

/// One connection per peer, reused for every object.
type Clients = std::collections::HashMap<String, WorkerClient<tonic::transport::Channel>>;

/// Asks each peer in turn for `req` until one answers bytes hashing to `want`.
async fn from_any(
    clients: &mut Clients,
    peers: &[(String, String)],
    req: proto::FetchRequest,
    want: &ObjectId,
    what: &str,
    used: &mut Vec<String>,
) -> Result<Vec<u8>> {
    let mut why = Vec::new();
    for (id, addr) in peers {
        match get(clients, addr, req.clone()).await {
            Ok(b) if ObjectId::of(&b) == *want => {
                if !used.contains(id) {
                    used.push(id.clone());
                }
                return Ok(b);
            }
            Ok(b) => {
                tracing::warn!(peer = %id, what, "a peer sent bytes that do not hash to the id");
                why.push(format!("{id}: {} bytes of another hash", b.len()));
            }
            Err(e) => why.push(format!("{id}: {e}")),
        }
    }
    Err(ClusterError::Fetch {
        what: what.to_string(),
        reason: if why.is_empty() {
            "no peer is registered".into()
        } else {
            why.join("; ")
        },
    })
}

/// Makes package `hash` whole in the store at `store_dir` from the workers registered in
/// `cluster` at `etcd`: the manifest if absent, then every object the store lacks, each
/// verified by its hash before it is written.
pub async fn fetch_package(
    etcd: &str,
    cluster: &str,
    hash: &ObjectId,
    store_dir: &Path,
    exclude: &str,
) -> Result<FetchReport> {
    fetch_package_part(etcd, cluster, hash, store_dir, exclude, None).await
}

/// [`fetch_package`] for the tensors named in `tensors` only (`None`: all): the manifest,
/// every object that is not a tensor's (graph, metadata, tokenizer) and the named tensors'
/// objects — what [`PackageModel::from_package_only`] over them reads. A pipeline stage
/// fetches its own layers' tensors this way.
///
/// [`PackageModel::from_package_only`]: synapse_import::PackageModel::from_package_only
pub async fn fetch_package_part(
    etcd: &str,
    cluster: &str,
    hash: &ObjectId,
    store_dir: &Path,
    exclude: &str,
    tensors: Option<&std::collections::BTreeSet<String>>,
) -> Result<FetchReport> {
    let t0 = Instant::now();
    let store = Store::open(store_dir)?;
    // Nothing to fetch: no call to etcd or a peer.
    if let Ok(package) = Package::open_in_store(&store, &hash.hex()) {
        let objects = wanted(&package, tensors)?;
        if objects.iter().all(|id| store.contains(id)) {
            return Ok(FetchReport {
                package: hash.to_string(),
                objects: objects.len(),
                seconds: t0.elapsed().as_secs_f64(),
                ..Default::default()
            });
        }
    }
    let mut c = membership::connect(etcd).await?;
    let (workers, _) = membership::workers(&mut c, &Keys::new(cluster)).await?;
    let peers: Vec<(String, String)> = workers
        .into_values()
        .filter(|w| w.id != exclude)
        .map(|w| (w.id, w.addr))
        .collect();
    let mut rep = FetchReport {
        package: hash.to_string(),
        ..Default::default()
    };
    let mut clients = Clients::new();
    let manifest = store.packages_dir().join(format!("{}.toml", hash.hex()));
    if !manifest.is_file() {
        let req = proto::FetchRequest {
            package: hash.hex(),
            object: Vec::new(),
        };
        let what = format!("the manifest of package {hash}");
        let bytes = from_any(&mut clients, &peers, req, hash, &what, &mut rep.peers).await?;
        // Parsed before it is written: a manifest this build cannot read is refused.
        let text = std::str::from_utf8(&bytes).map_err(|e| ClusterError::Fetch {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        synapse_cas::Manifest::parse(text, &manifest)?.validate()?;
        let rel = Path::new("packages").join(format!("{}.toml", hash.hex()));
        store.session()?.write_file(&rel, &bytes)?;
        rep.manifest_fetched = true;
        rep.bytes += bytes.len() as u64;
    }
    let package = Package::open_in_store(&store, &hash.hex())?;
    let objects = wanted(&package, tensors)?;
    rep.objects = objects.len();
    let todo: Vec<ObjectId> = objects
        .into_iter()
        .filter(|id| !store.contains(id))
        .collect();
    tracing::info!(
        package = %hash,
        objects = rep.objects,
        missing = todo.len(),
        peers = peers.len(),
        "fetching a package from peers"
    );
    for (k, id) in todo.iter().enumerate() {
        let req = proto::FetchRequest {
            package: String::new(),
            object: id.as_bytes().to_vec(),
        };
        let what = format!("object {id}");
        let bytes = from_any(&mut clients, &peers, req, id, &what, &mut rep.peers).await?;
        store.session()?.put_with_id(*id, &bytes)?;
        rep.fetched += 1;
        rep.bytes += bytes.len() as u64;
        tracing::info!(
            object = %id,
            n = k + 1,
            of = todo.len(),
            bytes = bytes.len(),
            "fetched"
        );
    }
    rep.seconds = t0.elapsed().as_secs_f64();
    Ok(rep)
}

/// The objects of `package` a fetch of `tensors` (`None`: all) makes present.
fn wanted(
    package: &Package,
    tensors: Option<&std::collections::BTreeSet<String>>,
) -> Result<std::collections::BTreeSet<ObjectId>> {
    Ok(match tensors {
        None => package.manifest().objects(),
        Some(names) => synapse_import::PackageModel::objects_for(package, names)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_hashes_name_a_package_to_fetch() {
        let id = ObjectId::of(b"x");
        assert_eq!(full_hash(&id.hex()), Some(id));
        assert_eq!(full_hash(&id.to_string()), Some(id));
        assert_eq!(full_hash(&id.hex()[..12]), None);
        assert_eq!(full_hash("not-a-hash"), None);
    }

    #[test]
    fn a_store_serves_verified_objects_and_manifests_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let id = store.session().unwrap().put(b"weights").unwrap().id;
        let req = |o: &ObjectId| proto::FetchRequest {
            package: String::new(),
            object: o.as_bytes().to_vec(),
        };
        assert_eq!(read_local(dir.path(), &req(&id)).unwrap(), b"weights");
        // A corrupt copy is not served.
        std::fs::write(store.object_path(&id), b"weightz").unwrap();
        assert!(read_local(dir.path(), &req(&id)).is_err());
        // Neither an unknown object, a malformed request, nor a prefix.
        assert!(read_local(dir.path(), &req(&ObjectId::of(b"other"))).is_err());
        let both = proto::FetchRequest {
            package: id.hex(),
            object: id.as_bytes().to_vec(),
        };
        assert!(read_local(dir.path(), &both).is_err());
        let prefix = proto::FetchRequest {
            package: id.hex()[..16].to_string(),
            object: Vec::new(),
        };
        assert!(read_local(dir.path(), &prefix).is_err());
    }
}
