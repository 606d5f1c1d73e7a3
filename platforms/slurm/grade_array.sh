#!/usr/bin/env bash
# Grade a cohort on a Slurm cluster: a job array, one task per shard, then a merge job once every task succeeded.
# Run it by hand from the course checkout (on the login node) and it submits both:
#
#   LAB=01_performance_model SUBMISSIONS=$PWD/submissions OUT=$PWD/grades SHARDS=8 platforms/slurm/grade_array.sh
#
# OUT must be on a file system every node sees. The gradebook lands in $OUT/merged/gradebook.csv.
# In the jobs, Slurm runs this same file: task K grades `--shard K/SHARDS`, the merge job runs `merge`.
#SBATCH --job-name=grade-cohort
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=02:00:00
#SBATCH --output=grade-cohort-%A_%a.log
set -euo pipefail
export COURSE="${COURSE:-$PWD}"   # jobs start in the folder they were submitted from: the course checkout
: "${SHARDS:?set SHARDS, the number of array tasks}"

if [ -z "${SLURM_JOB_ID:-}" ]; then
    # One seed for every task: every learner gets the same hidden cases (recorded in each result.json).
    export SEED="${SEED:-$(python3 -c 'import secrets; print(secrets.randbits(31))')}"
    array="$(sbatch --parsable --array=1-"$SHARDS" --export=ALL "$0")"
    merge="$(sbatch --parsable --dependency=afterok:"$array" --export=ALL,STEP=merge --job-name=merge-cohort "$0")"
    echo "submitted grading array $array ($SHARDS tasks) and merge job $merge; gradebook: $OUT/merged/gradebook.csv"
elif [ "${STEP:-grade}" = merge ]; then
    bash "$COURSE/platforms/cohort/shard.sh" merge "$SHARDS"
else
    bash "$COURSE/platforms/cohort/shard.sh" grade "$((SLURM_ARRAY_TASK_ID))" "$SHARDS"
fi
