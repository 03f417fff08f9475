//! A published summary's form in its hash: the field of a policy and
//! ranking, and the summary as text.
//!
//! The value is a first line `<total> <floor>`, then one line per key,
//! `<count> <error> <label>`, the label with `\` and line feeds escaped
//! (`\\`, `\n`).

use tollgate_core::topkeys::{Ranking, Summary, TopKey};

/// The field of `policy`'s summary under `ranking`: `<ranking>:<policy>`.
pub(super) fn field(policy: &str, ranking: Ranking) -> String {
    format!("{}:{policy}", ranking.as_str())
}

/// The policy and ranking of a field, if it is one.
pub(super) fn parse_field(field: &str) -> Option<(&str, Ranking)> {
    let (ranking, policy) = field.split_once(':')?;
    Some((policy, Ranking::from_name(ranking)?))
}

pub(super) fn encode(summary: &Summary) -> String {
    let mut out = format!("{} {}", summary.total(), summary.floor());
    for key in summary.keys() {
        out.push('\n');
        out.push_str(&format!("{} {} ", key.count(), key.error()));
        for c in key.label().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
    }
    out
}

/// The summary `encode` wrote; `None` for text it did not write.
pub(super) fn decode(text: &str) -> Option<Summary> {
    let mut lines = text.split('\n');
    let (total, floor) = lines.next()?.split_once(' ')?;
    let mut keys = Vec::new();
    for line in lines {
        let mut parts = line.splitn(3, ' ');
        let count: u64 = parts.next()?.parse().ok()?;
        let error: u64 = parts.next()?.parse().ok()?;
        let mut label = String::new();
        let mut chars = parts.next()?.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next()? {
                    'n' => label.push('\n'),
                    '\\' => label.push('\\'),
                    _ => return None,
                },
                c => label.push(c),
            }
        }
        keys.push(TopKey::new(label, count, error));
    }
    Some(Summary::new(total.parse().ok()?, floor.parse().ok()?, keys))
}

#[cfg(test)]
mod tests {
    use tollgate_core::topkeys::{Ranking, Summary, TopKey};

    use super::{decode, encode, field, parse_field};

    #[test]
    fn a_summary_reads_back_as_written_whatever_its_labels() {
        let summary = Summary::new(
            90,
            3,
            vec![
                TopKey::new("a b\\n\nc", 50, 2),
                TopKey::new("", 7, 0),
                TopKey::new("user:ab12", 30, 3),
            ],
        );
        let text = encode(&summary);
        assert_eq!(text, "90 3\n50 2 a b\\\\n\\nc\n30 3 user:ab12\n7 0 ");
        assert_eq!(decode(&text), Some(summary));
        assert_eq!(decode("90 3"), Some(Summary::new(90, 3, Vec::new())));
        for bad in ["", "90", "x 3", "90 3\n5 x a", "90 3\n5 1 a\\t"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_field_names_its_ranking_and_policy() {
        assert_eq!(field("api:v2", Ranking::Limited), "limited:api:v2");
        assert_eq!(
            parse_field("limited:api:v2"),
            Some(("api:v2", Ranking::Limited))
        );
        assert_eq!(parse_field("busy:api"), None);
    }
}
