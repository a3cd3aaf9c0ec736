//! Where the executor may send requests. An agent's address comes from
//! discovery; a capability's endpoint is a path on it and can never switch
//! hosts; and addresses in denied networks (by default link-local and cloud
//! metadata services, reachable from most hosts and full of credentials)
//! are refused, whether written as IPs or behind a hostname.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use url::Url;

/// Networks refused unless allowed explicitly: IPv4 and IPv6 link-local
/// (169.254.169.254 is the metadata service of most clouds), AWS's IPv6
/// metadata address, and Alibaba Cloud's metadata address.
pub const DEFAULT_DENY: [&str; 4] = ["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32"];

/// Loopback and private networks, denied too with `egress_deny_private`
/// (a mesh whose agents are all public services).
pub const PRIVATE: [&str; 9] = [
    "127.0.0.0/8",
    "::1/128",
    "0.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
    "::/128",
];

/// The IPv4 address an IPv6 address carries, in each form that reaches an
/// IPv4 host: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::/96` and the local-use
/// `64:ff9b:1::/48`) and 6to4 (`2002:AABB:CCDD::/48`).
fn embedded_ipv4(ip: std::net::Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return Some(low);
    }
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b;
    if nat64 && (s[2..6] == [0; 4] || s[2] == 1) {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
    }
    None
}

/// Parses a network, `10.0.0.0/8`, `fd00::/8`, or a single address.
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if !text.contains('/') {
        return text
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| format!("`{text}` is not an IP network (a.b.c.d/n)"));
    }
    text.parse::<IpNet>()
        .map_err(|_| format!("`{text}` is not an IP network (a.b.c.d/n, with a prefix length that fits)"))
}

/// The egress policy.
#[derive(Debug, Clone)]
pub struct Egress {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
    /// The mesh's own services, never agent targets: their addresses, and
    /// the names they were given by (lowercase, with the port).
    mesh: Vec<SocketAddr>,
    mesh_names: Vec<(String, u16)>,
}

impl Egress {
    /// `deny` is refused unless `allow` (which wins) covers the address.
    pub fn new(deny: &[String], allow: &[String]) -> Result<Self, String> {
        Ok(Self {
            deny: deny.iter().map(|c| parse_network(c)).collect::<Result<_, _>>()?,
            allow: allow.iter().map(|c| parse_network(c)).collect::<Result<_, _>>()?,
            mesh: Vec::new(),
            mesh_names: Vec::new(),
        })
    }

    /// Also refuses the mesh's own services as agent targets: a step sent
    /// to discovery's `/api/v1/agents` would register an agent, one sent to
    /// the gateway would start an orchestration.
    #[must_use]
    pub fn with_mesh(mut self, mesh: Vec<SocketAddr>) -> Self {
        self.mesh = mesh;
        self
    }

    /// The names the mesh's services are known by (`discovery:7400`), so
    /// that an agent URL naming one is refused without a lookup.
    #[must_use]
    pub fn with_mesh_names(mut self, names: Vec<(String, u16)>) -> Self {
        self.mesh_names = names.into_iter().map(|(h, p)| (h.to_lowercase(), p)).collect();
        self
    }

    /// The check made on every HTTP call, without a lookup: an IP literal
    /// must be permitted and not the mesh's; a name must not be one the
    /// mesh's services go by (`localhost` included). The addresses a name
    /// resolves to are checked by [`EgressResolver`] as the call connects.
    pub fn check_call(&self, url: &Url) -> Result<(), String> {
        let port = url.port_or_known_default().ok_or_else(|| format!("`{url}` names no port"))?;
        let (ip, name) = match url.host() {
            Some(url::Host::Ipv4(ip)) => (Some(IpAddr::V4(ip)), None),
            Some(url::Host::Ipv6(ip)) => (Some(IpAddr::V6(ip)), None),
            Some(url::Host::Domain(name)) => (None, Some(name.to_lowercase())),
            None => return Err(format!("`{url}` has no host")),
        };
        if let Some(ip) = ip {
            if !self.permits(ip) {
                return Err(format!(
                    "{ip} is in a denied network (egress_deny); allow it with egress_allow if intended"
                ));
            }
            if self.is_mesh(SocketAddr::new(ip, port)) {
                return Err(format!("{} is one of the mesh's own services, never an agent", SocketAddr::new(ip, port)));
            }
        }
        if let Some(name) = name {
            let loopback = name == "localhost" && self.is_mesh(SocketAddr::from(([127, 0, 0, 1], port)));
            if loopback || self.mesh_names.iter().any(|(n, p)| *n == name && *p == port) {
                return Err(format!("{name}:{port} is one of the mesh's own services, never an agent"));
            }
        }
        Ok(())
    }

    /// Whether the executor may connect to `ip`. An IPv6 address that
    /// carries an IPv4 address (mapped, compatible, NAT64, 6to4) is judged
    /// by that IPv4 address as well: every form must pass.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let one = |ip: IpAddr| self.allow.iter().any(|n| n.contains(&ip)) || !self.deny.iter().any(|n| n.contains(&ip));
        match ip {
            IpAddr::V4(_) => one(ip),
            IpAddr::V6(v6) => one(ip) && embedded_ipv4(v6).is_none_or(|v4| one(IpAddr::V4(v4))),
        }
    }

    /// Whether `address` is one of the mesh's own services (a service
    /// listening on all interfaces is matched on the loopback addresses).
    pub fn is_mesh(&self, address: SocketAddr) -> bool {
        let ip = address.ip().to_canonical();
        self.mesh.iter().any(|m| {
            m.port() == address.port() && (m.ip().to_canonical() == ip || (m.ip().is_unspecified() && ip.is_loopback()))
        })
    }

    /// Every address `url` names, resolved once: each must be permitted
    /// and none may be one of the mesh's services. The addresses returned
    /// are the ones to connect to.
    pub async fn resolve(&self, url: &Url) -> Result<Vec<SocketAddr>, String> {
        let port = url.port_or_known_default().ok_or_else(|| format!("`{url}` names no port"))?;
        let addresses: Vec<SocketAddr> = match url.host() {
            Some(url::Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
            Some(url::Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
            Some(url::Host::Domain(host)) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("cannot resolve `{host}`: {e}"))?
                .collect(),
            None => return Err(format!("`{url}` has no host")),
        };
        if let Some(denied) = addresses.iter().find(|a| !self.permits(a.ip())) {
            return Err(format!(
                "{} is in a denied network (egress_deny); allow it with egress_allow if intended",
                denied.ip()
            ));
        }
        if let Some(own) = addresses.iter().find(|a| self.is_mesh(**a)) {
            return Err(format!("{own} is one of the mesh's own services, never an agent"));
        }
        if addresses.is_empty() {
            return Err(format!("`{url}` resolves to no address"));
        }
        Ok(addresses)
    }

    /// Checks a URL whose host is an IP literal (names are checked when they
    /// are resolved, see [`EgressResolver`]).
    pub fn check_url(&self, url: &Url) -> Result<(), String> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
            Some(url::Host::Domain(_)) => return Ok(()),
            None => return Err(format!("`{url}` has no host")),
        };
        if self.permits(ip) {
            Ok(())
        } else {
            Err(format!("address {ip} is in a denied network (egress_deny); allow it with egress_allow if intended"))
        }
    }
}

/// The URL of a capability: the agent's base URL (from discovery) with the
/// capability's endpoint path appended. The endpoint must be a path, and
/// the result must stay on the agent's own scheme, host and port.
pub fn capability_url(base_url: &str, endpoint: &str) -> Result<Url, String> {
    let base = Url::parse(base_url).map_err(|e| format!("agent base_url `{base_url}` is not a URL: {e}"))?;
    if !matches!(base.scheme(), "http" | "https") {
        return Err(format!("agent base_url `{base_url}` must be http:// or https://"));
    }
    if !endpoint.starts_with('/') || endpoint.starts_with("//") || endpoint.contains('\\') || endpoint.contains("://") {
        return Err(format!("capability endpoint `{endpoint}` must be a path on the agent (`/skills/x`)"));
    }
    let dots = |segment: &str| {
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        decoded == "." || decoded == ".."
    };
    if endpoint.split(['/', '?', '#']).any(dots) {
        return Err(format!("capability endpoint `{endpoint}` must not contain `.` or `..` segments"));
    }
    let joined = format!("{}{endpoint}", base.as_str().trim_end_matches('/'));
    let url = Url::parse(&joined).map_err(|e| format!("`{joined}` is not a URL: {e}"))?;
    if url.scheme() != base.scheme()
        || url.host() != base.host()
        || url.port_or_known_default() != base.port_or_known_default()
    {
        return Err(format!("capability endpoint `{endpoint}` leaves the agent's host `{base_url}`"));
    }
    if !url.path().starts_with(base.path().trim_end_matches('/')) {
        return Err(format!("capability endpoint `{endpoint}` leaves the agent's base path `{}`", base.path()));
    }
    Ok(url)
}

/// A DNS resolver for the agent HTTP client that only returns permitted
/// addresses, so that no hostname leads into a denied network.
#[derive(Debug, Clone)]
pub struct EgressResolver(pub Arc<Egress>);

impl reqwest::dns::Resolve for EgressResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let permitted: Vec<SocketAddr> = all.iter().copied().filter(|a| egress.permits(a.ip())).collect();
            if permitted.is_empty() && !all.is_empty() {
                let message = format!("`{host}` resolves only to addresses in a denied network (egress_deny)");
                return Err(Box::new(std::io::Error::new(std::io::ErrorKind::PermissionDenied, message)) as _);
            }
            Ok(Box::new(permitted.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn policy() -> Egress {
        Egress::new(&DEFAULT_DENY.map(String::from), &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn metadata_and_link_local_addresses_are_denied() {
        let egress = policy();
        for denied in ["169.254.169.254", "169.254.0.1", "fd00:ec2::254", "fe80::1", "::ffff:169.254.169.254"] {
            assert!(!egress.permits(denied.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))), "{denied}");
        }
        for allowed in ["127.0.0.1", "10.0.0.5", "::1", "192.168.1.1"] {
            assert!(egress.permits(allowed.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))), "{allowed}");
        }
        let opened = Egress::new(&DEFAULT_DENY.map(String::from), &["169.254.10.0/24".into()]).ok();
        assert!(opened.is_some_and(|e| e.permits(IpAddr::V4(Ipv4Addr::new(169, 254, 10, 3)))));
        assert!(parse_network("10.0.0.0/33").is_err());
        assert!(parse_network("169.254.169.254").is_ok_and(|n| n.prefix_len() == 32));
    }

    #[test]
    fn an_endpoint_cannot_switch_hosts() {
        let ok = capability_url("http://agent:9000", "/skills/get").map(|u| u.to_string());
        assert_eq!(ok.as_deref(), Ok("http://agent:9000/skills/get"));
        let ok = capability_url("http://agent:9000/base/", "/skills/get").map(|u| u.to_string());
        assert_eq!(ok.as_deref(), Ok("http://agent:9000/base/skills/get"));
        for evil in ["//evil/x", "http://evil/x", "skills/x", "/\\evil", "https://agent:9000/x"] {
            assert!(capability_url("http://agent:9000", evil).is_err(), "{evil}");
        }
        assert!(capability_url("http://agent:9000", "/@evil.com/x").is_ok_and(|u| u.host_str() == Some("agent")));
        assert!(capability_url("ftp://agent", "/x").is_err());
    }

    #[test]
    fn every_ipv6_form_of_a_denied_ipv4_address_is_denied() {
        let egress = policy();
        for denied in [
            "::169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "::ffff:a9fe:a9fe",
            "::ffff:100.100.100.200",
        ] {
            let ip: IpAddr = denied.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            assert!(!egress.permits(ip), "{denied}");
        }
        for allowed in ["::1", "::", "64:ff9b::a00:1", "2001:db8::1"] {
            let ip: IpAddr = allowed.parse().unwrap_or(IpAddr::V4(Ipv4Addr::new(169, 254, 0, 1)));
            assert!(egress.permits(ip), "{allowed}");
        }
    }

    #[test]
    fn endpoints_stay_under_the_base_path() {
        for evil in ["/../../admin", "/skills/../../x", "/%2e%2e/admin", "/./x", "/%2E%2E"] {
            let refused = capability_url("http://agent:9000/tenant/a/", evil);
            assert!(refused.is_err(), "{evil}: {refused:?}");
        }
        let kept = capability_url("http://agent:9000/tenant/a/", "/skills/x").map(|u| u.path().to_owned());
        assert_eq!(kept.as_deref(), Ok("/tenant/a/skills/x"));
    }

    #[tokio::test]
    async fn the_mesh_itself_is_never_an_agent() {
        let mesh: Vec<SocketAddr> = vec!["127.0.0.1:7400".parse().unwrap(), "0.0.0.0:7404".parse().unwrap()];
        let egress = policy().with_mesh(mesh);
        for own in ["http://127.0.0.1:7400/api/v1/agents", "http://[::1]:7404/x", "http://localhost:7400/"] {
            let refused = egress.resolve(&Url::parse(own).unwrap()).await;
            assert!(refused.as_ref().is_err_and(|e| e.contains("mesh's own services")), "{own}: {refused:?}");
        }
        assert!(egress.resolve(&Url::parse("http://127.0.0.1:9001/").unwrap()).await.is_ok());
        // The check on every HTTP call, without a lookup.
        let named = policy()
            .with_mesh(vec!["127.0.0.1:7400".parse().unwrap()])
            .with_mesh_names(vec![("Discovery".into(), 7400)]);
        for own in ["http://discovery:7400/api/v1/agents", "http://localhost:7400/x", "http://127.0.0.1:7400/x"] {
            let refused = named.check_call(&Url::parse(own).unwrap());
            assert!(refused.as_ref().is_err_and(|e| e.contains("mesh's own services")), "{own}: {refused:?}");
        }
        assert!(named.check_call(&Url::parse("http://discovery:9001/x").unwrap()).is_ok());
        assert!(named.check_call(&Url::parse("http://[64:ff9b::a9fe:a9fe]/x").unwrap()).is_err());
        let metadata = egress.resolve(&Url::parse("http://[::169.254.169.254]/latest").unwrap()).await;
        assert!(metadata.is_err_and(|e| e.contains("denied network")));
    }

    #[test]
    fn ip_literals_are_checked_before_any_connection() {
        let egress = policy();
        let metadata = Url::parse("http://169.254.169.254/latest").ok();
        assert!(metadata.is_some_and(|u| egress.check_url(&u).is_err()));
        let local = Url::parse("http://127.0.0.1:8080/x").ok();
        assert!(local.is_some_and(|u| egress.check_url(&u).is_ok()));
    }
}
