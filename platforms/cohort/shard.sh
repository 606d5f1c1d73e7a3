#!/usr/bin/env bash
# One machine's part of grading a cohort on many machines; the CI matrix, Slurm and Kubernetes examples run it.
#
#   shard.sh grade K N    grade every N-th submission from the K-th (1-based) into $OUT/shard-K
#   shard.sh merge N      combine $OUT/shard-1 ... $OUT/shard-N into $OUT/merged: one gradebook.csv, a folder per
#                         submission, exactly what one unsharded `python -m grader cohort` run writes
#
# Variables: LAB (e.g. 01_performance_model), SUBMISSIONS (a folder of .ipynb), OUT (a folder every machine sees,
# or where the shards' artifacts are gathered before the merge), SEED (one number for every shard: every learner
# gets the same hidden cases); optional: PYTHON (python), JOBS (2 submissions at a time), DEVICE (cpu), COURSE (the
# course checkout holding this file) and GRADE_ARGS (more options of `python -m grader cohort`, e.g. --timeout 120).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COURSE="${COURSE:-$HERE/../..}"
PYTHON="${PYTHON:-python}"
GRADE_ARGS="${GRADE_ARGS:-}"
export PYTHONPATH="$COURSE${PYTHONPATH:+:$PYTHONPATH}"

case "${1:-}" in
    grade)
        K="${2:?usage: shard.sh grade K N}"
        N="${3:?usage: shard.sh grade K N}"
        : "${SEED:?set SEED to one number for every shard, e.g. SEED=\$(python3 -c 'import secrets; print(secrets.randbits(31))')}"
        "$PYTHON" -m grader cohort "${SUBMISSIONS:?set SUBMISSIONS to the folder of notebooks}" \
            --lab "${LAB:?set LAB, e.g. 01_performance_model}" --out "${OUT:?set OUT}/shard-$K" --shard "$K/$N" \
            --seed "$SEED" --jobs "${JOBS:-2}" --device "${DEVICE:-cpu}" $GRADE_ARGS
        ;;
    merge)
        N="${2:?usage: shard.sh merge N}"
        dirs=()
        for K in $(seq 1 "$N"); do
            # cohort writes a shard's gradebook.csv last: without it the shard did not finish
            if [ ! -f "${OUT:?set OUT}/shard-$K/gradebook.csv" ]; then
                echo "shard $K/$N did not finish ($OUT/shard-$K/gradebook.csv is missing): grade it again, then merge." >&2
                exit 1
            fi
            dirs+=("$OUT/shard-$K")
        done
        "$PYTHON" -m grader merge "${dirs[@]}" --out "$OUT/merged"
        ;;
    *)
        echo "usage: shard.sh grade K N | shard.sh merge N   (see the comments at the top of this file)" >&2
        exit 2
        ;;
esac
