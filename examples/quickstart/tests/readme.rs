//! The README's quick start is this crate: its program is `src/main.rs`
//! (without the file's opening `//!` lines), and its `[dependencies]`
//! block names this crate's dependencies, at the workspace's versions,
//! with the features this crate asks for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

const README: &str = include_str!("../../../README.md");
const MAIN: &str = include_str!("../src/main.rs");
const MANIFEST: &str = include_str!("../Cargo.toml");
const WORKSPACE: &str = include_str!("../../../Cargo.toml");

/// The code blocks of `text` fenced as `lang`.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    text.split(fence.as_str())
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .collect()
}

/// The README's section `## Quick start`, to the next section.
fn quick_start() -> &'static str {
    let (_, rest) = README.split_once("## Quick start\n").unwrap();
    rest.split("\n## ").next().unwrap()
}

#[test]
fn the_readme_shows_the_quick_start_program_whole() {
    let program: String = MAIN
        .lines()
        .skip_while(|line| line.starts_with("//!"))
        .skip_while(|line| line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect();
    let shown = blocks(quick_start(), "rust");
    assert!(
        shown.contains(&program.as_str()),
        "the README's quick start is not src/main.rs:\n{program}"
    );
}

#[test]
fn the_readme_names_the_quick_starts_dependencies_and_features() {
    let toml_blocks = blocks(quick_start(), "toml");
    let shown: toml::Table = toml::from_str(toml_blocks[0]).unwrap();
    let shown = shown["dependencies"].as_table().unwrap();
    let manifest: toml::Table = toml::from_str(MANIFEST).unwrap();
    let ours = manifest["dependencies"].as_table().unwrap();
    let workspace: toml::Table = toml::from_str(WORKSPACE).unwrap();
    let versions = workspace["workspace"]["dependencies"].as_table().unwrap();

    let names = |t: &toml::Table| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(shown), names(ours), "the same crates");
    for (name, spec) in shown {
        let (version, features) = match spec {
            toml::Value::String(version) => (version.as_str(), Vec::new()),
            table => (
                table["version"].as_str().unwrap(),
                table
                    .get("features")
                    .and_then(toml::Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            ),
        };
        let ours_version = match &versions[name] {
            toml::Value::String(v) => v.as_str(),
            table => table["version"].as_str().unwrap(),
        };
        assert!(
            ours_version.starts_with(version),
            "{name}: the README says {version}, the workspace {ours_version}"
        );
        // Features the README lists are the ones this crate asks for;
        // a crate listed without any takes its defaults (axum's include
        // what this crate asks for).
        let ours_features = ours[name]
            .get("features")
            .and_then(toml::Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !features.is_empty() {
            assert_eq!(features, ours_features, "{name}'s features");
        }
    }
}
