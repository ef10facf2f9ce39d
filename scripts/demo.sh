#!/usr/bin/env bash
# The main job: set up, build an artifact, deploy it to the embedded local fleet (3 simulated nodes under
# .work/), verified on every node, and show status.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
version=${1:-0.1.0}
.venv/bin/solfleet build --version "$version"
.venv/bin/solfleet deploy --version "$version" --yes
.venv/bin/solfleet status
