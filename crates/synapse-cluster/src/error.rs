//! The one error enum of `synapse-cluster`.

/// Everything that can go wrong in the cluster adapter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The coordination service (etcd) failed or could not be reached.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// A gRPC connection could not be made.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A gRPC call failed.
    #[error("rpc: {0}")]
    Rpc(Box<tonic::Status>),
    /// The engine, a stage or the model failed.
    #[error(transparent)]
    Runtime(#[from] synapse_runtime::RuntimeError),
    /// The planner found no placement.
    #[error("planner: {0}")]
    Plan(#[from] synapse_planner::PlanError),
    /// A stored plan or profile is not valid JSON of its type.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A request, packet or setting out of its domain.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A packet or request made under another plan than the receiver runs.
    #[error(
        "stale plan: sent under epoch {got_epoch} ({got_hash}), this worker runs epoch {have_epoch} ({have_hash})"
    )]
    StalePlan {
        /// The sender's epoch.
        got_epoch: u64,
        /// The sender's plan hash.
        got_hash: String,
        /// The receiver's epoch.
        have_epoch: u64,
        /// The receiver's plan hash.
        have_hash: String,
    },
    /// No worker can take the request now.
    #[error("no worker: {0}")]
    NoWorker(String),
    /// The worker's lease expired or was revoked: it no longer belongs to the cluster.
    #[error("the worker's lease was lost")]
    LeaseLost,
    /// The content-addressed store failed (a package or object missing or corrupt).
    #[error(transparent)]
    Cas(#[from] synapse_cas::CasError),
    /// A package could not be opened as a model (or a stage of one).
    #[error(transparent)]
    Import(#[from] synapse_import::ImportError),
    /// A package or object could not be fetched from any peer.
    #[error("fetching {what}: {reason}")]
    Fetch {
        /// The package or object.
        what: String,
        /// Why (every peer's answer).
        reason: String,
    },
    /// Reading or binding failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl From<tonic::Status> for ClusterError {
    fn from(s: tonic::Status) -> Self {
        ClusterError::Rpc(Box::new(s))
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ClusterError>;
