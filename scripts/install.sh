#!/usr/bin/env bash
# Installs what building and testing Halos needs on a fresh machine. Idempotent: a second
# run changes nothing. Rust itself comes with the machine (rustup).
set -euo pipefail

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi
for component in rustfmt clippy; do
  if ! rustup component list --installed | grep -q "^${component}"; then
    rustup component add "$component"
  fi
done
