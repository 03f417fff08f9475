//! The dashboard's page: markup, style and script in one file, with no
//! data in it and nothing loaded from elsewhere.

/// The page, `page.html`.
pub(super) const HTML: &str = include_str!("page.html");
