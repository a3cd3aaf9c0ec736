//! The gRPC DiscoveryService: thin handlers over the registry.

use std::sync::Arc;
use std::time::Instant;

use agentmesh_core::query::{DEFAULT_LIMIT, MAX_LIMIT};
use agentmesh_core::{CapabilityQuery, CatalogPage, HealthStatus, Pattern, ReportedStatus};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_server::DiscoveryService;
use bytes::Buf;
use chrono::{DateTime, Utc};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::cache::{Encoded, Source};
use crate::convert::{Detail, agent_to_pb, definition_from_pb, full_agent_to_pb, health_to_pb, timestamp};
use crate::encoded::EncodedReply;
use crate::error::DiscoveryError;
use crate::registry::Registry;
use crate::render::{Format, render};
use crate::watch_catalog::{self, WatchSlots};

/// The gRPC service.
pub struct DiscoveryGrpc {
    registry: Arc<Registry>,
    watch_slots: WatchSlots,
}

impl DiscoveryGrpc {
    /// A service over the registry, serving at most `max_watch_streams`
    /// `WatchCatalog` streams at once.
    pub fn new(registry: Arc<Registry>, max_watch_streams: usize) -> Self {
        let watch_slots = WatchSlots::new(max_watch_streams, registry.metrics().watch_streams.clone());
        Self { registry, watch_slots }
    }

    /// ListCapabilities, answered with the encoded response. A structured
    /// answer does not depend on the time of the request except for
    /// `discovered_at`, so its body is encoded once per query and catalog
    /// state and shared; `discovered_at` travels as a field of its own after
    /// it (protobuf readers accept fields in any order).
    pub async fn list_capabilities_encoded(
        &self,
        request: Request<pb::ListCapabilitiesRequest>,
    ) -> Result<Response<EncodedReply>, Status> {
        let started = Instant::now();
        let request_id = request_id(&request);
        let metrics = self.registry.metrics();
        let (query, format) = match query_from_pb(request.get_ref()) {
            Ok(parsed) => parsed,
            Err(e) => {
                metrics.requests.with_label_values(&["grpc", "error"]).inc();
                return Err(e.into());
            }
        };
        let label = format.map_or("grpc", Format::as_str);
        let detail = Detail {
            descriptions: query.include_descriptions,
            input_schema: query.include_input_schema,
            output_schema: query.include_output_schema,
            examples: query.include_examples,
        };
        let response = |page: &CatalogPage<'_>, now: Option<DateTime<Utc>>| pb::ListCapabilitiesResponse {
            discovered_at: now.map(timestamp),
            total_agents: u32::try_from(page.total_agents).unwrap_or(u32::MAX),
            total_reasoners: u32::try_from(page.total_reasoners).unwrap_or(u32::MAX),
            total_skills: u32::try_from(page.total_skills).unwrap_or(u32::MAX),
            pagination: Some(pb::Pagination {
                limit: u32::try_from(page.limit).unwrap_or(u32::MAX),
                offset: u32::try_from(page.offset).unwrap_or(u32::MAX),
                has_more: page.has_more,
            }),
            capabilities: page
                .agents
                .iter()
                .map(|m| {
                    let mut agent = agent_to_pb(
                        m.record,
                        m.health,
                        m.last_heartbeat,
                        m.reasoners.iter().copied(),
                        m.skills.iter().copied(),
                        detail,
                    );
                    // A listing shows an agent's address without its
                    // credentials; `GetAgent` and `WatchCatalog`, which the
                    // executor calls agents by, carry it as registered.
                    if let std::borrow::Cow::Owned(shown) = agentmesh_server::redacted(&agent.base_url) {
                        agent.base_url = shown;
                    }
                    agent
                })
                .collect(),
            rendered: match (format, now) {
                (Some(f), Some(now)) => render(f, page, &query, now),
                _ => String::new(),
            },
        };
        let result = match format {
            // Rendered text embeds the time: built for each request.
            Some(_) => {
                self.registry
                    .query(&query, |page, now| {
                        let body = response(page, Some(now)).encode_to_vec().into();
                        (Encoded { body, counts: Encoded::counts_of(page) }, Vec::new(), false)
                    })
                    .await
            }
            None => self
                .registry
                .query_encoded(&query, format!("grpc {query:?}"), |page| Encoded {
                    body: response(page, None).encode_to_vec().into(),
                    counts: Encoded::counts_of(page),
                })
                .await
                .map(|(encoded, source, shared)| {
                    let mut tail = Vec::with_capacity(16);
                    prost::encoding::message::encode(DISCOVERED_AT_TAG, &timestamp(Utc::now()), &mut tail);
                    ((encoded, tail, shared), source)
                }),
        };
        let elapsed = started.elapsed();
        metrics.duration.with_label_values(&[label]).observe(elapsed.as_secs_f64());
        match result {
            Ok(((encoded, tail, shared), source)) => {
                metrics.requests.with_label_values(&[label, "success"]).inc();
                tracing::info!(
                    request_id,
                    operation = "list_capabilities",
                    format = label,
                    agents = encoded.counts[0],
                    duration_ms = elapsed.as_secs_f64() * 1000.0,
                    cache_hit = source == Source::Hit,
                    shared_body = shared,
                    "discovery request completed"
                );
                Ok(Response::new(EncodedReply { body: encoded.body, tail }))
            }
            Err(e) => {
                metrics.requests.with_label_values(&[label, "error"]).inc();
                tracing::error!(request_id, error = %e, "discovery request failed");
                Err(e.into())
            }
        }
    }
}

/// Field number of `ListCapabilitiesResponse.discovered_at`.
const DISCOVERED_AT_TAG: u32 = 1;

fn request_id<T>(request: &Request<T>) -> String {
    agentmesh_server::call_request_id(request.metadata(), "").unwrap_or_else(|_| agentmesh_server::new_request_id())
}

fn health_from_pb(value: i32, field: &str) -> Result<Option<HealthStatus>, DiscoveryError> {
    match pb::HealthStatus::try_from(value) {
        Ok(pb::HealthStatus::Unspecified) => Ok(None),
        Ok(pb::HealthStatus::Active) => Ok(Some(HealthStatus::Active)),
        Ok(pb::HealthStatus::Degraded) => Ok(Some(HealthStatus::Degraded)),
        Ok(pb::HealthStatus::Inactive) => Ok(Some(HealthStatus::Inactive)),
        Err(_) => Err(DiscoveryError::invalid(field, &value.to_string(), format!("unknown {field} value {value}"))),
    }
}

/// A gRPC list request as a domain query, with the same limits as REST.
pub fn query_from_pb(r: &pb::ListCapabilitiesRequest) -> Result<(CapabilityQuery, Option<Format>), DiscoveryError> {
    let limit = match r.limit {
        0 => DEFAULT_LIMIT,
        n if n as usize <= MAX_LIMIT => n as usize,
        n => {
            return Err(DiscoveryError::invalid(
                "limit",
                &n.to_string(),
                format!("Invalid limit parameter. Must be an integer between 1 and {MAX_LIMIT}"),
            ));
        }
    };
    let format = match pb::RenderFormat::try_from(r.format) {
        Ok(pb::RenderFormat::Unspecified) => None,
        Ok(pb::RenderFormat::Json) => Some(Format::Json),
        Ok(pb::RenderFormat::Xml) => Some(Format::Xml),
        Ok(pb::RenderFormat::Compact) => Some(Format::Compact),
        Err(_) => return Err(DiscoveryError::not_one_of("format", &r.format.to_string(), &Format::NAMES)),
    };
    let non_empty = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(Pattern::new);
    let query = CapabilityQuery {
        agent_ids: r.agent_ids.iter().filter(|s| !s.is_empty()).cloned().collect(),
        reasoner: non_empty(&r.reasoner),
        skill: non_empty(&r.skill),
        tags: r.tags.iter().filter(|s| !s.is_empty()).map(|t| Pattern::new(t)).collect(),
        include_input_schema: r.include_input_schema,
        include_output_schema: r.include_output_schema,
        include_descriptions: r.include_descriptions.unwrap_or(true),
        include_examples: r.include_examples,
        health_status: health_from_pb(r.health_status, "health_status")?,
        limit,
        offset: r.offset as usize,
        exclude_agents: r.exclude_agents.clone(),
        include_internal: r.include_internal,
    };
    Ok((query, format))
}

#[tonic::async_trait]
impl DiscoveryService for DiscoveryGrpc {
    async fn register_agent(
        &self,
        request: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let Some(agent) = request.into_inner().agent else {
            return Err(DiscoveryError::invalid("agent", "", "agent is required").into());
        };
        let (record, created) = self.registry.register(&principal, definition_from_pb(&agent)).await?;
        Ok(Response::new(pb::RegisterAgentResponse {
            agent: Some(full_agent_to_pb(&record, HealthStatus::Active)),
            created,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let r = request.into_inner();
        let status = match health_from_pb(r.status, "status")? {
            None | Some(HealthStatus::Active) => ReportedStatus::Active,
            Some(HealthStatus::Degraded) => ReportedStatus::Degraded,
            Some(HealthStatus::Inactive) => {
                return Err(
                    DiscoveryError::invalid("status", "INACTIVE", "an agent may report ACTIVE or DEGRADED").into()
                );
            }
        };
        let record = self.registry.heartbeat(&principal, &r.agent_id, status).await?;
        let policy = self.registry.policy();
        let health = policy.derive(record.last_heartbeat, record.reported_status, chrono::Utc::now());
        Ok(Response::new(pb::HeartbeatResponse {
            health_status: health_to_pb(health) as i32,
            heartbeat_interval_seconds: u32::try_from(policy.heartbeat_interval.as_secs()).unwrap_or(u32::MAX).max(1),
        }))
    }

    async fn deregister_agent(
        &self,
        request: Request<pb::DeregisterAgentRequest>,
    ) -> Result<Response<pb::DeregisterAgentResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let agent_id = request.into_inner().agent_id;
        self.registry.deregister(&principal, &agent_id).await?;
        Ok(Response::new(pb::DeregisterAgentResponse {}))
    }

    async fn get_agent(&self, request: Request<pb::GetAgentRequest>) -> Result<Response<pb::GetAgentResponse>, Status> {
        let principal = agentmesh_server::principal_of(request.extensions());
        let (record, health) = self.registry.get(&request.into_inner().agent_id).await?;
        let mut agent = full_agent_to_pb(&record, health);
        // The address as registered is for the executor (a service) and
        // operators: anyone else sees it without its credentials.
        if !principal.sees_everything() {
            agent.base_url = agentmesh_server::redact(&agent.base_url);
        }
        Ok(Response::new(pb::GetAgentResponse { agent: Some(agent) }))
    }

    async fn list_capabilities(
        &self,
        request: Request<pb::ListCapabilitiesRequest>,
    ) -> Result<Response<pb::ListCapabilitiesResponse>, Status> {
        // The server routes this method to `list_capabilities_encoded`
        // directly (see `encoded.rs`); this path serves in-process callers.
        let reply = self.list_capabilities_encoded(request).await?.into_inner();
        pb::ListCapabilitiesResponse::decode(reply.body.chain(reply.tail.as_slice()))
            .map(Response::new)
            .map_err(|e| Status::internal(format!("re-reading an encoded response: {e}")))
    }

    type WatchCatalogStream = watch_catalog::WatchStream;

    async fn watch_catalog(
        &self,
        request: Request<pb::WatchCatalogRequest>,
    ) -> Result<Response<Self::WatchCatalogStream>, Status> {
        let slot = self.watch_slots.take().inspect_err(|e| tracing::warn!(error = %e, "WatchCatalog refused"))?;
        // Subscribe before reading the snapshot so that nothing falls between.
        let events = self.registry.subscribe();
        let initial = if request.into_inner().include_snapshot { self.registry.observed().await? } else { Vec::new() };
        Ok(Response::new(watch_catalog::stream(self.registry.clone(), slot, initial, events)))
    }
}
