//! `agentmesh up`: the mesh in one process on the embedded default.
//! Discovery and the executor always run; the planner and synthesis run
//! when an LLM is configured for them, and the executor then uses the
//! planner for loop-back; with both, the gateway runs in front.

use std::future::Future;

use tokio::sync::watch;

use crate::config::Config;

/// The listeners of the services `up` runs, bound before anything starts.
pub struct Listeners {
    discovery: tokio::net::TcpListener,
    executor: tokio::net::TcpListener,
    planner: Option<tokio::net::TcpListener>,
    synthesis: Option<tokio::net::TcpListener>,
    gateway: Option<tokio::net::TcpListener>,
}

/// Binds every port first, so that a port in use fails before anything is
/// announced, and writes the bound addresses (a port 0 becomes the port
/// given) back into `config`, with the addresses the services call each
/// other at.
pub fn bind(config: &mut Config) -> anyhow::Result<Listeners> {
    let with_planner = !config.planner.llm.llm.trim().is_empty();
    let with_synthesis = !config.synthesis.llm.llm.trim().is_empty();
    let with_gateway = with_planner && with_synthesis;
    let bind = |name: &str, addr: &mut std::net::SocketAddr| -> anyhow::Result<tokio::net::TcpListener> {
        let listener = agentmesh_server::service::bind(name, *addr)?;
        *addr = listener.local_addr()?;
        Ok(listener)
    };
    let listeners = Listeners {
        discovery: bind("discovery", &mut config.discovery.service.listen)?,
        executor: bind("the executor", &mut config.executor.service.listen)?,
        planner: with_planner.then(|| bind("the planner", &mut config.planner.service.listen)).transpose()?,
        synthesis: with_synthesis.then(|| bind("synthesis", &mut config.synthesis.service.listen)).transpose()?,
        gateway: with_gateway.then(|| bind("the gateway", &mut config.gateway.service.listen)).transpose()?,
    };
    let discovery_url = format!("http://{}", config.discovery.service.listen);
    config.planner.discovery_url.clone_from(&discovery_url);
    config.synthesis.discovery_url.clone_from(&discovery_url);
    config.gateway.planner_url = format!("http://{}", config.planner.service.listen);
    config.gateway.executor_url = format!("http://{}", config.executor.service.listen);
    config.gateway.synthesis_url = format!("http://{}", config.synthesis.service.listen);
    config.gateway.discovery_url.clone_from(&discovery_url);
    config.executor.discovery_url = discovery_url;
    if with_planner {
        config.executor.planner_url = Some(format!("http://{}", config.planner.service.listen));
    }
    // The services the executor does not call are never agents either.
    for (runs, listen) in
        [(with_synthesis, config.synthesis.service.listen), (with_gateway, config.gateway.service.listen)]
    {
        if runs {
            config.executor.mesh_addresses.push(listen.to_string());
        }
    }
    Ok(listeners)
}

/// Runs every service until `shutdown` resolves; the first to fail stops the rest.
pub async fn run(mut config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listeners = bind(&mut config)?;
    announce(&config);
    run_bound(config, listeners, shutdown).await
}

/// The one line that says what runs where.
fn announce(config: &Config) {
    let with_planner = !config.planner.llm.llm.trim().is_empty();
    let with_synthesis = !config.synthesis.llm.llm.trim().is_empty();
    let with_gateway = with_planner && with_synthesis;
    eprintln!(
        "agentmesh up: discovery on {} (gRPC and HTTP), executor on {}{}{}{}; data in {}",
        config.discovery.service.listen,
        config.executor.service.listen,
        if with_planner {
            format!(", planner on {} ({})", config.planner.service.listen, config.planner.llm.llm)
        } else {
            String::new()
        },
        if with_synthesis { format!(", synthesis on {}", config.synthesis.service.listen) } else { String::new() },
        if with_gateway {
            format!(", gateway on {} (agentmesh ask \"…\")", config.gateway.service.listen)
        } else {
            String::new()
        },
        agentmesh_server::redact(&config.discovery.service.database_url),
    );
    if !with_planner {
        eprintln!(
            "agentmesh up: no planner, synthesis or gateway: planning needs a model. Give one with \
             --llm openai:MODEL --llm-base-url http://127.0.0.1:11434/v1 (Ollama, llama.cpp, vLLM…) or \
             --llm anthropic:sonnet with ANTHROPIC_API_KEY set; or see the whole mesh at work offline with \
             `agentmesh demo`."
        );
    }
}

/// Runs the services on listeners from [`bind`] until `shutdown`.
pub async fn run_bound(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop, stopped) = watch::channel(false);
    let until = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let Listeners {
        discovery: discovery_listener,
        executor: executor_listener,
        planner: planner_listener,
        synthesis: synthesis_listener,
        gateway: gateway_listener,
    } = listeners;
    let discovery = agentmesh_discovery::serve_with_listener(config.discovery, discovery_listener, until());
    let executor = agentmesh_executor::serve_with_listener(config.executor, executor_listener, until());
    let (planner_stop, synthesis_stop, gateway_stop) = (until(), until(), until());
    let planner = async move {
        match planner_listener {
            Some(l) => agentmesh_planner::serve_with_listener(config.planner, l, planner_stop).await,
            None => Ok(()),
        }
    };
    let synthesis = async move {
        match synthesis_listener {
            Some(l) => agentmesh_synthesis::serve_with_listener(config.synthesis, l, synthesis_stop).await,
            None => Ok(()),
        }
    };
    let gateway = async move {
        match gateway_listener {
            Some(l) => agentmesh_gateway::serve_with_listener(config.gateway, l, gateway_stop).await,
            None => Ok(()),
        }
    };
    let signal = async move {
        shutdown.await;
        let _ = stop.send(true);
        Ok::<(), anyhow::Error>(())
    };
    tokio::try_join!(discovery, executor, planner, synthesis, gateway, signal)?;
    Ok(())
}
