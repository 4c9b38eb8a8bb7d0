//! Membership, leadership and the plan on etcd.
//!
//! Keys under `/synapse/<cluster>/`:
//! - `workers/<id>`: a worker's [`WorkerProfile`] (JSON), attached to the worker's lease —
//!   the lease is the worker's identity: when it expires (the process died, or lost etcd for
//!   longer than the TTL) the key goes, and the worker itself stops serving.
//! - `leader`: the election (etcd's election API); the leader runs the planner.
//! - `plan`: the published [`ClusterPlan`]; each publication is a compare-and-swap on the
//!   key's modification revision read before planning, with the epoch raised by one, so two
//!   leaders (a stale one and a new one) can never both publish from the same state.
//!
//! Steady decode makes no call here: workers and the router watch these keys and keep what
//! they saw.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::watch;

use crate::error::{ClusterError, Result};
use crate::plan::{ClusterPlan, EngineShape, Placement, plan_for};
use crate::profile::{ModelSpec, WorkerProfile};

/// The key names of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    root: String,
}

impl Keys {
    /// Keys of cluster `name`.
    pub fn new(name: &str) -> Self {
        Keys {
            root: format!("/synapse/{name}/"),
        }
    }
    /// Prefix of the worker keys.
    pub fn workers(&self) -> String {
        format!("{}workers/", self.root)
    }
    /// A worker's key.
    pub fn worker(&self, id: &str) -> String {
        format!("{}workers/{id}", self.root)
    }
    /// The plan key.
    pub fn plan(&self) -> String {
        format!("{}plan", self.root)
    }
    /// The election name.
    pub fn leader(&self) -> String {
        format!("{}leader", self.root)
    }
}

/// Connects to etcd at `endpoints` (`http://host:port`, comma-separated allowed); every
/// request times out after 5 s.
pub async fn connect(endpoints: &str) -> Result<Client> {
    connect_with(endpoints, Some(Duration::from_secs(5))).await
}

/// [`connect`] with another request timeout (`None`: none — for a campaign, which waits
/// until it wins).
pub async fn connect_with(endpoints: &str, timeout: Option<Duration>) -> Result<Client> {
    let eps: Vec<&str> = endpoints
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        // HTTP/2 pings no more often than etcd's `--grpc-keepalive-min-time` (5 s) allows:
        // faster pings on an idle stream (a campaign waiting to win) count as abuse, and
        // etcd closes the connection after two (GOAWAY `too_many_pings`).
        .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3));
    if let Some(t) = timeout {
        opts = opts.with_timeout(t);
    }
    Ok(Client::connect(eps, Some(opts)).await?)
}
/// Every registered worker now, with the revision read at.
pub async fn workers(
    client: &mut Client,
    keys: &Keys,
) -> Result<(BTreeMap<String, WorkerProfile>, i64)> {
    let r = client
        .get(keys.workers(), Some(GetOptions::new().with_prefix()))
        .await?;
    let rev = r.header().map_or(0, |h| h.revision());
    let mut out = BTreeMap::new();
    for kv in r.kvs() {
        match serde_json::from_slice::<WorkerProfile>(kv.value()) {
            Ok(p) => {
                out.insert(p.id.clone(), p);
            }
            Err(e) => {
                tracing::warn!(key = ?kv.key_str().ok(), error = %e, "unreadable worker profile")
            }
        }
    }
    Ok((out, rev))
}

/// The published plan and the key's modification revision (0: none yet).
pub async fn plan(client: &mut Client, keys: &Keys) -> Result<(Option<ClusterPlan>, i64)> {
    let r = client.get(keys.plan(), None).await?;
    match r.kvs().first() {
        Some(kv) => Ok((Some(serde_json::from_slice(kv.value())?), kv.mod_revision())),
        None => Ok((None, 0)),
    }
}

/// Publishes `next` as epoch `prev + 1` if the plan key is still at `mod_revision` (0: absent)
/// and, when given, the publisher's election key `leader_key` still exists (a leader whose
/// lease expired — a stopped or partitioned process that comes back — cannot publish);
/// returns the published plan, or `None` if either check failed.
pub async fn publish(
    client: &mut Client,
    keys: &Keys,
    mut next: ClusterPlan,
    prev_epoch: u64,
    mod_revision: i64,
    leader_key: Option<&[u8]>,
) -> Result<Option<ClusterPlan>> {
    next.epoch = prev_epoch + 1;
    let value = serde_json::to_vec(&next)?;
    let mut cmp = vec![if mod_revision == 0 {
        Compare::create_revision(keys.plan(), CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(keys.plan(), CompareOp::Equal, mod_revision)
    }];
    if let Some(k) = leader_key {
        cmp.push(Compare::version(k.to_vec(), CompareOp::Greater, 0));
    }
    let txn = Txn::new()
        .when(cmp)
        .and_then(vec![TxnOp::put(keys.plan(), value, None)]);
    let r = client.txn(txn).await?;
    Ok(r.succeeded().then_some(next))
}

/// Watches the plan key: the channel holds the newest plan (it starts with the current one).
/// Returns when the watch fails (the caller decides whether that is fatal).
pub async fn watch_plan(
    mut client: Client,
    keys: Keys,
    tx: watch::Sender<Option<ClusterPlan>>,
) -> Result<()> {
    loop {
        let (p, _) = plan(&mut client, &keys).await?;
        let rev = {
            let r = client.get(keys.plan(), None).await?;
            r.header().map_or(0, |h| h.revision())
        };
        if p.is_some() && *tx.borrow() != p {
            let _ = tx.send(p);
        }
        let mut stream = client
            .watch(
                keys.plan(),
                Some(WatchOptions::new().with_start_revision(rev + 1)),
            )
            .await?;
        loop {
            match futures_util::StreamExt::next(&mut stream).await {
                Some(Ok(resp)) => {
                    if resp.canceled() {
                        break;
                    }
                    for ev in resp.events() {
                        if ev.event_type() == EventType::Put
                            && let Some(kv) = ev.kv()
                        {
                            match serde_json::from_slice::<ClusterPlan>(kv.value()) {
                                Ok(p) => {
                                    let _ = tx.send(Some(p));
                                }
                                Err(e) => tracing::warn!(error = %e, "unreadable plan"),
                            }
                        }
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => break,
            }
        }
        // The watch ended (etcd restarted, compaction): read again and re-watch.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Watches the worker keys: the channel holds the registered workers (starting with the
/// current set).
pub async fn watch_workers(
    mut client: Client,
    keys: Keys,
    tx: watch::Sender<BTreeMap<String, WorkerProfile>>,
) -> Result<()> {
    loop {
        let (ws, rev) = workers(&mut client, &keys).await?;
        let _ = tx.send(ws.clone());
        let mut current = ws;
        let mut stream = client
            .watch(
                keys.workers(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(rev + 1),
                ),
            )
            .await?;
        loop {
            match futures_util::StreamExt::next(&mut stream).await {
                Some(Ok(resp)) => {
                    if resp.canceled() {
                        break;
                    }
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let id = kv
                            .key_str()
                            .unwrap_or_default()
                            .trim_start_matches(&keys.workers())
                            .to_string();
                        match ev.event_type() {
                            EventType::Put => {
                                if let Ok(p) = serde_json::from_slice::<WorkerProfile>(kv.value()) {
                                    current.insert(id, p);
                                }
                            }
                            EventType::Delete => {
                                current.remove(&id);
                            }
                        }
                    }
                    let _ = tx.send(current.clone());
                }
                Some(Err(e)) => return Err(e.into()),
                None => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker's registration: its lease, kept alive in the background. `lost` turns `true`
/// when the lease can no longer be kept (expired, revoked, or etcd unreachable for longer
/// than the TTL); the worker must then stop serving.
#[derive(Debug)]
pub struct Registration {
    /// The lease id.
    pub lease: i64,
    /// Becomes `true` when the lease is lost.
    pub lost: watch::Receiver<bool>,
}

/// Registers `profile` under a new lease of `ttl_s` seconds and keeps the lease alive
/// (every `ttl_s / 3`), reconnecting through `client`'s endpoints while the lease lasts.
pub async fn register(
    client: &mut Client,
    keys: &Keys,
    profile: &WorkerProfile,
    ttl_s: i64,
) -> Result<Registration> {
    let lease = client.lease_grant(ttl_s.max(2), None).await?.id();
    put_profile(client, keys, profile, lease).await?;
    let (lost_tx, lost) = watch::channel(false);
    let mut c = client.clone();
    let period = Duration::from_millis((ttl_s.max(2) as u64 * 1000) / 3);
    let ttl = Duration::from_secs(ttl_s.max(2) as u64);
    tokio::spawn(async move {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            let ok = async {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                loop {
                    keeper.keep_alive().await?;
                    match stream.message().await? {
                        Some(r) if r.ttl() > 0 => last_ok = tokio::time::Instant::now(),
                        // TTL 0: the lease is gone.
                        _ => return Ok::<bool, etcd_client::Error>(false),
                    }
                    tokio::time::sleep(period).await;
                }
            }
            .await;
            match ok {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "lease keep-alive failed; retrying");
                    if last_ok.elapsed() > ttl {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
        tracing::error!(lease, "the worker's lease is lost");
        let _ = lost_tx.send(true);
    });
    Ok(Registration { lease, lost })
}

/// Writes (or updates) a worker's profile under its lease.
pub async fn put_profile(
    client: &mut Client,
    keys: &Keys,
    profile: &WorkerProfile,
    lease: i64,
) -> Result<()> {
    client
        .put(
            keys.worker(&profile.id),
            serde_json::to_vec(profile)?,
            Some(PutOptions::new().with_lease(lease)),
        )
        .await?;
    Ok(())
}

/// How long the leader lets membership settle before it plans (joins and leaves often come
/// in bursts: several workers starting, a machine going down).
pub const SETTLE: Duration = Duration::from_millis(400);

/// A worker standing for leadership.
#[derive(Clone)]
pub struct Candidate {
    /// Its id (the election value).
    pub id: String,
    /// Its lease (the election key lives under it).
    pub lease: i64,
    /// The model it plans for.
    pub spec: ModelSpec,
    /// The engine shape it plans.
    pub shape: EngineShape,
    /// How it places layers.
    pub placement: Placement,
    /// A client without a request timeout for the campaign (default: `client`).
    pub campaign_client: Option<Client>,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("id", &self.id)
            .field("lease", &self.lease)
            .field("placement", &self.placement)
            .finish()
    }
}

/// Campaigns for leadership under `lease` and, once elected, plans whenever the workers
/// change: reads them, plans ([`plan_for`]), and publishes when the plan's placement
/// differs from the published one (hysteresis: a profile update that leaves the placement
/// as it is publishes nothing). Runs until an error (the caller's lease loss ends it too).
pub async fn lead(mut client: Client, keys: Keys, me: Candidate) -> Result<()> {
    let Candidate {
        id,
        lease,
        spec,
        shape,
        placement,
        campaign_client,
    } = me;
    // The campaign waits until it wins: on a client without a request timeout.
    let mut campaigner = campaign_client.unwrap_or_else(|| client.clone());
    let won = campaigner
        .campaign(keys.leader(), id.clone(), lease)
        .await?;
    let leader_key: Option<Vec<u8>> = won.leader().map(|l| l.key().to_vec());
    tracing::info!(worker = %id, "elected leader");
    let (wtx, mut wrx) = watch::channel(BTreeMap::new());
    let wc = client.clone();
    let wk = keys.clone();
    let watcher = tokio::spawn(async move {
        loop {
            if let Err(e) = watch_workers(wc.clone(), wk.clone(), wtx.clone()).await {
                tracing::warn!(error = %e, "membership watch failed; watching again");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let result = async {
        loop {
            // Settle: wait until no change for SETTLE.
            loop {
                match tokio::time::timeout(SETTLE, wrx.changed()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => {
                        return Err(ClusterError::NoWorker("the membership watch ended".into()));
                    }
                    Err(_) => break,
                }
            }
            let members: Vec<WorkerProfile> = wrx.borrow_and_update().values().cloned().collect();
            let (cur, rev) = plan(&mut client, &keys).await?;
            match plan_for(&spec, &members, shape, placement) {
                Ok(next) => {
                    let same = cur.as_ref().is_some_and(|c| c.hash == next.hash);
                    if !same {
                        let prev = cur.as_ref().map_or(0, |c| c.epoch);
                        match publish(&mut client, &keys, next, prev, rev, leader_key.as_deref())
                            .await?
                        {
                            Some(p) => tracing::info!(
                                epoch = p.epoch,
                                hash = %p.hash,
                                rule = %p.rule,
                                pipelines = p.pipelines.len(),
                                "published a plan"
                            ),
                            None => {
                                tracing::warn!(
                                    "the plan changed under us, or we are no longer leader"
                                );
                                if let Some(k) = &leader_key {
                                    let gone = client.get(k.clone(), None).await?.kvs().is_empty();
                                    if gone {
                                        return Err(ClusterError::LeaseLost);
                                    }
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, workers = members.len(), "no plan for these workers")
                }
            }
            if wrx.changed().await.is_err() {
                return Err(ClusterError::NoWorker("the membership watch ended".into()));
            }
        }
    }
    .await;
    watcher.abort();
    result
}
