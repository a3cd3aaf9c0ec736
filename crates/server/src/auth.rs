//! Who is calling, and whether they may: bearer tokens listed (hashed) in a
//! file every service can read, each naming a principal and its roles.
//! The shared stack authenticates every call but the probes, gRPC and REST
//! alike, and a service's rules say which roles each call needs;
//! handlers that need more (an agent registering only its own id, a client
//! reading only its own executions) read the [`Principal`] from the
//! request's extensions.
//!
//! The file, TOML, re-read when it changes:
//!
//! ```toml
//! [[token]]
//! principal = "checkout-service"
//! roles = ["client"]
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```
//!
//! `sha256` is the hex SHA-256 of the token (`printf %s "$TOKEN" | sha256sum`,
//! or `agentmesh token`): the file never holds a token itself. A
//! `[[certificate]]` entry, alike, names a principal by the SHA-256 of a
//! client certificate's DER (mTLS), for callers without a token.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use serde::Deserialize;
use sha2::Digest as _;

/// A role a principal holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything.
    Operator,
    /// Orchestrate, plan, execute; its own executions, orchestrations and
    /// interactions.
    Client,
    /// Another service of the mesh: what its calls need.
    Service,
    /// Register, heartbeat and remove the agent with this id; `*`: any id
    /// not yet bound to another principal (its first registration binds it).
    Agent(String),
}

impl Role {
    /// `operator`, `client`, `service` or `agent:<id>`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "operator" => Ok(Self::Operator),
            "client" => Ok(Self::Client),
            "service" => Ok(Self::Service),
            _ => match text.strip_prefix("agent:") {
                Some(id) if !id.is_empty() => Ok(Self::Agent(id.to_owned())),
                _ => Err(format!("unknown role `{text}`: the roles are operator, client, service and agent:<id>")),
            },
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::Operator => Kind::Operator,
            Self::Client => Kind::Client,
            Self::Service => Kind::Service,
            Self::Agent(_) => Kind::Agent,
        }
    }
}

/// A role without its agent id, for rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`Role::Operator`].
    Operator,
    /// [`Role::Client`].
    Client,
    /// [`Role::Service`].
    Service,
    /// Any [`Role::Agent`].
    Agent,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Operator => "operator",
            Self::Client => "client",
            Self::Service => "service",
            Self::Agent => "agent:<id>",
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The name the tokens file gives it.
    pub name: String,
    /// Its roles.
    pub roles: Vec<Role>,
}

impl Principal {
    /// The principal of a service when authentication is off: everything.
    pub fn anonymous_operator() -> Self {
        Self { name: String::new(), roles: vec![Role::Operator] }
    }

    /// Whether it holds a role of this kind.
    pub fn has(&self, kind: Kind) -> bool {
        self.roles.iter().any(|r| r.kind() == kind)
    }

    /// Operators and services see and act on everything.
    pub fn sees_everything(&self) -> bool {
        self.has(Kind::Operator) || self.has(Kind::Service)
    }

    /// Whether it may register, heartbeat or remove the agent `id`.
    pub fn may_manage_agent(&self, id: &str) -> bool {
        self.has(Kind::Operator) || self.roles.iter().any(|r| matches!(r, Role::Agent(own) if own == id))
    }

    /// Whether it may claim agent ids nobody holds yet (`agent:*`): the
    /// first registration of an id binds it to this principal.
    pub fn claims_agents(&self) -> bool {
        self.roles.iter().any(|r| matches!(r, Role::Agent(id) if id == "*"))
    }

    /// Whether it may read or act on what `owner` started (`""`: started
    /// without authentication, an operator's to see).
    pub fn owns(&self, owner: &str) -> bool {
        self.sees_everything() || (!owner.is_empty() && owner == self.name)
    }
}

/// Metadata a service of the mesh sends with a call it makes for a client
/// (the gateway's `Execute`): the client's principal, who then owns what
/// the call starts. Taken into account only from services and operators.
pub const ON_BEHALF_OF: &str = "x-agentmesh-on-behalf-of";

/// Who a call is made for: the caller, or, when the caller is another
/// service of the mesh (or an operator), the client it names in
/// [`ON_BEHALF_OF`]. What the call starts or records belongs to them.
pub fn acting_for<T>(request: &tonic::Request<T>) -> String {
    let principal = principal_of(request.extensions());
    let on_behalf =
        request.metadata().get(ON_BEHALF_OF).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty() && v.len() <= 256);
    match on_behalf {
        Some(client) if principal.sees_everything() => client.to_owned(),
        _ => principal.name,
    }
}

/// Marks `request`, made by a service for `client`, as made on its behalf.
pub fn on_behalf_of<T>(request: &mut tonic::Request<T>, client: &str) {
    if !client.is_empty()
        && let Ok(value) = client.parse()
    {
        request.metadata_mut().insert(ON_BEHALF_OF, value);
    }
}

/// The principal of a request, from its extensions: the caller, or an
/// anonymous operator when the service runs without authentication.
pub fn principal_of(extensions: &http::Extensions) -> Principal {
    extensions.get::<Principal>().cloned().unwrap_or_else(Principal::anonymous_operator)
}

/// The caller of a REST request, as an extractor ([`principal_of`]).
pub struct Caller(pub Principal);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(principal_of(&parts.extensions)))
    }
}

/// Which roles a call needs: a service's rules map its paths (gRPC
/// `/pkg.Service/Method`, REST `/api/v1/...`) to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without credentials (pages a browser loads by navigating).
    Public,
    /// Any authenticated caller.
    Authenticated,
    /// A caller holding one of these.
    Roles(&'static [Kind]),
}

/// A service's rules: the access a call to `path` with `method` needs.
pub type Rules = fn(&http::Method, &str) -> Access;

/// Every authenticated caller may make every call (the handlers still
/// check ownership).
pub fn any_authenticated(_: &http::Method, _: &str) -> Access {
    Access::Authenticated
}

/// Clients, services and operators, never agents: the rules of the
/// planner, the executor, synthesis and the gateway (their handlers check
/// what a client owns).
pub fn mesh_callers(_: &http::Method, _: &str) -> Access {
    Access::Roles(&[Kind::Operator, Kind::Service, Kind::Client])
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
    /// Client certificates (mTLS) as principals, by the SHA-256 of their DER.
    #[serde(default)]
    certificate: Vec<TokenEntry>,
}

/// The SHA-256 of the client certificate a TLS connection presented (its
/// DER), put in each of the connection's requests' extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCertificate(pub [u8; 32]);

impl PeerCertificate {
    /// The fingerprint of a certificate's DER.
    pub fn of(der: &[u8]) -> Self {
        Self(sha2::Sha256::digest(der).into())
    }
}

/// The hex SHA-256 of the first certificate of a PEM file's text, as a
/// tokens file's `[[certificate]]` lists it.
pub fn certificate_hash(pem: &[u8]) -> anyhow::Result<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let cert = CertificateDer::pem_slice_iter(pem).next().context("no certificate in the PEM text")??;
    Ok(hex::encode(PeerCertificate::of(&cert).0))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    principal: String,
    roles: Vec<String>,
    sha256: String,
}

/// The tokens of a file, by hash, and its certificates, by fingerprint.
#[derive(Debug, Default)]
struct Tokens {
    by_hash: HashMap<[u8; 32], Principal>,
    by_certificate: HashMap<[u8; 32], Principal>,
}

impl Tokens {
    fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("auth_tokens_file: cannot read {}", path.display()))?;
        let file: TokensFile =
            toml::from_str(&text).with_context(|| format!("auth_tokens_file {} is not valid", path.display()))?;
        let by_hash = entries(path, "token", file.token)?;
        let by_certificate = entries(path, "certificate", file.certificate)?;
        Ok(Self { by_hash, by_certificate })
    }
}

/// The entries of one kind (`token`, `certificate`) by hash.
fn entries(path: &Path, kind: &str, list: Vec<TokenEntry>) -> anyhow::Result<HashMap<[u8; 32], Principal>> {
    let mut by_hash = HashMap::new();
    for (i, entry) in list.into_iter().enumerate() {
        let at = || format!("auth_tokens_file {}, {kind} {} (`{}`)", path.display(), i + 1, entry.principal);
        anyhow::ensure!(!entry.principal.trim().is_empty(), "{}: principal is empty", at());
        let hash: [u8; 32] = hex::decode(entry.sha256.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .with_context(|| format!("{}: sha256 must be 64 hex digits, the SHA-256 of the {kind}", at()))?;
        let roles = entry
            .roles
            .iter()
            .map(|r| Role::parse(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        anyhow::ensure!(!roles.is_empty(), "{}: give it at least one role", at());
        let principal = Principal { name: entry.principal.clone(), roles };
        anyhow::ensure!(by_hash.insert(hash, principal).is_none(), "{}: the same {kind} is listed twice", at());
    }
    Ok(by_hash)
}

/// The hex SHA-256 of a token, as the tokens file lists it.
pub fn token_hash(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No credential, or one not known: `UNAUTHENTICATED`, 401.
    Unauthenticated(String),
    /// Known, without the role: `PERMISSION_DENIED`, 403.
    Denied(String),
}

/// Checks callers against the tokens file, re-read when it changes, and
/// JWTs against an identity provider's keys.
#[derive(Clone)]
pub struct Authenticator {
    tokens: crate::reload::Reloaded<Arc<Tokens>>,
    jwt: Option<crate::jwt::JwtVerifier>,
}

impl Authenticator {
    /// Loads `path` (an error names what is wrong in it), then loads it
    /// again whenever it changes ([`crate::reload`]), for as long as this
    /// value or a clone lives.
    pub fn watch(path: PathBuf, name: &'static str) -> anyhow::Result<Self> {
        let tokens = crate::reload::load_and_watch(vec![path.clone()], "auth_tokens_file", name, move || {
            Tokens::load(&path).map(Arc::new)
        })?;
        Ok(Self { tokens, jwt: None })
    }

    /// No tokens file: JWTs only (see [`Authenticator::with_jwt`]).
    pub fn without_tokens() -> Self {
        Self { tokens: Arc::new(RwLock::new(Arc::new(Tokens::default()))), jwt: None }
    }

    /// Also takes JWTs the verifier accepts as bearer tokens.
    #[must_use]
    pub fn with_jwt(mut self, jwt: crate::jwt::JwtVerifier) -> Self {
        self.jwt = Some(jwt);
        self
    }

    /// The caller of a request with these headers (a bearer token wins)
    /// or over a connection that presented this client certificate,
    /// allowed `access`.
    pub fn check(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&PeerCertificate>,
        access: Access,
    ) -> Result<Principal, Refusal> {
        let tokens = crate::reload::current(&self.tokens);
        let principal = match (headers.get(http::header::AUTHORIZATION), peer) {
            (Some(value), _) => {
                let token = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| Refusal::Unauthenticated("the authorization header is not `Bearer <token>`".into()))?;
                let hash: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
                match (tokens.by_hash.get(&hash), &self.jwt) {
                    (Some(principal), _) => principal.clone(),
                    (None, Some(jwt)) if token.matches('.').count() == 2 => {
                        jwt.verify(token).map_err(Refusal::Unauthenticated)?
                    }
                    (None, _) => {
                        return Err(Refusal::Unauthenticated("the bearer token is not known to this service".into()));
                    }
                }
            }
            (None, Some(peer)) => tokens.by_certificate.get(&peer.0).cloned().ok_or_else(|| {
                Refusal::Unauthenticated(format!(
                    "the client certificate (SHA-256 {}) is not listed in auth_tokens_file, and no bearer token was sent",
                    hex::encode(peer.0)
                ))
            })?,
            (None, None) => {
                return Err(Refusal::Unauthenticated(
                    "no credentials: send the header `authorization: Bearer <token>`".into(),
                ));
            }
        };
        match access {
            Access::Public | Access::Authenticated => Ok(principal),
            Access::Roles(kinds) if kinds.iter().any(|k| principal.has(*k)) => Ok(principal),
            Access::Roles(kinds) => Err(Refusal::Denied(format!(
                "`{}` may not make this call: it needs the role {}",
                principal.name,
                kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(" or ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("agentmesh-tokens-{:x}.toml", rand::random::<u64>()));
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        path
    }

    fn bearer(token: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers
            .insert(http::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap_or_else(|e| panic!("{e}")));
        headers
    }

    #[test]
    fn tokens_are_known_by_their_hash_and_roles_are_checked() {
        let path = file(&format!(
            "[[token]]\nprincipal = \"shop\"\nroles = [\"client\"]\nsha256 = \"{}\"\n\n[[token]]\nprincipal = \"weather\"\nroles = [\"agent:weather-tool-v2\"]\nsha256 = \"{}\"\n",
            token_hash("s3cret-shop"),
            token_hash("s3cret-weather")
        ));
        let tokens = Tokens::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
        let auth = Authenticator { tokens: Arc::new(RwLock::new(Arc::new(tokens))), jwt: None };
        let shop = auth.check(&bearer("s3cret-shop"), None, Access::Authenticated).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(shop.name, "shop");
        assert!(!shop.may_manage_agent("weather-tool-v2") && shop.owns("shop") && !shop.owns("other"));
        let weather = auth
            .check(&bearer("s3cret-weather"), None, Access::Roles(&[Kind::Agent]))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert!(weather.may_manage_agent("weather-tool-v2") && !weather.may_manage_agent("stocks"));
        let denied = auth.check(&bearer("s3cret-shop"), None, Access::Roles(&[Kind::Operator, Kind::Service]));
        assert_eq!(
            denied,
            Err(Refusal::Denied("`shop` may not make this call: it needs the role operator or service".into()))
        );
        let unknown = auth.check(&bearer("guess"), None, Access::Authenticated);
        assert!(matches!(unknown, Err(Refusal::Unauthenticated(m)) if !m.contains("guess")));
        assert!(matches!(
            auth.check(&http::HeaderMap::new(), None, Access::Authenticated),
            Err(Refusal::Unauthenticated(_))
        ));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_bad_tokens_file_says_where() {
        let path = file("[[token]]\nprincipal = \"x\"\nroles = [\"root\"]\nsha256 = \"abc\"\n");
        let said = format!("{:#}", Tokens::load(&path).err().unwrap_or_else(|| panic!("accepted")));
        assert!(said.contains("token 1 (`x`)") && said.contains("64 hex digits"), "{said}");
        let _ = std::fs::remove_file(path);
    }
}
