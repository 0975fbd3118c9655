#!/usr/bin/env bash
# Runs every test: installs prerequisites, then the workspace tests (all features) and the
# wasm32 build of halo-policy (the filter's dependency must stay wasm-clean).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install.sh
cargo build --locked -p halo-policy --target wasm32-unknown-unknown
cargo test --locked --workspace --all-features
