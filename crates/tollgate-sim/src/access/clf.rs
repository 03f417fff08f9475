//! The common and combined log formats:
//! `host ident user [day/Mon/year:hh:mm:ss zone] "METHOD target PROTO"
//! status bytes ["referer" "user-agent"]`.

use std::net::IpAddr;

use tollgate_core::Timestamp;

use super::{AccessRecord, valid_method, valid_target};

/// The last time field parsed and its value: consecutive lines of a busy
/// log mostly share their second.
#[derive(Debug, Default)]
pub(super) struct TimeCache {
    text: String,
    time: Option<Timestamp>,
}

impl TimeCache {
    fn parse(&mut self, text: &str) -> Result<Timestamp, &'static str> {
        if let Some(time) = self.time.filter(|_| self.text == text) {
            return Ok(time);
        }
        let parsed = jiff::Timestamp::strptime("%d/%b/%Y:%H:%M:%S %z", text)
            .map_err(|_| "a time that is not day/Mon/year:hh:mm:ss +zone")?;
        let micros = u64::try_from(parsed.as_microsecond()).map_err(|_| "a time before 1970")?;
        let time = Timestamp::from_micros(micros);
        self.text.clear();
        self.text.push_str(text);
        self.time = Some(time);
        Ok(time)
    }
}

/// Parses one line; `combined` requires the referer and user agent.
pub(super) fn parse(
    line: &str,
    combined: bool,
    times: &mut TimeCache,
) -> Result<AccessRecord, &'static str> {
    let mut rest = line;
    let host = word(&mut rest).ok_or("no client address")?;
    let ip: IpAddr = host
        .parse()
        .map_err(|_| "a client that is not an IP address")?;
    let _ident = word(&mut rest).ok_or("no ident field")?;
    let user = word(&mut rest).ok_or("no user field")?;
    let time = bracketed(&mut rest).ok_or("no [time] field")?;
    let time = times.parse(time)?;
    let request = quoted(&mut rest).ok_or("no quoted request")?;
    let mut parts = request.split(' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err("a request that is not METHOD target");
    };
    if !valid_method(method) || !valid_target(target) {
        return Err("a request that is not METHOD /path");
    }
    let status = word(&mut rest).ok_or("no status")?;
    let status: u16 = status
        .parse()
        .map_err(|_| "a status that is not a number")?;
    if !(100..=999).contains(&status) {
        return Err("a status out of range");
    }
    let _bytes = word(&mut rest).ok_or("no size field")?;
    let mut headers = Vec::new();
    if combined {
        let referer = quoted(&mut rest).ok_or("no quoted referer")?;
        let agent = quoted(&mut rest).ok_or("no quoted user agent")?;
        for (name, value) in [("referer", referer), ("user-agent", agent)] {
            if value != "-" {
                headers.push((name.to_owned(), value));
            }
        }
    }
    Ok(AccessRecord {
        time,
        method: method.to_owned(),
        target: target.to_owned(),
        ip,
        user: (user != "-").then(|| user.to_owned()),
        status: Some(status),
        headers,
    })
}

/// The next space-separated word.
fn word<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ');
    let end = s.find(' ').unwrap_or(s.len());
    let (word, tail) = s.split_at(end);
    *rest = tail;
    (!word.is_empty()).then_some(word)
}

/// The next `[...]` field, without its brackets.
fn bracketed<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ').strip_prefix('[')?;
    let end = s.find(']')?;
    *rest = &s[end + 1..];
    Some(&s[..end])
}

/// The next `"..."` field, unescaped: `\"` and `\\` (Apache), `\xHH`
/// (nginx).
fn quoted(rest: &mut &str) -> Option<String> {
    let s = rest.trim_start_matches(' ').strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                *rest = &s[i + 1..];
                return Some(out);
            }
            '\\' => match chars.next()? {
                (_, 'x') => {
                    let hi = chars.next()?.1.to_digit(16)?;
                    let lo = chars.next()?.1.to_digit(16)?;
                    out.push(char::from(u8::try_from(hi * 16 + lo).ok()?));
                }
                (_, escaped) => out.push(escaped),
            },
            c => out.push(c),
        }
    }
    None
}
