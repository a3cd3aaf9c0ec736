//! A snapshot of every agent, ordered by id, with a liveness overlay that
//! heartbeats update in place, an index built on first use, and the encoded
//! answers shared by every request for the same query while nothing they
//! show has changed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use agentmesh_core::{
    AgentRecord, CapabilityQuery, CatalogIndex, CatalogPage, HealthPolicy, HealthStatus, ReportedStatus,
};
use chrono::{DateTime, Utc};

/// Milliseconds since the first call: a clock that fits in an atomic.
fn monotonic_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    u64::try_from(BASE.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Applies the heartbeats among `patches` in place.
pub(crate) fn replay_heartbeats(snapshot: &Snapshot, patches: &[Patch]) {
    for patch in patches {
        if let Patch::Heartbeat { agent_id, status, at_ms } = patch
            && !snapshot.beat(agent_id, *status, *at_ms)
        {
            tracing::debug!(agent_id, "heartbeat for an agent not in the snapshot");
        }
    }
}

/// Heartbeat state that changes without copying the snapshot.
#[derive(Debug)]
struct Liveness {
    last_heartbeat_ms: AtomicI64,
    degraded: AtomicBool,
    /// Heartbeats applied in place, so that shared bodies holding this agent
    /// can tell they are stale.
    beats: AtomicU32,
}

impl Liveness {
    fn new(at_ms: i64, status: ReportedStatus) -> Self {
        Self {
            last_heartbeat_ms: AtomicI64::new(at_ms),
            degraded: AtomicBool::new(status == ReportedStatus::Degraded),
            beats: AtomicU32::new(0),
        }
    }

    fn copy(&self) -> Self {
        Self {
            last_heartbeat_ms: AtomicI64::new(self.last_heartbeat_ms.load(Ordering::Relaxed)),
            degraded: AtomicBool::new(self.degraded.load(Ordering::Relaxed)),
            beats: AtomicU32::new(0),
        }
    }
}

/// An agent as a snapshot holds it (shared, not copied), with its health
/// and last heartbeat when it was read.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The stored agent.
    pub record: Arc<AgentRecord>,
    /// Its derived health.
    pub health: HealthStatus,
    /// Its last heartbeat, heartbeats applied in place included.
    pub last_heartbeat: DateTime<Utc>,
}

/// A change to apply to a snapshot.
#[derive(Debug, Clone)]
pub(crate) enum Patch {
    Upsert(Arc<AgentRecord>),
    Remove(String),
    Heartbeat { agent_id: String, status: ReportedStatus, at_ms: i64 },
}

/// Most bytes of shared answers a snapshot keeps: keys (the whole query)
/// and encoded bodies together.
const ENCODED_BUDGET_BYTES: usize = 8 * 1024 * 1024;

/// Bytes an entry costs besides its key and body: the map slot, the entry
/// itself and its allocations' headers, roughly.
const ENTRY_OVERHEAD_BYTES: usize = 128;

/// A response body as sent, shared by every request that asks the same query
/// of the same snapshot state.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The encoded body.
    pub body: bytes::Bytes,
    /// Agents, reasoners and skills in it (for logs).
    pub counts: [usize; 3],
}

impl Encoded {
    /// Counts of a page, for [`Encoded::counts`].
    pub fn counts_of(page: &CatalogPage<'_>) -> [usize; 3] {
        [
            page.agents.len(),
            page.agents.iter().map(|a| a.reasoners.len()).sum(),
            page.agents.iter().map(|a| a.skills.len()).sum(),
        ]
    }
}

/// What a shared body depends on besides the snapshot itself.
#[derive(Debug)]
enum Stamp {
    /// Every agent's health (a `health_status` filter decides membership):
    /// `Snapshot::beats` when it was built.
    All(u64),
    /// Only the agents it holds: their positions and heartbeat counts.
    Agents(Vec<(usize, u32)>),
}

#[derive(Debug)]
struct EncodedEntry {
    encoded: Encoded,
    stamp: Stamp,
    /// Unix ms after which it is not served: the first change of derived
    /// health of an agent it depends on, and at most one heartbeat interval
    /// after it was built.
    valid_until_ms: i64,
}

impl EncodedEntry {
    /// What keeping it under `key` costs against the budget.
    fn footprint(&self, key: &str) -> usize {
        let stamp = match &self.stamp {
            Stamp::All(_) => 0,
            Stamp::Agents(agents) => agents.len() * std::mem::size_of::<(usize, u32)>(),
        };
        key.len() + self.encoded.body.len() + stamp + ENTRY_OVERHEAD_BYTES
    }
}

#[derive(Debug, Default)]
struct EncodedCache {
    entries: HashMap<String, EncodedEntry>,
    bytes: usize,
}

/// An immutable list of agents (ordered by id) with a mutable liveness overlay.
#[derive(Debug)]
pub struct Snapshot {
    /// Sorted by id; looked up by binary search.
    agents: Vec<Arc<AgentRecord>>,
    liveness: Vec<Liveness>,
    /// Bumped by every heartbeat applied in place.
    beats: AtomicU64,
    /// Encoded responses of this snapshot; a new snapshot starts empty.
    encoded: Mutex<EncodedCache>,
    pub(crate) generation: u64,
    /// When the catalog was last read in full from the database
    /// ([`monotonic_ms`]); a reload that finds it unchanged renews it.
    loaded_at_ms: AtomicU64,
    /// Approximate size in bytes of the cached agents.
    pub size_bytes: usize,
    /// Built on first use, so that writes do not pay for it.
    index: OnceLock<CatalogIndex>,
}

impl Snapshot {
    pub(crate) fn new(mut agents: Vec<Arc<AgentRecord>>, generation: u64) -> Self {
        agents.sort_by(|a, b| a.id().cmp(b.id()));
        agents.dedup_by(|a, b| a.id() == b.id());
        let liveness =
            agents.iter().map(|a| Liveness::new(a.last_heartbeat.timestamp_millis(), a.reported_status)).collect();
        let size_bytes = agents.iter().map(|a| approximate_size(a)).sum();
        Self {
            agents,
            liveness,
            beats: AtomicU64::new(0),
            encoded: Mutex::default(),
            generation,
            loaded_at_ms: AtomicU64::new(monotonic_ms()),
            size_bytes,
            index: OnceLock::new(),
        }
    }

    /// The answer to `query` as `build` encodes it, shared with every other
    /// request for the same `key` while nothing it shows has changed. Returns
    /// whether the body was shared.
    ///
    /// A body goes stale at any write (a new snapshot), at a heartbeat of an
    /// agent it holds, when the derived health of such an agent changes, and
    /// at the latest one heartbeat interval after it was built (what bounds
    /// an empty answer). Under a `health_status` filter it depends on every
    /// agent instead. Keys and bodies together stay within a byte budget.
    pub fn answer_encoded(
        &self,
        key: String,
        query: &CapabilityQuery,
        policy: HealthPolicy,
        now: DateTime<Utc>,
        build: impl FnOnce(&CatalogPage<'_>) -> Encoded,
    ) -> (Encoded, bool) {
        if let Some(encoded) = self.shared(&key, now) {
            return (encoded, true);
        }
        // Read before the page is built: a heartbeat landing meanwhile makes
        // the body stale at once.
        let all = self.beats.load(Ordering::SeqCst);
        let page = self.query(query, policy, now);
        let encoded = build(&page);
        let stamp = if query.health_status.is_some() {
            Some((Stamp::All(all), self.next_health_change(0..self.agents.len(), policy, now)))
        } else {
            self.page_stamp(&page, policy, now)
        };
        if let Some((stamp, valid_until_ms)) = stamp {
            // An answer whose agents' health never changes (an empty page,
            // or only inactive agents) would otherwise stay current until the
            // next write, and hold its place in the budget all that time.
            let longest = chrono::Duration::from_std(policy.heartbeat_interval)
                .map_or(i64::MAX, |d| now.timestamp_millis().saturating_add(d.num_milliseconds()));
            let valid_until_ms = valid_until_ms.min(longest);
            self.keep(key, EncodedEntry { encoded: encoded.clone(), stamp, valid_until_ms }, now);
        }
        (encoded, false)
    }

    /// The heartbeat counts of the agents on `page`, if the page still shows
    /// their current liveness (else a heartbeat raced the page: keep nothing).
    fn page_stamp(&self, page: &CatalogPage<'_>, policy: HealthPolicy, now: DateTime<Utc>) -> Option<(Stamp, i64)> {
        let mut agents = Vec::with_capacity(page.agents.len());
        for shown in &page.agents {
            let i = self.position(shown.record.id()).ok()?;
            // The count first: a heartbeat raises it after updating liveness.
            let beats = self.liveness[i].beats.load(Ordering::SeqCst);
            let (at, reported) = self.live(i);
            if at != shown.last_heartbeat || policy.derive(at, reported, now) != shown.health {
                return None;
            }
            agents.push((i, beats));
        }
        let valid_until_ms = self.next_health_change(agents.iter().map(|(i, _)| *i), policy, now);
        Some((Stamp::Agents(agents), valid_until_ms))
    }

    fn is_current(&self, entry: &EncodedEntry, now_ms: i64) -> bool {
        now_ms < entry.valid_until_ms
            && match &entry.stamp {
                Stamp::All(beats) => *beats == self.beats.load(Ordering::SeqCst),
                Stamp::Agents(agents) => {
                    agents.iter().all(|(i, beats)| self.liveness[*i].beats.load(Ordering::SeqCst) == *beats)
                }
            }
    }

    fn shared(&self, key: &str, now: DateTime<Utc>) -> Option<Encoded> {
        let cache = self.encoded.lock().ok()?;
        let entry = cache.entries.get(key)?;
        self.is_current(entry, now.timestamp_millis()).then(|| entry.encoded.clone())
    }

    /// Keeps an answer within the byte budget, its key counted with its
    /// body: stale answers go first; if that is not enough, the new one is
    /// not kept.
    fn keep(&self, key: String, entry: EncodedEntry, now: DateTime<Utc>) {
        let Ok(mut cache) = self.encoded.lock() else { return };
        if let Some(old) = cache.entries.remove(&key) {
            cache.bytes -= old.footprint(&key);
        }
        let size = entry.footprint(&key);
        if cache.bytes + size > ENCODED_BUDGET_BYTES {
            let now_ms = now.timestamp_millis();
            cache.entries.retain(|_, e| self.is_current(e, now_ms));
            cache.bytes = cache.entries.iter().map(|(k, e)| e.footprint(k)).sum();
            if cache.bytes + size > ENCODED_BUDGET_BYTES {
                return;
            }
        }
        cache.bytes += size;
        cache.entries.insert(key, entry);
    }

    /// The first instant after `now`, in Unix ms, at which the derived health
    /// of one of `agents` changes (`i64::MAX` when none will).
    fn next_health_change(&self, agents: impl Iterator<Item = usize>, policy: HealthPolicy, now: DateTime<Utc>) -> i64 {
        agents
            .filter_map(|i| policy.next_transition(self.live(i).0, now))
            .map(|at| at.timestamp_millis())
            .min()
            .unwrap_or(i64::MAX)
    }

    fn position(&self, id: &str) -> Result<usize, usize> {
        self.agents.binary_search_by(|a| a.id().cmp(id))
    }

    /// Number of agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// True when there are no agents.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    fn live(&self, i: usize) -> (DateTime<Utc>, ReportedStatus) {
        let l = &self.liveness[i];
        let at = DateTime::from_timestamp_millis(l.last_heartbeat_ms.load(Ordering::Relaxed)).unwrap_or_default();
        let status = if l.degraded.load(Ordering::Relaxed) { ReportedStatus::Degraded } else { ReportedStatus::Active };
        (at, status)
    }

    /// Every agent in id order with its health at `now` and last heartbeat.
    pub fn observed(
        &self,
        policy: HealthPolicy,
        now: DateTime<Utc>,
    ) -> impl Iterator<Item = (&AgentRecord, HealthStatus, DateTime<Utc>)> {
        self.agents.iter().enumerate().map(move |(i, record)| {
            let (at, reported) = self.live(i);
            (record.as_ref(), policy.derive(at, reported, now), at)
        })
    }

    /// Every agent in id order, sharing the snapshot's records, with its
    /// health at `now` and last heartbeat.
    pub fn observed_shared(&self, policy: HealthPolicy, now: DateTime<Utc>) -> Vec<Observed> {
        (0..self.agents.len())
            .map(|i| {
                let (at, reported) = self.live(i);
                Observed {
                    record: self.agents[i].clone(),
                    health: policy.derive(at, reported, now),
                    last_heartbeat: at,
                }
            })
            .collect()
    }

    fn index(&self) -> &CatalogIndex {
        self.index.get_or_init(|| CatalogIndex::build(self.agents.iter().map(AsRef::as_ref)))
    }

    /// Runs a query: unfiltered queries build only their page, exact filters
    /// look only at the agents the index names, the rest scan everything.
    pub fn query<'a>(&'a self, query: &CapabilityQuery, policy: HealthPolicy, now: DateTime<Utc>) -> CatalogPage<'a> {
        let observe = move |i: usize| {
            let (at, reported) = self.live(i);
            (self.agents[i].as_ref(), policy.derive(at, reported, now), at)
        };
        if query.is_unfiltered() {
            let start = query.offset.min(self.agents.len());
            let end = start.saturating_add(query.limit).min(self.agents.len());
            let totals = self.index().totals(query.include_internal);
            return query.page_unfiltered((start..end).map(observe), self.agents.len(), totals);
        }
        match self.index().candidates(query, |id| self.position(id).ok()) {
            Some(positions) => query.run(positions.into_iter().map(observe)),
            None => query.run(self.observed(policy, now)),
        }
    }

    /// One agent with its liveness applied, and its health at `now`.
    pub fn get(&self, id: &str, policy: HealthPolicy, now: DateTime<Utc>) -> Option<(AgentRecord, HealthStatus)> {
        let i = self.position(id).ok()?;
        let (at, reported) = self.live(i);
        let mut record = self.agents[i].as_ref().clone();
        record.last_heartbeat = at;
        record.reported_status = reported;
        Some((record, policy.derive(at, reported, now)))
    }

    /// Applies a heartbeat in place; false when the agent is not here.
    pub(crate) fn beat(&self, id: &str, status: ReportedStatus, at_ms: i64) -> bool {
        let Ok(i) = self.position(id) else {
            return false;
        };
        let l = &self.liveness[i];
        l.last_heartbeat_ms.fetch_max(at_ms, Ordering::Relaxed);
        l.degraded.store(status == ReportedStatus::Degraded, Ordering::Relaxed);
        // After the liveness: see `page_stamp`.
        l.beats.fetch_add(1, Ordering::SeqCst);
        self.beats.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Time since the catalog was last read in full.
    pub(crate) fn age(&self) -> Duration {
        Duration::from_millis(monotonic_ms().saturating_sub(self.loaded_at_ms.load(Ordering::Relaxed)))
    }

    /// True when `loaded` (a full read of the database) holds exactly the
    /// agents of this snapshot, in the same versions. Heartbeats are not
    /// compared. Yields to the runtime as it goes: at 10,000 agents this is
    /// a few milliseconds of work.
    pub(crate) async fn holds_same(&self, loaded: &[AgentRecord]) -> bool {
        if loaded.len() != self.agents.len() {
            return false;
        }
        for record in loaded {
            tokio::task::consume_budget().await;
            let Ok(i) = self.position(record.id()) else {
                return false;
            };
            let held = &self.agents[i];
            if held.updated_at != record.updated_at
                || held.registered_at != record.registered_at
                || held.definition != record.definition
            {
                return false;
            }
        }
        true
    }

    /// After a full read that found the same catalog: applies the stored
    /// heartbeats newer than those held, and restarts the TTL. The index and
    /// the shared bodies are kept.
    pub(crate) fn renew(&self, loaded: &[AgentRecord]) {
        for record in loaded {
            let at_ms = record.last_heartbeat.timestamp_millis();
            let newer = self
                .position(record.id())
                .is_ok_and(|i| self.liveness[i].last_heartbeat_ms.load(Ordering::Relaxed) < at_ms);
            if newer {
                self.beat(record.id(), record.reported_status, at_ms);
            }
        }
        self.loaded_at_ms.store(monotonic_ms(), Ordering::Relaxed);
    }

    /// The stored version (`updated_at`) of an agent, if held.
    pub fn version_of(&self, id: &str) -> Option<DateTime<Utc>> {
        self.position(id).ok().map(|i| self.agents[i].updated_at)
    }

    /// A copy with agents replaced (`Some`) or removed (`None`). A
    /// replacement older than the version held is ignored; heartbeat state of
    /// untouched agents is carried over.
    pub(crate) fn merged(&self, mut changes: HashMap<String, Option<Arc<AgentRecord>>>) -> Self {
        let mut entries: Vec<(Arc<AgentRecord>, Liveness)> = Vec::with_capacity(self.agents.len() + changes.len());
        let mut size_bytes = self.size_bytes;
        for (held, live) in self.agents.iter().zip(&self.liveness) {
            match changes.remove(held.id()) {
                None => entries.push((held.clone(), live.copy())),
                Some(None) => size_bytes -= approximate_size(held),
                Some(Some(newer)) if newer.updated_at >= held.updated_at => {
                    size_bytes = size_bytes - approximate_size(held) + approximate_size(&newer);
                    let fresh = Liveness::new(newer.last_heartbeat.timestamp_millis(), newer.reported_status);
                    entries.push((newer, fresh));
                }
                Some(Some(_)) => entries.push((held.clone(), live.copy())),
            }
        }
        for added in changes.into_values().flatten() {
            size_bytes += approximate_size(&added);
            let fresh = Liveness::new(added.last_heartbeat.timestamp_millis(), added.reported_status);
            entries.push((added, fresh));
        }
        entries.sort_by(|a, b| a.0.id().cmp(b.0.id()));
        let (agents, liveness) = entries.into_iter().unzip();
        Self {
            agents,
            liveness,
            beats: AtomicU64::new(0),
            encoded: Mutex::default(),
            generation: self.generation,
            loaded_at_ms: AtomicU64::new(self.loaded_at_ms.load(Ordering::Relaxed)),
            size_bytes,
            index: OnceLock::new(),
        }
    }
}

/// The last change per agent among `patches` (newest version wins).
pub(crate) fn coalesce<'a>(patches: impl IntoIterator<Item = &'a Patch>) -> HashMap<String, Option<Arc<AgentRecord>>> {
    let mut changes: HashMap<String, Option<Arc<AgentRecord>>> = HashMap::new();
    for patch in patches {
        match patch {
            Patch::Upsert(record) => {
                let newer = match changes.get(record.id()) {
                    Some(Some(held)) => record.updated_at >= held.updated_at,
                    _ => true,
                };
                if newer {
                    changes.insert(record.id().to_owned(), Some(record.clone()));
                }
            }
            Patch::Remove(id) => {
                changes.insert(id.clone(), None);
            }
            Patch::Heartbeat { .. } => {}
        }
    }
    changes
}

fn approximate_size(a: &AgentRecord) -> usize {
    let def = &a.definition;
    let caps: usize = def
        .capabilities()
        .map(|(_, c)| {
            c.id.len()
                + c.description.len()
                + c.endpoint.len()
                + c.tags.iter().map(|t| t.len() + 24).sum::<usize>()
                + [&c.input_schema, &c.output_schema]
                    .iter()
                    .filter_map(|s| s.as_ref())
                    .map(|s| s.get().len())
                    .sum::<usize>()
                + c.examples.iter().map(|e| e.get().len()).sum::<usize>()
                + 200
        })
        .sum();
    def.id.len()
        + def.base_url.len()
        + def.version.len()
        + def.tags.iter().map(|t| t.len() + 24).sum::<usize>()
        + caps
        + 300
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_core::AgentDefinition;

    fn record(id: &str, updated_ms: i64) -> Arc<AgentRecord> {
        let at = DateTime::from_timestamp_millis(1_700_000_000_000 + updated_ms).unwrap_or_default();
        let definition: AgentDefinition =
            serde_json::from_value(serde_json::json!({"id": id, "base_url": "http://a:1", "skills": [{"id": "s"}]}))
                .unwrap();
        Arc::new(AgentRecord {
            definition,
            registered_at: at,
            updated_at: at,
            last_heartbeat: at,
            reported_status: ReportedStatus::Active,
        })
    }

    fn ids(s: &Snapshot) -> Vec<&str> {
        s.agents.iter().map(|a| a.id()).collect()
    }

    #[test]
    fn patches_keep_order_ignore_older_versions_and_track_size() {
        let one = |p: Patch| coalesce(&[p]);
        let s = Snapshot::new(vec![record("c", 0), record("a", 0)], 0);
        assert_eq!(ids(&s), ["a", "c"]);
        let s = s.merged(one(Patch::Upsert(record("b", 5))));
        assert_eq!(ids(&s), ["a", "b", "c"]);
        let same = s.merged(one(Patch::Upsert(record("b", 1))));
        assert_eq!(same.version_of("b"), Some(record("b", 5).updated_at), "an older version is ignored");
        let newer = s.merged(one(Patch::Upsert(record("b", 9))));
        assert_eq!(newer.version_of("b"), Some(record("b", 9).updated_at));
        let s = newer.merged(one(Patch::Remove("a".into())));
        assert_eq!(ids(&s), ["b", "c"]);
        assert_eq!(ids(&s.merged(one(Patch::Remove("zz".into())))), ["b", "c"]);
        let batch =
            coalesce(&[Patch::Remove("b".into()), Patch::Upsert(record("b", 20)), Patch::Upsert(record("d", 1))]);
        let s = s.merged(batch);
        assert_eq!(ids(&s), ["b", "c", "d"], "the last change per agent wins");
        let rebuilt = Snapshot::new(s.agents.clone(), 0);
        assert_eq!(s.size_bytes, rebuilt.size_bytes, "incremental size matches a full count");
    }

    #[test]
    fn indexed_queries_answer_like_a_full_scan() {
        use agentmesh_core::Pattern;
        let agent = |id: &str, caps: serde_json::Value| -> Arc<AgentRecord> {
            let mut def = serde_json::json!({"id": id, "base_url": "http://a:1", "tags": [format!("team-{id}")]});
            def["skills"] = caps;
            let now = DateTime::from_timestamp_millis(1_700_000_000_000).unwrap_or_default();
            Arc::new(AgentRecord {
                definition: serde_json::from_value(def).unwrap(),
                registered_at: now,
                updated_at: now,
                last_heartbeat: now,
                reported_status: ReportedStatus::Active,
            })
        };
        let agents: Vec<Arc<AgentRecord>> = (0..30)
            .map(|i| {
                agent(
                    &format!("agent-{i:02}"),
                    serde_json::json!([
                        {"id": format!("s{}", i % 4), "tags": [format!("t{}", i % 5)]},
                        {"id": "shared", "tags": ["all"], "internal": i % 7 == 0},
                    ]),
                )
            })
            .collect();
        let s = Snapshot::new(agents, 0);
        let policy = HealthPolicy::default();
        let now = DateTime::from_timestamp_millis(1_700_000_001_000).unwrap_or_default();
        let p = |v: &str| Some(Pattern::new(v));
        let queries = vec![
            CapabilityQuery::default(),
            CapabilityQuery { offset: 25, limit: 10, ..Default::default() },
            CapabilityQuery { include_internal: true, limit: 5, ..Default::default() },
            CapabilityQuery {
                agent_ids: vec!["agent-03".into(), "agent-03".into(), "nobody".into()],
                ..Default::default()
            },
            CapabilityQuery { skill: p("s1"), ..Default::default() },
            CapabilityQuery { skill: p("shared"), include_internal: true, ..Default::default() },
            CapabilityQuery { skill: p("s*"), tags: vec![Pattern::new("t2")], ..Default::default() },
            CapabilityQuery { tags: vec![Pattern::new("t1"), Pattern::new("team-agent-07")], ..Default::default() },
            CapabilityQuery { reasoner: p("s1"), ..Default::default() },
            CapabilityQuery { agent_ids: vec!["agent-04".into()], skill: p("s0"), ..Default::default() },
            CapabilityQuery { exclude_agents: vec!["agent-00".into()], limit: 3, ..Default::default() },
        ];
        let view = |page: &CatalogPage<'_>| {
            let ids: Vec<String> = page
                .agents
                .iter()
                .flat_map(|a| a.skills.iter().map(move |c| format!("{}:{}", a.record.id(), c.id)))
                .collect();
            let agents: Vec<&str> = page.agents.iter().map(|a| a.record.id()).collect();
            (ids, agents.join(","), page.total_agents, page.total_reasoners, page.total_skills, page.has_more)
        };
        for q in &queries {
            let indexed = s.query(q, policy, now);
            let scanned = q.run(s.observed(policy, now));
            assert_eq!(view(&indexed), view(&scanned), "{q:?}");
        }
    }

    fn empty_body(page: &CatalogPage<'_>) -> Encoded {
        Encoded { body: bytes::Bytes::from_static(b"{}"), counts: Encoded::counts_of(page) }
    }

    /// Bytes held by the shared answers, counted from the entries themselves.
    fn held_bytes(s: &Snapshot) -> usize {
        let cache = s.encoded.lock().unwrap();
        cache.entries.iter().map(|(key, entry)| key.len() + entry.encoded.body.len()).sum()
    }

    #[test]
    fn distinct_large_keys_stay_within_the_budget() {
        let s = Snapshot::new(vec![record("a", 0)], 0);
        let policy = HealthPolicy::default();
        let now = DateTime::from_timestamp_millis(1_700_000_001_000).unwrap();
        // A query's key holds the whole query: long `agent_ids` lists make
        // keys far larger than the (empty) answers they map to.
        let ids: Vec<String> = (0..2_000).map(|i| format!("nobody-{i:05}")).collect();
        for i in 0..400 {
            let query = CapabilityQuery {
                agent_ids: ids.iter().cloned().chain([i.to_string()]).collect(),
                ..Default::default()
            };
            s.answer_encoded(format!("{query:?}"), &query, policy, now, empty_body);
        }
        let held = held_bytes(&s);
        assert!(held <= ENCODED_BUDGET_BYTES, "{held} bytes held, over the budget of {ENCODED_BUDGET_BYTES}");
        assert!(held > 0, "answers are still shared");
    }

    #[test]
    fn empty_answers_expire() {
        let s = Snapshot::new(vec![record("a", 0)], 0);
        let policy = HealthPolicy { heartbeat_interval: Duration::from_secs(10) };
        let query = CapabilityQuery { agent_ids: vec!["nobody".into()], ..Default::default() };
        let at = |ms: i64| DateTime::from_timestamp_millis(1_700_000_001_000 + ms).unwrap();
        let ask = |ms: i64| s.answer_encoded("nobody".into(), &query, policy, at(ms), empty_body).1;
        assert!(!ask(0), "built on first use");
        assert!(ask(1_000), "shared while fresh");
        assert!(!ask(10_001), "rebuilt once a heartbeat interval has passed");
        assert!(ask(10_002), "and shared again");
    }

    #[test]
    fn heartbeats_move_forward_and_survive_copies() {
        let s = Snapshot::new(vec![record("a", 0), record("b", 0)], 0);
        assert!(s.beat("a", ReportedStatus::Degraded, 1_700_000_005_000));
        assert!(s.beat("a", ReportedStatus::Degraded, 1_700_000_001_000), "older beat keeps the later time");
        assert!(!s.beat("nobody", ReportedStatus::Active, 0));
        let copy = s.merged(coalesce(&[Patch::Upsert(record("c", 1))]));
        let (at, status) = copy.live(0);
        assert_eq!((at.timestamp_millis(), status), (1_700_000_005_000, ReportedStatus::Degraded));
    }
}
