//! `agentmesh up`: the mesh in one process on the embedded default.
//! Discovery and the executor always run; the planner and synthesis run
//! when an LLM is configured for them, and the executor then uses the
//! planner for loop-back; with both, the gateway runs in front.

use std::future::Future;

use tokio::sync::watch;

use crate::config::Config;

/// Runs every service until `shutdown` resolves; the first to fail stops the rest.
pub async fn run(mut config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let (stop, stopped) = watch::channel(false);
    let until = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let with_planner = !config.planner.llm.llm.trim().is_empty();
    let with_synthesis = !config.synthesis.llm.llm.trim().is_empty();
    let discovery_url = format!("http://{}", config.discovery.service.listen);
    config.planner.discovery_url.clone_from(&discovery_url);
    config.synthesis.discovery_url.clone_from(&discovery_url);
    let with_gateway = with_planner && with_synthesis;
    config.gateway.planner_url = format!("http://{}", config.planner.service.listen);
    config.gateway.executor_url = format!("http://{}", config.executor.service.listen);
    config.gateway.synthesis_url = format!("http://{}", config.synthesis.service.listen);
    config.executor.discovery_url = discovery_url;
    if with_planner {
        config.executor.planner_url = Some(format!("http://{}", config.planner.service.listen));
    }
    // Every port first, so that a port in use fails before anything is announced.
    let bind = agentmesh_server::service::bind;
    let discovery_listener = bind("discovery", config.discovery.service.listen)?;
    let executor_listener = bind("the executor", config.executor.service.listen)?;
    let planner_listener = with_planner.then(|| bind("the planner", config.planner.service.listen)).transpose()?;
    let synthesis_listener = with_synthesis.then(|| bind("synthesis", config.synthesis.service.listen)).transpose()?;
    let gateway_listener = with_gateway.then(|| bind("the gateway", config.gateway.service.listen)).transpose()?;
    eprintln!(
        "agentmesh up: discovery on {} (gRPC and HTTP), executor on {}{}{}{}; data in {}",
        config.discovery.service.listen,
        config.executor.service.listen,
        if with_planner {
            format!(", planner on {} ({})", config.planner.service.listen, config.planner.llm.llm)
        } else {
            ", no planner (pass --llm provider:model to run one)".to_owned()
        },
        if with_synthesis { format!(", synthesis on {}", config.synthesis.service.listen) } else { String::new() },
        if with_gateway {
            format!(", gateway on {} (agentmesh ask \"…\")", config.gateway.service.listen)
        } else {
            String::new()
        },
        agentmesh_server::redact(&config.discovery.service.database_url),
    );
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
