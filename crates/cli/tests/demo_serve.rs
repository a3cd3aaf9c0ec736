//! Clients of `agentmesh demo --serve`, as a user runs them: `agentmesh
//! ask`, and the Python examples (`examples/python/`: a gRPC client with
//! stubs generated from `proto/`, a REST/SSE client, an agent written with
//! the standard library). The Python examples need Python 3 with
//! `examples/python/requirements.txt` installed (`.ci/run` installs it);
//! under `CI=true` a missing one is a failure, elsewhere that part says it
//! was skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/python")
}

#[test]
fn ask_and_the_python_examples_work_against_demo_serve() {
    let dir = std::env::temp_dir().join(format!("agentmesh-python-examples-{}", std::process::id()));
    let demo = common::serve_demo(&dir, &[]);
    let (discovery, gateway) = (&demo.addresses["discovery"], &demo.addresses["gateway"]);
    // agentmesh ask, as the demo's banner suggests.
    let asked = Command::new(env!("CARGO_BIN_EXE_agentmesh"))
        .args(["ask", "What is the weather in Chicago?", "--gateway", gateway])
        .env_remove("AGENTMESH_CONFIG")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&asked.stdout), String::from_utf8_lossy(&asked.stderr));
    assert!(asked.status.success(), "ask failed:\n{out}\n{err}");
    assert_eq!(out.trim(), "It is 18 °C and partly cloudy in Chicago right now.", "{err}");
    assert!(err.contains("step_succeeded s1 (weather-tool-v2)") && err.contains("done: goal achieved"), "{err}");

    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let ready = Command::new(&python).args(["-c", "import grpc, grpc_tools"]).output();
    if !ready.as_ref().is_ok_and(|o| o.status.success()) {
        let why = "Python 3 with examples/python/requirements.txt installed is needed (pip install -r examples/python/requirements.txt)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("SKIPPED: the Python examples: {why}");
        return;
    }
    let output = Command::new("bash")
        .arg(examples().join("run_examples.sh"))
        .env("AGENTMESH_DISCOVERY_URL", discovery)
        .env("AGENTMESH_GATEWAY_URL", gateway)
        .env("AGENTMESH_SKIP_PIP", "1")
        .env("PYTHON", &python)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "the Python examples failed:\n{said}");
    for example in ["client_grpc.py", "client_rest.py", "agent.py"] {
        assert!(said.contains(&format!("PASS {example}")), "{example}:\n{said}");
    }
}
