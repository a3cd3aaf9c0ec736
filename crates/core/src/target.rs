//! Invocation targets: `agent:reasoner` and `agent:skill:name`.

use std::fmt;
use std::str::FromStr;

use crate::agent::CapabilityKind;

/// A parsed invocation target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InvocationTarget {
    /// Agent id.
    pub agent: String,
    /// Reasoner or skill.
    pub kind: CapabilityKind,
    /// Capability id.
    pub capability: String,
}

/// Why a target string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetParseError {
    /// The string was empty.
    #[error("invocation target is empty; expected `agent:reasoner` or `agent:skill:name`")]
    Empty,
    /// One of the parts was empty.
    #[error("invocation target `{0}` has an empty part; expected `agent:reasoner` or `agent:skill:name`")]
    EmptyPart(String),
    /// Three parts, but the middle one is not `skill`.
    #[error("invocation target `{0}` has three parts but the middle one is not `skill`")]
    NotSkill(String),
    /// Too many or too few parts.
    #[error("invocation target `{0}` must have the form `agent:reasoner` or `agent:skill:name`")]
    Shape(String),
}

impl InvocationTarget {
    /// Builds a target.
    pub fn new(agent: impl Into<String>, kind: CapabilityKind, capability: impl Into<String>) -> Self {
        Self { agent: agent.into(), kind, capability: capability.into() }
    }
}

impl FromStr for InvocationTarget {
    type Err = TargetParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(TargetParseError::Empty);
        }
        let parts: Vec<&str> = s.split(':').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(TargetParseError::EmptyPart(s.to_owned()));
        }
        match parts.as_slice() {
            [agent, reasoner] => Ok(Self::new(*agent, CapabilityKind::Reasoner, *reasoner)),
            [agent, "skill", skill] => Ok(Self::new(*agent, CapabilityKind::Skill, *skill)),
            [_, _, _] => Err(TargetParseError::NotSkill(s.to_owned())),
            _ => Err(TargetParseError::Shape(s.to_owned())),
        }
    }
}

impl fmt::Display for InvocationTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CapabilityKind::Reasoner => write!(f, "{}:{}", self.agent, self.capability),
            CapabilityKind::Skill => write!(f, "{}:skill:{}", self.agent, self.capability),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        for s in ["agent-research-001:deep_research", "agent-research-001:skill:web_search"] {
            let t: InvocationTarget = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(t.to_string(), s);
        }
        let t: InvocationTarget = "a:skill:b".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.kind, CapabilityKind::Skill);
        assert_eq!(t.capability, "b");
    }

    #[test]
    fn errors_are_values() {
        assert_eq!("".parse::<InvocationTarget>(), Err(TargetParseError::Empty));
        assert!(matches!("a".parse::<InvocationTarget>(), Err(TargetParseError::Shape(_))));
        assert!(matches!("a::b".parse::<InvocationTarget>(), Err(TargetParseError::EmptyPart(_))));
        assert!(matches!("a:reasoner:b".parse::<InvocationTarget>(), Err(TargetParseError::NotSkill(_))));
        assert!(matches!("a:skill:b:c".parse::<InvocationTarget>(), Err(TargetParseError::Shape(_))));
        assert!(matches!(":b".parse::<InvocationTarget>(), Err(TargetParseError::EmptyPart(_))));
    }
}
