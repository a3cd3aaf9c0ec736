//! Capability hints decide whether a call that may have reached its agent
//! is made again: a capability declared not idempotent is called once when
//! its agent does not answer in time; one without hints is retried, and a
//! failure that says the call was not taken is retried whatever the hints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_testkit::{Answer, Backend, Behavior, FakeAgent};
use common::{Mesh, event_for, kinds, of_kind, options, plan, step};
use pb::ExecutionEventKind as Kind;
use serde_json::json;

async fn a_call_that_may_have_run_is_not_repeated_for_a_non_idempotent_capability(backend: Backend) {
    let Some(mesh) = Mesh::start(backend).await else { return };
    let slow = Answer::ok(json!({"done": true})).after(Duration::from_secs(3));
    let agent = FakeAgent::start(vec![
        ("charge", Behavior::Always(slow.clone())),
        ("lookup", Behavior::Always(slow)),
        ("refund", Behavior::Sequence(vec![Answer::status(503, json!({"error": "busy"})), Answer::ok(json!({}))])),
        (
            "transfer",
            Behavior::Sequence(vec![
                Answer::ok(json!({"done": true})).after(Duration::from_secs(3)),
                Answer::ok(json!({"transferred": 10})),
            ]),
        ),
    ])
    .await
    .unwrap();
    // One agent id each: every agent keeps its own circuit.
    let mut shop = agent.registration("shop", &[("charge", None)]);
    shop["skills"][0]["hints"] = json!({"idempotent": false});
    mesh.register(&shop).await;
    mesh.register(&agent.registration("catalog", &[("lookup", None)])).await;
    let mut bank = agent.registration("bank", &[("refund", None)]);
    bank["skills"][0]["hints"] = json!({"idempotent": false, "destructive": true});
    mesh.register(&bank).await;
    // Not idempotent, but the agent honours the Idempotency-Key: a repeat is safe.
    let mut ledger = agent.registration("ledger", &[("transfer", None)]);
    ledger["skills"][0]["hints"] = json!({"idempotent": false, "idempotency_key": true});
    mesh.register(&ledger).await;

    let events = mesh
        .run(
            plan(vec![
                step("s1", "shop", "charge", json!({"amount": 10}), &[]),
                step("s2", "catalog", "lookup", json!({}), &[]),
                step("s3", "bank", "refund", json!({}), &[]),
                step("s4", "ledger", "transfer", json!({"amount": 10}), &[]),
            ]),
            options(2, 200),
        )
        .await
        .unwrap();

    // Declared not idempotent, timed out: called once, and the error says why.
    assert_eq!(agent.calls_to("charge").len(), 1, "{:?}", kinds(&events));
    assert!(of_kind(&events, Kind::StepRetrying).iter().all(|e| e.step_id != "s1"), "{:?}", kinds(&events));
    let failed = event_for(&events, Kind::StepFailed, "s1");
    assert_eq!(failed.attempt, 1);
    assert!(failed.error.starts_with("no answer from http://"), "{}", failed.error);
    assert!(
        failed.error.ends_with(
            "within 200 ms (not retried: `shop:charge` is not idempotent, and the call may have reached it)"
        ),
        "{}",
        failed.error
    );

    // No hints: retried as before.
    assert_eq!(agent.calls_to("lookup").len(), 3);
    let failed = event_for(&events, Kind::StepFailed, "s2");
    assert!(failed.error.contains("within 200 ms") && failed.error.ends_with("(after 3 attempts)"), "{}", failed.error);
    assert_eq!(failed.attempt, 3);

    // A 503 says the call was not taken: retried although not idempotent.
    assert_eq!(agent.calls_to("refund").len(), 2);
    assert_eq!(event_for(&events, Kind::StepSucceeded, "s3").attempt, 2);

    // The agent honours the key: retried after the timeout, with the same key.
    let transfers = agent.calls_to("transfer");
    assert_eq!(transfers.len(), 2, "{:?}", kinds(&events));
    assert_eq!(transfers[0].headers.get("idempotency-key"), transfers[1].headers.get("idempotency-key"));
    assert_eq!(event_for(&events, Kind::StepSucceeded, "s4").attempt, 2);
}

agentmesh_testkit::both_backends!(a_call_that_may_have_run_is_not_repeated_for_a_non_idempotent_capability);
