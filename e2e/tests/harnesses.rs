//! The real coding tools through the gateway (issue 28): Claude Code, Codex and Gemini
//! CLI at the versions scripts/install.sh pins (halo_testkit::harness), each run once
//! non-interactively through a real Envoy with the built filter (scripts/test.sh runs
//! this file with both builds), configured only by the files halo-release's `build_ring`
//! (what `halo release build` writes) renders for the ring, laid at their real /etc paths.
//!
//! Each run checks: exit 0, the answer printed, the provider saw the policy's model id
//! for the alias, no credential of the developer reached it (only the gateway's own
//! key), and the harness's own OpenTelemetry export, pointed by the profile's telemetry
//! at halo-server's CLI receiver, arrived there with no exporter error, and each model
//! call became one `cli` evidence record with the device's experiment, variant, unit and
//! the provider's tokens: the release's files get the device's telemetry attribution (and
//! the CLI receiver's token) as halod adds them (`halo_release::adapters::telemetry`).
//! The developer's token comes from the release's helper command,
//! `halo auth token --audience api://halos`: a stand-in `halo` script on PATH prints a
//! token of the test issuer (the real command is engineer `auth`'s work in progress).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use halo_e2e::{AUDIENCE, Gateway, GatewayOptions, Issuer};
use halo_release::adapters::Os;
use halo_testkit::harness::{self, Output, Pinned, Run};
use halo_testkit::provider::{Received, WireProvider};

const ANTHROPIC_KEY: &str = "sk-ant-gateway-own-7c1";
const OPENAI_KEY: &str = "sk-openai-gateway-own-2b9";
const GEMINI_KEY: &str = "gemini-gateway-own-5d4";
/// The developer's user.
const USER: &str = "dev@acme.test";
/// The provider's answer starts so (halo_testkit::provider).
const ANSWER: &str = "Hello from the Halos demo provider.";
/// One harness run may take this long (a cold start of Gemini CLI is ~10 s here).
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
/// The client-axis experiment the device resolved (halod reads it from the ring
/// release's manifest; given here as it would be).
const EXPERIMENT: &str = "harness-effort";
const EXPERIMENT_SALT: &str = "harness-effort-salt";
const VARIANT: &str = "treatment";
/// The CLI receiver's optional token, when a test turns it on.
const CLI_TOKEN: &str = "3f9c2e7a1b8d4c6e0a5f7b2d9e1c4a8b6d0f3e7c";

/// Alias -> the policy's model id for it.
const MODELS: [(&str, &str); 6] = [
    ("sonnet", "claude-sonnet-4-5-20250929"),
    ("opus", "claude-opus-4-1-20250805"),
    ("haiku", "claude-haiku-4-5-20251001"),
    ("fable", "claude-fable-test-20260101"),
    ("gpt", "gpt-5-codex"),
    ("gemini-pro", "gemini-2.5-pro"),
];

fn model_id(alias: &str) -> &'static str {
    MODELS
        .iter()
        .find(|(a, _)| *a == alias)
        .map(|(_, m)| *m)
        .expect("an alias of the test policy")
}

/// The policy upstream an alias of the test policy is routed to.
fn upstream_of(alias: &str) -> &'static str {
    match alias {
        "gpt" => "openai",
        "gemini-pro" => "gemini",
        _ => "anthropic",
    }
}

/// The test policy as a policy directory: one ring, one profile pinning the installed
/// harnesses, every Claude Code family an alias.
fn write_policy(dir: &Path, issuer: &str, provider: &str, gateway_extra: &str) {
    let cc = harness::pinned_for("claude-code");
    let codex = harness::pinned_for("codex");
    let gemini = harness::pinned_for("gemini-cli");
    let models: String = MODELS
        .iter()
        .map(|(alias, id)| {
            let upstream = upstream_of(alias);
            format!("  {alias}:\n    upstream: {upstream}\n    model: {id}\n")
        })
        .collect();
    // Every routed model priced, so the policy is clean (no `unpriced` warning).
    let prices: String = ["anthropic", "openai", "gemini"]
        .iter()
        .map(|upstream| {
            let models: String = MODELS
                .iter()
                .filter(|(alias, _)| upstream_of(alias) == *upstream)
                .map(|(_, id)| format!("    {id}: {{input: 1, output: 5}}\n"))
                .collect();
            format!("  {upstream}:\n{models}")
        })
        .collect();
    let files = [
        (
            "halos.yaml",
            format!(
                "apiVersion: halos.dev/v1\norg: harness-org\nidentity:\n  issuer: {issuer}\n  clientID: harness-tests\n  audience: {AUDIENCE}\n  adminGroups: [halos-admins]\n  claims:\n    user: email\n    groups: groups\n"
            ),
        ),
        (
            "gateway.yaml",
            format!(
                "apiVersion: halos.dev/v1\nkind: Gateway\nbaseURL: https://gateway.invalid\nauth:\n  helperCommand: halo auth token --audience {AUDIENCE}\nupstreams:\n  anthropic:\n    url: {provider}\n    kind: anthropic\n    credential:\n      env: HALO_TEST_ANTHROPIC_KEY\n  openai:\n    url: {provider}\n    kind: openai\n    credential:\n      env: HALO_TEST_OPENAI_KEY\n  gemini:\n    url: {provider}\n    kind: gemini\n    credential:\n      env: HALO_TEST_GEMINI_KEY\nmodels:\n{models}prices:\n{prices}{gateway_extra}"
            ),
        ),
        (
            "profile.yaml",
            format!(
                "apiVersion: halos.dev/v1\nkind: Profile\nname: dev\nharnesses:\n  claude-code:\n    version: {}\n    model: sonnet\n  codex:\n    version: {}\n    model: gpt\n  gemini-cli:\n    version: {}\n    model: gemini-pro\nmodels: [sonnet, opus, haiku, fable, gpt, gemini-pro]\n",
                cc.version, codex.version, gemini.version
            ),
        ),
        (
            "rings.yaml",
            "apiVersion: halos.dev/v1\nkind: Ring\nname: general\norder: 0\nprofile: dev\nmembership:\n  default: true\n".to_string(),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write a policy file");
    }
}

/// The developer's daily budget in the budget fixture: one token, so one call spends it.
const BUDGET: &str = "dev-daily";
const BUDGET_YAML: &str = "budgets:\n  dev-daily:\n    appliesTo: {users: [dev@acme.test]}\n    period: day\n    limit: {tokens: 1}\n# The loaded test machine: a check slower than the default 1 s would fail open.\nbudgetService: {timeoutMs: 2000}\n";
const BUDGET_TOKEN: &str = "6b1f0c9e2a7d4358be41f07c93a2d58e16c4b7a09f3e25d8c71a4f60b9e2d317";

struct Fixture {
    /// Envoy, kept running for the fixture's life.
    gw: Gateway,
    /// halo-server's budget service, in [`fixture_with_budget`].
    budget: Option<halo_server::budget::BudgetServer>,
    /// halo-server's CLI evidence receiver, which the profile's telemetry points at.
    receivers: halo_server::evidence::Receivers,
    provider: WireProvider,
    issuer: Issuer,
    /// The ring's release as halod writes it on this device: (path, content) of every
    /// linux file, with the device's telemetry attribution.
    release: Vec<(String, Vec<u8>)>,
    /// What the harnesses' records must name.
    attribution: halo_release::adapters::telemetry::Attribution,
    /// Holds the `halo` stand-in and the tokens it prints.
    bin: tempfile::TempDir,
    _policy: tempfile::TempDir,
}

/// The gateway, the provider, the issuer and the ring's release; halo-server's CLI
/// evidence receiver runs (without a token) and the profile's telemetry points the
/// harnesses' own OpenTelemetry export at it.
async fn fixture() -> Fixture {
    fixture_with(None, false).await
}

/// [`fixture`] with the developer under [`BUDGET`] and Envoy asking halo-server's budget
/// service.
async fn fixture_with_budget() -> Fixture {
    fixture_with(None, true).await
}

/// [`fixture`], the CLI receiver requiring `cli_token` when given (halod writes it into
/// the harnesses' OTLP headers), with [`BUDGET`] when `budget`.
async fn fixture_with(cli_token: Option<&str>, budget: bool) -> Fixture {
    let issuer = Issuer::start().await;
    let provider = WireProvider::start(true).await.expect("the provider");
    let policy = tempfile::tempdir().expect("policy dir");
    let extra = if budget { BUDGET_YAML } else { "" };
    write_policy(policy.path(), &issuer.url, &provider.url(), extra);
    let mut org = halo_policy::load::load_dir(policy.path()).expect("the test policy loads");
    let receivers = {
        let data = policy.path().join("data");
        std::fs::create_dir(&data).expect("the data dir");
        let cli_token_file = cli_token.map(|t| {
            let path = policy.path().join("cli.token");
            std::fs::write(&path, t).expect("the CLI token file");
            path
        });
        let settings = halo_server::evidence::EvidenceSettings {
            cli_listen: Some("127.0.0.1:0".parse().expect("addr")),
            cli_token_file,
            ..Default::default()
        };
        let receivers = halo_server::evidence::start(&settings, Some(&data))
            .await
            .expect("receivers")
            .expect("the CLI receiver");
        let endpoint = format!(
            "http://{}",
            receivers
                .addr(halo_evidence::Source::Cli)
                .expect("its address")
        );
        for profile in org.profiles.values_mut() {
            profile.telemetry = Some(halo_policy::Telemetry {
                enabled: true,
                endpoint: Some(endpoint.clone()),
                log_prompts: false,
            });
        }
        receivers
    };
    // Clean but for the https rules the loopback fakes break; every Claude Code family
    // is mapped (no `unmapped-model` warning).
    let issues: Vec<_> = halo_policy::validate::validate(&org)
        .into_iter()
        .filter(|i| {
            !(matches!(i.rule.as_str(), "guardCredentialedHttps" | "guardIdentity")
                && i.message.contains("https"))
        })
        .collect();
    assert!(issues.is_empty(), "the test policy has issues: {issues:#?}");
    let env = vec![
        (
            "HALO_TEST_ANTHROPIC_KEY".to_string(),
            Some(ANTHROPIC_KEY.to_string()),
        ),
        ("HALO_TEST_OPENAI_KEY".into(), Some(OPENAI_KEY.into())),
        ("HALO_TEST_GEMINI_KEY".into(), Some(GEMINI_KEY.into())),
    ];
    let budget = if budget {
        let token_file = policy.path().join("budget.token");
        std::fs::write(&token_file, BUDGET_TOKEN).expect("the budget token");
        let compiled = halo_policy::compile(&org);
        let served = halo_xds::Served {
            org: org.clone(),
            version: compiled.version(),
            compiled,
        };
        let (_, policy_rx) = tokio::sync::watch::channel(std::sync::Arc::new(served));
        halo_server::budget::start(
            &halo_server::budget::BudgetSettings {
                listen: Some("127.0.0.1:0".parse().expect("addr")),
                token_file: Some(token_file),
            },
            None,
            Some(&policy.path().join("data")),
            policy_rx,
            None,
            halo_server::evidence::DEFAULT_RETENTION,
        )
        .await
        .expect("the budget service")
    } else {
        None
    };
    let gw = Gateway::start(
        halo_policy::compile(&org),
        GatewayOptions {
            // The provider listens on loopback: let it receive the gateway's keys.
            settings: serde_json::json!({"upstreamHosts": ["127.0.0.1"]}),
            env,
            budgets: budget
                .as_ref()
                .map(|b| halo_envoy_config::evidence::Export {
                    url: format!("http://{}", b.addr),
                    token_file: None,
                    token: BUDGET_TOKEN.into(),
                }),
            ..GatewayOptions::default()
        },
    );
    // The release points harnesses at this gateway.
    org.gateway.base_url = gw.base.clone();
    let build = halo_release::build::build_ring(&org, "general").expect("the release builds");
    let ring = &build.ring;
    let mut files: Vec<_> = ring
        .manifest
        .files
        .iter()
        .filter(|f| f.os == Os::Linux)
        .map(|f| halo_release::adapters::RenderedFile {
            harness: f.harness,
            os: f.os,
            path: f.path.clone(),
            mode: f.mode,
            content: ring.blobs[&f.sha256].clone(),
        })
        .collect();
    // What halod adds on the device after verifying the release.
    use halo_release::adapters::telemetry::{self, Attribution, Resolved};
    let attribution = Attribution::new(
        "general",
        &ring.digest,
        Some(Resolved {
            experiment: EXPERIMENT,
            salt: EXPERIMENT_SALT,
            variant: VARIANT,
        }),
        USER,
    );
    let warnings = telemetry::attribute(&mut files, &attribution, cli_token);
    assert!(warnings.is_empty(), "{warnings:?}");
    let release = files.into_iter().map(|f| (f.path, f.content)).collect();
    let bin = tempfile::tempdir().expect("bin dir");
    Fixture {
        gw,
        budget,
        receivers,
        provider,
        issuer,
        release,
        attribution,
        bin,
        _policy: policy,
    }
}

impl Fixture {
    /// The harness's own telemetry reached the CLI receiver (bounded wait: exporters
    /// batch), nothing of it was refused, and the harness printed no `exporter_error`.
    async fn assert_telemetry_arrived(&self, harness: &str, out: &Output, exporter_error: &str) {
        let metrics = &self.receivers.evidence.metrics;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while metrics.get("received", halo_evidence::Source::Cli) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{harness}'s telemetry never reached the CLI receiver: {}",
                metrics.render()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            metrics.get("refused_batches", halo_evidence::Source::Cli),
            0,
            "{}",
            metrics.render()
        );
        assert!(
            !out.stderr.contains(exporter_error) && !out.stdout.contains(exporter_error),
            "{harness} printed exporter errors: {}",
            out.stderr
        );
        eprintln!(
            "{harness} telemetry at the CLI receiver:\n{}",
            metrics.render()
        );
    }

    /// Every model call the provider answered in this fixture became one `cli` evidence
    /// record at the store, and each of the `failed` calls the harness saw fail one
    /// more (`errors` of them an error for the error rate: no answer, 429 or 5xx): the
    /// samples query for the device's experiment gives its variant and unit (the
    /// gateway's unit for this user), the provider's tokens and the error rate.
    /// Bounded wait: exporters batch.
    async fn assert_cli_evidence(&self, harness: &str, failed: u64, errors: u64) {
        use halo_evidence::{Metric, SampleQuery, Source};
        let calls = self.calls();
        let tokens: u64 = calls
            .iter()
            .map(|c| c.usage().map_or(0, |(i, o)| i + o))
            .sum();
        assert!(tokens > 0, "{harness}: the provider reported no usage");
        let unit = halo_policy::assign::unit(
            &halo_policy::assign::unit_salt(Some(EXPERIMENT_SALT), "general"),
            USER,
        );
        assert_eq!(self.attribution.unit, unit);
        let query = |metric| SampleQuery {
            experiment: EXPERIMENT.into(),
            metric,
            since_unix_ms: 0,
            until_unix_ms: i64::MAX,
        };
        let store = std::sync::Arc::clone(&self.receivers.evidence.store);
        let samples = |metric| {
            let store = std::sync::Arc::clone(&store);
            let q = query(metric);
            async move {
                tokio::task::spawn_blocking(move || store.samples(&q))
                    .await
                    .expect("the samples query")
                    .expect("the store answers")
            }
        };
        let total = calls.len() as u64 + failed;
        let metrics = &self.receivers.evidence.metrics;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let got = samples(Metric::Tokens).await;
            if got.len() == 1
                && got[0].value == tokens as f64
                && metrics.get("stored", Source::Cli) >= total
            {
                let s = &got[0];
                assert_eq!(
                    (s.variant.as_str(), s.unit.as_str(), s.source),
                    (VARIANT, unit.as_str(), Source::Cli),
                    "{harness}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{harness}: the tokens samples are {got:?}, not one {VARIANT} sample of {tokens} \
                 tokens for the unit ({} model calls); {}",
                calls.len(),
                self.receivers.evidence.metrics.render()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stored = metrics.get("stored", Source::Cli);
        assert_eq!(
            stored,
            total,
            "{harness}: one record per model call ({} answered, {failed} failed)",
            calls.len()
        );
        let rate = samples(Metric::ErrorRate).await;
        assert_eq!(rate.len(), 1, "{harness}: {rate:?}");
        assert_eq!(
            rate[0].value,
            errors as f64 / total as f64,
            "{harness}: the error rate"
        );
        eprintln!(
            "{harness}: {stored} cli records, {tokens} tokens, for the unit's {VARIANT} sample"
        );
    }

    /// Put a `halo` on PATH whose `auth token --audience api://halos` prints `tokens` in
    /// turn (the last one from then on). Returns the directory and the file counting calls.
    fn halo_stand_in(&self, tokens: &[String]) -> (PathBuf, PathBuf) {
        let dir = self.bin.path().to_path_buf();
        let calls = dir.join("calls");
        let mut script = format!(
            "#!/bin/sh\n# Stand-in for `halo auth token`: prints test tokens in turn.\n\
             [ \"$1 $2 $3 $4\" = \"auth token --audience {AUDIENCE}\" ] || {{ echo \"halo stand-in: unexpected $*\" >&2; exit 2; }}\n\
             n=$(cat '{calls}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{calls}'\n",
            calls = calls.display()
        );
        for (i, token) in tokens.iter().enumerate() {
            let cond = if i + 1 == tokens.len() {
                "true".to_string()
            } else {
                format!("[ $n -eq {} ]", i + 1)
            };
            script.push_str(&format!("if {cond}; then echo '{token}'; exit 0; fi\n"));
        }
        let path = dir.join("halo");
        std::fs::write(&path, script).expect("write halo stand-in");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod halo stand-in");
        let _ = std::fs::remove_file(&calls);
        (dir, calls)
    }

    fn token(&self) -> String {
        self.issuer.token(USER, &[])
    }

    /// Run a harness with the release's files, the quiet switches and `halo` on PATH.
    async fn run(&self, pinned: &Pinned, program: PathBuf, args: &[&str], path: PathBuf) -> Output {
        let mut path_first = vec![path];
        path_first.extend(pinned.binary().parent().map(Path::to_path_buf));
        let run = Run {
            program,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: pinned.quiet_env(),
            path_first,
            etc_files: self.release.clone(),
            home_files: pinned.home_files(),
            timeout: RUN_TIMEOUT,
        };
        let out = tokio::task::spawn_blocking(move || harness::run(&run))
            .await
            .expect("the harness run");
        eprintln!(
            "{}@{} ran {:?} ({} filter)",
            pinned.harness,
            pinned.version,
            out.duration,
            if halo_testkit::filter_is_native() {
                "native"
            } else {
                "wasm"
            }
        );
        out
    }

    /// The model calls the provider saw (not `GET .../models`).
    fn calls(&self) -> Vec<Received> {
        self.provider
            .received()
            .into_iter()
            .filter(|r| r.method == "POST")
            .collect()
    }

    /// No request the provider saw carries a developer token anywhere in its headers,
    /// and each model call carries the gateway's own key.
    fn assert_no_developer_credential(&self, tokens: &[String], key_header: &str, key: &str) {
        let all = self.provider.received();
        assert!(!all.is_empty(), "the provider saw nothing");
        for r in &all {
            for (name, value) in &r.headers {
                for t in tokens {
                    assert!(
                        !value.contains(t.as_str()),
                        "the developer's token reached the provider in {name} ({} {})",
                        r.method,
                        r.path
                    );
                }
            }
            if r.method != "POST" {
                // Codex's `GET /v1/models` is forwarded without any key: fine here, it
                // carries no developer credential either (checked above).
                continue;
            }
            let sent = r.header(key_header).unwrap_or("");
            assert!(
                sent.ends_with(key),
                "{} {}: {key_header} is not the gateway's own key",
                r.method,
                r.path
            );
        }
    }
}

fn assert_answered(out: &Output, model: &str) {
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(
        out.stdout.contains(ANSWER) && out.stdout.contains(model),
        "the answer (naming {model}) is not printed: {}",
        out.describe()
    );
}

/// Claude Code: managed-settings.json (ANTHROPIC_BASE_URL, apiKeyHelper, the families).
/// Once with the profile's model, then with each other family it resolves itself; the
/// first token the helper prints has expired, so the gateway's 401 must make Claude
/// Code run the helper again and retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_through_the_gateway_for_every_family() {
    let f = fixture_with(Some(CLI_TOKEN), false).await;
    let cc = harness::pinned_for("claude-code");
    let mut expired = f.issuer.claims(USER, &[]);
    // Well past Envoy's jwt_authn clock skew (60 s by default): a token 60 s old was
    // still accepted when Claude Code called within the second, and no 401 came.
    expired["exp"] = serde_json::json!(halo_e2e::now_unix() - 600);
    let expired = f.issuer.mint(&expired);
    let fresh = f.token();
    let tokens = [expired.clone(), fresh.clone()];
    let (path, helper_calls) = f.halo_stand_in(&tokens);

    let mut seen = 0;
    let mut last = None;
    for (i, (family, args)) in [
        ("sonnet", vec!["-p", "Say hello"]),
        ("opus", vec!["-p", "Say hello", "--model", "opus"]),
        ("haiku", vec!["-p", "Say hello", "--model", "haiku"]),
        ("fable", vec!["-p", "Say hello", "--model", "fable"]),
    ]
    .into_iter()
    .enumerate()
    {
        let out = f.run(&cc, cc.binary(), &args, path.clone()).await;
        assert_answered(&out, model_id(family));
        if i == 0 {
            // The expired token got a 401; the 200 came after the helper ran again.
            let helper_runs: u32 = std::fs::read_to_string(&helper_calls)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            assert!(
                helper_runs >= 2,
                "the helper ran {helper_runs} time(s): no refresh after the 401"
            );
        }
        let calls = f.calls();
        let new = &calls[seen..];
        seen = calls.len();
        assert!(
            !new.is_empty()
                && new
                    .iter()
                    .all(|r| r.model().as_deref() == Some(model_id(family))),
            "{family}: the provider saw {:?}, not only {}",
            new.iter().map(Received::model).collect::<Vec<_>>(),
            model_id(family)
        );
        last = Some(out);
    }
    let last = last.expect("a run");
    f.assert_no_developer_credential(&tokens, "x-api-key", ANTHROPIC_KEY);
    f.assert_telemetry_arrived("Claude Code", &last, "OTLPExporterError")
        .await;
    // The expired token's 401, retried after the helper ran again, is not reported as
    // an api_error by Claude Code: four calls, four records, no error. (A model outside
    // the profile's `availableModels` never leaves Claude Code: it falls back to one.)
    f.assert_cli_evidence("Claude Code", 0, 0).await;
}

/// Codex: /etc/codex/managed_config.toml (the halos provider, wire responses, the
/// helper as the provider's auth command). Codex takes its resource attributes from its
/// environment only: it runs from a login shell that sourced halod's telemetry script,
/// which exports the device's attribution; the CLI receiver's token is in its config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_through_the_gateway() {
    let f = fixture_with(Some(CLI_TOKEN), false).await;
    let codex = harness::pinned_for("codex");
    let tokens = [f.token()];
    let (path, _) = f.halo_stand_in(&tokens);
    let profile = halo_release::adapters::telemetry::profile_path(Os::Linux)
        .expect("a profile script on linux");
    let line = format!(
        ". {profile} && exec {} exec --skip-git-repo-check 'Say hello'",
        codex.command
    );
    let out = f
        .run(&codex, PathBuf::from("sh"), &["-c", &line], path)
        .await;
    assert_answered(&out, model_id("gpt"));
    let calls = f.calls();
    assert!(
        !calls.is_empty()
            && calls
                .iter()
                .all(|r| r.model().as_deref() == Some(model_id("gpt"))),
        "the provider saw {:?}",
        calls.iter().map(Received::model).collect::<Vec<_>>()
    );
    f.assert_no_developer_credential(&tokens, "authorization", OPENAI_KEY);
    f.assert_telemetry_arrived("Codex", &out, "OpenTelemetry")
        .await;
    // (A refused call, `-m nope`'s 400, exports nothing: Codex exec exits on the error
    // without flushing its telemetry, seen with 0.171.0.)
    f.assert_cli_evidence("Codex", 0, 0).await;
}

/// Gemini CLI: /etc/gemini-cli/settings.json (the model, API-key auth) and the login
/// shell's /etc/profile.d script (base URL, GEMINI_API_KEY from the helper), sourced as a
/// login shell would.
/// Also Gemini CLI's own OpenTelemetry export, as the release configures it (OTLP/HTTP
/// to the profile's endpoint): it sends JSON, and metrics and traces beside the logs, to
/// halo-server's CLI receiver, which takes them all (no exporter error printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_through_the_gateway() {
    let f = fixture().await;
    let gemini = harness::pinned_for("gemini-cli");
    let tokens = [f.token()];
    let (path, _) = f.halo_stand_in(&tokens);
    // A login shell sources every profile script: Gemini CLI's (base URL, key) and
    // halod's telemetry attribution.
    let profile = format!(
        ". {} && . {}",
        halo_release::adapters::gemini_cli::profile_path(Os::Linux)
            .expect("a profile script on linux"),
        halo_release::adapters::telemetry::profile_path(Os::Linux)
            .expect("a telemetry script on linux")
    );
    let line = format!("{profile} && exec {} -p 'Say hello'", gemini.command);
    let out = f
        .run(&gemini, PathBuf::from("sh"), &["-c", &line], path)
        .await;
    assert_answered(&out, model_id("gemini-pro"));
    let calls = f.calls();
    assert!(
        !calls.is_empty()
            && calls
                .iter()
                .all(|r| r.model().as_deref() == Some(model_id("gemini-pro"))),
        "the provider saw {:?}",
        calls.iter().map(Received::model).collect::<Vec<_>>()
    );
    f.assert_no_developer_credential(&tokens, "x-goog-api-key", GEMINI_KEY);
    f.assert_telemetry_arrived("Gemini CLI", &out, "OTLPExporterError")
        .await;
    // A model the policy does not have: the gateway's 400, which Gemini CLI reports as
    // a failed call (its api_error), never reaching the provider.
    let before = f.calls().len();
    let line = format!(
        "{profile} && exec {} -m nope -p 'Say hello'",
        gemini.command
    );
    let (path, _) = f.halo_stand_in(&tokens);
    let refused = f
        .run(&gemini, PathBuf::from("sh"), &["-c", &line], path)
        .await;
    assert_ne!(refused.code, Some(0), "{}", refused.describe());
    assert_eq!(
        f.calls().len(),
        before,
        "the refused call reached the provider"
    );
    // One answered call and one failed (status 400: the caller's, not the arm's error,
    // so the error rate stays 0).
    f.assert_cli_evidence("Gemini CLI", 1, 0).await;
}

/// Budgets (issue #25): with the developer's budget spent, each harness (as the release
/// configures it) makes one call, gets the 429 and exits 1 at once, printing the budget's
/// message (name, period, reset): Claude Code and Gemini CLI the body's message, Codex its
/// own quota text (see halo-policy's `budgets::spent_reply` for why each shape); the
/// provider sees no call. Each harness's calls and time are printed. The OpenAI and
/// Gemini wires' 429 bodies are checked through Envoy directly first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harnesses_show_a_spent_budgets_message_and_stop() {
    let f = fixture_with_budget().await;
    let service = &f.budget.as_ref().expect("the budget service").budgets;
    let tokens = [f.token()];
    let (path, _) = f.halo_stand_in(&tokens);
    let spent = || service.metrics.spent_tokens();
    // One call spends the one-token budget.
    let r =
        f.gw.client
            .post(format!("{}/v1/messages", f.gw.base))
            .bearer_auth(&tokens[0])
            .json(&serde_json::json!({"model": "sonnet", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("the gateway answers");
    assert_eq!(r.status(), 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while spent() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the spend never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let served = f.calls().len();
    let message = format!("halo budget {BUDGET} (1 tokens per day, UTC) is spent; it resets at ");

    // Each wire's own 429 shape, live through Envoy.
    for (path, body, check) in [
        (
            "/v1/responses".to_string(),
            serde_json::json!({"model": "gpt", "input": "hi"}),
            "/error/code",
        ),
        (
            "/v1beta/models/gemini-pro:generateContent".to_string(),
            serde_json::json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
            "/error/status",
        ),
    ] {
        let r =
            f.gw.client
                .post(format!("{}{path}", f.gw.base))
                .bearer_auth(&tokens[0])
                .json(&body)
                .send()
                .await
                .expect("the gateway answers");
        assert_eq!(r.status(), 429, "{path}");
        assert_eq!(r.headers()["x-halo-budget"], BUDGET);
        assert!(r.headers().contains_key("retry-after"), "{path}");
        let body: serde_json::Value = r.json().await.expect("a JSON body");
        let want = if check == "/error/code" {
            "insufficient_quota"
        } else {
            "RESOURCE_EXHAUSTED"
        };
        assert_eq!(
            body.pointer(check),
            Some(&serde_json::json!(want)),
            "{body}"
        );
        if check == "/error/status" {
            // Gemini CLI stops on a RetryInfo delay over 5 minutes (and retries without).
            assert_eq!(
                body.pointer("/error/details/0/@type"),
                Some(&serde_json::json!(
                    "type.googleapis.com/google.rpc.RetryInfo"
                )),
                "{body}"
            );
        }
        let text = body
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .unwrap_or("");
        assert!(text.starts_with(&message), "{body}");
    }

    let refused = || f.gw.envoy.stat_sum("ratelimit\\.halo_budget\\.over_limit");
    let cc = harness::pinned_for("claude-code");
    let codex = harness::pinned_for("codex");
    let gemini = harness::pinned_for("gemini-cli");
    let profile = halo_release::adapters::gemini_cli::profile_path(Os::Linux)
        .expect("a profile script on linux");
    let gemini_line = format!(". {profile} && exec {} -p 'Say hello'", gemini.command);
    let runs: [(&Pinned, PathBuf, Vec<&str>); 3] = [
        (&cc, cc.binary(), vec!["-p", "Say hello"]),
        (
            &codex,
            codex.binary(),
            vec!["exec", "--skip-git-repo-check", "Say hello"],
        ),
        (&gemini, PathBuf::from("sh"), vec!["-c", &gemini_line]),
    ];
    for (pinned, program, args) in runs {
        let before = refused();
        let out = f.run(pinned, program, &args, path.clone()).await;
        let attempts = refused() - before;
        eprintln!(
            "budget spent: {}@{} made {attempts} call(s), all refused 429, and exited {:?} after {:?}",
            pinned.harness, pinned.version, out.code, out.duration
        );
        assert!(
            !out.timed_out,
            "{} kept retrying: {}",
            pinned.harness,
            out.describe()
        );
        assert_eq!(out.code, Some(1), "{}", out.describe());
        // One call each: none of them retries the budget's 429.
        assert_eq!(attempts, 1, "{}: {}", pinned.harness, out.describe());
        let printed = format!("{}\n{}", out.stdout, out.stderr);
        // Codex prints its own text for OpenAI's `insufficient_quota` (the one 429 it does
        // not retry), never the body's message: the budget's name is not shown there.
        let shown = if pinned.harness == "codex" {
            "Quota exceeded. Check your plan and billing details."
        } else {
            message.as_str()
        };
        assert!(
            printed.contains(shown),
            "{} does not show {shown:?}: {}",
            pinned.harness,
            out.describe()
        );
        assert_eq!(
            f.calls().len(),
            served,
            "a refused call reached the provider"
        );
    }
}
