//! The order of resourceVersions: per object, only an event newer than the last one taken
//! changes anything (docs/semantics.md, "Order, repeats and replays"). One rule for every stage
//! that keeps per-object state: the ingest, the processor, `decide`.

use std::cmp::Ordering;

/// Whether resourceVersion `candidate` is newer than `last`.
///
/// Compared as integers when both parse (they are etcd revisions on
/// kube-apiserver); otherwise only equality is meaningful, and a different
/// value counts as newer.
pub fn is_newer(candidate: &str, last: &str) -> bool {
    match (candidate.parse::<u64>(), last.parse::<u64>()) {
        (Ok(c), Ok(l)) => c.cmp(&l) == Ordering::Greater,
        _ => candidate != last,
    }
}

#[cfg(test)]
mod tests {
    use super::is_newer;

    #[test]
    fn order_table() {
        let cases = [
            ("11", "10", true),
            ("10", "10", false),
            ("9", "10", false),
            // Integers, not strings: "9" < "10" although "9" > "10" as text.
            ("10", "9", true),
            ("abc", "abd", true),
            ("abc", "abc", false),
            ("", "", false),
            ("5", "", true),
        ];
        for (candidate, last, newer) in cases {
            assert_eq!(
                is_newer(candidate, last),
                newer,
                "is_newer({candidate:?}, {last:?})"
            );
        }
    }
}
