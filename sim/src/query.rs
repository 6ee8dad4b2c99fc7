//! Query parameters read as kube-apiserver reads them (apimachinery's `runtime/conversion.go`):
//! the first value of a repeated parameter wins; a boolean is false only when absent, `0` or
//! `false` in any case (so `watch=True`, Python's spelling, and a bare `watch=` are true); an
//! integer is base-10 or a 400.

use std::collections::HashMap;

use crate::status::ApiError;

/// The query string of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    values: HashMap<String, String>,
}

impl Query {
    /// Parses `a=1&b=x`; a parameter's first occurrence wins, as Go's `url.Values.Get`.
    pub fn parse(query: Option<&str>) -> Query {
        let mut values = HashMap::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            values
                .entry(key.into_owned())
                .or_insert_with(|| value.into_owned());
        }
        Query { values }
    }

    /// The raw value, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The value, when present and not empty.
    pub fn non_empty(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    /// A boolean parameter: absent, `0` and `false` (any case) are false; anything else is true.
    pub fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(parses_true)
    }

    /// An optional boolean (`*bool` in the API types): `None` when absent.
    pub fn optional_flag(&self, name: &str) -> Option<bool> {
        self.get(name).map(parses_true)
    }

    /// An integer parameter (`int64` in the API types), or 400 when it is not one.
    pub fn integer(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name)
            .map(|value| {
                value.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "invalid value for {name}: strconv.ParseInt: parsing {value:?}: invalid syntax"
                    ))
                })
            })
            .transpose()
    }
}

fn parses_true(value: &str) -> bool {
    !(value == "0" || value.eq_ignore_ascii_case("false"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_follow_the_apiserver_conversion() {
        let cases = [
            ("watch=true", true),
            ("watch=True", true),
            ("watch=TRUE", true),
            ("watch=1", true),
            ("watch=", true),
            ("watch=yes", true),
            ("watch=false", false),
            ("watch=False", false),
            ("watch=0", false),
            ("other=1", false),
            ("watch=0&watch=1", false),
        ];
        for (query, expected) in cases {
            assert_eq!(Query::parse(Some(query)).flag("watch"), expected, "{query}");
        }
    }

    #[test]
    fn optional_booleans_know_absence() {
        assert_eq!(
            Query::parse(Some("x=1")).optional_flag("sendInitialEvents"),
            None
        );
        assert_eq!(
            Query::parse(Some("sendInitialEvents=True")).optional_flag("sendInitialEvents"),
            Some(true)
        );
    }

    #[test]
    fn integers_are_base_ten_or_refused() {
        let query = Query::parse(Some("limit=500&timeoutSeconds=-3&bad=1.5&empty="));
        assert_eq!(query.integer("limit").ok(), Some(Some(500)));
        assert_eq!(query.integer("timeoutSeconds").ok(), Some(Some(-3)));
        assert_eq!(query.integer("absent").ok(), Some(None));
        assert_eq!(query.integer("bad").map_err(|e| e.code()), Err(400));
        assert_eq!(query.integer("empty").map_err(|e| e.code()), Err(400));
    }
}
