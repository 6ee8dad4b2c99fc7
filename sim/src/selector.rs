//! Label and field selectors: the query-string grammar kube-apiserver accepts, and matching.

use std::collections::BTreeMap;

use crate::names::{validate_label_key, validate_label_value};
use crate::status::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key`: the label is present.
    Exists(String),
    /// `!key`: the label is absent.
    DoesNotExist(String),
    /// `key=v`, `key==v`, `key in (v1,v2)`: present with one of the values.
    In(String, Vec<String>),
    /// `key!=v`, `key notin (v1,v2)`: absent, or present with none of the values.
    NotIn(String, Vec<String>),
    /// `key>n`: present, an integer, greater than n.
    GreaterThan(String, i64),
    /// `key<n`: present, an integer, less than n.
    LessThan(String, i64),
}

/// A parsed `labelSelector`: every requirement must hold. Empty selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector(pub Vec<Requirement>);

impl LabelSelector {
    /// Parses the `labelSelector` query value; errors are 400s worded like the real server's.
    pub fn parse(input: &str) -> Result<LabelSelector, ApiError> {
        let mut tokens = Lexer::new(input).tokens()?.into_iter().peekable();
        let mut requirements = Vec::new();
        if tokens.peek().is_none() {
            return Ok(LabelSelector(requirements));
        }
        loop {
            requirements.push(parse_requirement(&mut tokens, input)?);
            match tokens.next() {
                None => break,
                Some(Token::Comma) => continue,
                Some(other) => {
                    return Err(unparsable(input, &format!("found '{other}', expected ','")));
                }
            }
        }
        Ok(LabelSelector(requirements))
    }

    /// Whether a label set satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::GreaterThan(key, n) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Requirement::LessThan(key, n) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }

    /// Whether the selector selects every object.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Comma,
    Open,
    Close,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Word(word) => f.write_str(word),
            Token::Comma => f.write_str(","),
            Token::Open => f.write_str("("),
            Token::Close => f.write_str(")"),
            Token::Bang => f.write_str("!"),
            Token::Equals => f.write_str("="),
            Token::DoubleEquals => f.write_str("=="),
            Token::NotEquals => f.write_str("!="),
            Token::Greater => f.write_str(">"),
            Token::Less => f.write_str("<"),
        }
    }
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
}

impl<'a> Lexer<'a> {
    fn new(input: &'a str) -> Self {
        Lexer {
            chars: input.chars().peekable(),
        }
    }

    fn tokens(mut self) -> Result<Vec<Token>, ApiError> {
        let mut tokens = Vec::new();
        while let Some(c) = self.chars.next() {
            let token = match c {
                c if c.is_whitespace() => continue,
                ',' => Token::Comma,
                '(' => Token::Open,
                ')' => Token::Close,
                '>' => Token::Greater,
                '<' => Token::Less,
                '!' if self.chars.peek() == Some(&'=') => {
                    self.chars.next();
                    Token::NotEquals
                }
                '!' => Token::Bang,
                '=' if self.chars.peek() == Some(&'=') => {
                    self.chars.next();
                    Token::DoubleEquals
                }
                '=' => Token::Equals,
                first => {
                    let mut word = String::from(first);
                    while let Some(&next) = self.chars.peek() {
                        if next.is_whitespace() || ",()!=<>".contains(next) {
                            break;
                        }
                        word.push(next);
                        self.chars.next();
                    }
                    Token::Word(word)
                }
            };
            tokens.push(token);
        }
        Ok(tokens)
    }
}

type Tokens = std::iter::Peekable<std::vec::IntoIter<Token>>;

fn parse_requirement(tokens: &mut Tokens, input: &str) -> Result<Requirement, ApiError> {
    if tokens.peek() == Some(&Token::Bang) {
        tokens.next();
        let key = expect_key(tokens, input)?;
        return Ok(Requirement::DoesNotExist(key));
    }
    let key = expect_key(tokens, input)?;
    match tokens.peek().cloned() {
        None | Some(Token::Comma) => Ok(Requirement::Exists(key)),
        Some(Token::Equals | Token::DoubleEquals) => {
            tokens.next();
            let value = optional_value(tokens, input)?;
            Ok(Requirement::In(key, vec![value]))
        }
        Some(Token::NotEquals) => {
            tokens.next();
            let value = optional_value(tokens, input)?;
            Ok(Requirement::NotIn(key, vec![value]))
        }
        Some(op @ (Token::Greater | Token::Less)) => {
            tokens.next();
            let value = match tokens.next() {
                Some(Token::Word(word)) => word,
                _ => return Err(unparsable(input, "expected an integer after '>' or '<'")),
            };
            let n = value.parse::<i64>().map_err(|_| {
                unparsable(
                    input,
                    &format!("for '<', '>' operators, the value must be an integer, not {value:?}"),
                )
            })?;
            Ok(if op == Token::Greater {
                Requirement::GreaterThan(key, n)
            } else {
                Requirement::LessThan(key, n)
            })
        }
        Some(Token::Word(word)) if word == "in" || word == "notin" => {
            tokens.next();
            let values = value_set(tokens, input)?;
            Ok(if word == "in" {
                Requirement::In(key, values)
            } else {
                Requirement::NotIn(key, values)
            })
        }
        Some(other) => Err(unparsable(
            input,
            &format!("found '{other}', expected: in, notin, =, ==, !=, gt, lt"),
        )),
    }
}

fn expect_key(tokens: &mut Tokens, input: &str) -> Result<String, ApiError> {
    match tokens.next() {
        Some(Token::Word(key)) => {
            if let Err(why) = validate_label_key(&key) {
                return Err(unparsable(
                    input,
                    &format!("key: Invalid value: {key:?}: {why}"),
                ));
            }
            Ok(key)
        }
        Some(other) => Err(unparsable(
            input,
            &format!("found '{other}', expected: identifier"),
        )),
        None => Err(unparsable(input, "found '', expected: identifier")),
    }
}

fn optional_value(tokens: &mut Tokens, input: &str) -> Result<String, ApiError> {
    let value = match tokens.peek() {
        Some(Token::Word(_)) => match tokens.next() {
            Some(Token::Word(word)) => word,
            _ => String::new(),
        },
        _ => String::new(),
    };
    check_value(&value, input)?;
    Ok(value)
}

fn value_set(tokens: &mut Tokens, input: &str) -> Result<Vec<String>, ApiError> {
    if tokens.next() != Some(Token::Open) {
        return Err(unparsable(input, "expected '(' after in/notin"));
    }
    let mut values = Vec::new();
    loop {
        match tokens.next() {
            Some(Token::Word(word)) => {
                check_value(&word, input)?;
                values.push(word);
                match tokens.next() {
                    Some(Token::Comma) => continue,
                    Some(Token::Close) => break,
                    _ => return Err(unparsable(input, "expected ',' or ')' in a value set")),
                }
            }
            Some(Token::Close) if values.is_empty() => break,
            Some(Token::Comma) => values.push(String::new()),
            _ => return Err(unparsable(input, "unterminated value set")),
        }
    }
    if values.is_empty() {
        return Err(unparsable(
            input,
            "for 'in', 'notin' operators, values set can't be empty",
        ));
    }
    Ok(values)
}

fn check_value(value: &str, input: &str) -> Result<(), ApiError> {
    validate_label_value(value).map_err(|why| {
        unparsable(
            input,
            &format!("values[0]: Invalid value: {value:?}: {why}"),
        )
    })
}

fn unparsable(input: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} (in selector {input:?})"
    ))
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field label, such as `status.phase`.
    pub field: String,
    /// The compared value.
    pub value: String,
    /// `true` for `!=`.
    pub negated: bool,
}

/// A parsed `fieldSelector`: every term must hold. Empty selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector(pub Vec<FieldTerm>);

impl FieldSelector {
    /// Parses the `fieldSelector` query value, accepting only the given field labels.
    pub fn parse(input: &str, supported: &[&str]) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for part in split_unescaped(input, ',') {
            if part.trim().is_empty() {
                continue;
            }
            let (field, value, negated) = if let Some(at) = find_unescaped(&part, "!=") {
                (&part[..at], &part[at + 2..], true)
            } else if let Some(at) = find_unescaped(&part, "==") {
                (&part[..at], &part[at + 2..], false)
            } else if let Some(at) = find_unescaped(&part, "=") {
                (&part[..at], &part[at + 1..], false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: invalid selector: '{input}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !supported.contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push(FieldTerm {
                field: field.to_owned(),
                value: unescape(value.trim()),
                negated,
            });
        }
        Ok(FieldSelector(terms))
    }

    /// Whether an object's field values (looked up by label) satisfy every term.
    pub fn matches(&self, field: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|term| {
            let actual = field(&term.field).unwrap_or_default();
            (actual == term.value) != term.negated
        })
    }

    /// Whether the selector selects every object.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn split_unescaped(input: &str, separator: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in input.chars() {
        if escaped {
            current.push('\\');
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == separator {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

fn find_unescaped(part: &str, operator: &str) -> Option<usize> {
    let bytes = part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if part.is_char_boundary(i) && part[i..].starts_with(operator) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What a list or watch selects: a namespace (or all), labels and fields.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this namespace, when set.
    pub namespace: Option<String>,
    /// The label selector.
    pub labels: LabelSelector,
    /// The field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether a stored object is selected.
    pub fn matches(&self, object: &crate::object::Stored) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| object.key.namespace == ns)
            && self.labels.matches(&object.labels)
            && self.fields.matches(|label| object.field(label))
    }
}
