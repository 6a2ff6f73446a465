#!/bin/sh
# Slurm Epilog: the job ended, so its GPUs are no longer its own (see prolog.sh).
# Never fails: a failing Epilog drains the node.
dir="${GPUNET_SLURM_DIR:-/run/gpunet/slurm-jobs}"
[ -n "${SLURM_JOB_ID:-}" ] && rm -f "$dir/$SLURM_JOB_ID" "$dir/.$SLURM_JOB_ID.tmp" 2>/dev/null
exit 0
