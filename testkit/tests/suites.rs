//! scripts/filter-suites.sh finds every suite outside halo-e2e that runs the filter in
//! Envoy, so scripts/test.sh runs each with both builds: the ones a hand-kept list once
//! missed (halo-server's shadow and console) are among them, and each named test exists.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn every_suite_that_runs_the_filter_is_listed_for_the_native_build() {
    let root = halo_testkit::workspace_root();
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/filter-suites.sh"))
        .output()
        .expect("bash runs the script");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<(String, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (p, t) = l.split_once(' ').expect("package and test");
            (p.to_string(), t.to_string())
        })
        .collect();
    for suite in ["xds", "controller_live", "budgets", "shadow", "console"] {
        assert!(
            listed.contains(&("halo-server".to_string(), suite.to_string())),
            "halo-server {suite} missing from {listed:?}"
        );
    }
    assert!(
        listed.iter().all(|(p, _)| p != "halo-e2e"),
        "halo-e2e runs whole: {listed:?}"
    );
    for (package, test) in &listed {
        let dir = match package.as_str() {
            "halo-server" => "server",
            other => other.trim_start_matches("halo-"),
        };
        assert!(
            root.join(dir)
                .join("tests")
                .join(format!("{test}.rs"))
                .is_file(),
            "{package} {test}"
        );
    }
}
