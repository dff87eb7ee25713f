#!/usr/bin/env bash
# The supported-versions matrix: for each set of Python and dependency versions, a fresh virtual environment with
# `pip install .` (not editable), then scripts/compat_check.py (every verb and the API over the sample traces, and
# the output digests of the sample and shared traces). One line per set, then each set's log under $WORK.
#
#     bash scripts/compat_matrix.sh            # all sets
#     bash scripts/compat_matrix.sh floors     # the sets whose name contains 'floors'
#
# Needs pyenv's Pythons 3.10 to 3.13 (these machines have them). Takes a few minutes per set.
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/profparse-matrix.XXXXXX")}
ROOT=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
only=${1:-}

python_of() { ls -d "$ROOT"/versions/"$1".*/bin/python3 2>/dev/null | tail -n 1; }

# name | Python | pins (empty: whatever `pip install .` resolves)
SETS=(
    "floors-numpy1|3.10|numpy==1.24.1 pandas==2.0.0 pyarrow==14.0.0 matplotlib==3.7.0 msgspec==0.18.0 tqdm==4.60.0 xxhash==3.0.0"
    "floors-numpy2|3.10|numpy==2.0.2 pandas==2.2.2 pyarrow==16.0.0 matplotlib==3.8.4 msgspec==0.18.6"
    "pandas2.2-numpy1.26|3.11|pandas==2.2.3 numpy==1.26.4 pyarrow==17.0.0 matplotlib==3.9.4"
    "py3.10-plain|3.10|"
    "pandas3.0-numpy2.4|3.11|pandas==3.0.6 numpy==2.4.6 pyarrow==26.0.1"
    "pandas3.1-numpy2.0|3.11|pandas==3.1.0 numpy==2.0.2 pyarrow==16.0.0 matplotlib==3.8.4"
    "py3.12-latest|3.12|"
    "py3.13-latest|3.13|"
)

status=0
for entry in "${SETS[@]}"; do
    IFS='|' read -r name py pins <<<"$entry"
    [[ -n "$only" && "$name" != *"$only"* ]] && continue
    python=$(python_of "$py")
    if [[ -z "$python" ]]; then echo "$name: no Python $py"; status=1; continue; fi
    env="$WORK/$name"
    log="$WORK/$name.log"
    {
        "$python" -m venv "$env" &&
            if [[ -n "$pins" ]]; then
                # shellcheck disable=SC2086
                "$env/bin/pip" install -q $pins "setuptools>=70.1" &&
                    "$env/bin/pip" install -q --no-build-isolation .
            else
                "$env/bin/pip" install -q .
            fi
    } >"$log" 2>&1 || { echo "$name: install failed (see $log)"; status=1; continue; }
    versions=$("$env/bin/python" -c 'import sys, importlib.metadata as m; print(f"Python {sys.version.split()[0]}", *(f"{p} {m.version(p)}" for p in ("numpy", "pandas", "pyarrow", "matplotlib", "msgspec")), sep=", ")')
    # run outside the clone so the installed package (not src/) is what runs
    if (cd "$WORK" && "$env/bin/python" "$OLDPWD/scripts/compat_check.py") >>"$log" 2>&1; then
        echo "$name: ok ($versions): every verb and load() exit 0 without warnings; $(grep '^output digests' "$log")"
    else
        echo "$name: FAILED ($versions), see $log"
        status=1
    fi
done
exit $status
