//! Secrets kept out of logs, printed configuration and `Debug` output, by
//! one rule: a URL loses its password and its secret query parameters, and
//! a setting whose name says it holds a secret (`password`, `token`,
//! `…_key`) is shown as `***`.

use serde::Serialize;
use serde_json::Value;

/// Query parameters that carry a secret: libpq's passwords, and the API
/// keys and tokens some services take in the URL.
const SECRET_PARAMETERS: [&str; 9] =
    ["password", "sslpassword", "key", "api_key", "apikey", "api-key", "token", "access_token", "secret"];

/// A URL with its secrets replaced by `***`, for logs and printed
/// configuration: the user-info password, and query parameters such as
/// `password=` or `key=` alike.
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let base = match (base.find("://"), base.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match base[scheme + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &base[..scheme + 3], &base[at..]),
            None => base.to_owned(),
        },
        _ => base.to_owned(),
    };
    match query {
        None => base,
        Some(query) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if SECRET_PARAMETERS.iter().any(|s| key.eq_ignore_ascii_case(s)) => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
    }
}

/// Whether a setting named `key` holds a secret: `api_key`, `password`,
/// `auth_token`, `client_secret`…, but not `max_tokens` or `keys`.
pub fn names_a_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let words: Vec<&str> = key.split(['_', '-']).collect();
    words.last() == Some(&"key")
        || words.iter().any(|w| matches!(*w, "password" | "passwd" | "secret" | "token" | "apikey"))
}

/// Whether a setting named `key` holds an address that may carry a
/// password (`database_url`, `otlp_endpoint`).
fn names_an_address(key: &str) -> bool {
    key.ends_with("url") || key.ends_with("endpoint")
}

/// Hides every secret in settings turned into JSON: values of secret
/// settings become `***`, addresses lose their passwords.
pub fn hide_secrets(value: &mut Value) {
    hide(value, "");
}

fn hide(value: &mut Value, key: &str) {
    match value {
        Value::Object(fields) => fields.iter_mut().for_each(|(key, value)| hide(value, key)),
        Value::Array(items) => items.iter_mut().for_each(|item| hide(item, key)),
        Value::String(text) if names_a_secret(key) => "***".clone_into(text),
        Value::String(text) if names_an_address(key) => *text = redact(text),
        _ => {}
    }
}

/// `Debug` for settings: every field as its JSON value, secrets hidden
/// ([`hide_secrets`]), so that a new field can never be printed in the
/// clear. Use in `impl Debug`: `secrets::debug_settings("PlannerConfig", self, f)`.
pub fn debug_settings(name: &str, settings: &impl Serialize, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    let mut value = match serde_json::to_value(settings) {
        Ok(value) => value,
        Err(e) => return write!(f, "{name} {{ <not printable: {e}> }}"),
    };
    hide_secrets(&mut value);
    let mut out = f.debug_struct(name);
    if let Value::Object(fields) = &value {
        for (key, value) in fields {
            out.field(key, &Shown(value));
        }
    }
    out.finish()
}

/// A JSON value shown as JSON (`256`, `"text"`, `null`).
struct Shown<'a>(&'a Value);

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://a.db"), "sqlite://a.db");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=off&password=secret"),
            "postgres://u@h/db?sslmode=off&password=***"
        );
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db?SSLPassword=secret"), "postgres://u@h/db?SSLPassword=***");
        assert_eq!(
            redact("https://u:secret@llm.internal/v1?key=secret&model=m&access_token=secret"),
            "https://u:***@llm.internal/v1?key=***&model=m&access_token=***"
        );
    }

    #[test]
    fn secret_settings_are_known_by_name() {
        for key in ["api_key", "password", "auth_token", "client_secret", "OPENAI_API_KEY"] {
            assert!(names_a_secret(key), "{key}");
        }
        for key in ["max_tokens", "keys", "keyword", "llm", "database_url"] {
            assert!(!names_a_secret(key), "{key}");
        }
    }

    #[test]
    fn debug_output_shows_every_field_and_no_secret() {
        #[derive(Serialize)]
        struct Settings {
            database_url: String,
            api_key: Option<String>,
            retries: u32,
            nested: Vec<std::collections::BTreeMap<&'static str, &'static str>>,
        }
        struct Shown(Settings);
        impl std::fmt::Debug for Shown {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                debug_settings("Settings", &self.0, f)
            }
        }
        let settings = Settings {
            database_url: "postgres://app:hunter2@db/agentmesh".into(),
            api_key: Some("sk-hunter3".into()),
            retries: 3,
            nested: vec![[("client_secret", "hunter4")].into_iter().collect()],
        };
        let shown = format!("{:?}", Shown(settings));
        assert!(!shown.contains("hunter"), "{shown}");
        assert_eq!(
            shown,
            r#"Settings { database_url: "postgres://app:***@db/agentmesh", api_key: "***", retries: 3, nested: [{"client_secret":"***"}] }"#
        );
    }
}
