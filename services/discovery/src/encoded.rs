//! Sending shared bodies without copying them.
//!
//! Popular capability queries are answered many times per catalog state, so
//! their bodies are encoded once and shared (see `Registry::query_encoded`).
//! [`Pieces`] sends such a body as it is, with the few bytes of one request
//! (its `discovered_at`) beside it, instead of copying it into each response.
//! [`ListCapabilitiesRoute`] serves the gRPC `ListCapabilities` method that
//! way: it speaks the gRPC wire format itself, since a tonic codec would copy
//! every body into its own buffer.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentmesh_proto::v1 as pb;
use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use prost::Message;
use tonic::Status;

use crate::grpc::DiscoveryGrpc;

/// Path of the gRPC method [`ListCapabilitiesRoute`] serves.
pub const PATH: &str = "/agentmesh.v1.DiscoveryService/ListCapabilities";

/// Largest request message accepted (tonic's default too).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// An encoded `ListCapabilitiesResponse`: a shared body, then fields of this
/// request alone (protobuf readers accept fields in any order).
#[derive(Debug, Clone)]
pub struct EncodedReply {
    /// Encoded fields shared by every request for the same query and state.
    pub body: Bytes,
    /// Encoded fields of this request (`discovered_at`).
    pub tail: Vec<u8>,
}

/// A response body made of shared pieces, sent without copying, and
/// optionally trailers.
#[derive(Debug, Default)]
pub struct Pieces {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    remaining: u64,
}

impl Pieces {
    /// A body of these chunks, in order.
    pub fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        let chunks: VecDeque<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        Self { chunks, trailers: None, remaining }
    }

    /// Sends `trailers` after the data.
    #[must_use]
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            self.remaining -= chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The gRPC `ListCapabilities` method, as a tower service for the router.
#[derive(Clone)]
pub struct ListCapabilitiesRoute(pub Arc<DiscoveryGrpc>);

impl tower::Service<http::Request<axum::body::Body>> for ListCapabilitiesRoute {
    type Response = http::Response<axum::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            Ok(match serve(&service, request).await {
                Ok(response) => response,
                Err(status) => status.into_http(),
            })
        })
    }
}

/// One gRPC call: a length-prefixed request message in, a length-prefixed
/// response message and `grpc-status` trailers out.
async fn serve(
    service: &DiscoveryGrpc,
    request: http::Request<axum::body::Body>,
) -> Result<http::Response<axum::body::Body>, Status> {
    let (parts, body) = request.into_parts();
    if parts.headers.get("grpc-encoding").is_some_and(|e| e != "identity") {
        return Err(Status::unimplemented("compressed requests are not supported; send identity"));
    }
    let bytes = axum::body::to_bytes(body, MAX_REQUEST_BYTES + 5)
        .await
        .map_err(|e| Status::invalid_argument(format!("reading the request: {e}")))?;
    let message = unframe(bytes)?;
    let message = pb::ListCapabilitiesRequest::decode(message)
        .map_err(|e| Status::invalid_argument(format!("malformed ListCapabilitiesRequest: {e}")))?;
    let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers);
    let reply =
        service.list_capabilities_encoded(tonic::Request::from_parts(metadata, parts.extensions, message)).await?;
    let EncodedReply { body, tail } = reply.into_inner();
    let length = u32::try_from(body.len() + tail.len()).map_err(|_| Status::internal("response too large"))?;
    let mut prefix = [0u8; 5];
    prefix[1..].copy_from_slice(&length.to_be_bytes());
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let pieces = Pieces::new([Bytes::copy_from_slice(&prefix), body, Bytes::from(tail)]).with_trailers(trailers);
    let mut response = http::Response::new(axum::body::Body::new(pieces));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    Ok(response)
}

/// The message of a gRPC frame: a compression flag, a 4-byte length, the bytes.
fn unframe(mut frame: Bytes) -> Result<Bytes, Status> {
    if frame.len() < 5 {
        return Err(Status::invalid_argument("the request holds no gRPC message"));
    }
    let compressed = frame.get_u8();
    let length = frame.get_u32() as usize;
    if compressed != 0 {
        return Err(Status::unimplemented("compressed requests are not supported; send identity"));
    }
    if length > MAX_REQUEST_BYTES || length > frame.len() {
        return Err(Status::invalid_argument("the request message is truncated or too large"));
    }
    Ok(frame.split_to(length))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_and_bad_ones_named() {
        let frame = Bytes::from_static(&[0, 0, 0, 0, 2, 8, 5, 99]);
        assert_eq!(unframe(frame).ok(), Some(Bytes::from_static(&[8, 5])), "trailing bytes are not the message");
        let compressed = unframe(Bytes::from_static(&[1, 0, 0, 0, 1, 8]));
        assert_eq!(compressed.err().map(|s| s.code()), Some(tonic::Code::Unimplemented));
        let truncated = unframe(Bytes::from_static(&[0, 0, 0, 0, 9, 8]));
        assert_eq!(truncated.err().map(|s| s.code()), Some(tonic::Code::InvalidArgument));
        assert!(unframe(Bytes::from_static(&[0, 0])).is_err());
    }

    #[test]
    fn pieces_report_their_exact_size_then_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let mut body =
            Pieces::new([Bytes::from_static(b"ab"), Bytes::new(), Bytes::from_static(b"cde")]).with_trailers(trailers);
        assert_eq!(body.size_hint().exact(), Some(5));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut data = Vec::new();
        let mut saw_trailers = false;
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
            match frame.into_data() {
                Ok(chunk) => data.extend_from_slice(&chunk),
                Err(frame) => saw_trailers = frame.trailers_ref().is_some_and(|t| t.contains_key("grpc-status")),
            }
        }
        assert_eq!(data, b"abcde");
        assert!(saw_trailers && body.is_end_stream());
    }
}
