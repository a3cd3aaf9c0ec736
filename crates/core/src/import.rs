//! Capabilities made from another protocol's list (an MCP server's tools,
//! an A2A Agent Card's skills): each one held to the rules of a
//! registration, the ones the catalog cannot hold left out with the reason.

use crate::validate::{MAX_CAPABILITIES, check_id, validate_definition};
use crate::{AgentDefinition, Capability, Transport};

/// The skills imported so far, and what was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// One skill per imported item: its id is the item's name (made to fit
    /// the id rules when it does not), its endpoint the exact name.
    pub skills: Vec<Capability>,
    /// Items left out, each with the reason.
    pub skipped: Vec<(String, String)>,
    transport: Transport,
}

impl Imported {
    /// Nothing imported yet, for an agent of `transport`.
    pub fn new(transport: Transport) -> Self {
        Self { skills: Vec::new(), skipped: Vec::new(), transport }
    }

    /// Keeps `capability`, made from the item `name`, unless the catalog
    /// cannot hold it: past the 1,000th, an id taken already, or anything a
    /// registration would refuse (a schema that is not one, too deep).
    pub fn add(&mut self, name: &str, capability: Capability) {
        if self.skills.len() >= MAX_CAPABILITIES {
            self.skip(name, format!("an agent holds at most {MAX_CAPABILITIES} capabilities"));
            return;
        }
        if self.skills.iter().any(|c| c.id == capability.id) {
            self.skip(name, format!("another item already became `{}`", capability.id));
            return;
        }
        let mut alone = AgentDefinition {
            id: "imported".into(),
            base_url: "http://imported/".into(),
            transport: self.transport,
            version: String::new(),
            deployment_type: crate::DeploymentType::LongRunning,
            tags: Vec::new(),
            reasoners: Vec::new(),
            skills: vec![capability],
            credential: None,
        };
        match validate_definition(&alone) {
            Ok(()) => self.skills.append(&mut alone.skills),
            Err(errors) => {
                let why: Vec<String> = errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect();
                self.skip(name, why.join("; "));
            }
        }
    }

    /// Leaves the item `name` out.
    pub fn skip(&mut self, name: &str, why: impl Into<String>) {
        self.skipped.push((name.to_owned(), why.into()));
    }
}

/// `name` when it is a valid capability id, else the name with every
/// character ids do not allow replaced by `_`; `None` when even that is no
/// id.
pub fn capability_id(name: &str) -> Option<String> {
    if check_id(name).is_ok() {
        return Some(name.to_owned());
    }
    let replaced: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    let trimmed = replaced.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    check_id(trimmed).is_ok().then(|| trimmed.to_owned())
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn shortened(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_ids() {
        assert_eq!(capability_id("get_time").as_deref(), Some("get_time"));
        assert_eq!(capability_id("send mail!").as_deref(), Some("send_mail_"));
        assert_eq!(capability_id("???"), None);
        assert_eq!(shortened("héllo", 2), "h");
    }

    #[test]
    fn duplicates_and_invalid_items_are_left_out() {
        let mut imported = Imported::new(Transport::Mcp);
        let skill = |id: &str, endpoint: &str| Capability {
            id: id.into(),
            description: String::new(),
            tags: Vec::new(),
            input_schema: None,
            output_schema: None,
            examples: Vec::new(),
            endpoint: endpoint.into(),
            internal: false,
            hints: None,
        };
        imported.add("a", skill("a", "a"));
        imported.add("a again", skill("a", "a"));
        imported.add("no endpoint", skill("b", ""));
        assert_eq!(imported.skills.len(), 1);
        let skipped: Vec<&str> = imported.skipped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(skipped, ["a again", "no endpoint"]);
    }
}
