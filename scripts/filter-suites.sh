#!/usr/bin/env bash
# Prints "<package> <test>", one per line, for every integration test outside halo-e2e
# that runs the halo filter in Envoy, so scripts/test.sh runs each once more with the
# native build (halo-e2e's tests all do, and it runs them whole). Derived from the
# sources, never kept by hand: a test file runs the filter when it calls
# halo_testkit::filter_module itself, or starts a gateway through a helper that does
# (halo-server's tests/support/gateway.rs, or halo-e2e's Gateway).
set -euo pipefail
cd "$(dirname "$0")/.."

for file in */tests/*.rs; do
  crate_dir="${file%%/*}"
  [ "$crate_dir" = e2e ] && continue
  if grep -qE 'filter_module|support::gateway|halo_e2e::' "$file"; then
    package=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$crate_dir/Cargo.toml" | head -n 1)
    test=$(basename "$file" .rs)
    echo "$package $test"
  fi
done
