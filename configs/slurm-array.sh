#!/bin/bash
# A `tandem run` job split over a Slurm job array: task I of N runs shard I/N of the
# job (the input lines whose id hashes to I), each into its own output file.
#
#   mkdir -p logs && sbatch configs/slurm-array.sh                # from the repository root
#   JOB=/path/job.ini OUTDIR=/scratch/run1 sbatch configs/slurm-array.sh
#
# A task that fails, is preempted or requeued (--requeue) starts again on the same
# output and skips the ids already written, so it loses and duplicates nothing.  When
# every task has finished, join the shards (every id exactly once, all of the input):
#
#   sbatch --dependency=afterok:<ARRAY_JOB_ID> --wrap \
#     "./build/tandem merge out/all.jsonl out/shard-*.jsonl --input tests/data/prompts-dev.jsonl"
#
# The array size is the shard count: change --array=0-7 and nothing else (the script
# reads SLURM_ARRAY_TASK_COUNT).  The resources below fit configs/pycode-gpu.ini.
#SBATCH --job-name=tandem
#SBATCH --array=0-7
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=logs/tandem-%A_%a.log
set -euo pipefail

TANDEM=${TANDEM:-./build/tandem}
JOB=${JOB:-configs/pycode-gpu.ini}
OUTDIR=${OUTDIR:-out}
: "${SLURM_ARRAY_TASK_ID:?run this with sbatch (a job array)}"
N=${SLURM_ARRAY_TASK_COUNT:?no SLURM_ARRAY_TASK_COUNT (Slurm 18.08 or later)}

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd) # absolute: a relative --set path is taken from the job file's directory
exec "$TANDEM" run "$JOB" --shard "$SLURM_ARRAY_TASK_ID/$N" \
    --set job.output="$OUTDIR/shard-$SLURM_ARRAY_TASK_ID.jsonl"
