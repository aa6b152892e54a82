#!/usr/bin/env bash
# Run the tests N times in a row and count the passes: the flake hunt of issue 14 item 8 ("make test passes 5
# times in a row on an idle machine and 5 times under a CPU-burning neighbour, from fresh clones").
#
#   scripts/repeat_tests.sh [-n N] [--fresh-clone] [--burn [K]] [--out DIR] [--keep] [--make TARGET] [-- PYTEST_ARGS...]
#
#   -n N            runs (default 5)
#   --fresh-clone   each run in a new `git clone` of HEAD (committed work only) in a temporary directory
#   --burn [K]      a CPU-burning neighbour for the whole loop: K busy-looping processes (default: one per core)
#   --out DIR       where logs go (default: a new /tmp/repeat-tests.XXXX); a failed run keeps DIR/runI.log and its
#                   pytest base temp DIR/btI (every service log the tests left), a passed run keeps its log only
#   --keep          keep the base temp of passed runs too
#   --make TARGET   run `make TARGET PYTEST_ARGS=...` (e.g. `--make test`: builds .venv from nothing in a fresh
#                   clone, then lint, contracts, stub check and the suite) instead of `python -m pytest`
#   PYTEST_ARGS     passed to pytest (default: the whole suite)
#
# The python: $PYTHON, else the checkout's .venv/bin/python when it exists (what `make` builds), else `python`.
#
# Example (the fault tests, 10 times under load):
#   scripts/repeat_tests.sh -n 10 --burn -- tests/e2e/test_preemption_e2e.py tests/e2e/test_chaos_all_e2e.py \
#       tests/rollout_manager/test_restart_process.py -x
# The summary (passes, seconds and load average per run, each run's slowest tests) is DIR/summary.txt.
set -euo pipefail

runs=5 fresh=0 burn=0 out="" keep=0 make_target=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n) runs="$2"; shift 2 ;;
        --fresh-clone) fresh=1; shift ;;
        --burn)
            if [[ "${2:-}" =~ ^[0-9]+$ ]]; then burn="$2"; shift 2; else burn=$(nproc); shift; fi ;;
        --out) out="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        --make) make_target="$2"; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "repeat_tests.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "repeat_tests.sh: -n must be a positive integer, got $runs" >&2; exit 2; }

# the checkout this script lives in (else the one the current directory is in)
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null || git rev-parse --show-toplevel)
out=${out:-$(mktemp -d /tmp/repeat-tests.XXXX)}
mkdir -p "$out"
python=${PYTHON:-}
if [[ -z $python ]]; then  # the system python has none of the project's packages: the run would fail at import
    if [[ -x $repo/.venv/bin/python ]]; then python=$repo/.venv/bin/python; else python=python; fi
fi

burners=()
stop_burners() {
    for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_burners EXIT
for _ in $(seq 1 "$burn"); do
    python3 -c 'while True: pass' &
    burners+=($!)
done

# The packages of a checkout first on PYTHONPATH (as /work/wt/env.sh and the editable install do).
pythonpath_of() {
    local r="$1"
    echo "$r:$r/operator:$r/services/rollout-manager:$r/services/rollout-worker:$r/services/trainer:$r/services/weight-server"
}

summary="$out/summary.txt"
echo "repeat_tests: $runs runs of ${make_target:+make $make_target }${*:-the suite}; fresh clone: $fresh;" \
     "burning neighbours: $burn; $(nproc) cores; HEAD $(git -C "$repo" rev-parse --short HEAD); $(date -Is)" | tee "$summary"
passes=0
for i in $(seq 1 "$runs"); do
    dir="$repo"
    if [[ $fresh == 1 ]]; then
        dir="$out/clone$i"
        git clone --quiet --no-hardlinks "$repo" "$dir"
    fi
    log="$out/run$i.log" bt="$out/bt$i"
    start=$(date +%s)
    set +e
    if [[ -n "$make_target" ]]; then
        (cd "$dir" && make "$make_target" PYTEST_ARGS="--basetemp=$bt $*") >"$log" 2>&1
    else
        (cd "$dir" && PYTHONPATH=$(pythonpath_of "$dir") "$python" -m pytest -p no:cacheprovider -rA --tb=long \
            --basetemp="$bt" "$@") >"$log" 2>&1
    fi
    rc=$?
    set -e
    took=$(( $(date +%s) - start ))
    if [[ $rc == 0 ]]; then
        passes=$((passes + 1)) verdict=passed
        [[ $keep == 1 ]] || rm -rf "$bt"
        [[ $fresh == 1 ]] && rm -rf "$dir"
    else
        verdict="FAILED (exit $rc): $log, $bt"
    fi
    echo "run $i: $verdict, ${took} s, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$summary"
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' | tee -a "$summary" || true
    # pytest's --durations table (the suite's addopts ask for the 15 slowest)
    sed -n '/slowest .*durations/,/^$/p' "$log" | head -8 | sed 's/^/    /' >>"$summary"
done
echo "passed $passes / $runs" | tee -a "$summary"
[[ $passes == "$runs" ]]
