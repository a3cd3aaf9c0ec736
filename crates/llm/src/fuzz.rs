//! Property tests over what an LLM server sends: headers, server-sent event
//! streams and the JSON in them. Whatever arrives, reading it never panics.

use proptest::prelude::*;
use serde_json::{Value, json};

use futures_util::{FutureExt, StreamExt};

use crate::http::{event_json, parse_retry_after, sse_events};

/// JSON values rich in the fields the readers look at.
fn wire_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        prop_oneof![
            Just("message_start"),
            Just("content_block_start"),
            Just("content_block_delta"),
            Just("message_delta"),
            Just("message_stop"),
            Just("text_delta"),
            Just("input_json_delta"),
            Just("tool_use"),
            Just("text"),
            Just("error"),
            Just("length"),
            Just("MAX_TOKENS"),
        ]
        .prop_map(Value::from),
    ];
    let keys = prop_oneof![
        Just("type".to_owned()),
        Just("index".to_owned()),
        Just("delta".to_owned()),
        Just("content_block".to_owned()),
        Just("message".to_owned()),
        Just("usage".to_owned()),
        Just("choices".to_owned()),
        Just("candidates".to_owned()),
        Just("content".to_owned()),
        Just("parts".to_owned()),
        Just("text".to_owned()),
        Just("partial_json".to_owned()),
        Just("tool_calls".to_owned()),
        Just("function".to_owned()),
        Just("arguments".to_owned()),
        Just("finish_reason".to_owned()),
        Just("finishReason".to_owned()),
        Just("stop_reason".to_owned()),
        Just("output_tokens".to_owned()),
        Just("input_tokens".to_owned()),
        Just("usageMetadata".to_owned()),
        "[a-z_]{1,8}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((keys.clone(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
}

/// A byte stream cut into arbitrary chunks.
fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let piece = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..24),
        Just(b"data: ".to_vec()),
        Just(b"event: x\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b": ping\n".to_vec()),
        Just(b"data: [DONE]\n\n".to_vec()),
    ];
    prop::collection::vec(piece, 0..24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_retry_after_header_is_read_without_panic(value in "\\PC{0,40}", seconds in any::<f64>()) {
        let now = chrono::Utc::now();
        for text in [value, seconds.to_string(), format!("{seconds:e}")] {
            if let Some(wait) = parse_retry_after(&text, now) {
                prop_assert!(wait <= std::time::Duration::from_secs(24 * 3600));
            }
        }
    }

    #[test]
    fn any_byte_stream_parses_into_events_without_panic(stream in chunks()) {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
            stream.into_iter().map(|c| Ok(bytes::Bytes::from(c))).collect();
        let events = sse_events(futures_util::stream::iter(chunks)).collect::<Vec<_>>().now_or_never();
        for event in events.unwrap_or_default().iter().flatten() {
            let _ = event_json(event);
        }
    }

    #[test]
    fn any_event_json_is_read_by_every_provider_without_panic(events in prop::collection::vec(wire_json(), 0..8)) {
        crate::anthropic::read_all(&events);
        crate::gemini::read_all(&events);
        crate::openai::read_all(&events);
    }

    #[test]
    fn anthropic_block_indices_of_any_size_are_refused_or_read(index in any::<u64>()) {
        let start = json!({"type": "content_block_start", "index": index, "content_block": {"type": "text"}});
        let delta = json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": "x"}});
        crate::anthropic::read_all(&[start, delta]);
    }
}
