//! JSON text walked by hand, one value at a time: the reader under [`crate::pod_json`].
//!
//! The caller says what it expects next (an object, a string, anything to skip) and the
//! scan checks the text is that. What it skips is checked as serde_json checks it (strings,
//! escapes, numbers, literals, brackets), but nothing is built from it: no tokens, no values,
//! no copies. Any doubt, be it invalid JSON, a key holding escapes or nesting deeper than
//! `MAX_DEPTH` levels, is a [`Decline`]: the caller then hands the text to serde_json, which
//! says precisely what is wrong.

use std::borrow::Cow;

/// The scan cannot read the text as expected; the caller takes serde_json's path instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decline;

/// One step of a scan.
pub type Step<T> = Result<T, Decline>;

/// How deep the scan goes (it recurses): deeper text is declined for the generic path to read.
/// serde_json's own limit for what it builds; no real pod comes near it.
const MAX_DEPTH: usize = 128;

/// The length of the plain run at the start of a string's remaining `bytes`: up to the first
/// quote, backslash or control character, or `None` when the text ends first. Eight bytes at
/// a time, as serde_json does it: a string is most of the bytes the scan passes over.
fn plain_run(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let is_stop = |byte: u8| byte == b'"' || byte == b'\\' || byte < 0x20;
    let mut at = 0;
    while let Some(word) = bytes[at..].first_chunk::<8>() {
        let word = u64::from_le_bytes(*word);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // Each term sets a byte's high bit where it is zero (or below 0x20); a borrow can only
        // set bits above a byte truly set, so the lowest set bit is exact.
        let stops = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word))
            & HIGHS;
        if stops != 0 {
            return Some(at + stops.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&byte| is_stop(byte))
        .map(|run| at + run)
}

/// A position in JSON text.
pub struct Scan<'a> {
    text: &'a str,
    at: usize,
    /// How many objects and arrays the scan is inside.
    depth: usize,
}

impl<'a> Scan<'a> {
    /// A scan from the start of `text`.
    pub fn new(text: &'a str) -> Self {
        Scan {
            text,
            at: 0,
            depth: 0,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);
        let bytes = self.bytes();
        loop {
            let byte = *bytes.get(self.at)?;
            if !matches!(byte, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(byte);
            }
            self.at += 1;
            // Pretty-printed text indents every line: its spaces eight at a time.
            while let Some(chunk) = bytes[self.at..].first_chunk::<8>()
                && u64::from_ne_bytes(*chunk) == SPACES
            {
                self.at += 8;
            }
        }
    }

    fn eat(&mut self, byte: u8) -> Step<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(Decline)
        }
    }

    fn literal(&mut self, word: &[u8]) -> Step<()> {
        if self.bytes()[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(Decline)
        }
    }

    /// Only whitespace is left.
    pub fn end(&mut self) -> Step<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Decline),
        }
    }

    /// Consumes a `null` if that is what comes next; whether it did.
    pub fn null(&mut self) -> bool {
        if self.peek() == Some(b'n') && self.literal(b"null").is_ok() {
            return true;
        }
        false
    }

    /// An object, handing each key to `entry`, which must read or skip its value.
    pub fn object(&mut self, mut entry: impl FnMut(&'a str, &mut Self) -> Step<()>) -> Step<()> {
        self.eat(b'{')?;
        self.nested(|scan| {
            scan.elements(b'}', |scan| {
                if scan.peek() != Some(b'"') {
                    return Err(Decline);
                }
                let key = scan.plain_string()?;
                scan.eat(b':')?;
                entry(key, scan)
            })
        })
    }

    /// An array, calling `element` for each element, which must read or skip it.
    pub fn array(&mut self, element: impl FnMut(&mut Self) -> Step<()>) -> Step<()> {
        self.eat(b'[')?;
        self.nested(|scan| scan.elements(b']', element))
    }

    /// Runs `inside` one level deeper, down to [`MAX_DEPTH`].
    fn nested(&mut self, inside: impl FnOnce(&mut Self) -> Step<()>) -> Step<()> {
        self.depth += 1;
        if self.depth >= MAX_DEPTH {
            return Err(Decline);
        }
        inside(self)?;
        self.depth -= 1;
        Ok(())
    }

    /// The comma-separated elements of an object or array, each read by `element`, through
    /// `close`, its closing bracket.
    fn elements(&mut self, close: u8, mut element: impl FnMut(&mut Self) -> Step<()>) -> Step<()> {
        if self.peek() == Some(close) {
            self.at += 1;
            return Ok(());
        }
        loop {
            element(self)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(byte) if byte == close => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Decline),
            }
        }
    }

    /// A string, borrowed from the text unless it holds escapes.
    pub fn string(&mut self) -> Step<Cow<'a, str>> {
        // Past any whitespace first: the string starts at its quote.
        self.peek();
        let start = self.at;
        let (end, escaped) = self.string_end()?;
        if escaped {
            // Rare: serde_json decodes the escapes, exactly as the full path would.
            let quoted = &self.text[start..end];
            serde_json::from_str::<String>(quoted)
                .map(Cow::Owned)
                .map_err(|_| Decline)
        } else {
            Ok(Cow::Borrowed(&self.text[start + 1..end - 1]))
        }
    }

    /// A string without escapes (an object key), borrowed from the text.
    fn plain_string(&mut self) -> Step<&'a str> {
        self.peek();
        let start = self.at;
        match self.string_end()? {
            (end, false) => Ok(&self.text[start + 1..end - 1]),
            (_, true) => Err(Decline),
        }
    }

    /// Skips a string, returning where it ends (past the closing quote) and whether it holds
    /// escapes.
    fn string_end(&mut self) -> Step<(usize, bool)> {
        self.eat(b'"')?;
        let bytes = self.bytes();
        let mut escaped = false;
        loop {
            let run = plain_run(&bytes[self.at..]).ok_or(Decline)?;
            self.at += run;
            match bytes[self.at] {
                b'"' => {
                    self.at += 1;
                    return Ok((self.at, escaped));
                }
                b'\\' => {
                    escaped = true;
                    self.at += 1;
                    match bytes.get(self.at) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.at += 1;
                        }
                        Some(b'u') => {
                            let hex = bytes.get(self.at + 1..self.at + 5).ok_or(Decline)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(Decline);
                            }
                            self.at += 5;
                        }
                        _ => return Err(Decline),
                    }
                }
                // A raw control character: serde_json refuses it.
                _ => return Err(Decline),
            }
        }
    }

    /// A number's text, checked against JSON's grammar.
    pub fn number(&mut self) -> Step<&'a str> {
        self.peek();
        let start = self.at;
        let bytes = self.bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let mut at = self.at;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        if bytes.get(at) == Some(&b'0') {
            at += 1;
        } else if !digits(&mut at) {
            return Err(Decline);
        }
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            if !digits(&mut at) {
                return Err(Decline);
            }
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digits(&mut at) {
                return Err(Decline);
            }
        }
        self.at = at;
        Ok(&self.text[start..at])
    }

    /// Skips one value of any kind, checking it is JSON.
    pub fn skip(&mut self) -> Step<()> {
        match self.peek().ok_or(Decline)? {
            b'"' => self.string_end().map(drop),
            b'{' => self.object(|_, scan| scan.skip()),
            b'[' => self.array(Self::skip),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the scan skips `text` as one whole value.
    fn skips(text: &str) -> bool {
        let mut scan = Scan::new(text);
        scan.skip().and_then(|()| scan.end()).is_ok()
    }

    #[test]
    fn skips_what_serde_json_reads_and_declines_what_it_refuses() {
        let nest = |levels| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        let (deep_ok, too_deep) = (nest(MAX_DEPTH - 1), nest(MAX_DEPTH));
        let cases = [
            r#"{"a": [1, -2.5e+3, 0, true, false, null, "x\"\\\u00e9y"], "b": {}}"#,
            r#"  [ ]  "#,
            r#""tâche""#,
            "-0.0E7",
            "1e400",
            "123456789012345678901234567890",
            r#"{"a" 1}"#,
            r#"{"a": 1,}"#,
            "[1 2]",
            "[1,]",
            "01",
            "1.",
            "-",
            "tru",
            "nul",
            r#""open"#,
            "\"tab\there\"",
            r#""bad \x escape""#,
            r#""bad \u12 escape""#,
            r#"{1: 2}"#,
            "{} {}",
            &deep_ok,
        ];
        for text in cases {
            // What serde_json makes of a value it skips, as the derive skipped unknown fields.
            let serde = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
            assert_eq!(skips(text), serde, "{text:?}");
        }
        // serde_json skips any depth without recursing; the scan recurses, so it stops.
        assert!(!skips(&too_deep));
    }

    /// The plain run ends where a byte-by-byte look says, wherever in a word the stop falls.
    #[test]
    fn plain_runs_end_at_the_first_stop() {
        for stop in [b'"', b'\\', 0x00, 0x1f] {
            for len in 0..20 {
                for at in 0..len {
                    let mut bytes: Vec<u8> = "aé ~\x7f".bytes().cycle().take(len).collect();
                    bytes[at] = stop;
                    if at + 1 < len {
                        bytes[at + 1] = b'"';
                    }
                    assert_eq!(plain_run(&bytes), Some(at), "{bytes:?}");
                }
                let plain: Vec<u8> = "aé ~\x7f".bytes().cycle().take(len).collect();
                assert_eq!(plain_run(&plain), None, "{plain:?}");
            }
        }
    }

    #[test]
    fn strings_borrow_unless_escaped() {
        let mut scan = Scan::new(r#"["plain", "es\"caped\u00e9"]"#);
        let mut read = Vec::new();
        scan.array(|scan| {
            read.push(scan.string()?);
            Ok(())
        })
        .unwrap();
        assert!(matches!(read[0], Cow::Borrowed("plain")));
        assert!(matches!(&read[1], Cow::Owned(s) if s == "es\"capedé"));
    }

    /// JSON allows whitespace between any two tokens: a string after it is read from its
    /// quote, whatever whitespace came before.
    #[test]
    fn strings_after_whitespace_are_read_from_their_quote() {
        for text in [
            "{\"k\": \"v\"}",
            "{\"k\":\t\"v\"}",
            "{\"k\":\r\n    \"v\"}",
            "{ \"k\" : \"v\" }",
            "\n{\n    \"k\": \"v\"\n}\n",
        ] {
            let mut scan = Scan::new(text);
            let mut read = Vec::new();
            scan.object(|key, scan| {
                read.push((key, scan.string()?.into_owned()));
                Ok(())
            })
            .unwrap();
            scan.end().unwrap();
            assert_eq!(read, [("k", "v".to_owned())], "{text:?}");
        }
    }

    #[test]
    fn an_escaped_key_is_declined() {
        let mut scan = Scan::new(r#"{"k\u0065y": 1}"#);
        assert_eq!(scan.object(|_, scan| scan.skip()), Err(Decline));
    }

    #[test]
    fn null_is_taken_only_when_whole() {
        assert!(Scan::new(" null").null());
        assert!(!Scan::new("nul").null());
        assert!(!Scan::new("\"null\"").null());
    }
}
