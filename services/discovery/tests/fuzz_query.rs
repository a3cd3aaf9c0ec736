//! Property tests over the capability query string, which arrives from
//! outside: whatever it holds, parsing answers a query within the limits or
//! an error naming the parameter, never a panic, and the patterns it yields
//! match any text without one.

use agentmesh_core::query::MAX_LIMIT;
use agentmesh_discovery::params::{PARAMETERS, parse_query};
use proptest::prelude::*;

/// A value rich in what the parser looks at.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("true".to_owned()),
        Just("0".to_owned()),
        Just("500".to_owned()),
        Just("501".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        Just("*".to_owned()),
        Just("a*b*c*".to_owned()),
        Just("active".to_owned()),
        Just("json".to_owned()),
        Just("xml".to_owned()),
        Just("%ZZ".to_owned()),
        Just("%2C%20".to_owned()),
        "[a-z0-9*,._%-]{0,16}",
        "\\PC{0,16}",
    ]
}

fn query() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        4 => prop::sample::select(PARAMETERS.to_vec()).prop_map(str::to_owned),
        1 => "[a-z_]{0,10}",
    ];
    prop::collection::vec((name, value(), any::<bool>()), 0..8).prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(n, v, with_value)| if with_value { format!("{n}={v}") } else { n })
            .collect::<Vec<_>>()
            .join("&")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_query_string_is_a_bounded_query_or_an_error_naming_a_parameter(raw in query(), text in "\\PC{0,40}") {
        match parse_query(&raw) {
            Ok((query, _format)) => {
                prop_assert!((1..=MAX_LIMIT).contains(&query.limit), "limit {}", query.limit);
                for pattern in query.reasoner.iter().chain(query.skill.iter()).chain(query.tags.iter()) {
                    let _ = pattern.matches(&text);
                    let _ = pattern.matches(pattern.as_str());
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn any_text_at_all_is_parsed_without_panic(raw in "\\PC{0,120}") {
        let _ = parse_query(&raw);
    }
}
