//! `agentmesh token`: a new bearer token for a principal, and the entry
//! that lists it (hashed) in a service's `auth_tokens_file`.

use clap::Args;

/// Flags of `agentmesh token`.
#[derive(Args, Debug)]
pub struct TokenArgs {
    /// Who the token is for (shown in refusals and logs).
    #[arg(long)]
    principal: String,
    /// Its roles: operator, client, service or agent:<id> (repeatable).
    #[arg(long = "role", required = true)]
    roles: Vec<String>,
    /// Instead of a token: the principal's client certificate (PEM), for
    /// callers that authenticate with mTLS.
    #[arg(long, value_name = "PEM_FILE")]
    cert: Option<std::path::PathBuf>,
}

/// Prints a fresh token and its `auth_tokens_file` entry.
pub fn token(args: &TokenArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.principal.trim().is_empty(), "--principal must not be empty");
    for role in &args.roles {
        agentmesh_server::auth::Role::parse(role).map_err(|e| anyhow::anyhow!("--role {e}"))?;
    }
    let roles: Vec<String> = args.roles.iter().map(|r| format!("\"{r}\"")).collect();
    let principal = toml::Value::String(args.principal.clone());
    if let Some(path) = &args.cert {
        let pem = std::fs::read(path).map_err(|e| anyhow::anyhow!("--cert: cannot read {}: {e}", path.display()))?;
        let hash = agentmesh_server::auth::certificate_hash(&pem)
            .map_err(|e| anyhow::anyhow!("--cert {}: {e:#}", path.display()))?;
        eprintln!("add to the auth_tokens_file of every service it calls (with their tls_client_ca_file set):\n");
        println!("[[certificate]]\nprincipal = {principal}\nroles = [{}]\nsha256 = \"{hash}\"", roles.join(", "));
        return Ok(());
    }
    let token = format!(
        "am_{:016x}{:016x}{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>(),
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    eprintln!(
        "the token, for {} only (it is not kept anywhere; send it as `authorization: Bearer …`):",
        args.principal
    );
    println!("{token}");
    eprintln!("\nadd to the auth_tokens_file of every service it calls (the file holds only the hash):\n");
    eprintln!(
        "[[token]]\nprincipal = {principal}\nroles = [{}]\nsha256 = \"{}\"",
        roles.join(", "),
        agentmesh_server::auth::token_hash(&token)
    );
    Ok(())
}
