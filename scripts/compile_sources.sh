#!/usr/bin/env bash
# Byte-compile the project's own Python sources beside them (__pycache__/*.pyc): `make setup` does
# it for the venv's Python, scripts/guest/run.sh for the test guest's (docs/testing.md, "The set-up").
#
# Python writes this byte code itself on a module's first import, unless PYTHONDONTWRITEBYTECODE is
# set (as in many CI and container images) or the checkout is read-only (the guest's share). Then
# every process compiles again each of the project's modules it imports: the CLI, the controller, the
# fork server and the site servers of every run. Compiled here once, they read it instead; a source
# edited later no longer matches its byte code and is compiled as it is imported, as before.
# Third-party packages are compiled by pip as it installs them.
#
#   scripts/compile_sources.sh [PYTHON]   the interpreter the byte code is for (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-python3}
dirs=()
for d in orchestrator workers controller topologies tests benchmarks examples; do
    [ -d "$d" ] && dirs+=("$d")
done
# -j 0: one worker per CPU; a source that does not compile is named (its import will say why)
if ! "$PYTHON" -m compileall -q -j 0 "${dirs[@]}" >/dev/null; then
    echo "compile_sources.sh: some of the project's sources did not compile (they are compiled as imported)" >&2
fi
