//! Decoding of the one query that reads agents with their capabilities,
//! shared by both backends. An agent whose rows do not decode is left out
//! (and logged) rather than failing the whole read.

use agentmesh_core::{
    AgentDefinition, AgentRecord, Capability, CapabilityKind, DeploymentType, RawJson, ReportedStatus, Transport,
};
use serde::de::DeserializeOwned;
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::{CorruptAgent, Loaded, StoreError, StoreResult, from_ms};

/// A row of either database, read by column name as the types the stores
/// keep (text, 64-bit integers, booleans): decoders take any `StoredRow`,
/// and sqlx's per-type bounds are written here once.
pub(crate) trait StoredRow {
    /// A text column.
    fn text(&self, column: &str) -> Result<String, sqlx::Error>;
    /// A text column that may be NULL.
    fn maybe_text(&self, column: &str) -> Result<Option<String>, sqlx::Error>;
    /// An integer column.
    fn int(&self, column: &str) -> Result<i64, sqlx::Error>;
    /// An integer column that may be NULL.
    fn maybe_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error>;
    /// A boolean column that may be NULL.
    fn maybe_bool(&self, column: &str) -> Result<Option<bool>, sqlx::Error>;
}

impl<R> StoredRow for R
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, column: &str) -> Result<String, sqlx::Error> {
        self.try_get(column)
    }

    fn maybe_text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(column)
    }

    fn int(&self, column: &str) -> Result<i64, sqlx::Error> {
        self.try_get(column)
    }

    fn maybe_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(column)
    }

    fn maybe_bool(&self, column: &str) -> Result<Option<bool>, sqlx::Error> {
        self.try_get(column)
    }
}

/// Agents joined with their capabilities; callers append WHERE and must
/// order by `a.id` then `c.position`. A macro so that `concat!` keeps every
/// query a literal.
macro_rules! select_agents {
    () => {
        "SELECT a.id, a.base_url, a.transport, a.version, a.deployment_type, \
a.tags, a.reported_status, a.registered_at_ms, a.updated_at_ms, a.last_heartbeat_ms, a.credential, \
c.id AS cap_id, c.kind AS cap_kind, c.description AS cap_description, c.tags AS cap_tags, \
c.input_schema AS cap_input_schema, c.output_schema AS cap_output_schema, c.examples AS cap_examples, \
c.endpoint AS cap_endpoint, c.internal AS cap_internal, c.hints AS cap_hints \
FROM agentmesh_agents a LEFT JOIN agentmesh_capabilities c ON c.agent_id = a.id"
    };
}
pub(crate) use select_agents;

/// Capability columns in insertion order (shared by both backends).
pub(crate) const CAPABILITY_COLUMNS: &str =
    "agent_id, id, kind, position, description, tags, input_schema, output_schema, examples, endpoint, internal, hints";

/// One column of a row; a value that does not decode makes the row corrupt.
fn get<T>(value: Result<T, sqlx::Error>, column: &str) -> StoreResult<T> {
    value.map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
}

fn json<T: DeserializeOwned>(text: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// Serializes a value stored as JSON text.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn raw_list(text: &str) -> StoreResult<Vec<RawJson>> {
    let items: Vec<Box<serde_json::value::RawValue>> =
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("examples: {e}")))?;
    items.into_iter().map(|raw| RawJson::parse(raw.get()).map_err(|e| StoreError::Corrupt(e.to_string()))).collect()
}

fn transport(value: &str) -> StoreResult<Transport> {
    Transport::parse(value).ok_or_else(|| StoreError::Corrupt(format!("unknown transport `{value}`")))
}

fn deployment(value: &str) -> StoreResult<DeploymentType> {
    match value {
        "long_running" => Ok(DeploymentType::LongRunning),
        "serverless" => Ok(DeploymentType::Serverless),
        other => Err(StoreError::Corrupt(format!("unknown deployment type `{other}`"))),
    }
}

/// Groups joined rows (ordered by agent id, then capability position) into
/// agents, leaving out those whose rows cannot be decoded.
pub(crate) fn decode_agents<R>(rows: &[R]) -> Loaded
where
    R: StoredRow,
{
    let mut decoder = Decoder::default();
    for row in rows {
        decoder.push(row);
    }
    decoder.loaded
}

/// Streams joined rows into agents, one row in memory at a time, leaving
/// out those whose rows cannot be decoded. Fails only when the database does.
pub(crate) async fn collect_agents<'e, R, S>(mut rows: S) -> StoreResult<Loaded>
where
    S: futures_util::Stream<Item = Result<R, sqlx::Error>> + Unpin + 'e,
    R: StoredRow,
{
    use futures_util::TryStreamExt;
    let mut decoder = Decoder::default();
    while let Some(row) = rows.try_next().await? {
        decoder.push(&row);
        // A full read decodes every capability of the catalog: let other
        // tasks on this worker run now and then (rows can arrive faster than
        // the stream ever has to wait).
        tokio::task::consume_budget().await;
    }
    decoder.loaded.agents.shrink_to_fit();
    Ok(decoder.loaded)
}

impl Loaded {
    /// Adds the agents of another read (of other ids).
    pub(crate) fn extend(&mut self, other: Loaded) {
        self.agents.extend(other.agents);
        self.corrupt.extend(other.corrupt);
    }

    /// The one agent a read by id found: an error when it could not be decoded.
    pub(crate) fn single(mut self) -> StoreResult<Option<AgentRecord>> {
        match self.corrupt.pop() {
            Some(corrupt) => Err(StoreError::Corrupt(corrupt.to_string())),
            None => Ok(self.agents.pop()),
        }
    }
}

/// Builds agents from joined rows, one row at a time.
#[derive(Default)]
struct Decoder {
    loaded: Loaded,
    /// The agent being left out: its remaining rows are passed over.
    skipping: Option<String>,
}

impl Decoder {
    fn push<R: StoredRow>(&mut self, row: &R) {
        let id: String = match get(row.text("id"), "id") {
            Ok(id) => id,
            Err(e) => return self.skip(None, e),
        };
        if self.skipping.as_ref() == Some(&id) {
            return;
        }
        if let Err(e) = push_row(&mut self.loaded.agents, row, &id) {
            // The agent may be half built from its earlier rows.
            if self.loaded.agents.last().is_some_and(|a| a.definition.id == id) {
                self.loaded.agents.pop();
            }
            self.skip(Some(id), e);
        }
    }

    fn skip(&mut self, agent_id: Option<String>, error: StoreError) {
        let reason = match error {
            StoreError::Corrupt(reason) => reason,
            other => other.to_string(),
        };
        tracing::error!(
            agent_id = agent_id.as_deref().unwrap_or("(unreadable)"),
            error = %reason,
            "skipping a stored agent that cannot be read; registering it again rewrites it"
        );
        self.skipping.clone_from(&agent_id);
        self.loaded.corrupt.push(CorruptAgent { agent_id, reason });
    }
}

/// Adds one joined row of agent `id`: a new agent, or a capability of the last one.
fn push_row<R>(agents: &mut Vec<AgentRecord>, row: &R, id: &str) -> StoreResult<()>
where
    R: StoredRow,
{
    if agents.last().is_none_or(|a| a.definition.id != id) {
        let status: String = get(row.text("reported_status"), "reported_status")?;
        agents.push(AgentRecord {
            definition: AgentDefinition {
                base_url: get(row.text("base_url"), "base_url")?,
                transport: transport(&get(row.text("transport"), "transport")?)?,
                version: get(row.text("version"), "version")?,
                deployment_type: deployment(&get(row.text("deployment_type"), "deployment_type")?)?,
                tags: json(&get(row.text("tags"), "tags")?, "agent tags")?,
                reasoners: Vec::new(),
                skills: Vec::new(),
                credential: get(row.maybe_text("credential"), "credential")?,
                id: id.to_owned(),
            },
            registered_at: from_ms(get(row.int("registered_at_ms"), "registered_at_ms")?),
            updated_at: from_ms(get(row.int("updated_at_ms"), "updated_at_ms")?),
            last_heartbeat: from_ms(get(row.int("last_heartbeat_ms"), "last_heartbeat_ms")?),
            reported_status: ReportedStatus::parse(&status)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown reported status `{status}`")))?,
        });
    }
    let Some(cap_id) = get(row.maybe_text("cap_id"), "cap_id")? else {
        return Ok(());
    };
    let in_capability = |e: StoreError| match e {
        StoreError::Corrupt(reason) => StoreError::Corrupt(format!("capability `{cap_id}`: {reason}")),
        other => other,
    };
    let (kind, capability) = capability(row, cap_id.clone()).map_err(in_capability)?;
    if let Some(agent) = agents.last_mut() {
        match kind.as_str() {
            "reasoner" => agent.definition.reasoners.push(capability),
            "skill" => agent.definition.skills.push(capability),
            other => return Err(in_capability(StoreError::Corrupt(format!("unknown capability kind `{other}`")))),
        }
    }
    Ok(())
}

/// The capability columns of a joined row, with its kind.
fn capability<R>(row: &R, id: String) -> StoreResult<(String, Capability)>
where
    R: StoredRow,
{
    let kind: String = get(row.maybe_text("cap_kind"), "cap_kind")?.unwrap_or_default();
    let schema = |column| -> StoreResult<Option<RawJson>> {
        get(row.maybe_text(column), column)?
            .map(|text| {
                too_deep(column, &text)?;
                RawJson::parse(&text).map_err(|e| StoreError::Corrupt(format!("{column}: {e}")))
            })
            .transpose()
    };
    let capability = Capability {
        id,
        description: get(row.maybe_text("cap_description"), "cap_description")?.unwrap_or_default(),
        tags: json(&get(row.maybe_text("cap_tags"), "cap_tags")?.unwrap_or_else(|| "[]".into()), "capability tags")?,
        input_schema: schema("cap_input_schema")?,
        output_schema: schema("cap_output_schema")?,
        examples: {
            let text = get(row.maybe_text("cap_examples"), "cap_examples")?.unwrap_or_else(|| "[]".into());
            // The list itself is one level.
            too_deep_by("cap_examples", &text, 1)?;
            raw_list(&text)?
        },
        endpoint: get(row.maybe_text("cap_endpoint"), "cap_endpoint")?.unwrap_or_default(),
        internal: get(row.maybe_bool("cap_internal"), "cap_internal")?.unwrap_or(false),
        hints: get(row.maybe_text("cap_hints"), "cap_hints")?.map(|text| json(&text, "hints")).transpose()?,
    };
    Ok((kind, capability))
}

/// A document stored before registrations were held to
/// [`MAX_JSON_DEPTH`](agentmesh_core::validate::MAX_JSON_DEPTH) that no
/// consumer could decode: its agent is skipped like a corrupt one (and
/// served again once registered anew), instead of failing every listing.
fn too_deep(column: &str, text: &str) -> StoreResult<()> {
    too_deep_by(column, text, 0)
}

fn too_deep_by(column: &str, text: &str, wrapping: usize) -> StoreResult<()> {
    let depth = agentmesh_core::validate::json_text_depth(text).saturating_sub(wrapping);
    let limit = agentmesh_core::validate::MAX_JSON_DEPTH;
    if depth > limit {
        return Err(StoreError::Corrupt(format!(
            "{column} nests {depth} levels deep, more than the {limit} every consumer can decode"
        )));
    }
    Ok(())
}

/// Capabilities of a definition with their kind and global position.
pub(crate) fn capability_rows(def: &AgentDefinition) -> impl Iterator<Item = (i32, CapabilityKind, &Capability)> {
    def.capabilities().enumerate().map(|(i, (kind, cap))| (i32::try_from(i).unwrap_or(i32::MAX), kind, cap))
}
