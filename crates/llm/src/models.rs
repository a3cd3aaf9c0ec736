//! Model names and aliases. A request may prefer a model by name or by alias
//! (`flash`, `pro`, `sonnet`, `opus`, `haiku`, `fast`, `smart`, `auto`); each
//! provider resolves the aliases of its own family and says whether it can
//! serve a name at all, so that a fallback chain can try first the providers
//! that serve the preferred model.

/// Which naming scheme a provider's models follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OpenAI's hosted models.
    OpenAi,
    /// A self-hosted OpenAI-compatible server (Ollama, vLLM, llama.cpp…):
    /// any name may exist there.
    Compatible,
    /// Anthropic's Claude models.
    Anthropic,
    /// Google's Gemini models.
    Gemini,
}

/// Every alias and the model it stands for, per family. `auto` (not listed)
/// always means the provider's configured model.
pub const ALIASES: &[(Family, &str, &str)] = &[
    (Family::OpenAi, "fast", "gpt-5-mini"),
    (Family::OpenAi, "smart", "gpt-5"),
    (Family::Anthropic, "sonnet", "claude-sonnet-4-5"),
    (Family::Anthropic, "opus", "claude-opus-4-5"),
    (Family::Anthropic, "haiku", "claude-haiku-4-5"),
    (Family::Anthropic, "fast", "claude-haiku-4-5"),
    (Family::Anthropic, "smart", "claude-opus-4-5"),
    (Family::Gemini, "flash", "gemini-2.5-flash"),
    (Family::Gemini, "pro", "gemini-2.5-pro"),
    (Family::Gemini, "fast", "gemini-2.5-flash"),
    (Family::Gemini, "smart", "gemini-2.5-pro"),
];

fn alias(family: Family, name: &str) -> Option<&'static str> {
    ALIASES.iter().find(|(f, a, _)| *f == family && *a == name).map(|(_, _, model)| *model)
}

/// Aliases that name one family's models (`sonnet`, `flash`…), as opposed to
/// the generic `fast`, `smart` and `auto`.
fn is_family_alias(name: &str) -> bool {
    ALIASES.iter().any(|(_, a, _)| *a == name) && !matches!(name, "fast" | "smart")
}

/// Whether a provider of `family` can serve the model `name` (a name or an alias).
pub fn accepts(family: Family, name: &str) -> bool {
    if name.is_empty() || name == "auto" || alias(family, name).is_some() {
        return true;
    }
    match family {
        Family::Anthropic => name.starts_with("claude"),
        Family::Gemini => name.starts_with("gemini") || name.starts_with("models/gemini"),
        Family::OpenAi | Family::Compatible => {
            !is_family_alias(name) && !name.starts_with("claude") && !name.starts_with("gemini")
        }
    }
}

/// The model to ask for: the preference resolved for this family when the
/// provider serves it, else the configured model.
pub fn choose(family: Family, configured: &str, preferred: Option<&str>) -> String {
    match preferred.map(str::trim).filter(|p| !p.is_empty() && *p != "auto") {
        None => configured.to_owned(),
        Some(name) => match alias(family, name) {
            Some(model) => model.to_owned(),
            // A self-hosted server has one model of its own behind the generic aliases.
            None if family == Family::Compatible && matches!(name, "fast" | "smart") => configured.to_owned(),
            None if accepts(family, name) => name.to_owned(),
            None => {
                tracing::debug!(
                    preferred = name,
                    model = configured,
                    "preferred model not served by this provider; using its own"
                );
                configured.to_owned()
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_resolve_per_family_and_foreign_names_fall_back() {
        assert_eq!(choose(Family::Anthropic, "claude-haiku-4-5", Some("sonnet")), "claude-sonnet-4-5");
        assert_eq!(choose(Family::Gemini, "gemini-2.5-pro", Some("flash")), "gemini-2.5-flash");
        assert_eq!(choose(Family::OpenAi, "gpt-5", Some("fast")), "gpt-5-mini");
        assert_eq!(choose(Family::Compatible, "smollm2", Some("smart")), "smollm2");
        assert_eq!(choose(Family::Gemini, "gemini-2.5-pro", Some("auto")), "gemini-2.5-pro");
        assert_eq!(choose(Family::Gemini, "gemini-2.5-pro", Some("sonnet")), "gemini-2.5-pro");
        assert_eq!(choose(Family::OpenAi, "gpt-5", Some("gpt-4.1")), "gpt-4.1");
        assert!(accepts(Family::Anthropic, "opus"));
        assert!(!accepts(Family::Anthropic, "flash"));
        assert!(!accepts(Family::OpenAi, "sonnet"));
        assert!(accepts(Family::Compatible, "qwen2.5:7b"));
        assert!(!accepts(Family::Compatible, "claude-opus-4-5"));
    }
}
