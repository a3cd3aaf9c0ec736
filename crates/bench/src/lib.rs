//! Shared pieces of the bench binaries: latency statistics, process memory,
//! a table printer, and starting a service in the process.

use std::time::Duration;

/// Latencies of one scenario.
#[derive(Debug, Default)]
pub struct Latencies {
    micros: Vec<u32>,
    /// Requests that failed.
    pub errors: u64,
}

impl Latencies {
    /// Records one successful request.
    pub fn record(&mut self, took: Duration) {
        self.micros.push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
    }

    /// Merges another set in.
    pub fn merge(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
        self.errors += other.errors;
    }

    /// Successful requests.
    pub fn count(&self) -> usize {
        self.micros.len()
    }

    /// The `p`-th percentile (0–100) in milliseconds.
    pub fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return f64::NAN;
        }
        self.micros.sort_unstable();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let rank = ((p / 100.0) * (self.micros.len() - 1) as f64).round() as usize;
        f64::from(self.micros[rank.min(self.micros.len() - 1)]) / 1000.0
    }
}

/// Resident and peak resident memory of a process, in MiB, from /proc.
pub fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time a process has used so far (user and system), in seconds,
/// from `/proc/PID/stat` (in ticks of 1/100 s, Linux's `USER_HZ`).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces, in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // utime and stime are the 14th and 15th fields, the 12th and 13th after the name.
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// Starts a service of this process on a loopback port and waits until
/// its `/healthz` answers; returns its address.
pub async fn spawn<F>(serve: impl FnOnce(tokio::net::TcpListener) -> F) -> anyhow::Result<std::net::SocketAddr>
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let listener = agentmesh_server::net::listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(serve(listener));
    let http = agentmesh_llm::client_builder().build()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while http.get(format!("http://{addr}/healthz")).send().await.is_err() {
        anyhow::ensure!(!task.is_finished() && std::time::Instant::now() < deadline, "a service did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(addr)
}

/// Prints a Markdown table.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", headers.join(" | "));
    println!("|{}|", headers.iter().map(|h| "-".repeat(h.len() + 2)).collect::<Vec<_>>().join("|"));
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut l = Latencies::default();
        for ms in 1..=100 {
            l.record(Duration::from_millis(ms));
        }
        assert_eq!(l.percentile_ms(50.0), 51.0);
        assert_eq!(l.percentile_ms(99.0), 99.0);
        assert_eq!(l.percentile_ms(0.0), 1.0);
        assert_eq!(l.count(), 100);
    }
}
