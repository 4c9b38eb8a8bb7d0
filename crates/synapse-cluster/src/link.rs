//! A pipeline hop over gRPC: [`GrpcStageLink`] is the runtime's `StageLink` port on one
//! bidirectional `Step` stream to the next stage.
//!
//! The engine thread is synchronous: `send` hands a packet to the stream's sender, `recv`
//! waits (with a timeout) for the oldest packet's reply, which a task moves off the stream;
//! a first stage keeps up to two packets in flight. Packets carry
//! the plan (epoch, hash) the pipeline was set up under and a step number; the receiver
//! refuses another plan, and a reply for another step is an error. Hidden states and logits
//! travel as exact little-endian `f32`.

use std::sync::mpsc;
use std::time::Duration;

use synapse_runtime::RuntimeError;
use synapse_runtime::pipeline::{StageLink, StepPacket};

use crate::error::Result;
use crate::proto;
use crate::proto::worker_client::WorkerClient;
use crate::wire;

/// One open `Step` stream to the next stage.
pub struct GrpcStageLink {
    tx: tokio::sync::mpsc::Sender<proto::StepPacket>,
    rx: mpsc::Receiver<std::result::Result<proto::StepReply, String>>,
    epoch: u64,
    plan_hash: String,
    step: u64,
    timeout: Duration,
    to: String,
    vocab: usize,
    dtype: crate::plan::LinkDtype,
    /// Steps sent and not yet answered: (step, row reads, logits rows).
    sent: std::collections::VecDeque<(u64, Vec<synapse_runtime::pipeline::RowRead>, usize)>,
    /// The log-probabilities that came with the last reply, per logits row.
    logprobs: Vec<Option<synapse_runtime::pipeline::RowLogprob>>,
}

impl std::fmt::Debug for GrpcStageLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcStageLink")
            .field("to", &self.to)
            .field("epoch", &self.epoch)
            .field("step", &self.step)
            .finish()
    }
}

impl GrpcStageLink {
    /// Opens the stream to the stage at `addr` for the plan (`epoch`, `plan_hash`) of a model
    /// of `vocab` tokens; a step not answered within `timeout` fails (a partitioned or
    /// stopped peer).
    pub async fn connect(
        addr: &str,
        epoch: u64,
        plan_hash: &str,
        vocab: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let channel = tonic::transport::Endpoint::from_shared(addr.to_string())?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .connect()
            .await?;
        let mut client = WorkerClient::new(channel)
            .max_decoding_message_size(1 << 30)
            .max_encoding_message_size(1 << 30);
        let (tx, rx) = tokio::sync::mpsc::channel::<proto::StepPacket>(2);
        let resp = client
            .step(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?;
        let mut inbound = resp.into_inner();
        let (stx, srx) = mpsc::channel();
        tokio::spawn(async move {
            loop {
                let m = match inbound.message().await {
                    Ok(Some(r)) => Ok(r),
                    Ok(None) => Err("the next stage closed the stream".to_string()),
                    Err(s) => Err(format!("the next stage failed: {}", s.message())),
                };
                let end = m.is_err();
                if stx.send(m).is_err() || end {
                    break;
                }
            }
        });
        Ok(GrpcStageLink {
            tx,
            rx: srx,
            epoch,
            plan_hash: plan_hash.to_string(),
            step: 0,
            timeout,
            to: addr.to_string(),
            vocab,
            dtype: crate::plan::LinkDtype::F32,
            sent: Default::default(),
            logprobs: Vec::new(),
        })
    }
}

impl GrpcStageLink {
    /// Sends hidden states as `dtype` from now on (`f32`, the default, is exact).
    pub fn with_dtype(mut self, dtype: crate::plan::LinkDtype) -> Self {
        self.dtype = dtype;
        self
    }
}

/// A step packet as it goes on the wire: the plan it belongs to, its step number, the slot
/// operations, rows, hidden states (as `dtype`) and argmax flags.
pub(crate) fn packet_to_wire(
    epoch: u64,
    plan_hash: &str,
    step: u64,
    packet: &StepPacket<'_>,
    dtype: crate::plan::LinkDtype,
) -> proto::StepPacket {
    let mut p = proto::StepPacket {
        epoch,
        plan_hash: plan_hash.to_string(),
        step,
        ops: packet.ops.iter().map(wire::op_to_wire).collect(),
        ..Default::default()
    };
    wire::rows_to_wire(packet.rows, &mut p);
    wire::hidden_to_wire(packet.hidden, dtype, &mut p.hidden);
    p.hidden_dtype = wire::dtype_code(dtype);
    wire::reads_to_wire(packet.reads, &mut p);
    p
}

impl GrpcStageLink {
    /// The stream's two ends for a stage that moves packets and replies itself (a middle
    /// stage hands replies back up as they come): the packet sender and the reply receiver.
    #[allow(clippy::type_complexity)]
    pub(crate) fn into_ends(
        self,
    ) -> (
        tokio::sync::mpsc::Sender<proto::StepPacket>,
        mpsc::Receiver<std::result::Result<proto::StepReply, String>>,
    ) {
        (self.tx, self.rx)
    }

    /// Waits for the next reply on the stream (a middle stage's reply pump).
    pub(crate) fn recv_reply(
        rx: &mpsc::Receiver<std::result::Result<proto::StepReply, String>>,
        timeout: Duration,
        step: u64,
    ) -> std::result::Result<proto::StepReply, String> {
        let reply = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => return Err(format!("no answer to step {step} within {timeout:?}")),
        };
        if !reply.error.is_empty() {
            return Err(reply.error);
        }
        if reply.step != step {
            return Err(format!("answer for step {}, not {step}", reply.step));
        }
        Ok(reply)
    }
}

impl StageLink for GrpcStageLink {
    fn send(&mut self, packet: &StepPacket<'_>) -> synapse_runtime::Result<()> {
        self.step += 1;
        let p = packet_to_wire(self.epoch, &self.plan_hash, self.step, packet, self.dtype);
        self.tx.blocking_send(p).map_err(|_| {
            RuntimeError::Stage(format!(
                "{}: the stream to the next stage is closed",
                self.to
            ))
        })?;
        let rows = packet.rows.iter().filter(|r| r.logits).count();
        self.sent
            .push_back((self.step, packet.reads.to_vec(), rows));
        Ok(())
    }

    fn recv(&mut self, logits: &mut Vec<f32>) -> synapse_runtime::Result<()> {
        let gone = |m: String| RuntimeError::Stage(format!("{}: {m}", self.to));
        let Some((step, reads, rows)) = self.sent.pop_front() else {
            return Err(gone("no step in flight".into()));
        };
        let reply = Self::recv_reply(&self.rx, self.timeout, step).map_err(gone)?;
        self.logprobs.clear();
        if reads.is_empty() {
            return wire::bytes_to_f32s(&reply.logits, logits).map_err(|e| gone(e.to_string()));
        }
        wire::expand_logits(
            &reply.logits,
            &reply.tokens,
            &reply.logprobs,
            self.vocab,
            &reads,
            rows,
            logits,
            &mut self.logprobs,
        )
        .map_err(|e| gone(e.to_string()))
    }

    fn take_logprobs(&mut self, out: &mut Vec<Option<synapse_runtime::pipeline::RowLogprob>>) {
        std::mem::swap(out, &mut self.logprobs);
        self.logprobs.clear();
    }
}
