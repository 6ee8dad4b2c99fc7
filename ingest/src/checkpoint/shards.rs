//! The pods' entries by shard, pure: which shard a pod's uid falls in, each shard's keys
//! (`pods.0007`, its parts `pods.0007.1`, …), and a shard's value encoded and decoded.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Prefix of shard keys: `pods.<shard>`, four digits.
pub(super) const SHARD_PREFIX: &str = "pods.";
/// Shards of the pods' entries. Changing it leaves keys past the new count to be purged
/// after the first write.
pub const SHARDS: usize = 1024;

/// The shard of a pod: FNV-1a of its uid, stable across builds and versions.
pub fn shard_of(uid: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in uid.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % SHARDS as u64) as usize
}

/// The key of part `part` of a shard: `pods.0007` for the first, `pods.0007.1` after it.
pub(super) fn shard_key(shard: usize, part: usize) -> String {
    if part == 0 {
        format!("{SHARD_PREFIX}{shard:04}")
    } else {
        format!("{SHARD_PREFIX}{shard:04}.{part}")
    }
}

/// The shard and part a key after [`SHARD_PREFIX`] names (`0007`, `0007.1`), if it names one.
pub(super) fn shard_and_part(rest: &str) -> Option<(usize, usize)> {
    let (shard, part) = match rest.split_once('.') {
        Some((shard, part)) => (shard, part.parse().ok().filter(|p| *p > 0)?),
        None => (rest, 0),
    };
    let shard = shard.parse().ok().filter(|s| *s < SHARDS)?;
    Some((shard, part))
}

/// A shard's events as the values of its parts, each at most `limit` bytes (an event over
/// the limit alone in its part); at least one part, empty when the shard has no pods.
pub fn encode_parts(events: &[Bytes], limit: usize) -> Vec<Bytes> {
    let mut parts = Vec::new();
    let mut from = 0;
    let mut size = 0;
    for (at, event) in events.iter().enumerate() {
        let entry = prost::encoding::encoded_len_varint(event.len() as u64) + event.len();
        if at > from && size + entry > limit {
            parts.push(encode_shard(&events[from..at]));
            from = at;
            size = 0;
        }
        size += entry;
    }
    if from < events.len() || parts.is_empty() {
        parts.push(encode_shard(&events[from..]));
    }
    parts
}

/// A shard's value: each pod's last event, encoded, as a varint length and the bytes.
pub fn encode_shard<'a>(events: impl IntoIterator<Item = &'a Bytes>) -> Bytes {
    let mut out = BytesMut::new();
    for event in events {
        prost::encoding::encode_varint(event.len() as u64, &mut out);
        out.put_slice(event);
    }
    out.freeze()
}

/// A shard's value that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum ShardUnreadable {
    /// An entry's length is not a varint.
    #[error("an entry's length is unreadable: {0}")]
    Length(#[from] prost::DecodeError),
    /// An entry is longer than what is left.
    #[error("an entry of {len} bytes with {left} left")]
    CutShort {
        /// The entry's length.
        len: u64,
        /// The bytes left.
        left: usize,
    },
}

/// The encoded events of a shard's value, in order.
pub fn decode_shard(mut value: &[u8]) -> Result<Vec<Bytes>, ShardUnreadable> {
    let mut events = Vec::new();
    while value.has_remaining() {
        let len = prost::encoding::decode_varint(&mut value)?;
        let Some(entry) = usize::try_from(len).ok().and_then(|n| value.get(..n)) else {
            return Err(ShardUnreadable::CutShort {
                len,
                left: value.len(),
            });
        };
        events.push(Bytes::copy_from_slice(entry));
        value.advance(entry.len());
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_value_reads_back_as_written_and_a_cut_one_is_refused() {
        let events = [
            Bytes::from_static(b"first"),
            Bytes::new(),
            Bytes::from(vec![7u8; 300]),
        ];
        let value = encode_shard(&events);
        assert_eq!(decode_shard(&value).unwrap(), events);
        assert_eq!(decode_shard(&[]).unwrap(), Vec::<Bytes>::new());
        let cut = &value[..value.len() - 1];
        assert!(matches!(
            decode_shard(cut),
            Err(ShardUnreadable::CutShort {
                len: 300,
                left: 299
            })
        ));
        assert!(matches!(
            decode_shard(&[0xff]),
            Err(ShardUnreadable::Length(_))
        ));
    }

    /// Parts hold the events in order, each part within the limit but for an event over it
    /// alone, and read back to the events; no events still make one (empty) part.
    #[test]
    fn parts_keep_within_the_limit_and_read_back_in_order() {
        let event = |n: usize| Bytes::from(vec![b'e'; n]);
        // (event sizes, limit, events per part); an entry is its length's varint plus it.
        let table: &[(&[usize], usize, &[usize])] = &[
            (&[], 100, &[0]),
            (&[10, 10, 10], 100, &[3]),
            (&[10, 10, 10], 22, &[2, 1]),
            (&[10, 10, 10], 11, &[1, 1, 1]),
            (&[50, 200, 10, 10], 100, &[1, 1, 2]),
            (&[200], 100, &[1]),
        ];
        for (sizes, limit, expected) in table {
            let events: Vec<Bytes> = sizes.iter().map(|&n| event(n)).collect();
            let parts = encode_parts(&events, *limit);
            let counts: Vec<usize> = parts
                .iter()
                .map(|part| decode_shard(part).unwrap().len())
                .collect();
            assert_eq!(&counts, expected, "{sizes:?} in parts of {limit}");
            for part in &parts {
                let decoded = decode_shard(part).unwrap();
                assert!(part.len() <= *limit || decoded.len() == 1, "{sizes:?}");
            }
            let read: Vec<Bytes> = parts
                .iter()
                .flat_map(|part| decode_shard(part).unwrap())
                .collect();
            assert_eq!(read, events);
        }
    }

    /// The keys of a shard's parts, and what is not one (left as stale by a load).
    #[test]
    fn shard_keys_name_their_shard_and_part() {
        assert_eq!(shard_key(7, 0), "pods.0007");
        assert_eq!(shard_key(7, 2), "pods.0007.2");
        for (rest, named) in [
            ("0007", Some((7, 0))),
            ("0007.2", Some((7, 2))),
            ("1023.11", Some((1023, 11))),
            ("0007.0", None),
            ("1024", None),
            ("0007.x", None),
            ("abc", None),
        ] {
            assert_eq!(shard_and_part(rest), named, "{rest}");
        }
    }

    /// A pod's shard must not change between versions: its entry would then live in two keys.
    #[test]
    fn the_shard_of_a_uid_is_pinned() {
        // FNV-1a's published vector: "a" hashes to 0xaf63dc4c8601ec8c.
        assert_eq!(
            shard_of("a"),
            (0xaf63_dc4c_8601_ec8c_u64 % SHARDS as u64) as usize
        );
        assert_eq!(shard_of("u-1"), 578);
        assert_eq!(shard_of("0b6e5c3a-6f1e-4c8e-9a55-1d2e3f405162"), 561);
        let spread: std::collections::HashSet<usize> =
            (0..10_000).map(|i| shard_of(&format!("uid-{i}"))).collect();
        assert!(
            spread.len() > SHARDS * 9 / 10,
            "10k uids use most shards: {}",
            spread.len()
        );
    }
}
