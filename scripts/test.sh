#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and run the whole test suite. Extra arguments go to pytest.
#   bash scripts/test.sh --quick    the tests without engines (unit and repository checks, a few minutes)
#   bash scripts/test.sh -m unit    one group (unit, repository, ascend, engine: see tests/conftest.py)
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
  if [ "$a" = "--quick" ]; then args+=(-m "not engine"); else args+=("$a"); fi
done
bash scripts/setup.sh
exec "${SCENE_EPLB_VENV:-.venv}/bin/python" -m pytest ${args[@]+"${args[@]}"}
