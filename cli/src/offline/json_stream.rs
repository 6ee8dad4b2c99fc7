//! Splits a byte stream into JSON values: one per line, or pretty-printed and
//! concatenated, as `kubectl ... -o json` prints them.
//!
//! A linear scan tracks nesting depth outside strings; a value is complete
//! when the depth returns to zero at the end of a line. A broken value does not
//! stop the stream: it becomes one [`Frame::Invalid`], and reading resumes at
//! the next line (for a value left open, at the next line that starts a
//! top-level value in column 0, as pretty-printed JSON does). A value or a line over
//! [`MAX_VALUE_BYTES`] is refused the same way, never buffered whole.

use std::io::{self, BufRead, Read};

use serde_json::value::RawValue;

/// The largest JSON value (and line) read. A Kubernetes object is at most about 1.5 MB (etcd's
/// limit) and the API server takes requests of up to 3 MB, so a watch event is far smaller;
/// a larger value is input gone wrong (a value never closed), not a pod.
pub const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// One item of the stream.
#[derive(Debug)]
pub enum Frame {
    /// The text of one syntactically valid JSON value.
    Value(Box<RawValue>),
    /// Bytes that are not a JSON value, with what was wrong.
    Invalid(String),
}

/// What [`JsonFrames::next_with`] read: the fast reader's result for a whole line, or a frame.
#[derive(Debug)]
pub enum Next<T> {
    /// What the fast reader made of a value it took whole (a line, or a pretty-printed value).
    Fast(T),
    /// A frame, as [`JsonFrames`] iterates them.
    Frame(Frame),
}

/// Iterator of [`Frame`]s over a reader.
pub struct JsonFrames<R> {
    reader: R,
    line: Vec<u8>,
    line_no: usize,
    value: Vec<u8>,
    value_start: usize,
    depth: i64,
    ready: std::collections::VecDeque<Frame>,
    done: bool,
    limit: usize,
    /// After a value over the limit: lines are skipped up to the next top-level value.
    skipping: bool,
}

impl<R: BufRead> JsonFrames<R> {
    /// Frames over `reader`, values of up to [`MAX_VALUE_BYTES`].
    pub fn new(reader: R) -> Self {
        JsonFrames::with_limit(reader, MAX_VALUE_BYTES)
    }

    /// Frames over `reader`, values of up to `limit` bytes.
    pub fn with_limit(reader: R, limit: usize) -> Self {
        JsonFrames {
            limit,
            skipping: false,
            reader,
            line: Vec::new(),
            line_no: 0,
            value: Vec::new(),
            value_start: 0,
            depth: 0,
            ready: Default::default(),
            done: false,
        }
    }

    /// The reader, to see whether more input is buffered.
    pub fn reader_mut(&mut self) -> &mut R {
        &mut self.reader
    }

    fn push_line(&mut self) {
        let starts_value = matches!(self.line.first(), Some(b'{' | b'['));
        if self.skipping && !starts_value {
            return;
        }
        self.skipping = false;
        if self.value.len() + self.line.len() > self.limit {
            let start = if self.value.is_empty() {
                self.line_no
            } else {
                self.value_start
            };
            self.ready.push_back(Frame::Invalid(format!(
                "the JSON value starting at line {start} is over {} bytes; skipped",
                self.limit
            )));
            self.reset();
            self.skipping = true;
            return;
        }
        if !self.value.is_empty() && starts_value {
            // Still inside a value while a new top-level one starts: the
            // previous one was cut short.
            let start = self.value_start;
            self.ready.push_back(Frame::Invalid(format!(
                "incomplete JSON value starting at line {start}"
            )));
            self.reset();
        }
        if self.value.is_empty() {
            if self.line.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            self.value_start = self.line_no;
        }
        let mut in_string = false;
        let mut escaped = false;
        for &byte in &self.line {
            if in_string {
                match byte {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => self.depth -= 1,
                _ => {}
            }
        }
        self.value.extend_from_slice(&self.line);
        if in_string {
            // JSON strings never span lines.
            let start = self.value_start;
            self.ready.push_back(Frame::Invalid(format!(
                "unterminated string in the JSON value starting at line {start}"
            )));
            self.reset();
        } else if self.depth <= 0 {
            self.parse_value();
        }
    }

    /// Parses the complete chunk: usually one value, possibly several on a line.
    fn parse_value(&mut self) {
        let start = self.value_start;
        let values = serde_json::Deserializer::from_slice(&self.value).into_iter::<Box<RawValue>>();
        for value in values {
            match value {
                Ok(value) => self.ready.push_back(Frame::Value(value)),
                Err(err) => {
                    let line = start + err.line().saturating_sub(1);
                    self.ready.push_back(Frame::Invalid(format!(
                        "not valid JSON at line {line}: {err}"
                    )));
                    break;
                }
            }
        }
        self.reset();
    }

    /// Reads and drops bytes up to the end of the current line, a chunk at a time.
    fn skip_to_line_end(&mut self) -> io::Result<()> {
        loop {
            let (done, used) = {
                let buffer = self.reader.fill_buf()?;
                match buffer.iter().position(|b| *b == b'\n') {
                    Some(at) => (true, at + 1),
                    None => (buffer.is_empty(), buffer.len()),
                }
            };
            self.reader.consume(used);
            if done {
                return Ok(());
            }
        }
    }

    fn reset(&mut self) {
        self.value.clear();
        self.depth = 0;
    }
}

impl<R: BufRead> JsonFrames<R> {
    /// The next item, offering each line that may start one whole object outside any value
    /// (it starts with `{` and ends with `}`, or it is a lone `{` opening a pretty-printed
    /// value) to `fast` first, with its line number (from 1) and the buffered bytes from that
    /// line on, not yet checked to be UTF-8. When `fast` takes it (`Some((item, len))`), the
    /// item stands for the first `len` bytes, whole lines, which are not framed: `fast` must
    /// then have read them as one valid JSON value, as a full deserialization does. When it
    /// declines, the line is framed as usual. Values are read once either way; nearly every
    /// value of `kubectl -o json -w` is such an object, so the common case parses each event
    /// once, not twice, and reads it where the reader buffered it, without a copy.
    pub fn next_with<T>(
        &mut self,
        mut fast: impl FnMut(usize, &[u8]) -> Option<(T, usize)>,
    ) -> Option<io::Result<Next<T>>> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some(Ok(Next::Frame(frame)));
            }
            if self.done {
                return None;
            }
            let mut declined = false;
            if self.value.is_empty() && !self.skipping {
                let buffer = match self.reader.fill_buf() {
                    Ok(buffer) => buffer,
                    Err(err) => {
                        self.done = true;
                        return Some(Err(err));
                    }
                };
                // A whole line in the buffer, as `read_until` below would read it uncut.
                if let Some(end) = memchr::memchr(b'\n', buffer).filter(|end| *end <= self.limit) {
                    let line_no = self.line_no + 1;
                    let line = &buffer[..=end];
                    let offered = object_shaped(line).is_some() || opens_value(line);
                    match offered.then(|| fast(line_no, buffer)).flatten() {
                        Some((taken, len)) if len > end && len <= buffer.len() => {
                            let lines = memchr::memchr_iter(b'\n', &buffer[..len]).count();
                            self.reader.consume(len);
                            self.line_no += lines;
                            return Some(Ok(Next::Fast(taken)));
                        }
                        _ => declined = true,
                    }
                }
            }
            self.line.clear();
            // At most one byte over the limit per read: a line without an end is not buffered.
            let most = u64::try_from(self.limit)
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            match (&mut self.reader)
                .take(most)
                .read_until(b'\n', &mut self.line)
            {
                Ok(0) => {
                    self.done = true;
                    if !self.value.is_empty() {
                        let start = self.value_start;
                        self.ready.push_back(Frame::Invalid(format!(
                            "incomplete JSON value starting at line {start} at end of input"
                        )));
                        self.reset();
                    }
                }
                Ok(_) => {
                    let cut = self.line.last() != Some(&b'\n') && self.line.len() > self.limit;
                    self.line_no += 1;
                    let offered = !declined && !cut && self.value.is_empty() && !self.skipping;
                    let line_no = self.line_no;
                    let whole_line = self.line.len();
                    if let Some((taken, _)) = offered
                        .then(|| object_shaped(&self.line))
                        .flatten()
                        .and_then(|_| fast(line_no, &self.line))
                        .filter(|(_, len)| *len == whole_line)
                    {
                        return Some(Ok(Next::Fast(taken)));
                    }
                    self.push_line();
                    if cut {
                        // The rest of that line is part of the refused value.
                        if let Err(err) = self.skip_to_line_end() {
                            self.done = true;
                            return Some(Err(err));
                        }
                    }
                }
                Err(err) => {
                    self.done = true;
                    return Some(Err(err));
                }
            }
        }
    }
}

impl<R: BufRead> Iterator for JsonFrames<R> {
    type Item = io::Result<Frame>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|_, _| None::<(std::convert::Infallible, usize)>)
            .map(|read| {
                read.map(|read| match read {
                    Next::Frame(frame) => frame,
                    Next::Fast(never) => match never {},
                })
            })
    }
}

/// The line's text when it may hold one object: UTF-8, `{` first and `}` last (around
/// whitespace). Whether it truly is one is for the reader that takes it to find out.
pub fn one_object(line: &[u8]) -> Option<&str> {
    std::str::from_utf8(object_shaped(line)?).ok()
}

/// Whether the line opens a pretty-printed value: a lone `{` at its start.
fn opens_value(line: &[u8]) -> bool {
    line.trim_ascii_end() == b"{"
}

/// The line without its surrounding whitespace when it starts with `{` and ends with `}`.
fn object_shaped(line: &[u8]) -> Option<&[u8]> {
    let trimmed = line.trim_ascii();
    (trimmed.first() == Some(&b'{') && trimmed.last() == Some(&b'}')).then_some(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &str) -> Vec<String> {
        JsonFrames::new(input.as_bytes())
            .map(|f| match f.unwrap() {
                Frame::Value(v) => serde_json::from_str::<serde_json::Value>(v.get())
                    .unwrap()
                    .to_string(),
                Frame::Invalid(e) => format!("invalid: {e}"),
            })
            .collect()
    }

    #[test]
    fn one_value_per_line() {
        assert_eq!(frames("{\"a\":1}\n{\"b\":2}\n"), ["{\"a\":1}", "{\"b\":2}"]);
    }

    #[test]
    fn pretty_printed_values_concatenated() {
        let input = "{\n  \"a\": {\n    \"b\": \"}{\"\n  }\n}\n{\n  \"c\": [1, 2]\n}\n";
        assert_eq!(frames(input), ["{\"a\":{\"b\":\"}{\"}}", "{\"c\":[1,2]}"]);
    }

    #[test]
    fn several_values_on_one_line_and_blank_lines() {
        assert_eq!(
            frames("\n{\"a\":1} {\"b\":2}\n\n"),
            ["{\"a\":1}", "{\"b\":2}"]
        );
    }

    #[test]
    fn syntax_error_resyncs_at_the_next_line() {
        let out = frames("{\"a\":1}\n{\"a\": nope}\n{\"b\":2}\n");
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(
            out[1].starts_with("invalid: not valid JSON at line 2"),
            "{out:?}"
        );
        assert_eq!(out[2], "{\"b\":2}");
    }

    #[test]
    fn truncated_value_resyncs_at_the_next_top_level_value() {
        let out = frames("{\"a\": {\"b\": 1\n{\"c\":3}\n");
        assert_eq!(
            out,
            [
                "invalid: incomplete JSON value starting at line 1",
                "{\"c\":3}"
            ]
        );
        let out = frames("{\"a\": \"open\n{\"c\":3}\n");
        assert!(
            out[0].starts_with("invalid: unterminated string"),
            "{out:?}"
        );
        assert_eq!(out[1], "{\"c\":3}");
    }

    #[test]
    fn truncated_at_end_of_input_is_reported() {
        let out = frames("{\"a\":1}\n{\"b\":\n");
        assert_eq!(out[0], "{\"a\":1}");
        assert!(out[1].contains("at end of input"), "{out:?}");
    }

    /// A value never closed, or one line without an end, is refused at the limit and the
    /// stream resumes at the next top-level value; nothing over the limit is buffered.
    #[test]
    fn a_value_over_the_limit_is_refused_and_the_stream_goes_on() {
        let limit = 64;
        let frames = |input: &str| -> Vec<String> {
            JsonFrames::with_limit(input.as_bytes(), limit)
                .map(|f| match f.unwrap() {
                    Frame::Value(v) => v.get().to_owned(),
                    Frame::Invalid(e) => format!("invalid: {e}"),
                })
                .collect()
        };
        let long_value = format!(
            "{{\n{}  \"end\": 1\n}}\n{{\"next\":1}}\n",
            "  \"k\": 1,\n".repeat(20)
        );
        let out = frames(&long_value);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(
            out[0].contains("starting at line 1 is over 64 bytes"),
            "{out:?}"
        );
        assert_eq!(out[1], "{\"next\":1}");

        let long_line = format!("{{\"blob\": \"{}\"}}\n{{\"next\":2}}\n", "x".repeat(1000));
        let out = frames(&long_line);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].contains("over 64 bytes"), "{out:?}");
        assert_eq!(out[1], "{\"next\":2}");

        assert_eq!(frames("{\"a\": \"short\"}\n"), ["{\"a\": \"short\"}"]);
    }

    #[test]
    fn stray_closer_and_non_utf8_are_invalid_not_fatal() {
        let out = frames("}\n{\"a\":1}\n");
        assert!(out[0].starts_with("invalid"), "{out:?}");
        assert_eq!(out[1], "{\"a\":1}");
        let bytes: &[u8] = b"{\"a\":\"\xff\"}\n{\"b\":1}\n";
        let out: Vec<_> = JsonFrames::new(bytes)
            .map(|f| matches!(f.unwrap(), Frame::Value(_)))
            .collect();
        assert_eq!(out, [false, true]);
    }

    /// `next_with` with a fast reader that takes objects holding `"fast"`.
    fn with_fast(input: &str) -> Vec<String> {
        let mut frames = JsonFrames::new(input.as_bytes());
        let mut out = Vec::new();
        while let Some(next) = frames.next_with(|_, buffer| {
            let line = memchr::memchr(b'\n', buffer).map_or(buffer, |end| &buffer[..=end]);
            one_object(line)
                .filter(|text| text.contains("fast"))
                .map(|text| (text.len(), line.len()))
        }) {
            out.push(match next.unwrap() {
                Next::Fast(len) => format!("fast: {len} bytes"),
                Next::Frame(Frame::Value(v)) => v.get().to_owned(),
                Next::Frame(Frame::Invalid(e)) => format!("invalid: {e}"),
            });
        }
        out
    }

    #[test]
    fn the_fast_reader_sees_whole_one_line_objects_only() {
        let input = concat!(
            "{\"fast\": 1}\r\n",
            "{\"slow\": 2}\n",
            "{\n  \"fast\": {\"x\": 3}\n}\n",
            "[{\"fast\": 4}]\n",
            "{\"fast\": 5} {\"fast\": 6}\n",
            "{\"fast\": \"\u{20ac}\"}\n",
        );
        assert_eq!(
            with_fast(input),
            [
                "fast: 11 bytes",
                "{\"slow\": 2}",
                // Inside a pretty-printed value the lines are framed, never offered.
                "{\n  \"fast\": {\"x\": 3}\n}",
                // An array is not an object.
                "[{\"fast\": 4}]",
                // Two objects on a line are offered as one line: the reader must refuse
                // what is not one value (a deserializer does); this one takes anything.
                "fast: 23 bytes",
                "fast: 15 bytes",
            ]
        );
    }

    #[test]
    fn a_declined_line_is_framed_as_if_never_offered() {
        let input = "{\"a\": 1}\n{\"b\": \n2}\n{\"c\": 3}\n{\"d\": }\n";
        let plain: Vec<String> = JsonFrames::new(input.as_bytes())
            .map(|f| match f.unwrap() {
                Frame::Value(v) => v.get().to_owned(),
                Frame::Invalid(e) => format!("invalid: {e}"),
            })
            .collect();
        assert_eq!(plain.len(), 4, "{plain:?}");
        assert_eq!(with_fast(input), plain);
    }
}
