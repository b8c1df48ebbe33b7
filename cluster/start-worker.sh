#!/usr/bin/env bash
# Start Dask workers that host gear_flow shards on this node.
#
#   cluster/start-worker.sh [--kind auto|cpu|gpu] [--dry-run] [SCHEDULER_ADDRESS] [-- EXTRA WORKER ARGUMENTS]
#
# --kind gpu runs `dask cuda worker` (dask-cuda: one worker per visible GPU, RMM, UCX/NVLink/InfiniBand);
# --kind cpu runs `dask worker`; auto (default) picks gpu when `nvidia-smi -L` lists a GPU.
# Both load gear_flow.distributed.preload (the GearFlowWorker plugin) and advertise Dask resources
# so that tables place shards (DistributedTable.create(..., resources="replay")) and learners run
# where they should (client.submit(learner, resources={"learner": 1})).
#
# The scheduler is SCHEDULER_ADDRESS, else $GEAR_FLOW_SCHEDULER_ADDRESS, else $GEAR_FLOW_SCHEDULER_FILE.
# Settings come from cluster/env.sh (GEAR_FLOW_PROTOCOL, GEAR_FLOW_TLS_DIR, GEAR_FLOW_HOST,
# GEAR_FLOW_INTERFACE) and:
#
#   GEAR_FLOW_HOST             the address the workers (and their nannies and dashboards) listen on.
#                              Unset (and no GEAR_FLOW_INTERFACE): the address this node reaches the
#                              scheduler from (127.0.0.1 for a scheduler on 127.0.0.1)
#   GEAR_FLOW_DASHBOARD        "none": no HTTP server in the workers; otherwise each worker serves its
#                              dashboard on a random port of that address
#   GEAR_FLOW_RESOURCES        Dask resources of each worker. Default: "replay=1,learner=1": shards, and
#                              one co-located learner per worker (per GPU with dask cuda worker)
#   GEAR_FLOW_NTHREADS         threads per worker (default 2 on CPU, 1 on GPU as dask-cuda does)
#   GEAR_FLOW_NWORKERS         CPU only: worker processes on this node (default 1)
#   GEAR_FLOW_MEMORY_LIMIT     host memory per worker (default auto)
#   GEAR_FLOW_LOCAL_DIRECTORY  fast local scratch (spill, logs), e.g. $TMPDIR or /scratch
#   GEAR_FLOW_NAME             worker name (prefix with dask cuda worker)
#   GPU only:
#   GEAR_FLOW_RMM_POOL_SIZE    RMM pool per GPU, e.g. 0.8 (of device memory) or 100GB, made by dask-cuda
#                              as each worker starts; default: no pool (or gear-flow.gpu.rmm-pool-size in
#                              the Dask config: the scheduler's preload then has every worker make it)
#   GEAR_FLOW_RMM_LIBS         with a pool: libraries that allocate from it (default cupy; cupy,torch)
#   GEAR_FLOW_DEVICE_MEMORY_LIMIT  device memory at which dask-cuda spills to host (default 0.8)
#   GEAR_FLOW_UCX_TRANSPORTS   with GEAR_FLOW_PROTOCOL=ucx: "auto" (default: UCX picks what it finds)
#                              or a comma list of tcp,nvlink,infiniband,rdmacm to force them on
#
# --dry-run prints the command instead of running it. Otherwise the script execs it: stop the
# workers with Ctrl-C or SIGTERM.
set -euo pipefail
dry_run=0
kind=auto
scheduler=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        --kind) kind="${2:?--kind needs cpu, gpu or auto}"; shift 2 ;;
        --kind=*) kind="${1#--kind=}"; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        -*) echo "start-worker.sh: unknown option $1 (pass worker options after --)" >&2; exit 2 ;;
        *) scheduler="$1"; shift ;;
    esac
done
gf_role=worker
# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if [ "$kind" = auto ]; then
    if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
        kind=gpu
    else
        kind=cpu
    fi
fi
case "$kind" in
    cpu | gpu) ;;
    *) echo "start-worker.sh: --kind ($kind) must be auto, cpu or gpu" >&2; exit 2 ;;
esac

scheduler="${scheduler:-${GEAR_FLOW_SCHEDULER_ADDRESS:-}}"
target=()
if [ -n "$scheduler" ]; then
    target=("$scheduler")
elif [ -n "${GEAR_FLOW_SCHEDULER_FILE:-}" ]; then
    target=(--scheduler-file "$GEAR_FLOW_SCHEDULER_FILE")
else
    echo "start-worker.sh: no scheduler: pass its address (e.g. tls://10.0.0.5:8786)," \
         "or set GEAR_FLOW_SCHEDULER_ADDRESS or GEAR_FLOW_SCHEDULER_FILE" >&2
    exit 2
fi

gf_settings worker "$scheduler"

read -r -a dask_cmd <<< "$GEAR_FLOW_DASK"
if [ "$kind" = gpu ]; then
    cmd=("${dask_cmd[@]}" cuda worker "${target[@]}"
         --nthreads "${GEAR_FLOW_NTHREADS:-1}"
         --memory-limit "${GEAR_FLOW_MEMORY_LIMIT:-auto}"
         --device-memory-limit "${GEAR_FLOW_DEVICE_MEMORY_LIMIT:-0.8}"
         --resources "${GEAR_FLOW_RESOURCES:-replay=1,learner=1}")
    if [ -n "${GEAR_FLOW_RMM_LIBS:-}" ]; then
        IFS=, read -r -a rmm_libs <<< "$GEAR_FLOW_RMM_LIBS"
        for lib in "${rmm_libs[@]}"; do
            case "$lib" in
                cupy | torch) ;;
                *) echo "start-worker.sh: GEAR_FLOW_RMM_LIBS: unknown library '$lib' (cupy, torch)" >&2; exit 2 ;;
            esac
        done
        if [ -z "${GEAR_FLOW_RMM_POOL_SIZE:-}" ]; then  # else silently ignored: say so
            echo "start-worker.sh: GEAR_FLOW_RMM_LIBS needs GEAR_FLOW_RMM_POOL_SIZE (without a pool, CuPy's" \
                 "own memory pool is faster than RMM's plain cudaMalloc)" >&2
            exit 2
        fi
    fi
    if [ -n "${GEAR_FLOW_RMM_POOL_SIZE:-}" ]; then  # the pool by dask-cuda's RMMSetup plugin, at worker start
        cmd+=(--rmm-pool-size "$GEAR_FLOW_RMM_POOL_SIZE" --set-rmm-allocator-for-libs "${GEAR_FLOW_RMM_LIBS:-cupy}")
    fi
    if [ "$GEAR_FLOW_PROTOCOL" = ucx ] && [ "${GEAR_FLOW_UCX_TRANSPORTS:-auto}" != auto ]; then
        IFS=, read -r -a transports <<< "$GEAR_FLOW_UCX_TRANSPORTS"
        for t in "${transports[@]}"; do
            case "$t" in
                tcp) cmd+=(--enable-tcp-over-ucx) ;;
                nvlink) cmd+=(--enable-nvlink) ;;
                infiniband) cmd+=(--enable-infiniband) ;;
                rdmacm) cmd+=(--enable-rdmacm) ;;
                *) echo "start-worker.sh: unknown UCX transport $t (tcp, nvlink, infiniband, rdmacm)" >&2; exit 2 ;;
            esac
        done
    fi
else
    if [ -n "${GEAR_FLOW_RMM_POOL_SIZE:-}${GEAR_FLOW_RMM_LIBS:-}" ]; then
        echo "start-worker.sh: GEAR_FLOW_RMM_POOL_SIZE / GEAR_FLOW_RMM_LIBS are for --kind gpu (dask cuda worker):" \
             "ignored by a CPU worker" >&2
    fi
    cmd=("${dask_cmd[@]}" worker "${target[@]}"
         --nthreads "${GEAR_FLOW_NTHREADS:-2}"
         --nworkers "${GEAR_FLOW_NWORKERS:-1}"
         --memory-limit "${GEAR_FLOW_MEMORY_LIMIT:-auto}"
         --resources "${GEAR_FLOW_RESOURCES:-replay=1,learner=1}")
fi
cmd+=(--protocol "$GEAR_FLOW_PROTOCOL" --preload gear_flow.distributed.preload)
if [ -n "${GEAR_FLOW_INTERFACE:-}" ] && [ -z "${GEAR_FLOW_HOST:-}" ]; then
    cmd+=(--interface "$GEAR_FLOW_INTERFACE")
else
    cmd+=(--host "$gf_listen")
fi
if [ -n "$gf_dashboard" ]; then
    cmd+=(--dashboard-address "$gf_dashboard")
else  # Dask starts its HTTP server even with --no-dashboard: the preload stops it
    cmd+=(--no-dashboard --preload gear_flow.deploy.no_http)
fi
[ -n "${GEAR_FLOW_LOCAL_DIRECTORY:-}" ] && cmd+=(--local-directory "$GEAR_FLOW_LOCAL_DIRECTORY")
[ -n "${GEAR_FLOW_NAME:-}" ] && cmd+=(--name "$GEAR_FLOW_NAME")
gf_add_tls worker
gf_launch
