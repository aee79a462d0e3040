//! Slurm hostlist expressions: `node[001-128,130]`, `gpu[1-2]-ib[0-1]`, `a,b[3-4]`.

/// Most names one expression may expand to; a typo such as `n[1-999999999]` is an error, not
/// an allocation.
pub const MAX_HOSTS: usize = 1 << 20;

/// Expands a hostlist expression into names, in order. Ranges keep their zero padding
/// (`[001-003]` gives `001 002 003`); several bracket groups multiply out.
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top(expr)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    for n in &mut names {
                        n.push_str(rest);
                    }
                    rest = "";
                }
                Some(open) => {
                    let close = rest[open..]
                        .find(']')
                        .map(|c| c + open)
                        .ok_or_else(|| format!("'{item}': '[' without ']'"))?;
                    let prefix = &rest[..open];
                    let values = ranges(&rest[open + 1..close], item)?;
                    if names.len().saturating_mul(values.len()) + out.len() > MAX_HOSTS {
                        return Err(format!("'{expr}' expands to more than {MAX_HOSTS} hosts"));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| values.iter().map(move |v| format!("{n}{prefix}{v}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
            }
        }
        out.extend(names);
    }
    Ok(out)
}

/// Splits at commas outside brackets.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("'{expr}': unbalanced or nested brackets"));
        }
    }
    if depth != 0 {
        return Err(format!("'{expr}': '[' without ']'"));
    }
    parts.push(&expr[start..]);
    Ok(parts)
}

/// `001-003,7` → `["001", "002", "003", "7"]`.
fn ranges(spec: &str, item: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for r in spec.split(',') {
        let r = r.trim();
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let bad = || format!("'{item}': '{r}' is not a number or a range such as 001-128");
        if lo.is_empty()
            || !lo.bytes().all(|b| b.is_ascii_digit())
            || !hi.bytes().all(|b| b.is_ascii_digit())
            || hi.is_empty()
        {
            return Err(bad());
        }
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| bad())?,
            hi.parse().map_err(|_| bad())?,
        );
        if b < a {
            return Err(format!("'{item}': range {r} runs backwards"));
        }
        if (b - a) as usize >= MAX_HOSTS || out.len() + (b - a) as usize >= MAX_HOSTS {
            return Err(format!("'{item}': range {r} is longer than {MAX_HOSTS}"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        out.extend((a..=b).map(|v| format!("{v:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn expands_slurm_forms() {
        assert_eq!(
            expand("node[001-003,130]").unwrap(),
            ["node001", "node002", "node003", "node130"]
        );
        assert_eq!(expand("a,b[3-4]").unwrap(), ["a", "b3", "b4"]);
        assert_eq!(
            expand("r[1-2]n[0-1]").unwrap(),
            ["r1n0", "r1n1", "r2n0", "r2n1"]
        );
        assert_eq!(expand("node[8-10]").unwrap(), ["node8", "node9", "node10"]);
        assert_eq!(expand("").unwrap(), Vec::<String>::new());
        for bad in [
            "node[1-",
            "node[a-b]",
            "node[5-1]",
            "n[1-9999999999]",
            "n[[1]]",
            "n][",
        ] {
            assert!(expand(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in "[a-z0-9\\[\\],-]{0,40}") {
            if let Ok(v) = expand(&s) {
                prop_assert!(v.len() <= MAX_HOSTS);
            }
        }
    }
}
