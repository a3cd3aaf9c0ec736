//! An agent registered with the gRPC transport, served for real with
//! `agentmesh.v1.AgentService`: invoked with the same contract as HTTP
//! agents (idempotency key and request id in metadata), retried on
//! `UNAVAILABLE`, and able to ask for collaboration in its answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmesh_proto::json::{from_struct, to_value};
use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use agentmesh_testkit::{Backend, bind_local};
use common::{Mesh, event_for, kinds, options, output, plan, step};
use pb::ExecutionEventKind as Kind;
use serde_json::json;

/// A call and its `idempotency-key` and `x-request-id` metadata.
type Received = (pb::InvokeRequest, Option<String>, Option<String>);

#[derive(Default, Clone)]
struct Calculator {
    calls: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl AgentService for Calculator {
    async fn invoke(
        &self,
        request: tonic::Request<pb::InvokeRequest>,
    ) -> Result<tonic::Response<pb::InvokeResponse>, tonic::Status> {
        let header = |name: &str| request.metadata().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (key, request_id) = (header("idempotency-key"), header("x-request-id"));
        let call = request.into_inner();
        let attempt = {
            let mut calls = self.calls.lock().unwrap();
            calls.push((call.clone(), key, request_id));
            calls.iter().filter(|(c, _, _)| c.capability_id == call.capability_id).count()
        };
        let parameters = call.parameters.as_ref().map(from_struct).unwrap_or_default();
        match call.capability_id.as_str() {
            "add" => {
                let sum = parameters["a"].as_f64().unwrap_or_default() + parameters["b"].as_f64().unwrap_or_default();
                Ok(tonic::Response::new(pb::InvokeResponse {
                    output: Some(to_value(&json!({"sum": sum}))),
                    ..Default::default()
                }))
            }
            "flaky" if attempt == 1 => Err(tonic::Status::unavailable("warming up")),
            "flaky" => Ok(tonic::Response::new(pb::InvokeResponse {
                output: Some(to_value(&json!("ready"))),
                ..Default::default()
            })),
            "refuse" => Ok(tonic::Response::new(pb::InvokeResponse {
                error: "numbers only".into(),
                retryable: false,
                ..Default::default()
            })),
            other => Err(tonic::Status::unimplemented(format!("no capability {other}"))),
        }
    }
}

async fn a_grpc_agent_is_invoked_with_the_same_contract(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let calculator = Calculator::default();
    let listener = bind_local().await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = tonic::service::Routes::new(AgentServiceServer::new(calculator.clone())).into_axum_router();
    tokio::spawn(async move { axum::serve(listener, app).await });
    mesh.register(&json!({"id": "calculator", "base_url": url, "transport": "grpc", "reasoners": [
        {"id": "add", "description": "Adds"}, {"id": "flaky", "description": "Flaky"}, {"id": "refuse", "description": "Refuses"}]}))
        .await;
    let p = plan(vec![
        step("s1", "calculator", "add", json!({"a": 2, "b": 40}), &[]),
        step("s2", "calculator", "add", json!({"a": "{{s1.output.sum}}", "b": 0.5}), &["s1"]),
        step("s3", "calculator", "flaky", json!({}), &[]),
        step("s4", "calculator", "refuse", json!({}), &[]),
    ]);
    let events = mesh.run(p, options(2, 5_000)).await.unwrap();
    assert_eq!(output(&events, "s1"), json!({"sum": 42}));
    assert_eq!(output(&events, "s2"), json!({"sum": 42.5}));
    assert_eq!(output(&events, "s3"), json!("ready"));
    let retry = event_for(&events, Kind::StepRetrying, "s3");
    assert!(retry.error.contains("Unavailable") && retry.error.contains("warming up"), "{}", retry.error);
    let refused = event_for(&events, Kind::StepFailed, "s4");
    assert_eq!(refused.error, "the agent reported an error: numbers only");
    assert_eq!(refused.attempt, 1, "not retryable: {:?}", kinds(&events));
    let calls = calculator.calls.lock().unwrap().clone();
    let execution_id = &events[0].execution_id;
    for (call, key, request_id) in &calls {
        assert_eq!(key.as_deref(), Some(format!("{execution_id}/{}", call.step_id).as_str()));
        assert_eq!(request_id.as_deref(), Some("req_test"));
        assert_eq!(call.execution_id, *execution_id);
        assert_eq!(call.agent_id, "calculator");
        assert_eq!(call.kind, pb::CapabilityKind::Reasoner as i32);
        assert_eq!(call.instruction, format!("do {}", call.step_id));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

async fn a_grpc_agent_at_an_https_address_is_called_over_tls(backend: Backend) {
    agentmesh_testkit::install_tls();
    let pki = agentmesh_testkit::TestPki::new("grpc-agent").unwrap();
    let issued = pki.issue("calculator").unwrap();
    let files = agentmesh_server::tls::TlsFiles { cert: issued.cert, key: issued.key, client_ca: None };
    let tls = agentmesh_server::tls::ServerTls::watch(files, "calculator").unwrap();
    let calculator = Calculator::default();
    let listener = bind_local().await.unwrap();
    let url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let app = tonic::service::Routes::new(AgentServiceServer::new(calculator.clone())).into_axum_router();
    tokio::spawn(agentmesh_server::serve(
        "calculator",
        listener,
        app,
        std::future::pending(),
        agentmesh_server::ConnectionLimits::default(),
        Some(tls),
    ));
    let ca = pki.ca_file();
    let Some(mesh) = Mesh::start_with(backend, |c| c.agent_ca_file = Some(ca)).await else { return };
    mesh.register(&json!({"id": "calculator", "base_url": url, "transport": "grpc",
        "reasoners": [{"id": "add", "description": "Adds"}]}))
        .await;
    let events =
        mesh.run(plan(vec![step("s1", "calculator", "add", json!({"a": 2, "b": 40}), &[])]), options(0, 5000)).await;
    let events = events.unwrap();
    assert_eq!(output(&events, "s1"), json!({"sum": 42}), "{:?}", kinds(&events));
    assert_eq!(calculator.calls.lock().unwrap().len(), 1);
}

agentmesh_testkit::both_backends!(
    a_grpc_agent_is_invoked_with_the_same_contract,
    a_grpc_agent_at_an_https_address_is_called_over_tls
);
