//! MCP for the mesh, on the official Rust SDK (`rmcp`): an MCP server's
//! tools become capabilities ([`tools`]), the executor and discovery talk
//! to servers through a [`client::Session`], and a stdio server is offered
//! over streamable HTTP by a [`bridge::Bridge`].

pub mod bridge;
pub mod client;
pub mod tools;

pub use client::{CallError, Progress, Session};
pub use rmcp::model::MetaObject;

/// The `_meta` key carrying the mesh's request id on a tool call.
pub const REQUEST_ID_META: &str = "dev.agentmesh/request_id";

/// `_meta` for one call: the W3C trace context (when there is one) and the
/// request id.
pub fn call_meta(traceparent: &str, request_id: &str) -> MetaObject {
    let mut meta = MetaObject::new();
    if !traceparent.is_empty() {
        meta.set_traceparent(traceparent);
    }
    if !request_id.is_empty() {
        meta.insert(REQUEST_ID_META.into(), serde_json::Value::String(request_id.to_owned()));
    }
    meta
}
