#!/usr/bin/env bash
# Runs every test: installs prerequisites, then the workspace tests (all features), with
# the filter's live suites run against both builds of the filter (wasm, native).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install.sh
# The filter module, once per run (it pulls in halo-policy for wasm32 too); the e2e tests
# load it from target/wasm32-unknown-unknown/release (halo_testkit::filter_wasm).
cargo build --locked -p halo-filter-wasm --target wasm32-unknown-unknown --release
# The native build (an Envoy dynamic module), loaded from target/release.
cargo build --locked -p halo-filter-native --release
cargo test --locked --workspace --all-features
# The live suites once more with the native build in Envoy (halo_testkit::filter_module):
# the filter's own (with the CLI's routes against Envoy and `halo auth token` as Claude
# Code's apiKeyHelper through Envoy), halo-server's pushes over xDS, the controller's loop
# through Envoy, the budget check.
HALO_FILTER=native cargo test --locked -p halo-e2e
HALO_FILTER=native cargo test --locked -p halo-server --test xds
HALO_FILTER=native cargo test --locked -p halo-server --test controller_live
HALO_FILTER=native cargo test --locked -p halo-server --test budgets
