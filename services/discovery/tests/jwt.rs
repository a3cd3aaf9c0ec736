//! JWTs as bearer credentials: discovery checks them against the keys an
//! identity provider publishes (a JWKS served here, over real HTTP): the
//! subject is the principal and the `roles` claim its roles; an expired
//! token, another audience or issuer, a bad signature are refused, saying
//! why; a key rotated in by the provider is fetched when a token names it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmesh_testkit::Backend;
use base64::Engine as _;
use common::Ctx;
use reqwest::StatusCode;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};

const ISSUER: &str = "https://idp.example.test/";
const AUDIENCE: &str = "agentmesh";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

struct SigningKey {
    kid: String,
    pair: EcdsaKeyPair,
}

impl SigningKey {
    fn new(kid: &str) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        Self { kid: kid.into(), pair }
    }

    fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig",
            "x": b64(&point[1..33]), "y": b64(&point[33..65])})
    }

    fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let signed = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
        let signature = self.pair.sign(&ring::rand::SystemRandom::new(), signed.as_bytes()).unwrap();
        format!("{signed}.{}", b64(signature.as_ref()))
    }
}

fn claims(sub: &str, roles: &[&str], expires_in: i64) -> Value {
    let now = chrono::Utc::now().timestamp();
    json!({"iss": ISSUER, "aud": [AUDIENCE, "other"], "sub": sub, "roles": roles, "iat": now, "exp": now + expires_in})
}

/// A JWKS endpoint serving whatever keys are set.
async fn jwks_server(keys: Arc<Mutex<Vec<Value>>>) -> String {
    let listener = agentmesh_testkit::bind_local().await.unwrap();
    let url = format!("http://{}/.well-known/jwks.json", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/.well-known/jwks.json",
        axum::routing::get(move || {
            let keys = keys.lock().unwrap().clone();
            async move { axum::Json(json!({ "keys": keys })) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn call(
    ctx: &Ctx,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let mut request = ctx.http.request(method, ctx.url(path)).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_from_the_identity_provider_are_principals_and_a_rotated_key_is_fetched() {
    let first = SigningKey::new("k1");
    let keys = Arc::new(Mutex::new(vec![first.jwk()]));
    let jwks = jwks_server(keys.clone()).await;
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| {
        c.service.auth_jwks_url = Some(jwks);
        c.service.auth_jwt_issuer = Some(ISSUER.into());
        c.service.auth_jwt_audience = Some(AUDIENCE.into());
    })
    .await
    else {
        return;
    };
    let catalog = "/api/v1/discovery/capabilities";
    let client = first.sign(&claims("checkout", &["client"], 300));
    assert_eq!(call(&ctx, reqwest::Method::GET, catalog, &client, None).await.0, StatusCode::OK);
    // The agent's own id only.
    let agent = first.sign(&claims("weather-agent", &["agent:weather-tool-v2"], 300));
    let weather = json!({"id": "weather-tool-v2", "base_url": "http://w:1", "skills": [{"id": "now"}]});
    assert_eq!(
        call(&ctx, reqwest::Method::POST, "/api/v1/agents", &agent, Some(&weather)).await.0,
        StatusCode::CREATED
    );
    let other = json!({"id": "stock-quotes", "base_url": "http://s:1", "skills": [{"id": "quote"}]});
    let (status, body) = call(&ctx, reqwest::Method::POST, "/api/v1/agents", &agent, Some(&other)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = call(&ctx, reqwest::Method::POST, "/api/v1/agents", &client, Some(&other)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a client registered an agent: {body}");

    // Refused, saying why, never quoting the token.
    let mut wrong_audience = claims("checkout", &["client"], 300);
    wrong_audience["aud"] = json!("someone-else");
    let mut wrong_issuer = claims("checkout", &["client"], 300);
    wrong_issuer["iss"] = json!("https://evil.example.test/");
    let mut tampered = first.sign(&claims("checkout", &["client"], 300));
    tampered.replace_range(tampered.len() - 4.., "AAAA");
    for (token, says) in [
        (first.sign(&claims("checkout", &["client"], -600)), "expired"),
        (first.sign(&wrong_audience), "not for the audience agentmesh"),
        (first.sign(&wrong_issuer), "not issued by https://idp.example.test/"),
        (tampered, "signature does not verify"),
        (first.sign(&claims("checkout", &["root"], 300)), "names no role"),
    ] {
        let (status, body) = call(&ctx, reqwest::Method::GET, catalog, &token, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{says}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{says}: {body}");
        assert!(!message.contains(&token), "{body}");
    }

    // The provider rotates its key: a token naming the new key id makes
    // discovery fetch the keys again.
    let second = SigningKey::new("k2");
    keys.lock().unwrap().push(second.jwk());
    let rotated = second.sign(&claims("checkout", &["client"], 300));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = call(&ctx, reqwest::Method::GET, catalog, &rotated, None).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(body["message"].as_str().unwrap_or_default().contains("key id `k2`"), "{body}");
        assert!(tokio::time::Instant::now() < deadline, "the rotated key was never fetched");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_jwks_url_without_issuer_or_audience_is_refused_at_start() {
    let settings = agentmesh_server::ServiceSettings {
        auth_jwks_url: Some("https://idp.example.test/jwks".into()),
        ..Default::default()
    };
    let said = settings.validate().unwrap_err().to_string();
    assert!(said.contains("auth_jwks_url needs auth_jwt_issuer and auth_jwt_audience"), "{said}");
}
