//! `WatchCatalog` streams: at most `max_watch_streams` open at once, each
//! holding its slot until it ends, and each starting from the records of the
//! current snapshot, shared rather than copied.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentmesh_proto::v1 as pb;
use futures_util::Stream;
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::Status;

use crate::cache::Observed;
use crate::convert::{Detail, agent_to_pb, full_agent_to_pb, health_to_pb, timestamp};
use crate::error::DiscoveryError;
use crate::registry::{CatalogEvent, EventKind, Registry};

/// The response stream of `WatchCatalog`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchCatalogResponse, Status>> + Send>>;

/// The slots of `WatchCatalog` streams.
pub struct WatchSlots {
    slots: Arc<Semaphore>,
    limit: usize,
    open: IntGauge,
}

impl WatchSlots {
    /// `limit` slots; `open` follows how many are taken.
    pub fn new(limit: usize, open: IntGauge) -> Self {
        Self { slots: Arc::new(Semaphore::new(limit)), limit, open }
    }

    /// A slot for one more stream, or the error naming the setting to raise.
    pub fn take(&self) -> Result<WatchSlot, DiscoveryError> {
        let permit =
            self.slots.clone().try_acquire_owned().map_err(|_| DiscoveryError::TooManyWatchStreams(self.limit))?;
        self.open.inc();
        Ok(WatchSlot { _permit: permit, open: self.open.clone() })
    }
}

/// One stream's slot, given back when it is dropped.
pub struct WatchSlot {
    _permit: OwnedSemaphorePermit,
    open: IntGauge,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// A stream that keeps its slot until it is dropped: when it ends, or when
/// the client goes away.
struct Slotted {
    inner: WatchStream,
    _slot: WatchSlot,
}

impl Stream for Slotted {
    type Item = Result<pb::WatchCatalogResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().inner.as_mut().poll_next(cx)
    }
}

/// The stream of one watcher: `initial` (agents in id order, as a snapshot
/// held them when the watcher subscribed to `events`), then every event
/// except those announcing a version `initial` already showed.
pub fn stream(
    registry: Arc<Registry>,
    slot: WatchSlot,
    initial: Vec<Observed>,
    events: broadcast::Receiver<CatalogEvent>,
) -> WatchStream {
    let initial = Arc::new(initial);
    let sent = initial.clone();
    let first = tokio_stream::iter(0..initial.len()).map(move |i| Ok(observed_to_pb(&initial[i])));
    let live = BroadcastStream::new(events).filter(move |event| match event {
        Ok(CatalogEvent { kind: EventKind::Registered | EventKind::Updated, agent: Some(agent), .. }) => {
            let shown =
                sent.binary_search_by(|o| o.record.id().cmp(agent.id())).ok().map(|i| sent[i].record.updated_at);
            shown.is_none_or(|at| agent.updated_at > at)
        }
        _ => true,
    });
    let live = live.map(move |event| match event {
        Ok(event) => Ok(event_to_pb(&event, &registry)),
        Err(BroadcastStreamRecvError::Lagged(missed)) => {
            Err(Status::aborted(format!("watcher fell {missed} events behind; reconnect with include_snapshot=true")))
        }
    });
    Box::pin(Slotted { inner: Box::pin(first.chain(live)), _slot: slot })
}

fn observed_to_pb(observed: &Observed) -> pb::WatchCatalogResponse {
    let record = &observed.record;
    let def = &record.definition;
    pb::WatchCatalogResponse {
        kind: pb::CatalogEventKind::Registered as i32,
        agent_id: record.id().to_owned(),
        agent: Some(agent_to_pb(
            record,
            observed.health,
            observed.last_heartbeat,
            &def.reasoners,
            &def.skills,
            Detail::FULL,
        )),
        health_status: health_to_pb(observed.health) as i32,
        occurred_at: Some(timestamp(chrono::Utc::now())),
    }
}

fn event_to_pb(event: &CatalogEvent, registry: &Registry) -> pb::WatchCatalogResponse {
    let kind = match event.kind {
        EventKind::Registered => pb::CatalogEventKind::Registered,
        EventKind::Updated => pb::CatalogEventKind::Updated,
        EventKind::HealthChanged => pb::CatalogEventKind::HealthChanged,
        EventKind::Deregistered => pb::CatalogEventKind::Deregistered,
    };
    let health = event.health.or_else(|| {
        event.agent.as_ref().map(|a| registry.policy().derive(a.last_heartbeat, a.reported_status, chrono::Utc::now()))
    });
    pb::WatchCatalogResponse {
        kind: kind as i32,
        agent_id: event.agent_id.clone(),
        agent: event
            .agent
            .as_ref()
            .map(|a| full_agent_to_pb(a, health.unwrap_or(agentmesh_core::HealthStatus::Active))),
        health_status: health.map_or(pb::HealthStatus::Unspecified, health_to_pb) as i32,
        occurred_at: Some(timestamp(event.at)),
    }
}
