//! The tuning file (`STRATA_TUNING_FILE`): JSON rules that override the tuner's choice for
//! ranges of message sizes.
//!
//! ```json
//! { "rules": [
//!     { "collective": "all_reduce", "max_bytes": 65536, "algorithm": "rd" },
//!     { "collective": "all_reduce", "min_bytes": 65537, "algorithm": "hier_ring" } ] }
//! ```
//!
//! Sizes are bytes per rank (NCCL's count × element size), both ends inclusive; a missing
//! end is open. The first rule that covers a call wins; sizes no rule covers are tuned.

use std::path::Path;

use serde::Deserialize;
use strata_algorithms::tuner::Rule;
use strata_algorithms::{Algorithm, Collective, valid_names};

use crate::error::{Error, Result};

/// Largest tuning file read.
const MAX_BYTES: u64 = 1 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    rules: Vec<RuleSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    collective: String,
    #[serde(default)]
    min_bytes: Option<u64>,
    #[serde(default)]
    max_bytes: Option<u64>,
    algorithm: String,
}

/// Reads and checks the rules of the tuning file at `path`.
pub fn load_rules(path: &Path) -> Result<Vec<Rule>> {
    let bad =
        |m: String| Error::InvalidArgument(format!("STRATA_TUNING_FILE {}: {m}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.len() > MAX_BYTES {
        return Err(bad(format!("larger than {MAX_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    parse_rules(&text).map_err(bad)
}

/// Parses tuning-file text; the error names the rule and what is wrong with it.
pub fn parse_rules(text: &str) -> std::result::Result<Vec<Rule>, String> {
    let file: File = serde_json::from_str(text).map_err(|e| format!("line {}: {e}", e.line()))?;
    file.rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let at = |m: String| format!("rule {i}: {m}");
            let collective = Collective::parse(&r.collective)
                .ok_or_else(|| at(format!("unknown collective '{}'", r.collective)))?;
            let algorithm = Algorithm::parse_for(collective, &r.algorithm).ok_or_else(|| {
                at(format!(
                    "'{}' cannot run {collective}; valid: {}",
                    r.algorithm,
                    valid_names(collective)
                ))
            })?;
            let clamp = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
            let min_bytes = r.min_bytes.map_or(0, clamp);
            let max_bytes = r.max_bytes.map_or(usize::MAX, clamp);
            if min_bytes > max_bytes {
                return Err(at(format!("min_bytes {min_bytes} > max_bytes {max_bytes}")));
            }
            Ok(Rule {
                collective,
                min_bytes,
                max_bytes,
                algorithm,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_bad_ones_say_which_and_why() {
        let rules = parse_rules(
            r#"{"rules": [
                {"collective": "all_reduce", "max_bytes": 65536, "algorithm": "rd"},
                {"collective": "broadcast", "min_bytes": 1048576, "algorithm": "ring"}
            ]}"#,
        )
        .unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            (rules[0].min_bytes, rules[0].max_bytes, rules[0].algorithm),
            (0, 65536, Algorithm::RecursiveDoubling)
        );
        assert_eq!(
            rules[1].algorithm,
            Algorithm::Chain,
            "NCCL's word for the chain"
        );
        assert_eq!(rules[1].max_bytes, usize::MAX);
        let e = parse_rules(r#"{"rules": [{"collective": "all_gather", "algorithm": "tree"}]}"#)
            .unwrap_err();
        assert!(
            e.contains("rule 0") && e.contains("valid: ring, rd, bruck"),
            "{e}"
        );
        let e =
            parse_rules(r#"{"rules": [{"collective": "nope", "algorithm": "ring"}]}"#).unwrap_err();
        assert!(e.contains("unknown collective 'nope'"), "{e}");
        let e = parse_rules(
            r#"{"rules": [{"collective": "all_reduce", "min_bytes": 9, "max_bytes": 8, "algorithm": "ring"}]}"#,
        )
        .unwrap_err();
        assert!(e.contains("min_bytes 9 > max_bytes 8"), "{e}");
        assert!(parse_rules("{").unwrap_err().contains("line 1"));
        assert!(parse_rules(r#"{"rules": [], "extra": 1}"#).is_err());
    }
}
