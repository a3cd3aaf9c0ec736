//! Live events for watchers on this replica. The journal publishes each
//! event once it is stored; for executions another replica runs, a
//! notification only "pokes" watchers, which then read the new events from
//! the store. Watchers never depend on the hub alone: what they miss here
//! (a lagging receiver, a lost notification) they read back from the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agentmesh_core::execution::Event;
use tokio::sync::broadcast;

/// What a watcher receives.
#[derive(Debug, Clone)]
pub enum Live {
    /// A stored event of an execution this replica runs.
    Event(Arc<Event>),
    /// New events were stored elsewhere: read them from the store.
    Poke,
}

/// Live channels, by execution id.
#[derive(Default)]
pub struct Hub {
    channels: Mutex<HashMap<String, broadcast::Sender<Live>>>,
}

/// Events a watcher may fall behind by before it re-reads from the store.
const CAPACITY: usize = 4096;

impl Hub {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<Live>>> {
        self.channels.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Follows an execution's live events.
    pub fn subscribe(&self, id: &str) -> broadcast::Receiver<Live> {
        let mut channels = self.channels();
        if channels.len() > 1024 {
            channels.retain(|_, sender| sender.receiver_count() > 0);
        }
        channels.entry(id.to_owned()).or_insert_with(|| broadcast::channel(CAPACITY).0).subscribe()
    }

    /// Sends stored events to the execution's watchers, if any.
    pub fn publish(&self, id: &str, events: &[Arc<Event>]) {
        self.send(id, events.iter().map(|e| Live::Event(e.clone())));
    }

    /// Tells the execution's watchers to read from the store.
    pub fn poke(&self, id: &str) {
        self.send(id, std::iter::once(Live::Poke));
    }

    /// Tells every watcher to read from the store (notifications may have been missed).
    pub fn poke_all(&self) {
        for sender in self.channels().values() {
            let _ = sender.send(Live::Poke);
        }
    }

    fn send(&self, id: &str, items: impl Iterator<Item = Live>) {
        let mut channels = self.channels();
        let Some(sender) = channels.get(id) else { return };
        if sender.receiver_count() == 0 {
            channels.remove(id);
            return;
        }
        for item in items {
            let _ = sender.send(item);
        }
    }
}
