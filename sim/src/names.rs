//! Kubernetes names and label values, checked as the apiserver checks them.

/// Checks a label key: an optional DNS subdomain prefix and `/`, then a name of ≤ 63 characters.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err("prefix part must be a lowercase RFC 1123 subdomain".to_owned());
    }
    if name.is_empty() || name.len() > 63 || !is_qualified_name(name) {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (max 63 characters)".to_owned());
    }
    Ok(())
}

/// Checks a label value: empty, or ≤ 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err("must be no more than 63 characters".to_owned());
    }
    if !is_qualified_name(value) {
        return Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".to_owned());
    }
    Ok(())
}

fn is_qualified_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.first().copied().is_some_and(edge)
        && bytes.last().copied().is_some_and(edge)
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// An RFC 1123 subdomain: ≤ 253 lowercase alphanumerics, `-` and `.`, alphanumeric at both ends.
pub fn is_dns_subdomain(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 253
        && bytes.first().copied().is_some_and(edge)
        && bytes.last().copied().is_some_and(edge)
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// An RFC 1123 label: a subdomain of ≤ 63 characters without dots.
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_dns_subdomain(name)
}
