//! The decision scripts, one per algorithm, assembled from `src/lua`.

use tollgate_core::Algorithm;

macro_rules! decision_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!(concat!("lua/", $file)),
            include_str!("lua/epilogue.lua"),
        )
    };
}

/// The Lua source of the decision script of `algorithm`, as sent to Redis,
/// or `None` for an algorithm this version does not implement.
///
/// Useful to load it elsewhere, such as into `redis-benchmark`.
pub fn script_source(algorithm: Algorithm) -> Option<&'static str> {
    Some(match algorithm {
        Algorithm::FixedWindow => decision_script!("fixed_window.lua"),
        Algorithm::SlidingLog => decision_script!("sliding_log.lua"),
        Algorithm::SlidingWindow => decision_script!("sliding_window.lua"),
        Algorithm::TokenBucket => decision_script!("token_bucket.lua"),
        Algorithm::LeakyBucket => decision_script!("leaky_bucket.lua"),
        Algorithm::Gcra => decision_script!("gcra.lua"),
        _ => return None,
    })
}

/// A decision script: its source and SHA-1.
#[derive(Debug)]
pub(crate) struct DecisionScript {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

/// The six scripts, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    scripts: Vec<(Algorithm, DecisionScript)>,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            scripts: Algorithm::ALL
                .into_iter()
                .filter_map(|a| {
                    let source = script_source(a)?;
                    let sha = redis::Script::new(source).get_hash().to_owned();
                    Some((a, DecisionScript { source, sha }))
                })
                .collect(),
        }
    }

    /// The script of `algorithm`, or `None` for an algorithm this store
    /// does not know.
    pub(crate) fn get(&self, algorithm: Algorithm) -> Option<&DecisionScript> {
        self.scripts
            .iter()
            .find(|(a, _)| *a == algorithm)
            .map(|(_, s)| s)
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &DecisionScript> {
        self.scripts.iter().map(|(_, s)| s)
    }
}
