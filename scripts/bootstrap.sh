#!/usr/bin/env bash
# Set up a fresh machine for solfleet: the sshd used by the end-to-end fleet tests, and the Python
# environment in .venv. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# openssh-server: the e2e tests start several real sshd nodes on 127.0.0.1 (never a remote host).
# prometheus-node-exporter and prometheus (promtool): the metrics e2e test scrapes a real node_exporter on
# 127.0.0.1 and lints what it serves. chromium: the report test renders report.html headless and checks the
# screenshot. Only what is missing is installed.
missing=()
{ command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; } || missing+=(openssh-server openssh-client)
[ -x /usr/bin/prometheus-node-exporter ] || missing+=(prometheus-node-exporter)
[ -x /usr/bin/promtool ] || missing+=(prometheus)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing ${missing[*]} (apt-get)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "bootstrap: ${missing[*]} missing and this is not a root Debian shell; e2e tests needing them will be skipped" >&2
    fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last successful install.
stamp=.venv/.solfleet-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing solfleet and its dependencies into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[dev,plot]"
    touch "$stamp"
fi
