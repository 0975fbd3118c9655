#!/usr/bin/env bash
# Runs every test: installs prerequisites, then the workspace tests (all features) and the
# wasm32 build of halo-policy (the filter's dependency must stay wasm-clean).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install.sh
# The filter module, once per run (it pulls in halo-policy for wasm32 too); the e2e tests
# load it from target/wasm32-unknown-unknown/release (halo_testkit::filter_wasm).
cargo build --locked -p halo-filter --target wasm32-unknown-unknown --release
cargo test --locked --workspace --all-features
