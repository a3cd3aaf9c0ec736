//! Case-sensitive wildcard patterns: `*` matches any run of characters,
//! anywhere in the pattern. `*abc*` contains, `abc*` starts with, `*abc`
//! ends with, `abc` is exact; `a*b*c` works too.

use std::fmt;

/// A compiled wildcard pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    /// The literal pieces between stars.
    parts: Vec<String>,
    anchored_start: bool,
    anchored_end: bool,
}

impl Pattern {
    /// Compiles a pattern. Every string is a valid pattern.
    pub fn new(source: &str) -> Self {
        let parts: Vec<String> = source.split('*').filter(|p| !p.is_empty()).map(str::to_owned).collect();
        Self {
            source: source.to_owned(),
            parts,
            anchored_start: !source.starts_with('*'),
            anchored_end: !source.ends_with('*'),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// True when the pattern has no `*` and so matches exactly one value.
    pub fn is_exact(&self) -> bool {
        !self.source.contains('*')
    }

    /// Whether `value` matches the whole pattern.
    pub fn matches(&self, value: &str) -> bool {
        if self.is_exact() {
            return value == self.source;
        }
        let mut rest = value;
        let last = self.parts.len().saturating_sub(1);
        for (i, part) in self.parts.iter().enumerate() {
            if i == 0 && self.anchored_start {
                match rest.strip_prefix(part.as_str()) {
                    Some(r) => rest = r,
                    None => return false,
                }
            } else if i == last && self.anchored_end {
                return rest.ends_with(part.as_str());
            } else {
                match rest.find(part.as_str()) {
                    Some(pos) => rest = &rest[pos + part.len()..],
                    None => return false,
                }
            }
        }
        // Only stars (or an anchored end already consumed): whatever is left
        // must be empty unless the pattern ends with a star.
        !self.anchored_end || rest.is_empty()
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    fn m(p: &str, v: &str) -> bool {
        Pattern::new(p).matches(v)
    }

    #[test]
    fn prd_forms() {
        for v in ["deep_research", "web_researcher", "research_agent"] {
            assert!(m("*research*", v), "{v}");
        }
        assert!(!m("*research*", "deep_search"));
        for v in ["ml", "mlops", "ml_vision"] {
            assert!(m("ml*", v), "{v}");
        }
        assert!(!m("ml*", "aiml"));
        for v in ["web_search", "web_scraper", "web_parser"] {
            assert!(m("web_*", v), "{v}");
        }
        assert!(m("*learning", "deep_learning"));
        assert!(!m("*learning", "learning_rate"));
        assert!(m("abc", "abc"));
        assert!(!m("abc", "abcd"));
        assert!(!m("abc", "xabc"));
    }

    #[test]
    fn case_sensitive_and_stars_anywhere() {
        assert!(!m("Web_*", "web_search"));
        assert!(!m("abc", "ABC"));
        assert!(m("a*c", "abc"));
        assert!(m("a*c", "ac"));
        assert!(!m("a*c", "acb"));
        assert!(m("a*b*c", "axxbyyc"));
        assert!(!m("a*b*c", "axxcyyb"));
        assert!(m("*", ""));
        assert!(m("**", "anything"));
        assert!(m("*a*", "a"));
        assert!(!m("", "a"));
        assert!(m("", ""));
        // The anchored end must not reuse characters consumed by the start.
        assert!(!m("ab*ba", "aba"));
        assert!(m("ab*ba", "abba"));
    }
}
