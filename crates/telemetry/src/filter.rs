//! Which spans and events are exported. Decided from each callsite's
//! metadata alone, so the answer is cached per callsite and a span no layer
//! wants costs nothing when it is reached.

use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Filter};

/// Libraries whose own spans would swamp a trace (a span per HTTP/2 frame,
/// per pooled connection, per query).
const NOISY: [&str; 6] = ["h2", "hyper", "tower", "tonic", "sqlx", "reqwest"];

/// agentmesh's spans from DEBUG up (the child spans of queries, store and
/// agent calls live there, so that logs at INFO never pay for them), other
/// libraries' spans from INFO up; events (which become span events) from
/// INFO up for agentmesh, WARN up for the rest.
pub(crate) struct Exported;

impl Exported {
    fn wanted(meta: &Metadata<'_>) -> bool {
        if meta.target() == crate::EVENT_LOG_TARGET {
            // Logged copies of events added to spans directly.
            return false;
        }
        let ours = meta.target().starts_with("agentmesh");
        let level = *meta.level();
        match (meta.is_span(), ours) {
            (true, true) => level <= Level::DEBUG,
            (true, false) => level <= Level::INFO && !NOISY.iter().any(|n| meta.target().starts_with(n)),
            (false, true) => level <= Level::INFO,
            (false, false) => level <= Level::WARN,
        }
    }
}

impl<S> Filter<S> for Exported {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        Self::wanted(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if Self::wanted(meta) { Interest::always() } else { Interest::never() }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }
}
