#!/usr/bin/env bash
# Grade one submission exactly as classroom.yml's "Grade" step does (that step runs this file).
#
#   platforms/github-classroom/grade_locally.sh SUBMISSION.ipynb LAB      (or set SUBMISSION and LAB)
#
# Writes OUT/result.json, feedback.md, junit.xml and grader.log. Under GitHub Actions it also sets the step's
# output `result` (the points of each exercise, in the format of GitHub Classroom's grading reporter) and appends
# feedback.md to the job summary; elsewhere it prints both. Exit status: `python -m grader grade`'s (0 graded,
# 1 below FAIL_UNDER percent, 2 not gradable).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COURSE="${COURSE:-$HERE/../..}"          # the course checkout whose grader grades
SUBMISSION="${SUBMISSION:-${1:?usage: grade_locally.sh SUBMISSION.ipynb LAB (or set SUBMISSION and LAB)}}"
LAB="${LAB:-${2:?usage: grade_locally.sh SUBMISSION.ipynb LAB (or set SUBMISSION and LAB)}}"
OUT="${OUT:-grades}"
PYTHON="${PYTHON:-python}"
DEVICE="${DEVICE:-cpu}"
FAIL_UNDER="${FAIL_UNDER:-}"
SEED="${SEED:-}"                          # empty: a secret seed per run, recorded in result.json
GRADE_ARGS="${GRADE_ARGS:-}"              # more options of `python -m grader grade`, e.g. --timeout 120

status=0
PYTHONPATH="$COURSE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m grader grade "$SUBMISSION" --lab "$LAB" --out "$OUT" \
    --device "$DEVICE" ${SEED:+--seed "$SEED"} ${FAIL_UNDER:+--fail-under "$FAIL_UNDER"} $GRADE_ARGS || status=$?
if [ ! -f "$OUT/result.json" ]; then
    echo "grading did not produce $OUT/result.json (exit status $status); see the messages above." >&2
    exit "$status"
fi
result="$(PYTHONPATH="$COURSE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/classroom_result.py" "$OUT/result.json" \
    --lab "$LAB" ${FAIL_UNDER:+--fail-under "$FAIL_UNDER"})"
if [ -n "${GITHUB_OUTPUT:-}" ]; then
    echo "result=$result" >> "$GITHUB_OUTPUT"
else
    echo "result=$result"
fi
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$OUT/feedback.md" >> "$GITHUB_STEP_SUMMARY"
else
    cat "$OUT/feedback.md"
fi
exit "$status"
