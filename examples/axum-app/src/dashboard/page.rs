//! The dashboard's page and its script, with no data in them and nothing
//! loaded from elsewhere.

/// The page, `page.html`.
pub(super) const HTML: &str = include_str!("page.html");

/// Its script, `page.js`, served apart so that the page's content
/// security policy allows no inline script.
pub(super) const SCRIPT: &str = include_str!("page.js");
