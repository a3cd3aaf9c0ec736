//! Files a service re-reads when they change (its TLS certificate, the
//! tokens file): looked at every few seconds and loaded again once one of
//! them changes, so that a renewal needs no restart. A change that does not
//! load keeps what was loaded before in force, and is logged.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// How often the files are looked at for a change.
const CHECK: Duration = Duration::from_secs(5);

/// A value loaded from files, replaced when they change.
pub type Reloaded<T> = Arc<RwLock<T>>;

/// Loads `load()` now (its error stops the caller) and again whenever one
/// of `paths` changes, for as long as the returned value or a clone lives.
/// `what` names it in the logs (`the TLS certificate`).
pub fn load_and_watch<T, F>(
    paths: Vec<PathBuf>,
    what: &'static str,
    service: &'static str,
    load: F,
) -> anyhow::Result<Reloaded<T>>
where
    T: Send + Sync + 'static,
    F: Fn() -> anyhow::Result<T> + Send + 'static,
{
    let current = Arc::new(RwLock::new(load()?));
    let weak = Arc::downgrade(&current);
    tokio::spawn(async move {
        let mut seen = stamp(&paths);
        loop {
            tokio::time::sleep(CHECK).await;
            let Some(current) = weak.upgrade() else { return };
            let now = stamp(&paths);
            if now == seen {
                continue;
            }
            seen = now;
            match load() {
                Ok(value) => {
                    *current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = value;
                    tracing::info!(service, "{what} reloaded");
                }
                Err(e) => tracing::warn!(service, error = %format!("{e:#}"),
                    "{what} changed but cannot be loaded; the one loaded before stays in force"),
            }
        }
    });
    Ok(current)
}

/// The value as loaded last.
pub fn current<T: Clone>(reloaded: &Reloaded<T>) -> T {
    reloaded.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// When each file last changed, and its size: a renewal changes one.
fn stamp(paths: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    paths.iter().map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())))).collect()
}
