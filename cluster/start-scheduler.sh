#!/usr/bin/env bash
# Start a Dask scheduler with gear_flow's coordinator (preload) on this node.
#
#   cluster/start-scheduler.sh [--dry-run] [-- EXTRA `dask scheduler` ARGUMENTS]
#
# Settings come from cluster/env.sh (GEAR_FLOW_PROTOCOL, GEAR_FLOW_TLS_DIR,
# GEAR_FLOW_SCHEDULER_PORT, GEAR_FLOW_HOST, GEAR_FLOW_INTERFACE, GEAR_FLOW_SCHEDULER_FILE) and:
#
#   GEAR_FLOW_DASHBOARD       dashboard address (default :8787; "none": no dashboard).
#                             The dashboard is plain HTTP even with TLS: keep it on a private network.
#
# --dry-run prints the command instead of running it. Otherwise the script execs it, so the
# process you started is the scheduler itself: stop it with Ctrl-C or SIGTERM.
set -euo pipefail
dry_run=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "start-scheduler.sh: unknown argument $1 (pass dask scheduler options after --)" >&2; exit 2 ;;
    esac
done
# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

read -r -a dask_cmd <<< "$GEAR_FLOW_DASK"
cmd=("${dask_cmd[@]}" scheduler --protocol "$GEAR_FLOW_PROTOCOL" --port "$GEAR_FLOW_SCHEDULER_PORT"
     --preload gear_flow.distributed.preload)
[ -n "${GEAR_FLOW_HOST:-}" ] && cmd+=(--host "$GEAR_FLOW_HOST")
[ -n "${GEAR_FLOW_INTERFACE:-}" ] && cmd+=(--interface "$GEAR_FLOW_INTERFACE")
[ -n "${GEAR_FLOW_SCHEDULER_FILE:-}" ] && cmd+=(--scheduler-file "$GEAR_FLOW_SCHEDULER_FILE")
case "${GEAR_FLOW_DASHBOARD:-:8787}" in
    none) cmd+=(--no-dashboard --dashboard-address :0) ;;  # :0: the health/metrics routes still listen
    *) cmd+=(--dashboard-address "${GEAR_FLOW_DASHBOARD:-:8787}") ;;
esac
gf_add_tls scheduler
gf_launch
