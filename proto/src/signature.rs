//! Signed worker pods: the annotation `PodstreamKubernetesExecutor` writes on every pod it
//! launches, an HMAC-SHA256 over the pod's namespace, name and TI key, and its check
//! (docs/semantics.md "Signed worker pods"). The executor signs; the processor verifies
//! with `--require-signed-pods`. A pod that anyone else created cannot carry a valid one.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

use crate::v1::{PodRef, TaskKey};

/// The annotation that carries a pod's signature.
pub const SIGNATURE_ANNOTATION: &str = "podstream.io/signature";

/// The first line of the signed text and the prefix of the annotation's value: a later
/// scheme gets a new version, and both are accepted while pods of the old one live.
const VERSION: &str = "v1";

/// The fewest bytes a signing key may have (SHA-256's block of output).
pub const MIN_KEY_BYTES: usize = 32;

/// The most keys accepted at once: the current one and the one being rotated out.
pub const MAX_KEYS: usize = 2;

type HmacSha256 = Hmac<Sha256>;

/// Why a set of signing keys is unusable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// No key was given.
    #[error("no signing key")]
    None,
    /// More keys than rotation needs.
    #[error("{0} signing keys; at most {MAX_KEYS} (the current one and the previous one)")]
    TooMany(usize),
    /// A key is too short to resist guessing.
    #[error("signing key {index} has {bytes} bytes; at least {MIN_KEY_BYTES} are required")]
    TooShort {
        /// Its place in the list, from 0.
        index: usize,
        /// Its length.
        bytes: usize,
    },
}

/// Why a pod's signature does not vouch for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error, serde::Serialize, serde::Deserialize)]
pub enum Unsigned {
    /// The pod carries no signature annotation.
    #[error("no `{SIGNATURE_ANNOTATION}` annotation")]
    Missing,
    /// The annotation is not `v1:` and 64 hex digits.
    #[error("`{SIGNATURE_ANNOTATION}` is not `{VERSION}:` and 64 hex digits")]
    Malformed,
    /// No accepted key made this signature for this pod and TI.
    #[error("`{SIGNATURE_ANNOTATION}` does not match the pod, its task instance and any key")]
    Mismatch,
}

impl Unsigned {
    /// A short name for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Unsigned::Missing => "missing",
            Unsigned::Malformed => "malformed",
            Unsigned::Mismatch => "mismatch",
        }
    }
}

/// The keys pods are signed with: the first signs, every one verifies.
#[derive(Clone, PartialEq, Eq)]
pub struct PodSigning {
    keys: Vec<Vec<u8>>,
}

impl fmt::Debug for PodSigning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PodSigning({} key(s), redacted)", self.keys.len())
    }
}

impl PodSigning {
    /// Keys as the files hold them, surrounding whitespace trimmed (a Secret made with
    /// `--from-file` often ends in a newline): the current key first, then the one being
    /// rotated out.
    pub fn new<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Result<Self, KeyError> {
        let keys: Vec<Vec<u8>> = keys
            .into_iter()
            .map(|k| trim(k.as_ref()).to_vec())
            .collect();
        match keys.len() {
            0 => return Err(KeyError::None),
            n if n > MAX_KEYS => return Err(KeyError::TooMany(n)),
            _ => {}
        }
        if let Some((index, key)) = keys
            .iter()
            .enumerate()
            .find(|(_, k)| k.len() < MIN_KEY_BYTES)
        {
            return Err(KeyError::TooShort {
                index,
                bytes: key.len(),
            });
        }
        Ok(PodSigning { keys })
    }

    /// The annotation's value for `pod` running `task`, made with the current key.
    pub fn sign(&self, pod: &PodRef, task: &TaskKey) -> String {
        let tag = mac(&self.keys[0], pod, task).finalize().into_bytes();
        let mut value = String::with_capacity(VERSION.len() + 1 + 64);
        value.push_str(VERSION);
        value.push(':');
        for byte in tag {
            value.push(char::from(HEX[usize::from(byte >> 4)]));
            value.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        value
    }

    /// Whether `signature` (the annotation's value, empty when absent) was made by one of
    /// the keys for `pod` running `task`. The comparison takes the same time wherever the
    /// bytes differ.
    pub fn verify(&self, pod: &PodRef, task: &TaskKey, signature: &str) -> Result<(), Unsigned> {
        if signature.is_empty() {
            return Err(Unsigned::Missing);
        }
        let tag = signature
            .strip_prefix(VERSION)
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(decode_hex)
            .ok_or(Unsigned::Malformed)?;
        self.keys
            .iter()
            .any(|key| mac(key, pod, task).verify_slice(&tag).is_ok())
            .then_some(())
            .ok_or(Unsigned::Mismatch)
    }
}

/// The signed text: the version, then one line each for namespace, name, dag_id, task_id,
/// run_id, map_index and try_number. No field can hold a newline (Kubernetes names cannot,
/// and a TI key with a control character is refused before it is checked).
pub fn signed_text(pod: &PodRef, task: &TaskKey) -> String {
    format!(
        "{VERSION}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        pod.namespace,
        pod.name,
        task.dag_id,
        task.task_id,
        task.run_id,
        task.map_index,
        task.try_number
    )
}

fn mac(key: &[u8], pod: &PodRef, task: &TaskKey) -> HmacSha256 {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(hmac::digest::InvalidLength) => unreachable!("HMAC accepts keys of any length"),
    };
    mac.update(signed_text(pod, task).as_bytes());
    mac
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let digit = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut tag = [0u8; 32];
    for (at, pair) in bytes.chunks_exact(2).enumerate() {
        tag[at] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(tag)
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(start), Some(end)) => &bytes[start..=end],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";
    const OLD_KEY: &str = "fedcba9876543210fedcba9876543210";

    fn pod() -> PodRef {
        PodRef {
            namespace: "airflow".into(),
            name: "etl-load-x7k2".into(),
            uid: "u1".into(),
        }
    }

    fn task() -> TaskKey {
        TaskKey {
            dag_id: "etl".into(),
            task_id: "load".into(),
            run_id: "scheduled__2026-12-06T00:00:00+00:00".into(),
            map_index: -1,
            try_number: 1,
            ..TaskKey::default()
        }
    }

    /// The vector `podstream-airflow/tests/test_signing.py` checks too, computed with
    /// `printf 'v1\nairflow\n…' | openssl dgst -sha256 -hmac <KEY>`.
    const VECTOR: &str = "v1:38a8521adc9cb406366d922a3ecabf3c9801d2c14a4057cb32f2ac1b54976304";

    #[test]
    fn the_shared_vector_is_what_both_languages_compute() {
        let signing = PodSigning::new([KEY]).unwrap();
        assert_eq!(signing.sign(&pod(), &task()), VECTOR);
    }

    #[test]
    fn a_signature_vouches_for_its_pod_and_task_only() {
        let signing = PodSigning::new([KEY]).unwrap();
        let signature = signing.sign(&pod(), &task());
        assert_eq!(signing.verify(&pod(), &task(), &signature), Ok(()));
        let other_name = PodRef {
            name: "etl-load-copy".into(),
            ..pod()
        };
        let other_namespace = PodRef {
            namespace: "dags".into(),
            ..pod()
        };
        let next_try = TaskKey {
            try_number: 2,
            ..task()
        };
        let mapped = TaskKey {
            map_index: 0,
            ..task()
        };
        let cases: [(&PodRef, &TaskKey, &str, Result<(), Unsigned>); 7] = [
            (&other_name, &task(), &signature, Err(Unsigned::Mismatch)),
            (
                &other_namespace,
                &task(),
                &signature,
                Err(Unsigned::Mismatch),
            ),
            (&pod(), &next_try, &signature, Err(Unsigned::Mismatch)),
            (&pod(), &mapped, &signature, Err(Unsigned::Mismatch)),
            (&pod(), &task(), "", Err(Unsigned::Missing)),
            (&pod(), &task(), "v1:abc", Err(Unsigned::Malformed)),
            (
                &pod(),
                &task(),
                &signature.replacen("v1", "v2", 1),
                Err(Unsigned::Malformed),
            ),
        ];
        for (pod, task, signature, want) in cases {
            assert_eq!(
                signing.verify(pod, task, signature),
                want,
                "{pod} {task} {signature}"
            );
        }
    }

    #[test]
    fn a_uid_is_not_signed_so_a_pod_recreated_under_its_name_keeps_it() {
        let signing = PodSigning::new([KEY]).unwrap();
        let signature = signing.sign(&pod(), &task());
        let again = PodRef {
            uid: "u2".into(),
            ..pod()
        };
        assert_eq!(signing.verify(&again, &task(), &signature), Ok(()));
    }

    #[test]
    fn rotation_accepts_the_previous_key_and_signs_with_the_current_one() {
        let old = PodSigning::new([OLD_KEY]).unwrap();
        let rotating = PodSigning::new([KEY, OLD_KEY]).unwrap();
        let new = PodSigning::new([KEY]).unwrap();
        let by_old = old.sign(&pod(), &task());
        assert_eq!(rotating.verify(&pod(), &task(), &by_old), Ok(()));
        assert_eq!(rotating.sign(&pod(), &task()), new.sign(&pod(), &task()));
        assert_eq!(
            new.verify(&pod(), &task(), &by_old),
            Err(Unsigned::Mismatch)
        );
    }

    #[test]
    fn keys_are_checked_and_trimmed() {
        assert_eq!(PodSigning::new(Vec::<&str>::new()), Err(KeyError::None));
        assert_eq!(PodSigning::new([KEY, KEY, KEY]), Err(KeyError::TooMany(3)));
        assert_eq!(
            PodSigning::new([KEY, "short\n"]),
            Err(KeyError::TooShort { index: 1, bytes: 5 })
        );
        let with_newline = format!("{KEY}\n");
        assert_eq!(PodSigning::new([with_newline]), PodSigning::new([KEY]));
        assert!(!format!("{:?}", PodSigning::new([KEY]).unwrap()).contains(KEY));
    }
}
