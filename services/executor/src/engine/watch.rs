//! The event stream of `Execute` and `WatchExecution`: the stored events
//! after a sequence number, then live ones, each exactly once and in order,
//! until the final event. Live events come from the hub; whatever the hub
//! cannot vouch for (a gap, a lagging receiver, an execution another
//! replica runs, a quiet spell) is read back from the store.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_core::execution::Event;
use agentmesh_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::Engine;
use super::hub::Live;
use crate::convert::{event_from_row, event_to_pb};

/// Events read from the store at once.
const PAGE: i64 = 500;
/// The longest a watcher waits on the hub before checking the store.
const RECHECK: Duration = Duration::from_secs(2);

/// Streams the events of execution `id` after `after`.
pub fn stream(
    engine: Arc<Engine>,
    id: String,
    after: u64,
) -> ReceiverStream<Result<pb::ExecutionEvent, tonic::Status>> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(follow(engine, id, after, tx).in_current_span());
    ReceiverStream::new(rx)
}

type Sink = mpsc::Sender<Result<pb::ExecutionEvent, tonic::Status>>;

/// Sends one event; false when the stream is over (final event, or the
/// client went away).
async fn send(tx: &Sink, id: &str, event: &Event, last: &mut u64) -> Option<bool> {
    *last = event.sequence;
    if tx.send(Ok(event_to_pb(id, event))).await.is_err() {
        return None;
    }
    Some(event.kind.final_status().is_none())
}

async fn follow(engine: Arc<Engine>, id: String, after: u64, tx: Sink) {
    let mut live = engine.hub.subscribe(&id);
    let mut stop = engine.stop.clone();
    let mut last = after;
    let mut backfill = true;
    loop {
        if backfill {
            let rows = match engine.store.events_after(&id, i64::try_from(last).unwrap_or(i64::MAX), PAGE).await {
                Ok(rows) => rows,
                Err(e) => {
                    let _ = tx.send(Err(tonic::Status::unavailable(format!("reading events: {e}")))).await;
                    return;
                }
            };
            for (i, row) in rows.iter().enumerate() {
                let event = match event_from_row(row) {
                    Ok(event) => event,
                    Err(e) => {
                        let _ = tx.send(Err(tonic::Status::from(e))).await;
                        return;
                    }
                };
                if event.sequence <= last {
                    continue;
                }
                match send(&tx, &id, &event, &mut last).await {
                    Some(true) => {}
                    // A final event with more after it: the execution was
                    // extended (ExtendExecution) and goes on.
                    Some(false) if i + 1 < rows.len() => {}
                    Some(false) | None => return,
                }
            }
            if i64::try_from(rows.len()).unwrap_or(PAGE) == PAGE {
                continue;
            }
            backfill = false;
        }
        let next = tokio::select! {
            next = tokio::time::timeout(RECHECK, live.recv()) => Some(next),
            _ = stop.wait_for(|stopping| *stopping) => None,
        };
        let Some(next) = next else {
            // Let the server stop: the client resumes on another replica or after the restart.
            let message = format!(
                "the executor is shutting down; the execution goes on: resume with \
                 WatchExecution(execution_id = \"{id}\", from_sequence = {last})"
            );
            let _ = tx.send(Err(tonic::Status::unavailable(message))).await;
            return;
        };
        match next {
            Ok(Ok(Live::Event(event))) if event.sequence == last + 1 => match send(&tx, &id, &event, &mut last).await {
                Some(true) => {}
                Some(false) | None => return,
            },
            // Already sent.
            Ok(Ok(Live::Event(event))) if event.sequence <= last => {}
            // A gap, a poke, a lag, a quiet spell, a closed channel: ask the store.
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) | Err(_) => backfill = true,
            Ok(Err(broadcast::error::RecvError::Closed)) => {
                live = engine.hub.subscribe(&id);
                backfill = true;
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}
