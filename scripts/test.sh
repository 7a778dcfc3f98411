#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and run the whole test suite. Extra arguments go to pytest.
#   bash scripts/test.sh --quick    the tests without engines (unit and repository checks, a few minutes)
#   bash scripts/test.sh -m unit    one group (unit, repository, ascend, engine: see tests/conftest.py)
# Where no argument selects tests (only -q, -v, -x, -rX or --durations=N are given), the suite runs in
# two lanes at once: the tests marked side_lane (tests/ascend, tests/repository, tests/unit but for its
# timed files, and the engine files without a server; none asserts on time) at a lower CPU
# priority, beside the rest (vLLM servers, timed windows and deadlines). On two cores a starting
# server leaves one idle while it imports, and the second lane takes that core. The second lane's
# report follows the first's.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
lanes=1
for a in "$@"; do
  if [ "$a" = "--quick" ]; then args+=(-m "not engine"); else args+=("$a"); fi
  case "$a" in
    -q | -v | -vv | -x | -r?* | --durations=*) ;;
    *) lanes=0 ;;
  esac
done
bash scripts/setup.sh
PY="${SCENE_EPLB_VENV:-.venv}/bin/python"
if [ "$lanes" = 0 ]; then
  exec "$PY" -m pytest ${args[@]+"${args[@]}"}
fi
side=$(mktemp "${TMPDIR:-/tmp}/scene-eplb-lane.XXXXXX")
nice -n 10 "$PY" -m pytest ${args[@]+"${args[@]}"} -m side_lane >"$side" 2>&1 &
side_pid=$!
trap 'kill "$side_pid" 2>/dev/null || true; rm -f "$side"' EXIT
main_rc=0
"$PY" -m pytest ${args[@]+"${args[@]}"} -m "not side_lane" || main_rc=$?
side_rc=0
wait "$side_pid" || side_rc=$?
echo
echo "test.sh: the second lane (-m side_lane, run beside the first):"
cat "$side"
echo "test.sh: first lane exit $main_rc; second lane (side_lane) exit $side_rc"
[ "$main_rc" = 0 ] && [ "$side_rc" = 0 ]
