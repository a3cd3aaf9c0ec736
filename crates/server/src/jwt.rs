//! JSON Web Tokens as bearer credentials: signed by a key the identity
//! provider publishes at a JWKS URL (RS256 or ES256), issued by the
//! configured issuer for the configured audience, not expired. The token's
//! `sub` is the principal and its `roles` claim (an array of
//! `operator`, `client`, `service`, `agent:<id>`) its roles. The keys are
//! fetched at start, every ten minutes, and at once (at most every 30 s)
//! when a token names a key not yet known, so that a provider's key
//! rotation needs no restart.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::auth::{Principal, Role};

/// How a service checks JWTs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// Where the identity provider publishes its keys.
    pub jwks_url: String,
    /// The `iss` every token must carry.
    pub issuer: String,
    /// A value the token's `aud` must hold.
    pub audience: String,
}

/// Leeway for clocks that differ between the provider and the service.
const LEEWAY_SECS: i64 = 60;
/// How often the keys are fetched again.
const REFRESH: Duration = Duration::from_secs(600);
/// Shortest time between two fetches asked for by unknown key ids.
const MIN_REFETCH: Duration = Duration::from_secs(30);

/// One published key.
#[derive(Debug, Clone)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed P-256 point (`04 || x || y`).
    P256(Vec<u8>),
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

fn b64(text: &str) -> anyhow::Result<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')).context("not base64url")
}

fn parse_keys(body: &str) -> anyhow::Result<HashMap<String, Key>> {
    let jwks: Jwks = serde_json::from_str(body).context("the JWKS is not a JSON key set")?;
    let mut keys = HashMap::new();
    for jwk in jwks.keys {
        let key = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
            ("RSA", _) => match (&jwk.n, &jwk.e) {
                (Some(n), Some(e)) => Key::Rsa { n: b64(n)?, e: b64(e)? },
                _ => continue,
            },
            ("EC", Some("P-256")) => match (&jwk.x, &jwk.y) {
                (Some(x), Some(y)) => Key::P256([vec![4], b64(x)?, b64(y)?].concat()),
                _ => continue,
            },
            _ => continue,
        };
        keys.insert(jwk.kid.unwrap_or_default(), key);
    }
    Ok(keys)
}

/// Checks JWTs against the provider's keys, kept fresh in the background.
#[derive(Clone)]
pub struct JwtVerifier {
    settings: Arc<JwtSettings>,
    keys: Arc<RwLock<HashMap<String, Key>>>,
    refetch: Arc<tokio::sync::Notify>,
}

impl JwtVerifier {
    /// Fetches the keys once (a provider that cannot be reached stops the
    /// service at start, saying where it looked), then keeps them fresh for
    /// as long as this value or a clone lives.
    pub async fn start(settings: JwtSettings, name: &'static str) -> anyhow::Result<Self> {
        let client = agentmesh_telemetry::http::client_builder().timeout(Duration::from_secs(10)).build()?;
        let keys = fetch(&client, &settings.jwks_url).await?;
        let verifier = Self {
            settings: Arc::new(settings),
            keys: Arc::new(RwLock::new(keys)),
            refetch: Arc::new(tokio::sync::Notify::new()),
        };
        let (weak, refetch, url) =
            (Arc::downgrade(&verifier.keys), verifier.refetch.clone(), verifier.settings.jwks_url.clone());
        tokio::spawn(async move {
            // The first unknown key id may fetch at once.
            let mut last = Instant::now().checked_sub(MIN_REFETCH).unwrap_or_else(Instant::now);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(REFRESH) => {}
                    () = refetch.notified() => {
                        if last.elapsed() < MIN_REFETCH {
                            continue;
                        }
                    }
                }
                last = Instant::now();
                let Some(keys) = weak.upgrade() else { return };
                match fetch(&client, &url).await {
                    Ok(fresh) => *keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = fresh,
                    Err(e) => tracing::warn!(service = name, error = %format!("{e:#}"),
                        "cannot fetch the JWKS; the keys fetched before stay in use"),
                }
            }
        });
        Ok(verifier)
    }

    /// The principal of a JWT, or why it is refused (never quoting it).
    pub fn verify(&self, token: &str) -> Result<Principal, String> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("the bearer token is not a JWT".into());
        };
        let decode = |part: &str| -> Result<Value, String> {
            b64(part)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .ok_or_else(|| "the JWT cannot be read".to_owned())
        };
        let header = decode(header)?;
        let alg = header["alg"].as_str().unwrap_or_default();
        let kid = header["kid"].as_str().unwrap_or_default();
        let key = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(kid).cloned();
        let Some(key) = key else {
            self.refetch.notify_one();
            return Err(format!(
                "the JWT's key id `{}` is not among the JWKS's keys",
                kid.chars().take(64).collect::<String>()
            ));
        };
        let signed = &token[..token.len() - signature.len() - 1];
        let signature = b64(signature).map_err(|_| "the JWT's signature cannot be read".to_owned())?;
        let verified = match (alg, &key) {
            ("RS256", Key::Rsa { n, e }) => ring::signature::RsaPublicKeyComponents { n, e }
                .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed.as_bytes(), &signature)
                .is_ok(),
            ("ES256", Key::P256(point)) => {
                ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signed.as_bytes(), &signature)
                    .is_ok()
            }
            _ => {
                return Err(format!(
                    "the JWT's algorithm `{alg}` does not match its key (RS256 and ES256 are accepted)"
                ));
            }
        };
        if !verified {
            return Err("the JWT's signature does not verify".into());
        }
        let claims = decode(payload)?;
        let now = chrono::Utc::now().timestamp();
        match claims["exp"].as_i64() {
            Some(exp) if exp + LEEWAY_SECS >= now => {}
            Some(_) => return Err("the JWT has expired".into()),
            None => return Err("the JWT has no expiry (exp)".into()),
        }
        if claims["nbf"].as_i64().is_some_and(|nbf| nbf - LEEWAY_SECS > now) {
            return Err("the JWT is not valid yet (nbf)".into());
        }
        if claims["iss"].as_str() != Some(self.settings.issuer.as_str()) {
            return Err(format!("the JWT was not issued by {}", self.settings.issuer));
        }
        let audience = &self.settings.audience;
        let for_us = match &claims["aud"] {
            Value::String(aud) => aud == audience,
            Value::Array(auds) => auds.iter().any(|a| a.as_str() == Some(audience)),
            _ => false,
        };
        if !for_us {
            return Err(format!("the JWT is not for the audience {audience}"));
        }
        let name = claims["sub"].as_str().filter(|s| !s.is_empty()).ok_or("the JWT has no subject (sub)")?;
        let roles: Vec<Role> = claims["roles"]
            .as_array()
            .map(|roles| roles.iter().filter_map(|r| Role::parse(r.as_str()?).ok()).collect())
            .unwrap_or_default();
        if roles.is_empty() {
            return Err("the JWT's roles claim names no role agentmesh knows".into());
        }
        Ok(Principal { name: name.to_owned(), roles })
    }
}

async fn fetch(client: &reqwest::Client, url: &str) -> anyhow::Result<HashMap<String, Key>> {
    let shown = agentmesh_telemetry::redact(url);
    let body = client
        .get(url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("fetching the JWKS at {shown}"))?
        .text()
        .await
        .with_context(|| format!("reading the JWKS at {shown}"))?;
    let keys = parse_keys(&body).with_context(|| format!("the JWKS at {shown}"))?;
    anyhow::ensure!(!keys.is_empty(), "the JWKS at {shown} holds no RSA or P-256 key");
    Ok(keys)
}
