//! Secrets kept out of logs, printed configuration and `Debug` output, by
//! one rule: a URL loses its password and its secret query parameters, and
//! a setting whose name says it holds a secret (`password`, `token`,
//! `…_key`) is shown as `***`.

use serde::Serialize;
use serde_json::Value;

/// Query parameters that carry a secret: libpq's passwords, and the API
/// keys, tokens and signatures some services take in the URL.
const SECRET_PARAMETERS: [&str; 6] = ["key", "apikey", "api-key", "sig", "signature", "auth"];

/// Whether a query parameter named `name` carries a secret: the names in
/// [`SECRET_PARAMETERS`] and any a setting would be hidden for
/// (`password`, `sslpassword`, `access_token`, `client_secret`, `api_key`…).
fn secret_parameter(name: &str) -> bool {
    SECRET_PARAMETERS.iter().any(|s| name.eq_ignore_ascii_case(s))
        || names_a_secret(name)
        || name.to_ascii_lowercase().ends_with("password")
}

/// A URL with its secrets replaced by `***`, for logs, spans, errors and
/// printed configuration: the user-info password, and query parameters such
/// as `password=`, `key=` or `access_token=` alike. The user name stays (it
/// says which account is used); anything after `#` is dropped.
pub fn redact(url: &str) -> String {
    let url = url.split_once('#').map_or(url, |(url, _)| url);
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    // The user info ends at the last `@` of the authority, which ends at the
    // first `/` after the scheme: an `@` in the path is not user info.
    let base = match base.find("://") {
        Some(scheme) => {
            let rest = &base[scheme + 3..];
            let authority = rest.find('/').map_or(rest, |slash| &rest[..slash]);
            match authority.rfind('@').and_then(|at| authority[..at].split_once(':').map(|(user, _)| (user, at))) {
                Some((user, at)) => format!("{}{user}:***{}", &base[..scheme + 3], &rest[at..]),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    match query {
        None => base,
        Some(query) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if secret_parameter(key) => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
    }
}

/// [`redact`] without a copy for the usual URL, which has no user info, no
/// query and no fragment: for hot paths that show many addresses.
pub fn redacted(url: &str) -> std::borrow::Cow<'_, str> {
    if url.contains(['@', '?', '#']) { std::borrow::Cow::Owned(redact(url)) } else { std::borrow::Cow::Borrowed(url) }
}

/// The secret parts of a URL as they may appear in a text: the user-info
/// password and the values of secret query parameters, as written and
/// percent-decoded. What [`scrub`] hides in texts that may echo the URL.
pub fn url_secrets(url: &str) -> Vec<String> {
    let Ok(parsed) = reqwest::Url::parse(url) else { return Vec::new() };
    let mut secrets = Vec::new();
    if let Some(password) = parsed.password() {
        secrets.push(password.to_owned());
    }
    for pair in parsed.query().unwrap_or_default().split('&') {
        if let Some((name, value)) = pair.split_once('=')
            && secret_parameter(name)
        {
            secrets.push(value.to_owned());
        }
    }
    for (name, value) in parsed.query_pairs() {
        if secret_parameter(&name) {
            secrets.push(value.into_owned());
        }
    }
    if let Some(password) = parsed.password() {
        secrets.push(percent_encoding::percent_decode_str(password).decode_utf8_lossy().into_owned());
    }
    secrets.retain(|s| !s.is_empty());
    secrets.sort();
    secrets.dedup();
    secrets
}

/// Secrets shorter than this are not hidden in free text: they would hide
/// ordinary words and numbers (and are no secret worth the name).
const SHORTEST_SCRUBBED: usize = 4;

/// `text` with every occurrence of each of `secrets` replaced by `***`: for
/// texts a server wrote (an error body that echoes the API key) or that
/// quote a URL, before they reach a log, a span, an error or a store.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_owned();
    // Longest first, so that a secret containing another is hidden whole.
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| s.len() >= SHORTEST_SCRUBBED).collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "***");
        }
    }
    text
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
        // An `@` in the path is not user info; a fragment is dropped.
        assert_eq!(redact("https://h/a@b:c/d?x=1#frag"), "https://h/a@b:c/d?x=1");
        assert_eq!(redact("http://u:pw@h/p@q"), "http://u:***@h/p@q");
        assert_eq!(
            redact("https://h/v1?client_secret=s&x-api-key=k&Signature=s2&page=2"),
            "https://h/v1?client_secret=***&x-api-key=***&Signature=***&page=2"
        );
    }

    #[test]
    fn the_secrets_of_a_url_are_found_and_scrubbed_from_text() {
        let url = "https://user:p%40ss-word@llm.internal/v1?api_key=k3y-value&model=m";
        let secrets = url_secrets(url);
        assert_eq!(secrets, ["k3y-value", "p%40ss-word", "p@ss-word"]);
        let echoed = "bad request for https://llm.internal/v1?api_key=k3y-value (password p@ss-word)";
        assert_eq!(scrub(echoed, &secrets), "bad request for https://llm.internal/v1?api_key=*** (password ***)");
        // Short secrets are not hunted in free text.
        assert_eq!(scrub("a b c", &["b".to_owned()]), "a b c");
        assert!(url_secrets("not a url").is_empty());
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
