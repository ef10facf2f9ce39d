#!/usr/bin/env bash
# The test command: set up, lint, then run every test this machine can run (GPU tests skip without a GPU;
# SSH end-to-end tests run against sshd nodes on 127.0.0.1). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"  # ansible-lint and ansible-runner find their tools in .venv
echo "== ruff";          .venv/bin/ruff check kernels fleet tests playbooks benchmarks
                          .venv/bin/ruff format --check kernels fleet tests playbooks benchmarks
echo "== mypy";          .venv/bin/mypy
echo "== ansible-lint";  (cd playbooks && ../.venv/bin/ansible-lint --offline -q .)
# Test files run on parallel workers, one file per worker at a time (its module-scoped sshd fleet stays on
# it). Most of an e2e test's time is spent waiting on ssh and ansible-playbook processes, so more workers
# than cores still pays; SOLFLEET_TEST_WORKERS=0 runs everything in this process.
echo "== pytest";        .venv/bin/pytest -n "${SOLFLEET_TEST_WORKERS:-3}" --dist loadfile "$@"
