//! The execution store's contract on both backends: creation is
//! idempotent, appends are fenced by ownership and sequence, leases are
//! claimed, renewed and released, cancellations are announced, lists page,
//! and finished executions are purged with their events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentmesh_store::connect_executions;
use agentmesh_store::executions::{
    Append, Created, EventRow, ExecutionFilter, ExecutionNotice, ExecutionStore, NewExecution,
};
use agentmesh_testkit::{Backend, TestDatabase};

fn event(sequence: i64, kind: &str) -> EventRow {
    EventRow {
        sequence,
        kind: kind.into(),
        step_id: if sequence > 1 { "s1".into() } else { String::new() },
        attempt: 1,
        payload: format!("{{\"n\":{sequence}}}"),
        occurred_at_ms: 1_700_000_000_000 + sequence,
    }
}

fn new(id: &str, request_id: &str) -> NewExecution {
    NewExecution {
        id: id.into(),
        request_id: request_id.into(),
        spec: "{\"plan\":1}".into(),
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        steps: 1,
        first_event: event(1, "execution_started"),
        principal: if id == "e3" { "shop".into() } else { String::new() },
    }
}

fn append(id: &str, events: Vec<EventRow>, status: Option<&str>) -> Append {
    Append {
        execution_id: id.into(),
        finished_at_ms: status.filter(|s| *s == "completed").map(|_| 1_700_000_000_999),
        error: None,
        events,
        status: status.map(str::to_owned),
        steps: None,
    }
}

async fn notice(rx: &mut tokio::sync::broadcast::Receiver<ExecutionNotice>) -> ExecutionNotice {
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a notification within 5 s").unwrap()
}

async fn contract(backend: Backend) {
    let Some(db) = TestDatabase::new(backend).await else { return };
    let store = connect_executions(&db.url).await.unwrap();
    let mut notices = store.subscribe();
    assert_eq!(store.create(&new("e1", "r1"), "a", i64::MAX).await.unwrap(), Created::New);
    assert_eq!(notice(&mut notices).await, ExecutionNotice::Appended { id: "e1".into(), last_sequence: 1 });
    match store.create(&new("e1", "other"), "b", i64::MAX).await.unwrap() {
        Created::Existing(row) => assert_eq!((row.request_id.as_str(), row.owner.as_deref()), ("r1", Some("a"))),
        Created::New => panic!("an existing id was created twice"),
    }

    // Appends continue the log, only from its owner, only without gaps.
    let refused = store.append("b", &[append("e1", vec![event(2, "step_started")], Some("running"))], 1).await.unwrap();
    assert_eq!(refused, ["e1"], "another owner is fenced off");
    let refused = store.append("a", &[append("e1", vec![event(3, "step_started")], None)], 1).await.unwrap();
    assert_eq!(refused, ["e1"], "a gap is refused");
    let ok = store
        .append("a", &[append("e1", vec![event(2, "step_started"), event(3, "step_succeeded")], Some("running"))], 1)
        .await
        .unwrap();
    assert!(ok.is_empty());
    assert_eq!(notice(&mut notices).await, ExecutionNotice::Appended { id: "e1".into(), last_sequence: 3 });
    let refused = store.append("a", &[append("e1", vec![event(3, "step_succeeded")], None)], 1).await.unwrap();
    assert_eq!(refused, ["e1"], "a repeat is refused");
    let row = store.get("e1").await.unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.last_sequence, row.traceparent.as_str()),
        ("running", 3, new("e1", "").traceparent.as_str())
    );
    let events = store.events_after("e1", 1, 10).await.unwrap();
    assert_eq!(events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(events[1], event(3, "step_succeeded"));
    assert_eq!(store.events_after("e1", 0, 1).await.unwrap().len(), 1);

    // Leases: claimed when free or run out, renewed by their owner, released.
    store.create(&new("e2", "r1"), "a", 1_000).await.unwrap();
    assert_eq!(store.claim("b", 5_000, 500, 10, false).await.unwrap(), Vec::<String>::new(), "e2's lease runs");
    assert_eq!(store.claim("b", 5_000, 2_000, 10, false).await.unwrap(), ["e2"], "a lease that ran out is taken");
    assert_eq!(store.renew("a", i64::MAX).await.unwrap(), ["e1"]);
    store.release("a", &["e1".into()]).await.unwrap();
    assert_eq!(store.get("e1").await.unwrap().unwrap().owner, None);
    let mut claimed = store.claim("b", 9_000, 2_000, 10, false).await.unwrap();
    claimed.sort();
    assert_eq!(claimed, ["e1", "e2"], "a released execution is free; an owner gets its own back");
    let mut everything = store.claim("c", 9_000, 0, 10, true).await.unwrap();
    everything.sort();
    assert_eq!(everything, ["e1", "e2"], "one executor per database takes everything");

    // A cancellation is recorded once and announced.
    let mut notices = store.subscribe();
    let row = store.request_cancel("e2", "user gave up").await.unwrap().unwrap();
    assert_eq!(row.cancel_requested.as_deref(), Some("user gave up"));
    assert_eq!(notice(&mut notices).await, ExecutionNotice::CancelRequested { id: "e2".into() });
    let row = store.request_cancel("e2", "again").await.unwrap().unwrap();
    assert_eq!(row.cancel_requested.as_deref(), Some("user gave up"));
    assert!(store.request_cancel("nope", "x").await.unwrap().is_none());

    // The end: a finished execution takes no more events and is purged later.
    let done =
        store.append("c", &[append("e1", vec![event(4, "execution_completed")], Some("completed"))], 1).await.unwrap();
    assert!(done.is_empty());
    let refused = store.append("c", &[append("e1", vec![event(5, "step_started")], None)], 1).await.unwrap();
    assert_eq!(refused, ["e1"], "nothing after the end");
    assert_eq!(
        store.claim("d", 9_000, i64::MAX, 10, true).await.unwrap(),
        ["e2"],
        "finished executions are not claimed"
    );

    // Lists: newest first, by status and request, in pages.
    store.create(&new("e3", "r2"), "a", i64::MAX).await.unwrap();
    let all = store.list(&ExecutionFilter { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["e3", "e2", "e1"]);
    let completed = store
        .list(&ExecutionFilter { statuses: vec!["completed".into()], limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(completed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["e1"]);
    let first = store.list(&ExecutionFilter { request_id: "r1".into(), limit: 1, ..Default::default() }).await.unwrap();
    let before = Some((first[0].created_at.timestamp_millis(), first[0].id.clone()));
    let second =
        store.list(&ExecutionFilter { request_id: "r1".into(), limit: 5, before, ..Default::default() }).await.unwrap();
    assert_eq!((first[0].id.as_str(), second.iter().map(|r| r.id.as_str()).collect::<Vec<_>>()), ("e2", vec!["e1"]));
    // A client's page holds its own executions only, however many others there are.
    let shop = store.list(&ExecutionFilter { principal: Some("shop".into()), limit: 1, ..Default::default() }).await;
    assert_eq!(shop.unwrap().iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["e3"]);
    let billing = ExecutionFilter { principal: Some("billing".into()), limit: 5, ..Default::default() };
    assert!(store.list(&billing).await.unwrap().is_empty());

    assert_eq!(store.purge_finished(1_700_000_001_000).await.unwrap(), 1);
    assert!(store.get("e1").await.unwrap().is_none());
    assert!(store.events_after("e1", 0, 10).await.unwrap().is_empty(), "events go with their execution");
    assert!(store.get("e2").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_execution_store_contract() {
    contract(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_execution_store_contract() {
    contract(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_hear_of_each_others_events() {
    let Some(db) = TestDatabase::new(Backend::Postgres).await else { return };
    let a = connect_executions(&db.url).await.unwrap();
    let b: std::sync::Arc<dyn ExecutionStore> = connect_executions(&db.url).await.unwrap();
    let mut heard = b.subscribe();
    a.create(&new("e1", "r1"), "a", i64::MAX).await.unwrap();
    assert_eq!(notice(&mut heard).await, ExecutionNotice::Appended { id: "e1".into(), last_sequence: 1 });
    a.append("a", &[append("e1", vec![event(2, "step_started")], Some("running"))], 1).await.unwrap();
    assert_eq!(notice(&mut heard).await, ExecutionNotice::Appended { id: "e1".into(), last_sequence: 2 });
    a.request_cancel("e1", "stop").await.unwrap();
    assert_eq!(notice(&mut heard).await, ExecutionNotice::CancelRequested { id: "e1".into() });
}
