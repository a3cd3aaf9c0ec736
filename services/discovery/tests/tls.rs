//! TLS on discovery's one port: REST and gRPC over TLS with a certificate
//! from files, plaintext refused; with a client CA, only clients that
//! present a certificate it signed get in (through the channel every
//! service calls another with); a renewed certificate is served without a
//! restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use agentmesh_proto::v1 as pb;
use agentmesh_proto::v1::discovery_service_client::DiscoveryServiceClient;
use agentmesh_telemetry::rpc::ClientSettings;
use agentmesh_testkit::{Backend, TestPki};
use common::Ctx;

fn https_client(ca_pem: &str, identity: Option<(&std::path::Path, &std::path::Path)>) -> reqwest::Client {
    let mut builder = agentmesh_testkit::http_client_builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes()).unwrap());
    if let Some((cert, key)) = identity {
        let pem = [std::fs::read(cert).unwrap(), std::fs::read(key).unwrap()].concat();
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

async fn list(url: &str, tls: &ClientSettings) -> Result<usize, tonic::Status> {
    let channel = agentmesh_telemetry::rpc::channel("discovery", url, tls).unwrap();
    let mut client = DiscoveryServiceClient::new(channel);
    Ok(client.list_capabilities(pb::ListCapabilitiesRequest::default()).await?.into_inner().capabilities.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_and_grpc_are_served_over_tls_and_a_renewed_certificate_without_a_restart() {
    agentmesh_testkit::install_tls();
    let pki = TestPki::new("serve").unwrap();
    let server = pki.issue("discovery").unwrap();
    let (cert, key) = (server.cert.clone(), server.key.clone());
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| {
        c.service.tls_cert_file = Some(cert);
        c.service.tls_key_file = Some(key);
    })
    .await
    else {
        return;
    };
    let https = format!("https://localhost:{}", ctx.svc.addr.port());
    let client = https_client(&pki.ca_pem, None);
    let ready = client.get(format!("{https}/healthz")).send().await.unwrap();
    assert!(ready.status().is_success());
    let tls = ClientSettings { ca_pem: Some(pki.ca_pem.clone().into_bytes()), identity: None, bearer: None };
    assert_eq!(list(&https, &tls).await.unwrap(), 0);
    // Plaintext gets nothing, and a client that does not trust the CA neither.
    assert!(agentmesh_testkit::http_client().get(format!("{}/healthz", ctx.svc.url())).send().await.is_err());
    assert!(list(&https, &ClientSettings::default()).await.is_err());

    // The certificate is renewed in place, by another CA: served within seconds.
    let renewed = TestPki::new("renewed").unwrap();
    let next = renewed.issue("discovery").unwrap();
    std::fs::copy(&next.cert, &server.cert).unwrap();
    std::fs::copy(&next.key, &server.key).unwrap();
    let trusts_renewed = https_client(&renewed.ca_pem, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while trusts_renewed.get(format!("{https}/healthz")).send().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the renewed certificate was never served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(https_client(&pki.ca_pem, None).get(format!("{https}/healthz")).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_clients_with_its_certificates_get_in() {
    agentmesh_testkit::install_tls();
    let pki = TestPki::new("mtls").unwrap();
    let server = pki.issue("discovery").unwrap();
    let caller = pki.issue("executor").unwrap();
    let stranger_pki = TestPki::new("stranger").unwrap();
    let stranger = stranger_pki.issue("stranger").unwrap();
    let (cert, key, client_ca) = (server.cert.clone(), server.key.clone(), pki.ca_file());
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| {
        c.service.tls_cert_file = Some(cert);
        c.service.tls_key_file = Some(key);
        c.service.tls_client_ca_file = Some(client_ca);
    })
    .await
    else {
        return;
    };
    let https = format!("https://127.0.0.1:{}", ctx.svc.addr.port());
    let ca = Some(pki.ca_pem.clone().into_bytes());
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    // A service calling another presents its own certificate.
    let with_cert =
        ClientSettings { ca_pem: ca.clone(), identity: Some((read(&caller.cert), read(&caller.key))), bearer: None };
    assert_eq!(list(&https, &with_cert).await.unwrap(), 0);
    let no_cert = ClientSettings { ca_pem: ca.clone(), identity: None, bearer: None };
    assert!(list(&https, &no_cert).await.is_err(), "a client without a certificate got in");
    let foreign =
        ClientSettings { ca_pem: ca, identity: Some((read(&stranger.cert), read(&stranger.key))), bearer: None };
    assert!(list(&https, &foreign).await.is_err(), "a certificate of another CA got in");
    // REST alike.
    let ok = https_client(&pki.ca_pem, Some((&caller.cert, &caller.key)));
    assert!(ok.get(format!("{https}/api/v1/discovery/capabilities")).send().await.unwrap().status().is_success());
    assert!(https_client(&pki.ca_pem, None).get(format!("{https}/healthz")).send().await.is_err());
}

#[tokio::test]
async fn tls_settings_that_cannot_work_stop_the_service_at_start() {
    let mut settings =
        agentmesh_server::ServiceSettings { tls_cert_file: Some("/nonexistent/cert.pem".into()), ..Default::default() };
    let said = settings.validate().unwrap_err().to_string();
    assert!(said.contains("tls_cert_file and tls_key_file go together"), "{said}");
    settings.tls_key_file = Some("/nonexistent/key.pem".into());
    let said = format!("{:#}", settings.server_tls("discovery").err().expect("no such file"));
    assert!(said.contains("tls_cert_file: cannot read /nonexistent/cert.pem"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_listed_in_the_tokens_file_is_a_principal() {
    agentmesh_testkit::install_tls();
    let pki = TestPki::new("cert-principal").unwrap();
    let server = pki.issue("discovery").unwrap();
    let executor = pki.issue("executor").unwrap();
    let unlisted = pki.issue("unlisted").unwrap();
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tokens = pki.dir().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[certificate]]\nprincipal = \"executor\"\nroles = [\"service\"]\nsha256 = \"{}\"\n",
            agentmesh_server::auth::certificate_hash(&read(&executor.cert)).unwrap()
        ),
    )
    .unwrap();
    let (cert, key, client_ca) = (server.cert.clone(), server.key.clone(), pki.ca_file());
    let Some(ctx) = Ctx::start_with(Backend::Sqlite, |c| {
        c.service.tls_cert_file = Some(cert);
        c.service.tls_key_file = Some(key);
        c.service.tls_client_ca_file = Some(client_ca);
        c.service.auth_tokens_file = Some(tokens);
    })
    .await
    else {
        return;
    };
    let https = format!("https://127.0.0.1:{}", ctx.svc.addr.port());
    let ca = Some(pki.ca_pem.clone().into_bytes());
    // Its certificate alone makes the executor a service: it may watch the catalog.
    let listed = ClientSettings {
        ca_pem: ca.clone(),
        identity: Some((read(&executor.cert), read(&executor.key))),
        bearer: None,
    };
    let channel = agentmesh_telemetry::rpc::channel("discovery", &https, &listed).unwrap();
    let mut client = DiscoveryServiceClient::new(channel);
    let watch = client.watch_catalog(pb::WatchCatalogRequest { include_snapshot: true }).await;
    assert!(watch.is_ok(), "{:?}", watch.err());
    // Signed by the CA but not listed: the connection is made, the call refused.
    let other =
        ClientSettings { ca_pem: ca, identity: Some((read(&unlisted.cert), read(&unlisted.key))), bearer: None };
    let refused = list(&https, &other).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("client certificate") && refused.message().contains("not listed"),
        "{}",
        refused.message()
    );
}
