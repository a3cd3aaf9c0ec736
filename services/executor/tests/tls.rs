//! Agents at `https://` addresses: the executor verifies their certificate
//! against the system's roots and `agent_ca_file`, and a certificate it
//! cannot verify fails the step, saying so, with nothing sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Backend, ScriptedLlmServer, ScriptedReply, TEST_CA_PEM};
use common::{Mesh, event_for, options, plan, step};
use pb::ExecutionEventKind as Kind;
use serde_json::json;

async fn an_https_agent_is_called_when_its_certificate_verifies(backend: Backend) {
    agentmesh_testkit::install_tls();
    // A real HTTPS server (the test CA's certificate for 127.0.0.1) answering as an agent.
    let agent = ScriptedLlmServer::start_tls(vec![ScriptedReply::ok(json!({"output": {"temp_c": 21}}))]).await.unwrap();
    let ca = std::env::temp_dir().join(format!("agentmesh-agent-ca-{}-{backend:?}.pem", std::process::id()));
    std::fs::write(&ca, TEST_CA_PEM).unwrap();

    // Without the CA, the certificate cannot be verified: nothing is sent.
    let Some(untrusting) = Mesh::start(backend).await else { return };
    untrusting.register(&json!({"id": "secure", "base_url": agent.url(), "skills": [{"id": "weather"}]})).await;
    let events = untrusting.run(plan(vec![step("s1", "secure", "weather", json!({}), &[])]), options(0, 5000)).await;
    let error = event_for(&events.unwrap(), Kind::StepFailed, "s1").error.clone();
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    assert!(agent.requests().is_empty(), "a request went to an unverified agent");

    let path = ca.clone();
    let Some(trusting) = Mesh::start_with(backend, |c| c.agent_ca_file = Some(path)).await else { return };
    trusting.register(&json!({"id": "secure", "base_url": agent.url(), "skills": [{"id": "weather"}]})).await;
    let events =
        trusting.run(plan(vec![step("s1", "secure", "weather", json!({}), &[])]), options(0, 5000)).await.unwrap();
    let done = event_for(&events, Kind::StepSucceeded, "s1");
    assert!(done.output.is_some(), "{done:?}");
    assert_eq!(agent.requests().len(), 1);
    let _ = std::fs::remove_file(&ca);
}

agentmesh_testkit::both_backends!(an_https_agent_is_called_when_its_certificate_verifies);
