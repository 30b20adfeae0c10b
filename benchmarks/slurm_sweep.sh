#!/bin/bash
# The default study on N machines as a SLURM job array: one shard per array element, each on a whole node.
#
#   sbatch --array=1-4 benchmarks/slurm_sweep.sh          # 4 shards (N = the array's size)
#   # when every element has finished (or after a failure: resubmit the missing elements, same command):
#   specdec merge --out results/mine.db results/shards/shard_*.db
#   specdec report --db results/mine.db
#
# Each element runs `specdec sweep --shard I/N`: the plan is split by prompt (a prompt's baseline and all
# its runs stay on one node), every shard has the same sweep id, and `--resume` makes a resubmitted element
# skip the runs its store already holds. The store is written on the node's LOCAL disk ($TMPDIR; SQLite on
# a network file system is unsafe) and copied to the shared results folder after every exit, including a
# timeout or a failure, so the next attempt resumes from it.
#
# Extra `specdec sweep` flags (same for every element, or the shards are different sweeps) go after the
# script name: sbatch --array=1-4 benchmarks/slurm_sweep.sh --quick
#
#SBATCH --job-name=specdec-sweep
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --exclusive              # the whole node: no other job runs beside a timed run
#SBATCH --time=04:00:00
#SBATCH --output=specdec-sweep-%A_%a.log

set -euo pipefail

N=${SLURM_ARRAY_TASK_COUNT:?submit as a job array: sbatch --array=1-N benchmarks/slurm_sweep.sh}
I=${SLURM_ARRAY_TASK_ID:?submit as a job array: sbatch --array=1-N benchmarks/slurm_sweep.sh}
if [ "${SLURM_ARRAY_TASK_MIN:-1}" != 1 ]; then
    echo "number the array from 1 (--array=1-$N): shards are 1/N ... N/N" >&2
    exit 2
fi
RESULTS=${SPECDEC_RESULTS:-results/shards}            # shared folder the merged study is built from
LOCAL=${TMPDIR:-/tmp}/specdec-shard-${SLURM_ARRAY_JOB_ID}-$I
mkdir -p "$RESULTS" "$LOCAL"
DB=$LOCAL/shard_$I.db
SHARED=$RESULTS/shard_$I.db

# A resubmitted element continues the store of its previous attempt.
if [ -f "$SHARED" ]; then cp "$SHARED" "$DB"; fi
RESUME=()
if [ -f "$DB" ]; then RESUME=(--resume); fi

copy_back() {  # after any exit: the runs committed so far go to the shared folder
    if [ -f "$DB" ]; then
        python -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$DB" || true
        cp "$DB" "$SHARED.part" && mv "$SHARED.part" "$SHARED"
    fi
}
trap copy_back EXIT

# No --threads here: it is part of the sweep identity, so it must be the same flag on every element (torch's
# default, all the node's cores, is recorded per run as the machine's); pass --threads T after the script name.
specdec sweep --shard "$I/$N" --db "$DB" "${RESUME[@]}" --no-progress "$@"
