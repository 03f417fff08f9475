//! How an override is kept in Redis: its field (policy, key kind, key
//! bytes) and its value (expiry, rule), and the reply of the poll script.

use tollgate_core::{Key, KeyKind, Override, Timestamp};

/// One override as read from Redis: key, policy name, rule, expiry.
pub(super) type Read = (Key, String, Override, Option<Timestamp>);

/// The field of `key`'s override under the policy named `policy`: the
/// name, NUL, the key's kind, NUL, the key's bytes. Unlike state keys,
/// which are digests, the field keeps the key an operator named: every
/// instance rebuilds its table of keys from it.
pub(super) fn field(policy: &str, key: &Key) -> Vec<u8> {
    let kind = key.kind().as_str();
    let mut field = Vec::with_capacity(policy.len() + kind.len() + 2 + key.as_bytes().len());
    field.extend_from_slice(policy.as_bytes());
    field.push(0);
    field.extend_from_slice(kind.as_bytes());
    field.push(0);
    field.extend_from_slice(key.as_bytes());
    field
}

/// The value of `rule` until `expires_at`: the expiry in µs (0 for none),
/// `;`, the rule's text.
pub(super) fn value(rule: &Override, expires_at: Option<Timestamp>) -> String {
    let ends = expires_at.map_or(0, Timestamp::as_micros);
    format!("{ends};{rule}")
}

/// The override of a field and its value, or `None` for one this version
/// cannot read (written by a later version, or by hand).
pub(super) fn read(field: &[u8], value: &[u8]) -> Option<Read> {
    let mut parts = field.splitn(3, |&b| b == 0);
    let policy = std::str::from_utf8(parts.next()?).ok()?;
    let kind = KeyKind::from_name(std::str::from_utf8(parts.next()?).ok()?)?;
    let key = Key::new(kind, parts.next()?);
    let (ends, rule) = std::str::from_utf8(value).ok()?.split_once(';')?;
    let ends: u64 = ends.parse().ok()?;
    let rule: Override = rule.parse().ok()?;
    let expires_at = (ends > 0).then_some(Timestamp::from_micros(ends));
    Some((key, policy.to_owned(), rule, expires_at))
}

/// The poll script's reply: the version, and every override if it
/// changed (`None` when it did not); fields that cannot be read are
/// left out.
pub(super) fn poll_reply(reply: redis::Value) -> Option<(String, Option<Vec<Read>>)> {
    let redis::Value::Array(mut parts) = reply else {
        return None;
    };
    let all = (parts.len() == 2).then(|| parts.pop()).flatten();
    let version: String = redis::from_redis_value(parts.pop()?).ok()?;
    let Some(all) = all else {
        return Some((version, None));
    };
    let flat: Vec<Vec<u8>> = redis::from_redis_value(all).ok()?;
    let read = flat
        .chunks_exact(2)
        .filter_map(|pair| read(&pair[0], &pair[1]))
        .collect();
    Some((version, Some(read)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_reads_back_as_written() {
        let key = Key::user(b"a\0b;c");
        let rule: Override = "1000/min 50/s burst 60".parse().unwrap();
        let ends = Some(Timestamp::from_secs(1_700_000_000));
        let read = read(&field("export-pro", &key), value(&rule, ends).as_bytes()).unwrap();
        assert_eq!(read, (key.clone(), "export-pro".to_owned(), rule, ends));
        let deny = read_value(&key, "0;deny");
        assert_eq!((deny.2, deny.3), (Override::Deny, None));
        assert!(super::read(&field("api", &key), b"0;often").is_none());
        assert!(super::read(b"api\0nokind\0x", b"0;deny").is_none());
    }

    fn read_value(key: &Key, value: &str) -> Read {
        read(&field("api", key), value.as_bytes()).unwrap()
    }
}
