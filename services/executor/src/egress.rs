//! Where the executor may send requests. An agent's address comes from
//! discovery; a capability's endpoint is a path on it and can never switch
//! hosts; and addresses in denied networks (by default link-local and cloud
//! metadata services, reachable from most hosts and full of credentials)
//! are refused, whether written as IPs or behind a hostname.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use url::Url;

/// Networks refused unless allowed explicitly: IPv4 and IPv6 link-local
/// (169.254.169.254 is the metadata service of most clouds), AWS's IPv6
/// metadata address, and Alibaba Cloud's metadata address.
pub const DEFAULT_DENY: [&str; 4] = ["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32"];

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
}

impl Egress {
    /// `deny` is refused unless `allow` (which wins) covers the address.
    pub fn new(deny: &[String], allow: &[String]) -> Result<Self, String> {
        Ok(Self {
            deny: deny.iter().map(|c| parse_network(c)).collect::<Result<_, _>>()?,
            allow: allow.iter().map(|c| parse_network(c)).collect::<Result<_, _>>()?,
        })
    }

    /// Whether the executor may connect to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        // An IPv4-mapped IPv6 address (`::ffff:169.254.169.254`) is its IPv4 address.
        let ip = ip.to_canonical();
        self.allow.iter().any(|n| n.contains(&ip)) || !self.deny.iter().any(|n| n.contains(&ip))
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

    /// Every address a host resolves to must be permitted.
    pub async fn check_host(&self, url: &Url) -> Result<(), String> {
        self.check_url(url)?;
        let Some(url::Host::Domain(host)) = url.host() else { return Ok(()) };
        let port = url.port_or_known_default().unwrap_or(80);
        let addresses: Vec<SocketAddr> =
            tokio::net::lookup_host((host, port)).await.map_err(|e| format!("cannot resolve `{host}`: {e}"))?.collect();
        match addresses.iter().find(|a| !self.permits(a.ip())) {
            Some(denied) => Err(format!(
                "`{host}` resolves to {}, in a denied network (egress_deny); allow it with egress_allow if intended",
                denied.ip()
            )),
            None => Ok(()),
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
    let joined = format!("{}{endpoint}", base.as_str().trim_end_matches('/'));
    let url = Url::parse(&joined).map_err(|e| format!("`{joined}` is not a URL: {e}"))?;
    if url.scheme() != base.scheme()
        || url.host() != base.host()
        || url.port_or_known_default() != base.port_or_known_default()
    {
        return Err(format!("capability endpoint `{endpoint}` leaves the agent's host `{base_url}`"));
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
                let message = format!("`{host}` resolves only to denied addresses (egress_deny)");
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
    fn ip_literals_are_checked_before_any_connection() {
        let egress = policy();
        let metadata = Url::parse("http://169.254.169.254/latest").ok();
        assert!(metadata.is_some_and(|u| egress.check_url(&u).is_err()));
        let local = Url::parse("http://127.0.0.1:8080/x").ok();
        assert!(local.is_some_and(|u| egress.check_url(&u).is_ok()));
    }
}
