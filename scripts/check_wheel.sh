#!/usr/bin/env bash
# The wheel works: build it from this checkout's files, install it (not editable) into a new venv and run
#   stitchtune space  examples/layernorm_small.json
#   stitchtune search examples/layernorm_small.json --trials 4 --db <tmp>
# from a directory outside the source tree; then prove that everything ran from the wheel.
#
#   bash scripts/check_wheel.sh                       # CI (.ci/run): CHECK_WHEEL_VENV=system
#   CHECK_WHEEL_VENV=fresh bash scripts/check_wheel.sh  # a venv of its own: pip installs every dependency
#
# system: `python -m venv --system-site-packages`, the wheel installed with --no-deps (~15 s in all; the
#   dependencies are the ones already installed). An editable install of stitchtune in the surrounding
#   environment (CI has one) could serve a module the wheel lacks, so the proof below checks that every
#   stitchtune module of the checkout and the schedule space resolve inside the venv, that the installed
#   distribution is the wheel (not editable), and that every declared requirement is installed at a
#   version it allows. That the code imports no undeclared package is tests/test_packaging.py's job.
# fresh: the same proof in a venv without the system's packages (pip installs the dependencies, from its
#   cache or find-links when warm; ~40 s more and ~650 MB here).
# Everything lives in one temp directory, removed at exit. Exit 0: the wheel works; else the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY="${PYTHON:-python3}"
MODE="${CHECK_WHEEL_VENV:-system}"
case "$MODE" in system|fresh) ;; *) echo "check_wheel: CHECK_WHEEL_VENV must be system or fresh (got $MODE)" >&2; exit 2;; esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/stitchtune-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s)

# 1. the wheel, from a copy of the files a clone would hold (tracked + new not-ignored files): no stale
#    build/ or *.egg-info of the checkout can leak into it
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/cwd"
git ls-files -z -co --exclude-standard \
  | xargs -0 sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' _ | xargs -0 cp --parents -t "$WORK/src"
# the build backend already installed (setuptools, wheel: offline, seconds), else pip's isolated build
ISOLATION=--no-build-isolation
"$PY" -c 'import setuptools, wheel' 2>/dev/null || ISOLATION=
"$PY" -m pip wheel --no-deps $ISOLATION -q -w "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log" >&2; echo "check_wheel: the wheel did not build" >&2; exit 1; }
WHEEL=$(ls "$WORK"/dist/stitchtune-*.whl)
echo "check_wheel: built $(basename "$WHEEL") ($(( $(date +%s) - t0 )) s)"

# 2. the venv
if [ "$MODE" = system ]; then
  "$PY" -m venv --system-site-packages "$WORK/venv"
  "$WORK/venv/bin/python" -m pip install -q --no-deps --force-reinstall "$WHEEL" >"$WORK/install.log" 2>&1
else
  "$PY" -m venv "$WORK/venv"
  "$WORK/venv/bin/python" -m pip install -q "$WHEEL" >"$WORK/install.log" 2>&1
fi || { grep -v '^WARNING: Location' "$WORK/install.log" >&2; echo "check_wheel: pip install failed" >&2; exit 1; }
echo "check_wheel: installed into a $MODE venv ($(( $(date +%s) - t0 )) s)"

# 3. the two commands, from outside the source tree, with nothing pointing back at it
run() {  # run NAME ARGS...: the venv's console script; stdout NAME.out, stderr NAME.err
  local name=$1; shift
  (cd "$WORK/cwd" && env -u PYTHONPATH -u STITCHTUNE_SPACES -u STITCHTUNE_DB \
     "$WORK/venv/bin/stitchtune" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err") \
    || { tail -20 "$WORK/$name.err" >&2; echo "check_wheel: stitchtune $1 failed" >&2; exit 1; }
}
cp examples/layernorm_small.json "$WORK/cwd/graph.json"
run space space graph.json
[ "$(grep -c '^{' "$WORK/space.out")" = 5 ] || { cat "$WORK/space.out" >&2; echo "check_wheel: space printed no 5 schedules" >&2; exit 1; }
run search search graph.json --trials 4 --db "$WORK/db" --no-progress --jobs 2
ls "$WORK"/db/part-*.parquet >/dev/null 2>&1 || { echo "check_wheel: search wrote no database part" >&2; exit 1; }
grep -q "trials by status" "$WORK/search.out" || { cat "$WORK/search.out" >&2; echo "check_wheel: no search summary" >&2; exit 1; }

# 4. the proof (run by the venv's python, from outside the tree)
git ls-files -co --exclude-standard 'stitchtune/*.py' | sed 's#\.py$##; s#/__init__$##; s#/#.#g' >"$WORK/modules.txt"
(cd "$WORK/cwd" && env -u PYTHONPATH -u STITCHTUNE_SPACES "$WORK/venv/bin/python" - "$WORK" <<'PYEOF'
import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
venv = (work / "venv").resolve()
problems = []


def inside(path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(venv)


import stitchtune  # noqa: E402
from stitchtune.space import default_space_file  # noqa: E402

if not inside(stitchtune.__file__):
    problems.append(f"stitchtune imported from {stitchtune.__file__}, not from the venv")
for name in (work / "modules.txt").read_text().split():
    spec = importlib.util.find_spec(name)
    if spec is None or not inside(spec.origin):
        problems.append(f"{name}: {'missing from the wheel' if spec is None else 'served from ' + str(spec.origin)}")
space = default_space_file()
if not inside(str(space)) or "params" not in json.loads(space.read_text()):
    problems.append(f"schedule space read from {space}, not from the wheel")
dist = md.distribution("stitchtune")
direct = json.loads(dist.read_text("direct_url.json") or "{}")
if not inside(dist.locate_file("")) or direct.get("dir_info", {}).get("editable"):
    problems.append(f"the stitchtune distribution at {dist.locate_file('')} is not the installed wheel")
try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
except ImportError:  # a venv of its own: pip's copy
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement


def requirements(d, extra=""):
    env = dict(default_environment(), extra=extra)
    for r in map(Requirement, d.requires or []):
        if r.marker is None or r.marker.evaluate(env):
            yield r


declared = list(requirements(dist))
for r in declared:  # what the wheel declares (no extra), installed at a version it allows
    try:
        version = md.version(r.name)
    except md.PackageNotFoundError:
        problems.append(f"requirement {r} is not installed")
        continue
    if not r.specifier.contains(version, prereleases=True):
        problems.append(f"requirement {r} is not met: {r.name} {version}")
for p in problems:
    print(f"check_wheel: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check_wheel: stitchtune {dist.version} from {Path(stitchtune.__file__).parent}; schedule space {space}; "
      f"{len((work / 'modules.txt').read_text().split())} modules from the wheel; {len(declared)} "
      "requirements met")
PYEOF
) || exit 1
echo "check_wheel: ok: space and search ran from the $MODE venv in $WORK/cwd ($(( $(date +%s) - t0 )) s)"
