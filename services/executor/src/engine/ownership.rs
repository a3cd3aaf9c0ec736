//! Who runs what. Each replica renews the leases of its executions every
//! third of the lease time and claims executions nobody holds (their owner
//! stopped, or crashed and its lease ran out), resuming them from their
//! stored log. On SQLite there is one executor: at start it claims every
//! unfinished execution at once. Notifications from the store poke local
//! watchers of executions run elsewhere and deliver cancellations to their
//! owner; finished executions are purged after the retention time.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_store::executions::{ExecutionNotice, lease_end};
use tokio::sync::{broadcast, watch};

use super::Engine;

/// Starts the lease keeper, the notification follower and the purger; the
/// handle ends once the lease keeper has handed the executions on after `stop`.
pub fn spawn(engine: &Arc<Engine>, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(follow_notices(engine.clone(), stop.clone()));
    tokio::spawn(purge(engine.clone(), stop.clone()));
    tokio::spawn(keep_leases(engine.clone(), stop))
}

async fn keep_leases(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let period = (engine.settings.lease / 3).max(Duration::from_millis(50));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One executor per SQLite file: whatever is unfinished there is ours.
    let mut everything = !engine.store.shared();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let now = chrono::Utc::now();
        let lease = lease_end(now, engine.settings.lease);
        match engine.store.renew(&engine.owner, lease).await {
            Ok(held) => engine.drop_lost(&held),
            Err(e) => {
                tracing::warn!(error = %e, "could not renew execution leases");
                continue;
            }
        }
        let room = engine.settings.max_concurrent_executions.saturating_sub(engine.running_count());
        if room == 0 {
            continue;
        }
        let limit = i64::try_from(room).unwrap_or(i64::MAX);
        match engine.store.claim(&engine.owner, lease, now.timestamp_millis(), limit, everything).await {
            Ok(claimed) => {
                everything = false;
                for id in claimed.into_iter().filter(|id| !engine.runs(id)) {
                    if let Err(e) = engine.resume(&id).await {
                        tracing::error!(execution_id = %id, error = %e, "could not resume execution");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not claim executions"),
        }
    }
    // Stopping: store what the runners produced, then hand their executions
    // to whoever comes next, at once.
    engine.journal.flush().await;
    match engine.store.release_all(&engine.owner).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(executions = n, "handed unfinished executions on"),
        Err(e) => tracing::warn!(error = %e, "could not release leases; they expire on their own"),
    }
}

async fn follow_notices(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut notices = engine.store.subscribe();
    loop {
        let notice = tokio::select! {
            notice = notices.recv() => notice,
            _ = stop.changed() => return,
        };
        match notice {
            Ok(ExecutionNotice::Appended { id, .. }) => {
                if !engine.runs(&id) {
                    engine.hub.poke(&id);
                }
            }
            Ok(ExecutionNotice::CancelRequested { id }) => {
                if let Ok(Some(row)) = engine.store.get(&id).await
                    && let Some(reason) = row.cancel_requested
                {
                    engine.signal_cancel(&id, reason);
                }
            }
            Ok(ExecutionNotice::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => engine.hub.poke_all(),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

async fn purge(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let before = lease_end(chrono::Utc::now(), Duration::ZERO)
            .saturating_sub(i64::try_from(engine.settings.retention.as_millis()).unwrap_or(i64::MAX));
        match engine.store.purge_finished(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(executions = n, "purged finished executions past their retention"),
            Err(e) => tracing::warn!(error = %e, "could not purge finished executions"),
        }
    }
}
