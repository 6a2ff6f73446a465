#!/bin/sh
# Slurm Prolog: tell gpunet-exporter which GPUs of this node the starting job holds.
#
# Install on every GPU node (slurm.conf: Prolog=/etc/slurm/prolog.d/*, or call it from your
# prolog) together with epilog.sh. It writes one file per job into the folder the exporter
# reads (--workload.slurm-dir, default /run/gpunet/slurm-jobs), in the format of
# exporter/readers/slurm_jobs.py:
#   gpus=0,1,2,3
#   name=llama-pretrain
# SLURM_JOB_GPUS holds the job's GPU indices on this node; they are NVML's indices when
# gres.conf uses AutoDetect=nvml (or lists /dev/nvidia* in PCI bus order). Where they may
# differ, set GPUNET_GPU_IDS=uuid and the indices are written as UUIDs via nvidia-smi.
#
# A failing Prolog drains the node, so this script never fails: whatever goes wrong, the
# job runs and only its attribution is missing.
dir="${GPUNET_SLURM_DIR:-/run/gpunet/slurm-jobs}"
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_GPUS:-}" ] || exit 0
gpus="$SLURM_JOB_GPUS"
if [ "${GPUNET_GPU_IDS:-index}" = uuid ] && command -v nvidia-smi >/dev/null 2>&1; then
    uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$gpus" 2>/dev/null | paste -sd, -)
    [ -n "$uuids" ] && gpus="$uuids"
fi
# One line per value: a job name holding a newline must not add lines of its own.
name=$(printf '%s' "${SLURM_JOB_NAME:-}" | tr '\n\r' '  ')
user=$(printf '%s' "${SLURM_JOB_USER:-}" | tr '\n\r' '  ')
{
    mkdir -p "$dir" &&
    tmp="$dir/.$SLURM_JOB_ID.tmp" &&
    printf 'gpus=%s\nname=%s\nuser=%s\n' "$gpus" "$name" "$user" >"$tmp" &&
    mv -f "$tmp" "$dir/$SLURM_JOB_ID"
} 2>/dev/null
exit 0
