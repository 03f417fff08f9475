//! The bundled policy file, and the errors of bad ones.

use super::*;

#[test]
fn the_bundled_file_is_valid() {
    let config = AppConfig::parse(include_str!("../../policies.toml")).unwrap();
    assert_eq!(config.routes.len(), 8);
    let plans: Vec<_> = config
        .routes
        .iter()
        .flat_map(|r| r.plans.iter().map(|p| (p.policy.to_string(), p.cost)))
        .collect();
    assert_eq!(plans.len(), 3, "{plans:?}");
    let settled: Vec<_> = config
        .routes
        .iter()
        .map(|r| (r.policy.name(), r.settle))
        .filter(|(_, s)| *s != SettleSpec::Reserved)
        .collect();
    assert_eq!(
        settled,
        [
            ("login-failures", SettleSpec::Failures),
            ("completion-tokens", SettleSpec::Actual)
        ]
    );
    assert_eq!(config.failure, FailureMode::Local);
    assert_eq!(config.instances.get(), 1);
}

#[test]
fn instances_is_a_count_of_at_least_one() {
    let base = "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"n\"\nkey = \"user\"\nalgorithm = \"gcra\"\nlimits = [\"5/s\"]\n";
    let instances = |text: &str| AppConfig::parse(text).map(|c| c.instances.get());
    assert_eq!(instances(base).unwrap(), 1);
    assert_eq!(instances(&format!("instances = 3\n{base}")).unwrap(), 3);
    for n in ["0", "-2"] {
        let err = instances(&format!("instances = {n}\n{base}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "field `instances`: invalid value \"{n}\": must be at least 1 (the number of \
                 app servers sharing the limits)"
            )
        );
    }
    let err = instances(&format!("instances = \"two\"\n{base}")).unwrap_err();
    assert!(err.to_string().contains("instances"), "{err}");
}

#[test]
fn errors_name_the_field_and_the_value() {
    let base = "[[route]]\nmethod = \"GET\"\npath = \"/api/items\"\nname = \"n\"\nkey = \"user\"\nalgorithm = \"gcra\"\nlimits = [\"5/s\"]\n";
    let cases = [
        (format!("colour = 1\n{base}"), "unknown field `colour`"),
        (
            format!("header_style = \"fancy\"\n{base}"),
            "field `header_style`: invalid value \"fancy\"",
        ),
        (
            format!("failure = \"maybe\"\n{base}"),
            "field `failure`: invalid value \"maybe\"",
        ),
        (
            format!("ipv6_prefix = 12\n{base}"),
            "field `ipv6_prefix`: invalid value \"12\"",
        ),
        (
            format!("trusted_proxies = [\"10.0.0.0/99\"]\n{base}"),
            "invalid trusted_proxies \"10.0.0.0/99\"",
        ),
        (
            base.replace("/api/items", "/api/nope"),
            "field `path`: invalid value \"/api/nope\"",
        ),
        (
            base.replace("\"GET\"", "\"DELETE\""),
            "field `method`: invalid value \"DELETE\"",
        ),
        (
            base.replace("\"user\"", "\"cookie\""),
            "field `key`: invalid value \"cookie\"",
        ),
        (
            base.replace("\"gcra\"", "\"magic\""),
            "field `algorithm`: invalid value \"magic\"",
        ),
        (
            format!("{base}settle = \"later\"\n"),
            "field `settle`: invalid value \"later\": expected reserved, actual or failures",
        ),
        (
            base.replace("5/s", "0/s"),
            "field `limits`: invalid value \"0/s\": limit count must be at least 1",
        ),
        (
            base.replace("5/s", "5/fortnight"),
            "field `limits`: invalid value \"5/fortnight\"",
        ),
        (
            base.replace("\"n\"", "\"a name\""),
            "field `name`: invalid value \"a name\"",
        ),
        (
            format!("{base}burst = 0\n"),
            "field `burst`: invalid value \"0\"",
        ),
        (
            format!("{base}cost = -1\n"),
            "field `cost`: invalid value \"-1\": must be at least 1",
        ),
        // A cost of 0 limits nothing; one above the capacity admits nothing
        // (found by an audit: every request a 429, or none limited).
        (
            format!("{base}cost = 0\n"),
            "field `cost`: invalid value \"0\": must be at least 1",
        ),
        (
            format!("{base}cost = 6\n"),
            "field `cost`: invalid value \"6\": exceeds 5, what the limits hold",
        ),
        (
            format!("{base}cost = 3\n[route.plans.pro]\nlimits = [\"2/s\"]\n"),
            "field `plans.pro.cost`: invalid value \"3\": exceeds 2",
        ),
        (
            format!("{base}burst = 4294967296\n"),
            "field `burst`: invalid value \"4294967296\": burst overflows",
        ),
        (
            format!("{base}enforce_percent = 101\n"),
            "field `enforce_percent`: invalid value \"101\"",
        ),
        (
            base.replace("/api/items", "/login").replace("GET", "POST"),
            "field `key`: invalid value \"user\"",
        ),
        (String::new(), "no [[route]] entries"),
        (
            format!("{base}[route.plans.pro]\nlimits = [\"0/s\"]\n"),
            "field `plans.pro.limits`: invalid value \"0/s\"",
        ),
        (
            format!("{base}[route.plans.pro]\ncost = -2\n"),
            "field `plans.pro.cost`: invalid value \"-2\"",
        ),
        (
            format!("{base}[route.plans.pro]\nspeed = 2\n"),
            "unknown field `speed`",
        ),
        (
            format!("{base}[route.plans.pro]\n")
                .replace("/api/items", "/login")
                .replace("GET", "POST")
                .replace("\"user\"", "\"ip\""),
            "field `plans`: invalid value \"pro\"",
        ),
        (
            format!(
                "{base}[route.plans.pro]\n{}",
                base.replace("\"n\"", "\"n-pro\"").replace("GET", "POST")
            ),
            "field `name`: invalid value \"n-pro\"",
        ),
    ];
    for (text, expected) in cases {
        let err = AppConfig::parse(&text).unwrap_err().to_string();
        assert!(err.contains(expected), "expected {expected:?} in {err:?}");
    }
}
