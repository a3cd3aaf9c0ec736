//! Generated code for the `agentmesh.v1` gRPC contracts, and the encoded
//! descriptor set that servers hand to gRPC reflection.

#![allow(clippy::all, missing_docs)]

/// The `agentmesh.v1` package.
pub mod v1 {
    tonic::include_proto!("agentmesh.v1");
}

/// Encoded `FileDescriptorSet` of every agentmesh proto, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("agentmesh_descriptor");

pub mod convert;

/// Conversions between JSON and `google.protobuf.Struct`/`Value`.
pub mod json {
    use prost_types::value::Kind;
    use serde_json::{Map, Number, Value};

    /// JSON to a protobuf `Value`.
    pub fn to_value(json: &Value) -> prost_types::Value {
        let kind = match json {
            Value::Null => Kind::NullValue(0),
            Value::Bool(b) => Kind::BoolValue(*b),
            Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
            Value::String(s) => Kind::StringValue(s.clone()),
            Value::Array(items) => {
                Kind::ListValue(prost_types::ListValue { values: items.iter().map(to_value).collect() })
            }
            Value::Object(map) => Kind::StructValue(map_to_struct(map)),
        };
        prost_types::Value { kind: Some(kind) }
    }

    fn map_to_struct(map: &Map<String, Value>) -> prost_types::Struct {
        prost_types::Struct { fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect() }
    }

    /// JSON to a protobuf `Struct`; `None` when the JSON is not an object.
    pub fn to_struct(json: &Value) -> Option<prost_types::Struct> {
        json.as_object().map(map_to_struct)
    }

    /// A protobuf `Value` to JSON; whole numbers become integers, so that
    /// `{"n": 5}` survives a round trip as an integer.
    pub fn from_value(value: &prost_types::Value) -> Value {
        match &value.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::BoolValue(b)) => Value::Bool(*b),
            Some(Kind::NumberValue(n)) => number(*n),
            Some(Kind::StringValue(s)) => Value::String(s.clone()),
            Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(from_value).collect()),
            Some(Kind::StructValue(s)) => from_struct(s),
        }
    }

    fn number(n: f64) -> Value {
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        if n.fract() == 0.0 && n.abs() < EXACT {
            #[allow(clippy::cast_possible_truncation)]
            return Value::Number(Number::from(n as i64));
        }
        Number::from_f64(n).map_or(Value::Null, Value::Number)
    }

    /// A protobuf `Struct` to a JSON object.
    pub fn from_struct(s: &prost_types::Struct) -> Value {
        Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), from_value(v))).collect())
    }
}
