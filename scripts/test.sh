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
# all of halo-e2e (the filter's own suites, the CLI's against Envoy), then every other
# suite that runs the filter in Envoy, as scripts/filter-suites.sh derives them from the
# sources (halo-server's pushes over xDS, the controller's loop, the budget check, the
# mirror, the console...), so a new suite cannot miss a build.
HALO_FILTER=native cargo test --locked -p halo-e2e
suites=$(bash scripts/filter-suites.sh)
while read -r package test; do
  HALO_FILTER=native cargo test --locked -p "$package" --test "$test" </dev/null
done <<<"$suites"
