//! Conversions between protobuf messages and the domain model, in one place.

use agentmesh_core::{
    AgentDefinition, AgentRecord, Capability, CapabilityKind, DeploymentType, HealthStatus, InvocationTarget, RawJson,
};
pub use agentmesh_proto::convert::{hints_from_pb, hints_to_pb, transport_from_pb, transport_to_pb};
use agentmesh_proto::v1 as pb;
use chrono::{DateTime, Utc};
use serde_json::Value;

pub use agentmesh_proto::json::{
    from_struct as struct_to_json, from_value as value_to_json, to_struct as json_to_struct, to_value as json_to_value,
};

/// A timestamp to protobuf.
pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: at.timestamp(), nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0) }
}

/// Health to protobuf.
pub fn health_to_pb(h: HealthStatus) -> pb::HealthStatus {
    match h {
        HealthStatus::Active => pb::HealthStatus::Active,
        HealthStatus::Degraded => pb::HealthStatus::Degraded,
        HealthStatus::Inactive => pb::HealthStatus::Inactive,
    }
}

/// Which parts of a capability to include.
#[derive(Debug, Clone, Copy)]
pub struct Detail {
    /// Descriptions.
    pub descriptions: bool,
    /// Input schemas.
    pub input_schema: bool,
    /// Output schemas.
    pub output_schema: bool,
    /// Examples.
    pub examples: bool,
}

impl Detail {
    /// Everything.
    pub const FULL: Self = Self { descriptions: true, input_schema: true, output_schema: true, examples: true };
}

fn raw_to_struct(raw: Option<&RawJson>) -> Option<prost_types::Struct> {
    raw.and_then(|r| json_to_struct(&r.to_value()))
}

/// A capability to protobuf.
pub fn capability_to_pb(agent: &str, kind: CapabilityKind, c: &Capability, detail: Detail) -> pb::Capability {
    pb::Capability {
        id: c.id.clone(),
        kind: match kind {
            CapabilityKind::Reasoner => pb::CapabilityKind::Reasoner,
            CapabilityKind::Skill => pb::CapabilityKind::Skill,
        } as i32,
        description: if detail.descriptions { c.description.clone() } else { String::new() },
        tags: c.tags.clone(),
        input_schema: if detail.input_schema { raw_to_struct(c.input_schema.as_ref()) } else { None },
        output_schema: if detail.output_schema { raw_to_struct(c.output_schema.as_ref()) } else { None },
        examples: if detail.examples {
            c.examples.iter().filter_map(|e| raw_to_struct(Some(e))).collect()
        } else {
            Vec::new()
        },
        endpoint: c.endpoint_or_default(kind),
        internal: c.internal,
        invocation_target: InvocationTarget::new(agent, kind, c.id.as_str()).to_string(),
        hints: c.hints.as_ref().map(hints_to_pb),
    }
}

/// An agent to protobuf with the given capabilities.
pub fn agent_to_pb<'a>(
    record: &AgentRecord,
    health: HealthStatus,
    last_heartbeat: DateTime<Utc>,
    reasoners: impl IntoIterator<Item = &'a Capability>,
    skills: impl IntoIterator<Item = &'a Capability>,
    detail: Detail,
) -> pb::Agent {
    let def = &record.definition;
    pb::Agent {
        id: def.id.clone(),
        base_url: def.base_url.clone(),
        transport: transport_to_pb(def.transport) as i32,
        version: def.version.clone(),
        deployment_type: match def.deployment_type {
            DeploymentType::LongRunning => pb::DeploymentType::LongRunning,
            DeploymentType::Serverless => pb::DeploymentType::Serverless,
        } as i32,
        health_status: health_to_pb(health) as i32,
        last_heartbeat: Some(timestamp(last_heartbeat)),
        tags: def.tags.clone(),
        reasoners: reasoners
            .into_iter()
            .map(|c| capability_to_pb(&def.id, CapabilityKind::Reasoner, c, detail))
            .collect(),
        skills: skills.into_iter().map(|c| capability_to_pb(&def.id, CapabilityKind::Skill, c, detail)).collect(),
        registered_at: Some(timestamp(record.registered_at)),
        updated_at: Some(timestamp(record.updated_at)),
        credential: def.credential.clone().unwrap_or_default(),
    }
}

/// A whole agent to protobuf.
pub fn full_agent_to_pb(record: &AgentRecord, health: HealthStatus) -> pb::Agent {
    let def = &record.definition;
    agent_to_pb(record, health, record.last_heartbeat, &def.reasoners, &def.skills, Detail::FULL)
}

/// A registration to protobuf (for clients).
pub fn definition_to_pb(def: &AgentDefinition) -> pb::Agent {
    let now = Utc::now();
    let record = AgentRecord {
        definition: def.clone(),
        registered_at: now,
        updated_at: now,
        last_heartbeat: now,
        reported_status: agentmesh_core::ReportedStatus::Active,
    };
    let mut agent = full_agent_to_pb(&record, HealthStatus::Active);
    agent.health_status = pb::HealthStatus::Unspecified as i32;
    agent.last_heartbeat = None;
    agent.registered_at = None;
    agent
}

/// A protobuf agent as the JSON document the REST API returns.
pub fn agent_pb_to_json(agent: &pb::Agent) -> Value {
    let caps = |list: &[pb::Capability]| -> Vec<Value> {
        list.iter()
            .map(|c| {
                let mut v = serde_json::json!({
                    "id": c.id, "description": c.description, "tags": c.tags, "endpoint": c.endpoint,
                    "internal": c.internal, "invocation_target": c.invocation_target,
                });
                if let Some(s) = &c.input_schema {
                    v["input_schema"] = struct_to_json(s);
                }
                if let Some(s) = &c.output_schema {
                    v["output_schema"] = struct_to_json(s);
                }
                if !c.examples.is_empty() {
                    v["examples"] = Value::Array(c.examples.iter().map(struct_to_json).collect());
                }
                if let Some(hints) = &c.hints {
                    v["hints"] = serde_json::to_value(hints_from_pb(hints)).unwrap_or(Value::Null);
                }
                v
            })
            .collect()
    };
    let ts = |t: &Option<prost_types::Timestamp>| {
        t.as_ref()
            .and_then(|t| DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0)))
            .map(crate::render::timestamp)
    };
    let mut json = serde_json::json!({
        "id": agent.id,
        "base_url": agentmesh_server::redact(&agent.base_url),
        "transport": transport_from_pb(agent.transport).as_str(),
        "version": agent.version,
        "deployment_type": if agent.deployment_type == pb::DeploymentType::Serverless as i32 { "serverless" } else { "long_running" },
        "tags": agent.tags,
        "health_status": health_name(agent.health_status),
        "last_heartbeat": ts(&agent.last_heartbeat),
        "registered_at": ts(&agent.registered_at),
        "updated_at": ts(&agent.updated_at),
        "reasoners": caps(&agent.reasoners),
        "skills": caps(&agent.skills),
    });
    if !agent.credential.is_empty() {
        json["credential"] = Value::String(agent.credential.clone());
    }
    json
}

/// Lowercase name of a protobuf health value.
pub fn health_name(value: i32) -> &'static str {
    match pb::HealthStatus::try_from(value) {
        Ok(pb::HealthStatus::Active) => "active",
        Ok(pb::HealthStatus::Degraded) => "degraded",
        Ok(pb::HealthStatus::Inactive) => "inactive",
        _ => "unknown",
    }
}

fn capability_from_pb(c: &pb::Capability) -> Capability {
    Capability {
        id: c.id.clone(),
        description: c.description.clone(),
        tags: c.tags.clone(),
        input_schema: c.input_schema.as_ref().map(|s| RawJson::from_value(&struct_to_json(s))),
        output_schema: c.output_schema.as_ref().map(|s| RawJson::from_value(&struct_to_json(s))),
        examples: c.examples.iter().map(|s| RawJson::from_value(&struct_to_json(s))).collect(),
        endpoint: c.endpoint.clone(),
        internal: c.internal,
        hints: c.hints.as_ref().map(hints_from_pb),
    }
}

/// A registration from protobuf. Capabilities go to the list they are in;
/// a `kind` that disagrees with the list is reported by the caller.
pub fn definition_from_pb(agent: &pb::Agent) -> AgentDefinition {
    AgentDefinition {
        id: agent.id.clone(),
        base_url: agent.base_url.clone(),
        transport: transport_from_pb(agent.transport),
        version: agent.version.clone(),
        deployment_type: match pb::DeploymentType::try_from(agent.deployment_type) {
            Ok(pb::DeploymentType::Serverless) => DeploymentType::Serverless,
            _ => DeploymentType::LongRunning,
        },
        tags: agent.tags.clone(),
        reasoners: agent.reasoners.iter().map(capability_from_pb).collect(),
        skills: agent.skills.iter().map(capability_from_pb).collect(),
        credential: (!agent.credential.is_empty()).then(|| agent.credential.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trips_through_struct() {
        let v = json!({"a": 1, "b": [true, null, "x", 2.5], "c": {"d": -3}});
        let s = json_to_struct(&v).unwrap_or_default();
        assert_eq!(struct_to_json(&s), v);
    }

    #[test]
    fn transports_and_hints_round_trip_through_protobuf() {
        use agentmesh_core::{Hints, Transport};
        let def: AgentDefinition = serde_json::from_value(json!({
            "id": "shop", "base_url": "http://shop:1/mcp", "transport": "mcp",
            "skills": [{"id": "charge", "hints": {"idempotent": false, "open_world": true}}, {"id": "look"}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let agent = definition_to_pb(&def);
        assert_eq!(agent.transport, pb::Transport::Mcp as i32);
        let hints = agent.skills[0].hints.unwrap_or_default();
        assert_eq!((hints.idempotent, hints.open_world, hints.read_only), (Some(false), Some(true), None));
        assert_eq!(agent.skills[1].hints, None);
        let back = definition_from_pb(&agent);
        assert_eq!(back.transport, Transport::Mcp);
        let hints: Vec<Option<Hints>> = back.skills.iter().map(|c| c.hints).collect();
        assert_eq!(hints, def.skills.iter().map(|c| c.hints).collect::<Vec<_>>());
        let json = agent_pb_to_json(&agent);
        assert_eq!(json["transport"], "mcp");
        assert_eq!(json["skills"][0]["hints"], json!({"idempotent": false, "open_world": true}));
        assert!(json["skills"][1].get("hints").is_none());
        for transport in [Transport::Http, Transport::Grpc, Transport::Mcp] {
            assert_eq!(transport_from_pb(transport_to_pb(transport) as i32), transport);
        }
        assert_eq!(transport_from_pb(pb::Transport::Unspecified as i32), Transport::Http);
    }
}
