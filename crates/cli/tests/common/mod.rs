//! `agentmesh demo --serve` for the CLI's tests: on free ports, stopped when
//! the test ends, however it ends.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// A running `agentmesh demo --serve`.
pub struct Demo {
    child: std::process::Child,
    /// Each service's URL by name (`discovery`, …, `gateway`), as printed.
    pub addresses: HashMap<String, String>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the demo with its data in `dir` and these extra environment
/// variables; returns once it has printed every service's address.
pub fn serve_demo(dir: &Path, env: &[(&str, &str)]) -> Demo {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentmesh"));
    command
        .args(["demo", "--serve", "--data-dir", dir.to_str().unwrap()])
        .env_remove("AGENTMESH_CONFIG")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for service in ["DISCOVERY", "PLANNER", "EXECUTOR", "SYNTHESIS", "GATEWAY"] {
        command.env(format!("AGENTMESH_{service}__LISTEN"), "127.0.0.1:0");
    }
    let mut child = command.spawn().unwrap();
    let mut addresses = HashMap::new();
    let mut printed = String::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [name, url] = words[..]
            && url.starts_with("http://")
        {
            addresses.insert(name.to_owned(), url.to_owned());
        }
        if addresses.contains_key("gateway") {
            break;
        }
    }
    // The demo goes on printing: its output is read (and dropped) until it
    // ends, since a closed pipe would end it.
    std::thread::spawn(move || lines.for_each(drop));
    let demo = Demo { child, addresses };
    assert!(
        demo.addresses.contains_key("discovery") && demo.addresses.contains_key("gateway"),
        "the demo printed no addresses:\n{printed}"
    );
    demo
}
