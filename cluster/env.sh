# Settings shared by the launch scripts and by clients:  source cluster/env.sh
#
# Set any of these before sourcing (or in the job script / pod spec) to change them:
#
#   GEAR_FLOW_PROTOCOL        tls | tcp | ucx. Default: tls when $GEAR_FLOW_TLS_DIR/ca.pem exists, else tcp
#   GEAR_FLOW_TLS_DIR         folder of ca.pem, {scheduler,worker,client}.pem and -key.pem
#                             (cluster/tls/make_certs.py). Default: cluster/tls/certs
#   GEAR_FLOW_SCHEDULER_ADDRESS  how workers and clients reach the scheduler, e.g. tls://10.0.0.5:8786
#   GEAR_FLOW_SCHEDULER_FILE  or a scheduler file on a shared filesystem (written by the scheduler)
#   GEAR_FLOW_SCHEDULER_PORT  the scheduler's port (8786)
#   GEAR_FLOW_HOST            address this process listens on (default: Dask's choice)
#   GEAR_FLOW_INTERFACE       network interface to listen on, e.g. ib0 (UCX over InfiniBand) or eth0
#   GEAR_FLOW_DASK            the dask command (default: dask)
#
# It exports DASK_CONFIG (this folder's config/; if you already set DASK_CONFIG, that folder is kept:
# copy config/gear-flow.yaml into it), and, with TLS, the DASK_DISTRIBUTED__COMM__TLS__*
# variables so that any Client started from this shell (gear-flow, Python) uses the certificates.
# shellcheck shell=bash

GEAR_FLOW_CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GEAR_FLOW_CLUSTER_DIR
export DASK_CONFIG="${DASK_CONFIG:-$GEAR_FLOW_CLUSTER_DIR/config}"
export GEAR_FLOW_TLS_DIR="${GEAR_FLOW_TLS_DIR:-$GEAR_FLOW_CLUSTER_DIR/tls/certs}"
export GEAR_FLOW_SCHEDULER_PORT="${GEAR_FLOW_SCHEDULER_PORT:-8786}"
export GEAR_FLOW_DASK="${GEAR_FLOW_DASK:-dask}"
if [ -z "${GEAR_FLOW_PROTOCOL:-}" ]; then
    if [ -f "$GEAR_FLOW_TLS_DIR/ca.pem" ]; then GEAR_FLOW_PROTOCOL=tls; else GEAR_FLOW_PROTOCOL=tcp; fi
fi
export GEAR_FLOW_PROTOCOL

case "$GEAR_FLOW_PROTOCOL" in
    tls)
        for _gf_f in ca.pem scheduler.pem scheduler-key.pem worker.pem worker-key.pem client.pem client-key.pem; do
            if [ ! -r "$GEAR_FLOW_TLS_DIR/$_gf_f" ]; then
                echo "gear_flow env.sh: GEAR_FLOW_PROTOCOL=tls needs $GEAR_FLOW_TLS_DIR/$_gf_f" \
                     "(make them with: python cluster/tls/make_certs.py --out $GEAR_FLOW_TLS_DIR)" >&2
                return 2 2>/dev/null || exit 2
            fi
        done
        unset _gf_f
        export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
        export DASK_DISTRIBUTED__COMM__TLS__CA_FILE="$GEAR_FLOW_TLS_DIR/ca.pem"
        export DASK_DISTRIBUTED__COMM__TLS__SCHEDULER__CERT="$GEAR_FLOW_TLS_DIR/scheduler.pem"
        export DASK_DISTRIBUTED__COMM__TLS__SCHEDULER__KEY="$GEAR_FLOW_TLS_DIR/scheduler-key.pem"
        export DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT="$GEAR_FLOW_TLS_DIR/worker.pem"
        export DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY="$GEAR_FLOW_TLS_DIR/worker-key.pem"
        export DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT="$GEAR_FLOW_TLS_DIR/client.pem"
        export DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY="$GEAR_FLOW_TLS_DIR/client-key.pem"
        ;;
    tcp | ucx) ;;
    *)
        echo "gear_flow env.sh: GEAR_FLOW_PROTOCOL ($GEAR_FLOW_PROTOCOL) must be tls, tcp or ucx" >&2
        return 2 2>/dev/null || exit 2
        ;;
esac

# Client() with no address, and gear-flow without --scheduler, use this
if [ -n "${GEAR_FLOW_SCHEDULER_ADDRESS:-}" ]; then
    export DASK_SCHEDULER_ADDRESS="$GEAR_FLOW_SCHEDULER_ADDRESS"
fi

# Shared tail of the launch scripts: TLS options for a role, then print (--dry-run) or exec.
# Both work on the caller's `cmd` array and read its `extra` array and `dry_run` flag.
gf_add_tls() {  # gf_add_tls scheduler|worker
    if [ "$GEAR_FLOW_PROTOCOL" = tls ]; then
        cmd+=(--tls-ca-file "$GEAR_FLOW_TLS_DIR/ca.pem" --tls-cert "$GEAR_FLOW_TLS_DIR/$1.pem"
              --tls-key "$GEAR_FLOW_TLS_DIR/$1-key.pem")
    fi
}

gf_launch() {
    cmd+=("${extra[@]}")
    if [ "$dry_run" = 1 ]; then
        printf 'DASK_CONFIG=%q ' "$DASK_CONFIG"
        printf '%q ' "${cmd[@]}"
        printf '\n'
        exit 0
    fi
    exec "${cmd[@]}"
}
