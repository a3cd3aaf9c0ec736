//! The demo agents of `agentmesh demo`, each a few lines of the agent SDK.
//! Their data is made up and fixed, so that a demo run is the same every
//! time: they show how an agent is written, not where weather comes from.
//!
//! - [`weather`]: `weather-tool-v2`, the current weather for a city;
//! - [`stocks`]: `stock-quotes`, the last price of a ticker symbol; its
//!   first attempt at each step fails as retryable, to show retries;
//! - [`calculator`]: `calculator`, arithmetic expressions;
//! - [`travel`]: `travel-orchestrator`, whose `orchestrate_request` asks the
//!   mesh itself and is registered as internal, so that no plan ever calls
//!   it (an orchestrator offered to its own planner calls itself);
//! - [`reviewer`] and [`fixer`]: `code-reviewer` finds a SQL injection and
//!   asks `fixer` to collaborate (the executor's loop-back).

mod calc;

use std::time::Duration;

use agentmesh_agent::{Agent, AgentError, Call, Capability};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use calc::evaluate;

/// A city.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Location {
    /// The city, e.g. "Chicago".
    pub location: String,
}

/// The weather now.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Weather {
    /// The city asked for.
    pub location: String,
    /// Temperature in degrees Celsius.
    pub temp_c: f64,
    /// Sky and precipitation, in words.
    pub conditions: String,
}

/// The weather agent (`weather-tool-v2`, skill `get_current_weather`).
pub fn weather() -> Agent {
    Agent::new("weather-tool-v2").version("2.0.0").tags(["weather"]).capability(
        Capability::skill(
            "get_current_weather",
            "Current weather for a location",
            |_: Call, input: Location| async move {
                let city = input.location.trim();
                if city.is_empty() {
                    return Err(AgentError::new("no location given"));
                }
                let (temp_c, conditions) = match city.to_lowercase().as_str() {
                    "chicago" => (18.0, "partly cloudy"),
                    "tokyo" => (24.0, "clear"),
                    "london" => (12.5, "light rain"),
                    "new york" => (20.0, "sunny"),
                    other => (f64::from(other.bytes().map(u32::from).sum::<u32>() % 30), "clear"),
                };
                Ok(Weather { location: city.to_owned(), temp_c, conditions: conditions.to_owned() })
            },
        )
        .tags(["weather", "data"]),
    )
}

/// A ticker symbol.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Symbol {
    /// The ticker, e.g. "TSLA".
    pub symbol: String,
}

/// A price.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Quote {
    /// The ticker.
    pub symbol: String,
    /// Last price in US dollars.
    pub price_usd: f64,
}

/// The stock quotes agent (`stock-quotes`, skill `get_stock_price`). The
/// first attempt of every step fails as retryable ("the quote feed timed
/// out"), so that a demo shows the executor retrying.
pub fn stocks() -> Agent {
    Agent::new("stock-quotes").version("1.0.0").tags(["finance"]).capability(
        Capability::skill(
            "get_stock_price",
            "Last traded price of a stock by ticker symbol",
            |call: Call, input: Symbol| async move {
                if call.attempt <= 1 && !call.execution_id.is_empty() {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    return Err(AgentError::retryable("the quote feed timed out"));
                }
                let symbol = input.symbol.trim().to_uppercase();
                let price_usd = match symbol.as_str() {
                    "TSLA" => 250.0,
                    "AAPL" => 190.0,
                    "MSFT" => 410.0,
                    "" => return Err(AgentError::new("no ticker symbol given")),
                    other => return Err(AgentError::new(format!("unknown ticker symbol {other}"))),
                };
                Ok(Quote { symbol, price_usd })
            },
        )
        .tags(["finance", "stocks"]),
    )
}

/// An arithmetic expression.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Expression {
    /// E.g. "100 * 250 * 18": numbers, + - * / ^ and parentheses.
    pub expression: String,
}

/// A number.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Number {
    /// The expression's value.
    pub result: f64,
}

/// The calculator (`calculator`, skill `evaluate`).
pub fn calculator() -> Agent {
    Agent::new("calculator").version("1.0.0").tags(["math"]).capability(
        Capability::skill(
            "evaluate",
            "Evaluates an arithmetic expression (+ - * / ^ and parentheses)",
            |_: Call, input: Expression| async move {
                evaluate(&input.expression).map(|result| Number { result }).map_err(AgentError::new)
            },
        )
        .tags(["math", "calculator"]),
    )
}

/// A travel request in words.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TravelRequest {
    /// What the traveller wants, e.g. "a trip to Tokyo next week".
    pub request: String,
}

/// The mesh's answer to it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TravelAnswer {
    /// The answer.
    pub answer: String,
    /// The request id of the orchestration, to look it up.
    pub request_id: String,
}

/// The travel orchestrator (`travel-orchestrator`): its
/// `orchestrate_request` asks the mesh's gateway (REST, at `gateway_url`)
/// to orchestrate the request, naming itself as the caller. It is
/// registered as internal, and the gateway is told who calls, so the
/// planner never offers the orchestrator to itself.
pub fn travel(gateway_url: impl Into<String>) -> Agent {
    let gateway_url = gateway_url.into();
    Agent::new("travel-orchestrator").version("1.0.0").tags(["travel", "orchestrator"]).capability(
        Capability::reasoner(
            "orchestrate_request",
            "Plans and researches a trip from a request in natural language",
            move |call: Call, input: TravelRequest| {
                let url = format!("{}/api/v1/orchestrate", gateway_url.trim_end_matches('/'));
                async move {
                    let body = serde_json::json!({
                        "query": input.request,
                        "caller_agent_ids": ["travel-orchestrator"],
                        "options": {"context": {"asked_by_request": call.request_id}},
                    });
                    let http = agentmesh_agent::http_client_builder()
                        .build()
                        .map_err(|e| AgentError::new(format!("no HTTP client: {e}")))?;
                    let answer: serde_json::Value = http
                        .post(&url)
                        .json(&body)
                        .send()
                        .await
                        .map_err(|e| AgentError::retryable(format!("the mesh cannot be reached at {url}: {e}")))?
                        .json()
                        .await
                        .map_err(|e| AgentError::new(format!("the mesh answered no JSON: {e}")))?;
                    Ok(TravelAnswer {
                        answer: answer["answer"].as_str().unwrap_or_default().to_owned(),
                        request_id: answer["request_id"].as_str().unwrap_or_default().to_owned(),
                    })
                }
            },
        )
        .internal(),
    )
}

/// Code to look at.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Code {
    /// The file's name, e.g. "auth.py".
    pub file: String,
    /// Its source.
    pub code: String,
}

/// A review.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Review {
    /// "approved" or "changes requested".
    pub verdict: String,
    /// What was found, one line each.
    pub issues: Vec<String>,
}

/// Where `code` builds SQL by pasting values into it, as `file:line`.
fn sql_injections(file: &str, code: &str) -> Vec<String> {
    code.lines()
        .enumerate()
        .filter(|(_, line)| {
            let lower = line.to_lowercase();
            lower.contains("select ") && (line.contains("\" +") || line.contains("' +") || line.contains("f\""))
        })
        .map(|(i, _)| format!("{file}:{}: SQL built by pasting user input (SQL injection)", i + 1))
        .collect()
}

/// The code reviewer (`code-reviewer`, reasoner `review_code`): when it
/// finds a SQL injection it asks `fixer` to fix it (a collaboration
/// request: the executor loops back through the planner).
pub fn reviewer() -> Agent {
    Agent::new("code-reviewer").version("1.0.0").tags(["code"]).capability(
        Capability::reasoner(
            "review_code",
            "Reviews source code for security bugs",
            |call: Call, input: Code| async move {
                let issues = sql_injections(&input.file, &input.code);
                if let Some(first) = issues.first() {
                    let place = first.split(": ").next().unwrap_or(&input.file).to_owned();
                    call.collaborate("fixer", "fix_code", format!("Fix the SQL injection in {place}"));
                }
                let verdict = if issues.is_empty() { "approved" } else { "changes requested" };
                Ok(Review { verdict: verdict.to_owned(), issues })
            },
        )
        .tags(["code", "review"]),
    )
}

/// What to fix.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Fix {
    /// The bug, with its place, e.g. "SQL injection in auth.py:2".
    pub issue: String,
}

/// A proposed change.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Patch {
    /// What was changed and how.
    pub patch: String,
}

/// The fixer (`fixer`, skill `fix_code`).
pub fn fixer() -> Agent {
    Agent::new("fixer").version("1.0.0").tags(["code"]).capability(
        Capability::skill("fix_code", "Fixes a reported bug in source code", |_: Call, input: Fix| async move {
            let issue = input.issue.trim();
            if issue.is_empty() {
                return Err(AgentError::new("no issue given"));
            }
            let patch = if issue.to_lowercase().contains("sql injection") {
                format!("{issue}: use a parameterised query, cursor.execute(\"SELECT … WHERE name = %s\", (name,))")
            } else {
                format!("{issue}: no automatic fix known")
            };
            Ok(Patch { patch })
        })
        .tags(["code", "fix"]),
    )
}

/// Every demo agent, the travel orchestrator asking the gateway at `gateway_url`.
pub fn all(gateway_url: &str) -> Vec<Agent> {
    vec![weather(), stocks(), calculator(), travel(gateway_url), reviewer(), fixer()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reviewer_finds_pasted_sql() {
        let code = "def login(name):\n    q = \"SELECT * FROM users WHERE name = '\" + name + \"'\"\n";
        assert_eq!(sql_injections("auth.py", code), ["auth.py:2: SQL built by pasting user input (SQL injection)"]);
        assert!(sql_injections("ok.py", "cursor.execute(\"SELECT 1\", ())").is_empty());
    }

    /// `weather.json` is the weather agent's registration at
    /// 127.0.0.1:9001, for the README's walk-through (`AGENTMESH_BLESS=1`
    /// writes it anew).
    #[test]
    fn the_walk_through_registration_file_is_the_agents_own() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weather.json");
        let expected = serde_json::to_string_pretty(&weather().registration("http://127.0.0.1:9001")).unwrap() + "\n";
        if std::env::var("AGENTMESH_BLESS").as_deref() == Ok("1") {
            std::fs::write(&path, &expected).unwrap();
        }
        let found = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(found, expected, "{} is out of date: run with AGENTMESH_BLESS=1", path.display());
    }

    #[test]
    fn registrations_carry_derived_schemas() {
        let weather = weather().registration("http://127.0.0.1:9001");
        let skill = &weather["skills"][0];
        assert_eq!(skill["id"], "get_current_weather");
        assert_eq!(skill["input_schema"]["required"], serde_json::json!(["location"]));
        assert_eq!(skill["input_schema"]["properties"]["location"]["type"], "string");
        assert_eq!(skill["output_schema"]["properties"]["temp_c"]["type"], "number");
        let travel = travel("http://127.0.0.1:7404").registration("http://x");
        assert_eq!(travel["reasoners"][0]["internal"], true);
    }
}
