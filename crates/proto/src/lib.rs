//! Generated code for the `agentmesh.v1` gRPC contracts, and the encoded
//! descriptor set that servers hand to gRPC reflection.

#![allow(clippy::all, missing_docs)]

/// The `agentmesh.v1` package.
pub mod v1 {
    tonic::include_proto!("agentmesh.v1");
}

/// Encoded `FileDescriptorSet` of every agentmesh proto, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("agentmesh_descriptor");
