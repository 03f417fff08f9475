//! The answer to a request without a rate-limit key: whose mistake it is
//! decides the status and the words.

use http::StatusCode;

use crate::extract::MissingCause;

/// What the layer does with a request from which no key can be extracted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer by whose mistake it is, as the key extractor tells
    /// ([`KeyExtractor::missing`](crate::KeyExtractor::missing)); the
    /// default. A client that left out what it must send gets 400 with an
    /// `application/problem+json` body saying what, an unauthenticated
    /// request 401, and a server wired without what the key needs 500.
    /// Each is logged (client mistakes at debug level, server ones at
    /// error level) at most once a second, with the count held back.
    #[default]
    ByCause,
    /// Answer 500 whatever the cause, logged at error level at most once a
    /// second.
    Error,
    /// Answer with this status (for example 401 on routes keyed by user).
    Reject(StatusCode),
    /// Let the request through unlimited, without rate-limit headers.
    Allow,
}

/// The words of a missing key that are not the client's to fix.
const NO_KEY: &str = "no rate-limit key for this request";

impl MissingKey {
    /// The status and the words of the answer to a request whose key is
    /// missing for `cause`. [`MissingKey::Allow`] lets such requests
    /// through before any answer is made; were one made, it would be 500.
    pub(super) fn answer(self, cause: &MissingCause) -> (StatusCode, &str) {
        match self {
            MissingKey::ByCause => match cause {
                MissingCause::Client(what) => (StatusCode::BAD_REQUEST, what),
                MissingCause::Unauthenticated => {
                    (StatusCode::UNAUTHORIZED, "authentication required")
                }
                MissingCause::Server(_) => (StatusCode::INTERNAL_SERVER_ERROR, NO_KEY),
            },
            MissingKey::Reject(status) => (status, NO_KEY),
            MissingKey::Error | MissingKey::Allow => (StatusCode::INTERNAL_SERVER_ERROR, NO_KEY),
        }
    }
}
