//! The `ListCapabilities` route with a codec that sends bodies already
//! encoded. Popular queries are answered many times per catalog state, so
//! [`DiscoveryGrpc::list_capabilities_encoded`] encodes each answer once and
//! every request shares the bytes; the generated server would encode the
//! message again for each request.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentmesh_proto::v1 as pb;
use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::grpc::DiscoveryGrpc;

/// Path of the method this route serves.
pub const PATH: &str = "/agentmesh.v1.DiscoveryService/ListCapabilities";

/// An encoded `ListCapabilitiesResponse`: a shared body, then fields of this
/// request alone.
#[derive(Debug, Clone)]
pub struct EncodedReply {
    /// Encoded fields shared by every request for the same query and state.
    pub body: Bytes,
    /// Encoded fields of this request (`discovered_at`).
    pub tail: Vec<u8>,
}

/// Decodes requests with prost, writes replies as they are.
#[derive(Debug, Clone, Copy, Default)]
struct EncodedCodec;

impl Codec for EncodedCodec {
    type Encode = EncodedReply;
    type Decode = pb::ListCapabilitiesRequest;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self::Encoder {
        *self
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Encoder for EncodedCodec {
    type Item = EncodedReply;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item.body);
        dst.put_slice(&item.tail);
        Ok(())
    }
}

impl Decoder for EncodedCodec {
    type Item = pb::ListCapabilitiesRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        pb::ListCapabilitiesRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("malformed ListCapabilitiesRequest: {e}")))
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct Unary(Arc<DiscoveryGrpc>);

impl tonic::server::UnaryService<pb::ListCapabilitiesRequest> for Unary {
    type Response = EncodedReply;
    type Future = BoxFuture<Result<tonic::Response<EncodedReply>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::ListCapabilitiesRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.list_capabilities_encoded(request).await })
    }
}

/// The route, as a tower service for the router.
#[derive(Clone)]
pub struct ListCapabilitiesRoute(pub Arc<DiscoveryGrpc>);

impl tower::Service<http::Request<axum::body::Body>> for ListCapabilitiesRoute {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(EncodedCodec).unary(Unary(service), request).await) })
    }
}
