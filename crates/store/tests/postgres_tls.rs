//! PostgreSQL over TLS, against a real PostgreSQL server started for the
//! test (its own data directory and port, TLS on with a certificate from a
//! CA made here): `sslmode=verify-full` connects and verifies, a server
//! certificate of another CA is refused with a message that says where to
//! look, and an `[::1]`-style host is resolved.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentmesh_testkit::TestPki;
use sqlx::Connection;

/// The newest PostgreSQL installation's `bin` directory.
fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| d.parent().and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok()).unwrap_or(0));
    dirs.pop()
}

fn running_as_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args…`, as the `postgres` user when this runs as root
/// (PostgreSQL refuses to run as root).
fn as_postgres(program: &Path, args: &[&str]) -> Command {
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program).args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

/// A PostgreSQL server of its own, stopped when dropped.
struct TlsPostgres {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl TlsPostgres {
    /// Starts PostgreSQL with TLS on, serving `cert` and `key`; `None`
    /// (reported) when PostgreSQL is not installed outside CI.
    async fn start(cert: &Path, key: &Path) -> Option<Self> {
        let Some(bin) = postgres_bin() else {
            assert!(std::env::var("CI").is_err(), "PostgreSQL's initdb is required under CI=true");
            eprintln!("SKIPPED: no PostgreSQL installation under /usr/lib/postgresql");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("agentmesh-pgtls-{}-{:x}", std::process::id(), rand_suffix()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).unwrap();
        for (from, to) in [(cert, "server.pem"), (key, "server.key")] {
            std::fs::copy(from, dir.join(to)).unwrap();
        }
        if running_as_root() {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().unwrap();
            assert!(status.success());
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let data_arg = data.to_string_lossy().to_string();
        let initdb = as_postgres(&bin.join("initdb"), &["-D", &data_arg, "-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(initdb.status.success(), "initdb failed: {}", String::from_utf8_lossy(&initdb.stderr));
        let port = free_port();
        let (cert_arg, key_arg) = (
            format!("ssl_cert_file={}", dir.join("server.pem").display()),
            format!("ssl_key_file={}", dir.join("server.key").display()),
        );
        let socket_dir = dir.to_string_lossy().to_string();
        let child = as_postgres(
            &bin.join("postgres"),
            &[
                "-D",
                &data_arg,
                "-p",
                &port.to_string(),
                "-k",
                &socket_dir,
                "-c",
                "listen_addresses=127.0.0.1,::1",
                "-c",
                "ssl=on",
                "-c",
                &cert_arg,
                "-c",
                &key_arg,
                "-c",
                "fsync=off",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let server = Self { child, dir, port };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable");
        while sqlx::PgConnection::connect(&url).await.is_err() {
            assert!(tokio::time::Instant::now() < deadline, "the TLS PostgreSQL did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(server)
    }
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_over_tls_says_so_and_refuses_a_server_it_cannot_verify() {
    let pki = TestPki::new("postgres").unwrap();
    let server_cert = pki.issue("postgres").unwrap();
    let Some(pg) = TlsPostgres::start(&server_cert.cert, &server_cert.key).await else { return };
    let ca = pki.ca_file();

    // The store opens over verified TLS (by name and by address) and runs its migrations.
    for host in ["localhost", "127.0.0.1"] {
        let url =
            format!("postgres://postgres@{host}:{}/postgres?sslmode=verify-full&sslrootcert={}", pg.port, ca.display());
        let store = agentmesh_store::connect(&url).await.unwrap_or_else(|e| panic!("{host}: {e}"));
        store.ping().await.unwrap();
        let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
        let encrypted: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&mut connection)
            .await
            .unwrap();
        assert!(encrypted, "{host}: connected in plaintext");
    }

    // A CA that did not sign the server's certificate: refused, saying where to look.
    let other = TestPki::new("other").unwrap();
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.port,
        other.ca_file().display()
    );
    let refused = agentmesh_store::connect(&url).await.err().expect("an unverified server was accepted").to_string();
    assert!(refused.contains("TLS to PostgreSQL") && refused.contains("sslrootcert"), "{refused}");

    // Whether a connection is encrypted is always said. (In this one test:
    // a subscriber set for one thread misses events while tests on other
    // threads reach the same log lines.)
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || sink.clone()).with_ansi(false).finish();
    {
        let _guard = tracing::subscriber::set_default(subscriber);
        let tls = format!(
            "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
            pg.port,
            pki.ca_file().display()
        );
        agentmesh_store::connect(&tls).await.unwrap();
        let plain = format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable", pg.port);
        agentmesh_store::connect(&plain).await.unwrap();
    }
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).to_string();
    assert!(logs.contains("PostgreSQL connection encrypted (TLS)") && logs.contains("verifyfull"), "{logs}");
    assert!(logs.contains("PostgreSQL connection not encrypted (loopback)") && logs.contains("disable"), "{logs}");

    // An IPv6 literal in brackets is resolved without them.
    let url = format!("postgres://postgres@[::1]:{}/postgres?sslmode=disable", pg.port);
    if std::net::TcpStream::connect(("::1", pg.port)).is_ok() {
        agentmesh_store::connect(&url).await.unwrap_or_else(|e| panic!("[::1]: {e}"));
    }
}

/// Log lines written while `run` runs, on this thread.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
