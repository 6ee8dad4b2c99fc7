//! Subject names on the bus (docs/contract.md §2) and the encoding of Kubernetes
//! values into subject tokens.
//!
//! A NATS subject token may not be empty and may not contain `.`, `*`, `>` or
//! white space. Kubernetes label values and uids are usually safe, but the
//! encoding must hold for any string, so that one scheduler id is always
//! exactly one token and decodes back to itself:
//!
//! - `A`–`Z`, `a`–`z`, `0`–`9`, `-` and `_` stand for themselves;
//! - every other byte of the UTF-8 value is `~` followed by two upper-case
//!   hex digits (`.` → `~2E`, `~` → `~7E`, `é` → `~C3~A9`);
//! - the empty string is the single token `~`.
//!
//! So `42` stays `42`, a uid stays itself, and `team.a` becomes `team~2Ea`.

use thiserror::Error;

/// The default first token of every podstream subject.
pub const DEFAULT_PREFIX: &str = "podstream";

/// A token that is not the encoding of any string.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TokenError {
    /// `~` not followed by two hex digits.
    #[error("bad escape at byte {at} of token {token:?}")]
    BadEscape {
        /// The token as received.
        token: String,
        /// Byte offset of the `~`.
        at: usize,
    },
    /// A byte outside the encoding's alphabet.
    #[error("byte {byte:#04x} at {at} of token {token:?} is never produced by the encoding")]
    BadByte {
        /// The token as received.
        token: String,
        /// Byte offset of the byte.
        at: usize,
        /// The byte.
        byte: u8,
    },
    /// Escapes that do not form UTF-8.
    #[error("token {token:?} decodes to bytes that are not UTF-8")]
    NotUtf8 {
        /// The token as received.
        token: String,
    },
    /// A subject prefix that is not a sequence of valid tokens.
    #[error(
        "subject prefix {prefix:?} is not valid: use tokens of letters, digits, '-' and '_' separated by '.'"
    )]
    BadPrefix {
        /// The prefix as configured.
        prefix: String,
    },
}

fn is_plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

/// Encodes any string as exactly one valid subject token.
pub fn encode_token(value: &str) -> String {
    escaped(value, '~')
}

/// Encodes any string as one token of a KV key (whose characters are fewer than a
/// subject's: no `~`): letters, digits, `-` and `_` stay, every other byte becomes `=XX`; the
/// empty string is `=`.
pub fn encode_key_token(value: &str) -> String {
    escaped(value, '=')
}

/// The length of `value` as one escaped token ([`encode_token`], [`encode_key_token`]).
pub fn escaped_len(value: &str) -> usize {
    value
        .bytes()
        .map(|byte| if is_plain(byte) { 1 } else { 3 })
        .sum::<usize>()
        .max(1)
}

/// `value` with every byte outside the plain alphabet as `escape` and two upper-case hex
/// digits; the empty string is `escape` alone.
fn escaped(value: &str, escape: char) -> String {
    if value.is_empty() {
        return escape.to_string();
    }
    if value.bytes().all(is_plain) {
        return value.to_owned();
    }
    let mut token = String::with_capacity(value.len() * 3);
    for byte in value.bytes() {
        if is_plain(byte) {
            token.push(char::from(byte));
        } else {
            token.push(escape);
            token.push_str(&format!("{byte:02X}"));
        }
    }
    token
}

/// Decodes a token made by [`encode_token`].
pub fn decode_token(token: &str) -> Result<String, TokenError> {
    if token == "~" {
        return Ok(String::new());
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte == b'~' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| {
                    h.bytes()
                        .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
                })
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| TokenError::BadEscape {
                    token: token.to_owned(),
                    at,
                })?;
            out.push(hex);
            at += 3;
        } else if is_plain(byte) {
            out.push(byte);
            at += 1;
        } else {
            return Err(TokenError::BadByte {
                token: token.to_owned(),
                at,
                byte,
            });
        }
    }
    String::from_utf8(out).map_err(|_| TokenError::NotUtf8 {
        token: token.to_owned(),
    })
}

/// Why a message goes on a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The pod's event, on its current owner's subject.
    Event,
    /// The same event on the previous owner's subject: the pod left that scheduler.
    Left,
}

impl Role {
    /// The value of the `Podstream-Role` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Event => "event",
            Role::Left => "left",
        }
    }
}

/// The `Podstream-Role` header of pod-event messages: `event`, or `left` for the notice to a previous owner.
pub const ROLE_HEADER: &str = "Podstream-Role";

/// The header of a dead letter saying why it was dead-lettered.
pub const REASON_HEADER: &str = "Podstream-Reason";

/// The header of a dead letter naming the subject it came from or was meant for.
pub const SOURCE_HEADER: &str = "Podstream-Source";

/// The header of a dead letter whose payload was cut to fit the server's `max_payload`: the
/// original size in bytes (the source header says where the whole item is).
pub const ORIGINAL_SIZE_HEADER: &str = "Podstream-Original-Size";

/// The streams podstream writes, one per kind of subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Pod events: `<prefix>.pods.>`.
    PodEvents,
    /// Commands: `<prefix>.commands.>`.
    Commands,
    /// Dead letters: `<prefix>.dead.>`.
    DeadLetters,
    /// Spark driver pods and SparkApplications (`ingest --spark`): `<prefix>.spark.>`.
    Spark,
}

impl Stream {
    /// The subject token after the prefix, and the stream name's suffix.
    pub fn token(self) -> &'static str {
        match self {
            Stream::PodEvents => "pods",
            Stream::Commands => "commands",
            Stream::DeadLetters => "dead",
            Stream::Spark => "spark",
        }
    }
}

/// The kinds of Spark object on the Spark stream, one subject token each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparkKind {
    /// Driver pods: `<prefix>.spark.drivers.<namespace>.<uid>`.
    Driver,
    /// SparkApplications: `<prefix>.spark.applications.<namespace>.<uid>`.
    Application,
}

impl SparkKind {
    /// The subject token after `spark`.
    pub fn token(self) -> &'static str {
        match self {
            SparkKind::Driver => "drivers",
            SparkKind::Application => "applications",
        }
    }
}

/// The pipeline stage that dead-lettered a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A pod the ingest could not project.
    Ingest,
    /// A pod event the processor could not decode or decide.
    Processor,
    /// A command the sink could not apply.
    Sink,
    /// A command the collector could not read.
    Collector,
}

impl Stage {
    /// The stage's subject token.
    pub fn token(self) -> &'static str {
        match self {
            Stage::Ingest => "ingest",
            Stage::Processor => "processor",
            Stage::Sink => "sink",
            Stage::Collector => "collector",
        }
    }
}

/// Builds podstream's subject names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Default for Subjects {
    fn default() -> Self {
        Subjects {
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl Subjects {
    /// Subjects under `prefix`, which must be `.`-separated plain tokens.
    pub fn new(prefix: &str) -> Result<Self, TokenError> {
        let valid = !prefix.is_empty()
            && prefix
                .split('.')
                .all(|t| !t.is_empty() && t.bytes().all(is_plain));
        if !valid {
            return Err(TokenError::BadPrefix {
                prefix: prefix.to_owned(),
            });
        }
        Ok(Subjects {
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix these subjects live under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>-<role>`, dots as dashes: the name of this prefix's KV bucket or Lease for
    /// `role` (`ingest`, `process`, `spark`), so a deployment with a prefix of its own keeps
    /// its state apart as it keeps its subjects (`podstream-process` under the default).
    ///
    /// ```
    /// use podstream_proto::subject::Subjects;
    /// assert_eq!(Subjects::default().resource_name("process"), "podstream-process");
    /// assert_eq!(Subjects::new("team.b").unwrap().resource_name("ingest"), "team-b-ingest");
    /// ```
    pub fn resource_name(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix.replace('.', "-"))
    }

    /// `<prefix>.pods.<owner>.<uid>`: one pod's events while `owner` owns it.
    pub fn pod_events(&self, owner: &str, uid: &str) -> String {
        self.of_pod(Stream::PodEvents, &encode_token(owner), uid)
    }

    /// `<prefix>.commands.<owner>.<uid>`: commands decided from one pod's events.
    pub fn commands(&self, owner: &str, uid: &str) -> String {
        self.of_pod(Stream::Commands, &encode_token(owner), uid)
    }

    /// `<prefix>.pods.*.<uid>`: one pod's events, whoever owned it.
    pub fn pod_events_of_any_owner(&self, uid: &str) -> String {
        self.of_pod(Stream::PodEvents, "*", uid)
    }

    fn of_pod(&self, stream: Stream, owner_token: &str, uid: &str) -> String {
        format!(
            "{}.{}.{owner_token}.{}",
            self.prefix,
            stream.token(),
            encode_token(uid)
        )
    }

    /// `<prefix>.pods.<owner>.*`, or `<prefix>.pods.>` for every owner.
    pub fn pod_events_filter(&self, owner: Option<&str>) -> String {
        self.filter(Stream::PodEvents, owner)
    }

    /// `<prefix>.commands.<owner>.*`, or `<prefix>.commands.>` for every owner.
    pub fn commands_filter(&self, owner: Option<&str>) -> String {
        self.filter(Stream::Commands, owner)
    }

    fn filter(&self, stream: Stream, owner: Option<&str>) -> String {
        match owner {
            Some(owner) => format!(
                "{}.{}.{}.*",
                self.prefix,
                stream.token(),
                encode_token(owner)
            ),
            None => self.stream_subjects(stream),
        }
    }

    /// `<prefix>.spark.<drivers|applications>.<namespace>.<uid>`: one Spark object's events.
    pub fn spark(&self, kind: SparkKind, namespace: &str, uid: &str) -> String {
        format!(
            "{}.{}.{}.{}.{}",
            self.prefix,
            Stream::Spark.token(),
            kind.token(),
            encode_token(namespace),
            encode_token(uid)
        )
    }

    /// `<prefix>.dead.<stage>`: what a stage could not handle, with its reason.
    pub fn dead_letters(&self, stage: Stage) -> String {
        format!(
            "{}.{}.{}",
            self.prefix,
            Stream::DeadLetters.token(),
            stage.token()
        )
    }

    /// `<prefix>.<token>.>`: every subject of `stream`.
    pub fn stream_subjects(&self, stream: Stream) -> String {
        format!("{}.{}.>", self.prefix, stream.token())
    }

    /// The stream's name: the prefix in capitals, `.` as `_`, then the stream's token
    /// (`PODSTREAM_PODS` for `podstream`).
    pub fn stream_name(&self, stream: Stream) -> String {
        let prefix: String = self
            .prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("{prefix}_{}", stream.token().to_ascii_uppercase())
    }

    /// The stream whose subjects `subject` is one of, by the token after the prefix.
    pub fn stream_of(&self, subject: &str) -> Option<Stream> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix('.')?;
        let token = rest.split('.').next()?;
        [
            Stream::PodEvents,
            Stream::Commands,
            Stream::DeadLetters,
            Stream::Spark,
        ]
        .into_iter()
        .find(|stream| stream.token() == token)
    }

    /// Splits a pod-event or command subject into (owner, uid), decoded.
    pub fn parse(&self, subject: &str) -> Option<(String, String)> {
        if !matches!(
            self.stream_of(subject)?,
            Stream::PodEvents | Stream::Commands
        ) {
            return None;
        }
        let mut tokens = subject.get(self.prefix.len() + 1..)?.split('.').skip(1);
        let (owner, uid) = (tokens.next()?, tokens.next()?);
        if tokens.next().is_some() {
            return None;
        }
        Some((decode_token(owner).ok()?, decode_token(uid).ok()?))
    }
}

/// The streams' names under the default prefix, for tests and tools that name a stream
/// directly (each is checked against [`Subjects::stream_name`] below).
pub mod stream_names {
    /// Pod events.
    pub const PODS: &str = "PODSTREAM_PODS";
    /// Commands.
    pub const COMMANDS: &str = "PODSTREAM_COMMANDS";
    /// Dead letters.
    pub const DEAD: &str = "PODSTREAM_DEAD";
    /// Spark objects' events.
    pub const SPARK: &str = "PODSTREAM_SPARK";
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What nats-server accepts as one token of a published subject.
    fn is_one_valid_token(token: &str) -> bool {
        !token.is_empty()
            && token
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'.' && b != b'*' && b != b'>')
    }

    proptest! {
        #[test]
        fn escaped_len_is_the_length_of_either_encoding(value in ".{0,40}") {
            prop_assert_eq!(escaped_len(&value), encode_key_token(&value).len());
            prop_assert_eq!(escaped_len(&value), encode_token(&value).len());
        }
    }

    #[test]
    fn encoding_table() {
        let long = "a".repeat(63);
        let cases: &[(&str, &str)] = &[
            ("42", "42"),
            (
                "b7f1c9a0-5d2e-4c1f-9a3b-0e6f7d8c9b10",
                "b7f1c9a0-5d2e-4c1f-9a3b-0e6f7d8c9b10",
            ),
            ("team.a", "team~2Ea"),
            ("*", "~2A"),
            (">", "~3E"),
            ("a b", "a~20b"),
            ("~", "~7E"),
            ("é", "~C3~A9"),
            ("", "~"),
            (&long, &long),
        ];
        for (value, token) in cases {
            assert_eq!(encode_token(value), *token, "encoding {value:?}");
            assert_eq!(
                decode_token(token).as_deref(),
                Ok(*value),
                "decoding {token:?}"
            );
        }
    }

    #[test]
    fn key_tokens_use_only_kv_key_characters() {
        for (value, token) in [
            ("etl", "etl"),
            ("", "="),
            ("a.b", "a=2Eb"),
            ("r~1", "r=7E1"),
            ("t:00+00", "t=3A00=2B00"),
        ] {
            assert_eq!(encode_key_token(value), token, "{value:?}");
        }
    }

    #[test]
    fn decoding_rejects_what_encoding_never_makes() {
        assert!(matches!(
            decode_token("a.b"),
            Err(TokenError::BadByte { .. })
        ));
        assert!(matches!(
            decode_token("~2"),
            Err(TokenError::BadEscape { .. })
        ));
        assert!(matches!(
            decode_token("~2e"),
            Err(TokenError::BadEscape { .. })
        ));
        assert!(matches!(
            decode_token("~FF"),
            Err(TokenError::NotUtf8 { .. })
        ));
    }

    #[test]
    fn subjects_put_owner_and_uid_in_one_token_each() {
        let s = Subjects::default();
        assert_eq!(s.pod_events("1", "u-1"), "podstream.pods.1.u-1");
        assert_eq!(s.commands("a.b", "u-1"), "podstream.commands.a~2Eb.u-1");
        assert_eq!(s.pod_events_filter(Some("7")), "podstream.pods.7.*");
        assert_eq!(s.pod_events_filter(None), "podstream.pods.>");
        assert_eq!(s.commands_filter(None), "podstream.commands.>");
        assert_eq!(s.dead_letters(Stage::Sink), "podstream.dead.sink");
        assert_eq!(
            s.parse("podstream.pods.a~2Eb.u-1"),
            Some(("a.b".into(), "u-1".into()))
        );
        assert_eq!(s.parse("podstream.dead.sink"), None);
        assert_eq!(s.parse("other.pods.1.u"), None);
        assert_eq!(s.parse("podstream.pods.1.u.extra"), None);
        assert_eq!(s.pod_events_of_any_owner("u.1"), "podstream.pods.*.u~2E1");
        assert_eq!(
            s.spark(SparkKind::Driver, "team.a", "u-1"),
            "podstream.spark.drivers.team~2Ea.u-1"
        );
        assert_eq!(
            s.spark(SparkKind::Application, "airflow", "u-2"),
            "podstream.spark.applications.airflow.u-2"
        );
        assert_eq!(
            s.stream_of("podstream.spark.drivers.airflow.u-1"),
            Some(Stream::Spark)
        );
        assert_eq!(s.parse("podstream.spark.drivers.airflow.u-1"), None);
    }

    #[test]
    fn streams_have_one_name_and_one_subject_space_each() {
        let s = Subjects::new("acme.podstream").unwrap();
        let table = [
            (
                Stream::PodEvents,
                "ACME_PODSTREAM_PODS",
                "acme.podstream.pods.>",
            ),
            (
                Stream::Commands,
                "ACME_PODSTREAM_COMMANDS",
                "acme.podstream.commands.>",
            ),
            (
                Stream::DeadLetters,
                "ACME_PODSTREAM_DEAD",
                "acme.podstream.dead.>",
            ),
            (
                Stream::Spark,
                "ACME_PODSTREAM_SPARK",
                "acme.podstream.spark.>",
            ),
        ];
        for (stream, name, subjects) in table {
            assert_eq!(s.stream_name(stream), name);
            assert_eq!(s.stream_subjects(stream), subjects);
        }
        assert_eq!(
            s.stream_of("acme.podstream.pods.1.u"),
            Some(Stream::PodEvents)
        );
        assert_eq!(
            s.stream_of("acme.podstream.commands.1.u"),
            Some(Stream::Commands)
        );
        assert_eq!(
            s.stream_of(&s.dead_letters(Stage::Ingest)),
            Some(Stream::DeadLetters)
        );
        assert_eq!(s.stream_of("acme.podstream.other.1"), None);
        assert_eq!(s.stream_of("podstream.pods.1.u"), None);
    }

    #[test]
    fn prefix_must_be_plain_tokens() {
        assert!(Subjects::new("acme.podstream").is_ok());
        for bad in ["", "a..b", "a.*", "a b", "a.>"] {
            assert!(Subjects::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn any_string_is_one_token_and_round_trips(value in any::<String>()) {
            let token = encode_token(&value);
            prop_assert!(is_one_valid_token(&token), "{token:?}");
            prop_assert_eq!(decode_token(&token), Ok(value));
        }

        #[test]
        fn subjects_always_have_four_tokens(owner in any::<String>(), uid in any::<String>()) {
            let s = Subjects::default();
            let subject = s.pod_events(&owner, &uid);
            prop_assert_eq!(subject.split('.').count(), 4);
            prop_assert_eq!(s.parse(&subject), Some((owner, uid)));
        }
    }

    #[test]
    fn the_stream_name_constants_are_the_default_prefix_names() {
        let subjects = Subjects::new(DEFAULT_PREFIX).unwrap();
        for (name, stream) in [
            (stream_names::PODS, Stream::PodEvents),
            (stream_names::COMMANDS, Stream::Commands),
            (stream_names::DEAD, Stream::DeadLetters),
            (stream_names::SPARK, Stream::Spark),
        ] {
            assert_eq!(name, subjects.stream_name(stream));
        }
    }
}
