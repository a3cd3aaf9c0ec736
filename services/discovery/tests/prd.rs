//! The discovery API's unit cases (PRD §5.1) and integration scenarios
//! (PRD §5.2), over real HTTP against a real database, on both backends.

mod common;

use std::time::Duration;

use agentmesh_testkit::Backend;
use common::{Ctx, agent_ids, catalog, targets};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn ctx(backend: Backend) -> Option<Ctx> {
    let ctx = Ctx::start(backend).await?;
    ctx.register_catalog().await;
    Some(ctx)
}

// 1. Basic discovery (no filters)
async fn basic_discovery(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let body = ctx.discover("").await;
    assert_eq!(body["total_agents"], 3);
    assert_eq!(body["total_reasoners"], 4);
    assert_eq!(body["total_skills"], 4, "the internal skill is not listed by default");
    assert_eq!(body["pagination"], json!({"limit": 100, "offset": 0, "has_more": false}));
    assert_eq!(agent_ids(&body), ["agent-data-003", "agent-ml-002", "agent-research-001"], "ordered by agent id");
    assert!(!targets(&body).iter().any(|t| t.ends_with("orchestrate_natural")));
    let data = &body["capabilities"][0];
    assert_eq!(data["reasoners"], json!([]), "empty lists are [], never null");
    assert_eq!(data["health_status"], "active");
    assert_eq!(data["deployment_type"], "long_running");
    assert_eq!(data["base_url"], "http://agent-data:8080");
    assert!(data["last_heartbeat"].as_str().is_some_and(|s| s.ends_with('Z')));
    assert_eq!(data["skills"][0]["invocation_target"], "agent-data-003:skill:get_current_weather");
    let research = &body["capabilities"][2];
    assert_eq!(research["reasoners"][0]["invocation_target"], "agent-research-001:deep_research");
    let with_internal = ctx.discover("include_internal=true").await;
    assert!(targets(&with_internal).contains(&"agent-research-001:orchestrate_natural".to_owned()));
}

// 2. Filter by single agent_id
async fn single_agent(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let body = ctx.discover("agent=agent-ml-002").await;
    assert_eq!(agent_ids(&body), ["agent-ml-002"]);
    assert_eq!(body["total_reasoners"], 2);
    // Agent ids are exact, not patterns.
    assert_eq!(ctx.discover("agent=agent-ml-*").await["capabilities"], json!([]));
    assert_eq!(ctx.discover("agent=AGENT-ML-002").await["total_agents"], 0);
}

// 3. Filter by multiple agent_ids
async fn multiple_agents(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let body = ctx.discover("agent_ids=agent-ml-002,agent-data-003").await;
    assert_eq!(agent_ids(&body), ["agent-data-003", "agent-ml-002"]);
    let body = ctx.discover("agent_ids=agent-ml-002,agent-data-003&exclude_agents=agent-ml-002").await;
    assert_eq!(agent_ids(&body), ["agent-data-003"]);
}

// 4. Alias support (agent vs node_id, agent_ids vs node_ids)
async fn aliases(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    assert_eq!(
        ctx.discover("agent=agent-ml-002").await["capabilities"],
        ctx.discover("node_id=agent-ml-002").await["capabilities"]
    );
    let a = ctx.discover("agent_ids=agent-ml-002,agent-data-003").await;
    let b = ctx.discover("node_ids=agent-ml-002,agent-data-003").await;
    assert_eq!(a["capabilities"], b["capabilities"]);
    assert_eq!(agent_ids(&b).len(), 2);
}

// 5. Wildcard pattern matching (contains, prefix, suffix, exact)
async fn wildcards(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    assert_eq!(
        targets(&ctx.discover("reasoner=*research*").await),
        ["agent-ml-002:research_agent", "agent-research-001:deep_research", "agent-research-001:web_researcher"]
    );
    assert_eq!(targets(&ctx.discover("reasoner=deep_*").await), ["agent-research-001:deep_research"]);
    assert_eq!(targets(&ctx.discover("skill=*_weather").await), ["agent-data-003:get_current_weather"]);
    assert_eq!(targets(&ctx.discover("skill=web_search").await), ["agent-research-001:web_search"]);
    assert_eq!(ctx.discover("skill=web_searc").await["total_skills"], 0, "no wildcard means exact");
    assert_eq!(ctx.discover("skill=WEB_*").await["total_skills"], 0, "patterns are case-sensitive");
}

// 6. Tag filtering with wildcards
async fn tags(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    assert_eq!(
        targets(&ctx.discover("tags=ml*").await),
        ["agent-ml-002:research_agent", "agent-ml-002:web_scraper", "agent-research-001:deep_research"]
    );
    assert_eq!(
        targets(&ctx.discover("tags=nlp,*ther").await),
        ["agent-data-003:get_current_weather", "agent-ml-002:summarize"],
        "any pattern matching any tag"
    );
    // Tags AND the kind filter.
    assert_eq!(
        targets(&ctx.discover("tags=data&skill=*").await),
        ["agent-data-003:get_current_weather", "agent-research-001:web_search"]
    );
}

// 7. Reasoner filtering: only reasoners come back
async fn reasoner_filter(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let body = ctx.discover("reasoner=*").await;
    assert_eq!(body["total_skills"], 0);
    assert_eq!(body["total_reasoners"], 4);
    assert_eq!(agent_ids(&body), ["agent-ml-002", "agent-research-001"], "agents without a match are left out");
    // Both given: each kind filtered by its own pattern.
    let both = ctx.discover("reasoner=summarize&skill=web_p*").await;
    assert_eq!(targets(&both), ["agent-ml-002:summarize", "agent-ml-002:web_parser"]);
}

// 8. Skill filtering: only skills come back
async fn skill_filter(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let body = ctx.discover("skill=web_*").await;
    assert_eq!(body["total_reasoners"], 0);
    assert_eq!(
        targets(&body),
        ["agent-ml-002:web_scraper", "agent-ml-002:web_parser", "agent-research-001:web_search"]
    );
}

// 9. Schema inclusion flags
async fn schema_flags(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let deep = |body: &Value| body["capabilities"][0]["reasoners"][0].clone();
    let plain = deep(&ctx.discover("reasoner=deep_research").await);
    assert!(
        plain.get("input_schema").is_none() && plain.get("output_schema").is_none() && plain.get("examples").is_none()
    );
    assert_eq!(plain["description"], "Performs comprehensive research using multiple sources");
    let full = deep(
        &ctx.discover("reasoner=deep_research&include_input_schema=true&include_output_schema=true&include_examples=true&include_descriptions=false")
            .await,
    );
    assert_eq!(full["input_schema"]["required"], json!(["query"]));
    assert_eq!(full["output_schema"]["properties"]["confidence"]["maximum"], 1);
    assert_eq!(full["examples"][0]["input"]["depth"], 3);
    assert!(full.get("description").is_none());
}

// 10. JSON format response
async fn json_format(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let response = ctx
        .http
        .get(ctx.url("/api/v1/discovery/capabilities?format=json"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.unwrap_or_else(|e| panic!("{e}"));
    for key in ["discovered_at", "total_agents", "total_reasoners", "total_skills", "pagination", "capabilities"] {
        assert!(body.get(key).is_some(), "missing {key}");
    }
}

// 11. XML format response
async fn xml_format(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let response = ctx
        .http
        .get(ctx.url("/api/v1/discovery/capabilities?format=xml&include_input_schema=true&agent=agent-research-001"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(response.headers()["content-type"].to_str().unwrap_or_default().starts_with("application/xml"));
    let text = response.text().await.unwrap_or_default();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("not well-formed XML: {e}\n{text}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "discovery");
    let summary = root.children().find(|n| n.has_tag_name("summary")).unwrap_or_else(|| panic!("no summary"));
    assert_eq!(summary.attribute("total_agents"), Some("1"));
    let reasoner =
        doc.descendants().find(|n| n.attribute("id") == Some("deep_research")).unwrap_or_else(|| panic!("no reasoner"));
    assert_eq!(reasoner.attribute("target"), Some("agent-research-001:deep_research"));
    let query = doc
        .descendants()
        .find(|n| n.has_tag_name("field") && n.attribute("name") == Some("query"))
        .unwrap_or_else(|| panic!("no field"));
    assert_eq!((query.attribute("type"), query.attribute("required")), (Some("string"), Some("true")));
    let depth = doc.descendants().find(|n| n.attribute("name") == Some("depth")).unwrap_or_else(|| panic!("no depth"));
    assert_eq!(
        (depth.attribute("min"), depth.attribute("max"), depth.attribute("default")),
        (Some("1"), Some("5"), Some("3"))
    );
}

// 12. Compact format response
async fn compact_format(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let body = ctx.discover("format=compact").await;
    assert_eq!(body["reasoners"].as_array().map(Vec::len), Some(4));
    assert_eq!(body["skills"].as_array().map(Vec::len), Some(4));
    assert_eq!(
        body["skills"][0],
        json!({"id": "get_current_weather", "agent_id": "agent-data-003", "target": "agent-data-003:skill:get_current_weather", "tags": ["weather", "data"]})
    );
    assert!(body.get("capabilities").is_none());
    let empty = ctx.discover("format=compact&agent=nobody").await;
    assert_eq!((empty["reasoners"].clone(), empty["skills"].clone()), (json!([]), json!([])));
}

// 13. Pagination (limit/offset), 5.2.4 large result sets
async fn pagination(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    for i in 0..120 {
        ctx.register(&json!({"id": format!("agent-{i:03}"), "base_url": "http://a:1", "skills": [{"id": "s", "tags": ["bulk"]}]})).await;
    }
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let page = ctx.discover(&format!("limit=50&offset={offset}")).await;
        assert_eq!(page["total_agents"], 120);
        let ids = agent_ids(&page);
        assert_eq!(page["pagination"]["has_more"], offset + ids.len() < 120);
        if ids.is_empty() {
            break;
        }
        offset += ids.len();
        seen.extend(ids);
    }
    assert_eq!(seen.len(), 120);
    assert_eq!(seen, (0..120).map(|i| format!("agent-{i:03}")).collect::<Vec<_>>(), "every agent once, in id order");
    let default_page = ctx.discover("").await;
    assert_eq!(agent_ids(&default_page).len(), 100);
    assert_eq!(default_page["pagination"]["has_more"], true);
    assert_eq!(agent_ids(&ctx.discover("limit=500").await).len(), 120);
    assert_eq!(agent_ids(&ctx.discover("offset=1000").await).len(), 0);
}

// 14. Health status filtering, derived at query time
async fn health_filter(backend: Backend) {
    let Some(ctx) = Ctx::start_with(backend, |c| c.heartbeat_interval_secs = 0.2).await else { return };
    ctx.register_catalog().await;
    let beat = |id: &'static str, body: Value| {
        let ctx = &ctx;
        async move {
            let (status, _) = ctx.post(&format!("/api/v1/agents/{id}/heartbeat"), &body).await;
            assert_eq!(status, StatusCode::OK);
        }
    };
    beat("agent-ml-002", json!({"status": "degraded"})).await;
    assert_eq!(agent_ids(&ctx.discover("health_status=degraded").await), ["agent-ml-002"], "self-reported degraded");
    assert_eq!(agent_ids(&ctx.discover("health_status=active").await), ["agent-data-003", "agent-research-001"]);
    // Keep agent-data-003 alive while the others fall silent for > 3 intervals.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        beat("agent-data-003", json!({})).await;
    }
    assert_eq!(agent_ids(&ctx.discover("health_status=active").await), ["agent-data-003"]);
    assert_eq!(agent_ids(&ctx.discover("health_status=degraded").await), ["agent-ml-002", "agent-research-001"]);
    // One heartbeat makes an agent active at once: no stale cache.
    beat("agent-research-001", json!({"status": "active"})).await;
    assert_eq!(agent_ids(&ctx.discover("health_status=active").await), ["agent-data-003", "agent-research-001"]);
    // Silent for > 6 intervals: inactive.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        agent_ids(&ctx.discover("health_status=inactive").await),
        ["agent-data-003", "agent-ml-002", "agent-research-001"]
    );
}

// 15. Cache hit/miss scenarios, 5.2.3 invalidation on updates
async fn cache_behaviour(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let misses = ctx.metric("agentmesh_discovery_cache_misses_total").await;
    let hits = ctx.metric("agentmesh_discovery_cache_hits_total").await;
    ctx.discover("").await;
    ctx.discover("").await;
    ctx.discover("format=xml").await;
    let misses_after = ctx.metric("agentmesh_discovery_cache_misses_total").await;
    let hits_after = ctx.metric("agentmesh_discovery_cache_hits_total").await;
    assert!(misses_after - misses <= 1.0, "at most one load for three reads");
    assert!(hits_after - hits >= 2.0);
    // A registration is visible at once (no 30 s TTL wait), then cached again.
    ctx.register(&json!({"id": "agent-new", "base_url": "http://n:1", "skills": [{"id": "fresh"}]})).await;
    assert!(targets(&ctx.discover("").await).contains(&"agent-new:fresh".to_owned()));
    // An update replaces the capabilities.
    ctx.register(&json!({"id": "agent-new", "base_url": "http://n:1", "skills": [{"id": "fresher"}]})).await;
    let body = ctx.discover("agent=agent-new").await;
    assert_eq!(targets(&body), ["agent-new:fresher"]);
    // A removal too.
    assert_eq!(ctx.delete("/api/v1/agents/agent-new").await, StatusCode::NO_CONTENT);
    assert_eq!(ctx.discover("agent=agent-new").await["total_agents"], 0);
    let size = ctx.metric("agentmesh_discovery_cache_size_bytes").await;
    assert!(size > 0.0);
}

// 16. Error handling: invalid format and parameters, with the PRD body
async fn errors(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let (status, body) = ctx.get("/api/v1/discovery/capabilities?format=yaml").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "invalid_parameter");
    assert_eq!(body["message"], "Invalid format parameter. Must be one of: json, xml, compact");
    assert_eq!(
        body["details"],
        json!({"parameter": "format", "provided": "yaml", "allowed": ["json", "xml", "compact"]})
    );
    assert!(body["request_id"].as_str().is_some_and(|r| r.starts_with("req_")));
    for (query, parameter) in [
        ("limit=10abc", "limit"),
        ("limit=501", "limit"),
        ("include_input_schema=maybe", "include_input_schema"),
        ("health_status=sleeping", "health_status"),
        ("offset=-3", "offset"),
        ("colour=red", "colour"),
    ] {
        let (status, body) = ctx.get(&format!("/api/v1/discovery/capabilities?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(body["details"]["parameter"], parameter, "{query}");
        assert!(body["request_id"].is_string());
    }
    // A client-supplied request id is echoed in the body and the header.
    let response = ctx
        .http
        .get(ctx.url("/api/v1/discovery/capabilities?limit=x"))
        .header("x-request-id", "req_client42")
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.headers()["x-request-id"], "req_client42");
    let body: Value = response.json().await.unwrap_or_default();
    assert_eq!(body["request_id"], "req_client42");
}

// 5.2.1 End-to-end registration, lookup, heartbeat and removal over REST
async fn registration_lifecycle(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    let agent = catalog().remove(2);
    let (status, body) = ctx.post("/api/v1/agents", &agent).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["skills"][0]["endpoint"], "/skills/get_current_weather", "default endpoint");
    let (status, _) = ctx.post("/api/v1/agents", &agent).await;
    assert_eq!(status, StatusCode::OK, "re-registration is an update");
    let (status, body) = ctx.get("/api/v1/agents/agent-data-003").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["skills"][0]["input_schema"]["required"], json!(["location"]));
    assert_eq!(body["health_status"], "active");
    let (status, body) = ctx.post("/api/v1/agents/agent-data-003/heartbeat", &json!({"status": "degraded"})).await;
    assert_eq!((status, body["health_status"].clone()), (StatusCode::OK, json!("degraded")));
    let response = ctx
        .http
        .post(ctx.url("/api/v1/agents/agent-data-003/heartbeat"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), StatusCode::OK, "a heartbeat needs no body");
    let (status, body) = ctx.post("/api/v1/agents/agent-data-003/heartbeat", &json!({"status": "sleepy"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = ctx.post("/api/v1/agents/nobody/heartbeat", &json!({})).await;
    assert_eq!((status, body["error"].clone()), (StatusCode::NOT_FOUND, json!("not_found")));
    assert_eq!(ctx.delete("/api/v1/agents/agent-data-003").await, StatusCode::NO_CONTENT);
    assert_eq!(ctx.delete("/api/v1/agents/agent-data-003").await, StatusCode::NOT_FOUND);
    let (status, body) = ctx.get("/api/v1/agents/agent-data-003").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["request_id"].is_string());
    let (status, body) = ctx.get("/api/v1/discovery/capabilitiez").await;
    assert_eq!((status, body["error"].clone()), (StatusCode::NOT_FOUND, json!("not_found")));
}

// Validation at registration names every field
async fn registration_validation(backend: Backend) {
    let Some(ctx) = Ctx::start(backend).await else { return };
    let (status, body) = ctx
        .post(
            "/api/v1/agents",
            &json!({"id": "bad id", "base_url": "ftp://x", "skills": [
                {"id": "a", "input_schema": {"type": "strng"}}, {"id": "a", "output_schema": "nope"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "validation_failed");
    let fields: Vec<&str> =
        body["details"]["errors"].as_array().into_iter().flatten().filter_map(|e| e["field"].as_str()).collect();
    assert_eq!(fields, ["id", "base_url", "skills[0].input_schema", "skills[1].id", "skills[1].output_schema"]);
    let (status, body) =
        ctx.post("/api/v1/agents", &json!({"id": "x", "base_url": "http://x", "transport": "carrier-pigeon"})).await;
    assert_eq!((status, body["error"].clone()), (StatusCode::BAD_REQUEST, json!("invalid_json")));
    assert_eq!(body["details"]["path"], "transport");
    let (status, body) = ctx.post("/api/v1/agents", &json!({"id": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap_or_default().contains("base_url"), "{body}");
    let response =
        ctx.http.post(ctx.url("/api/v1/agents")).body("{not json").send().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // Last, on its own connection: the server closes a connection whose
    // oversized body it did not read.
    let huge = json!({"id": "big", "base_url": "http://x", "skills": [{"id": "s", "description": "x".repeat(1024 * 1024 + 1024)}]});
    let response = agentmesh_testkit::http_client()
        .post(ctx.url("/api/v1/agents"))
        .json(&huge)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = response.json().await.unwrap_or_default();
    assert_eq!(body["error"], "payload_too_large");
}

// 5.2.2 Performance under load: 1,000 concurrent requests, none failing
async fn thousand_concurrent_requests(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let client =
        agentmesh_testkit::http_client_builder().pool_max_idle_per_host(1000).build().unwrap_or_else(|e| panic!("{e}"));
    let queries = [
        "",
        "reasoner=*research*",
        "tags=ml*,web&format=compact",
        "format=xml&include_input_schema=true",
        "skill=web_*&limit=1",
    ];
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let url = ctx.url(&format!("/api/v1/discovery/capabilities?{}", queries[i % queries.len()]));
            let client = client.clone();
            tokio::spawn(async move { client.get(url).send().await.map(|r| r.status()) })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        match task.await {
            Ok(Ok(status)) if status == StatusCode::OK => ok += 1,
            other => panic!("a request failed: {other:?}"),
        }
    }
    assert_eq!(ok, 1000);
    assert_eq!(ctx.metric("agentmesh_discovery_requests_total{format=\"json\",status=\"error\"}").await, 0.0);
}

/// Bodies are shared between requests for the same query and catalog
/// state, but each answer carries the time it was given, in every format.
async fn each_answer_carries_its_own_time(backend: Backend) {
    let Some(ctx) = ctx(backend).await else { return };
    let recent = |text: &str| {
        let at = chrono::DateTime::parse_from_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let age = chrono::Utc::now().signed_duration_since(at);
        assert!(age.num_seconds().abs() <= 5, "discovered_at {text} is not the time of the request");
    };
    for _ in 0..2 {
        recent(ctx.discover("").await["discovered_at"].as_str().unwrap_or_default());
        recent(ctx.discover("format=compact").await["discovered_at"].as_str().unwrap_or_default());
        let (_, xml) = ctx.get("/api/v1/discovery/capabilities?format=xml").await;
        let xml = xml.as_str().unwrap_or_default().to_owned();
        let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}"));
        recent(doc.root_element().attribute("discovered_at").unwrap_or_default());
    }
}

agentmesh_testkit::both_backends!(
    each_answer_carries_its_own_time,
    basic_discovery,
    single_agent,
    multiple_agents,
    aliases,
    wildcards,
    tags,
    reasoner_filter,
    skill_filter,
    schema_flags,
    json_format,
    xml_format,
    compact_format,
    pagination,
    health_filter,
    cache_behaviour,
    errors,
    registration_lifecycle,
    registration_validation,
    thousand_concurrent_requests,
);
