#!/usr/bin/env bash
# Start a Dask scheduler with gear_flow's coordinator (preload) on this node.
#
#   cluster/start-scheduler.sh [--dry-run] [-- EXTRA `dask scheduler` ARGUMENTS]
#
# Settings come from cluster/env.sh (GEAR_FLOW_PROTOCOL, GEAR_FLOW_TLS_DIR,
# GEAR_FLOW_SCHEDULER_PORT, GEAR_FLOW_HOST, GEAR_FLOW_INTERFACE, GEAR_FLOW_SCHEDULER_FILE) and:
#
#   GEAR_FLOW_HOST            the address to listen on, dashboard included. Unset (and no
#                             GEAR_FLOW_INTERFACE): 127.0.0.1 only, so no other node can join;
#                             set it to this node's address (10.0.0.5), or 0.0.0.0 for every interface
#   GEAR_FLOW_DASHBOARD       dashboard address (default :8787, on GEAR_FLOW_HOST's address);
#                             "none": no HTTP server at all (no dashboard, /health or /metrics; the
#                             workers' too). The dashboard is plain HTTP even with TLS.
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
gf_role=scheduler
# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

gf_settings scheduler

read -r -a dask_cmd <<< "$GEAR_FLOW_DASK"
cmd=("${dask_cmd[@]}" scheduler --protocol "$GEAR_FLOW_PROTOCOL" --port "$GEAR_FLOW_SCHEDULER_PORT"
     --preload gear_flow.distributed.preload)
if [ -n "${GEAR_FLOW_INTERFACE:-}" ] && [ -z "${GEAR_FLOW_HOST:-}" ]; then
    cmd+=(--interface "$GEAR_FLOW_INTERFACE")
else
    cmd+=(--host "$gf_listen")
fi
[ -n "${GEAR_FLOW_SCHEDULER_FILE:-}" ] && cmd+=(--scheduler-file "$GEAR_FLOW_SCHEDULER_FILE")
if [ -n "$gf_dashboard" ]; then
    cmd+=(--dashboard-address "$gf_dashboard")
else  # Dask starts its HTTP server even with --no-dashboard: the preload stops it
    cmd+=(--no-dashboard --preload gear_flow.deploy.no_http)
fi
gf_add_tls scheduler
gf_launch
