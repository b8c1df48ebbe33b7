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
#   GEAR_FLOW_HOST            the one address this node's scheduler/worker listens on, dashboards and
#                             UCX included (e.g. 10.0.0.5; 0.0.0.0 only if you mean every interface).
#                             Unset: the scheduler listens on 127.0.0.1 only, a worker on the address
#                             it reaches its scheduler from
#   GEAR_FLOW_INTERFACE       or a network interface to listen on, e.g. ib0 (UCX over InfiniBand) or eth0
#   GEAR_FLOW_DASK            the dask command (default: dask)
#   GEAR_FLOW_PYTHON          the Python with gear_flow installed (default: python3)
#
# It exports DASK_CONFIG (this folder's config/; if you already set DASK_CONFIG, that folder is kept:
# copy config/gear-flow.yaml into it), and, with TLS, the DASK_DISTRIBUTED__COMM__TLS__*
# variables so that any Client started from this shell (gear-flow, Python) uses the certificates.
# Each role needs only its own key: a client ca.pem, client.pem and client-key.pem; a worker the
# worker files; the scheduler the scheduler files (the launch scripts set gf_role before sourcing).
# With GEAR_FLOW_PROTOCOL=ucx it also exports what UCX needs on this node (no CUDA context
# without a GPU; UCX_NET_DEVICES=lo for a loopback deployment): python -m gear_flow.deploy.
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

if [ -z "${GEAR_FLOW_PYTHON:-}" ]; then  # the Python beside the dask command, else python3
    _gf_bin="$(command -v "${GEAR_FLOW_DASK%% *}" 2> /dev/null || true)"
    if [ -n "$_gf_bin" ] && [ -x "$(dirname "$_gf_bin")/python" ]; then
        GEAR_FLOW_PYTHON="$(dirname "$_gf_bin")/python"
    else
        GEAR_FLOW_PYTHON=python3
    fi
    unset _gf_bin
fi
export GEAR_FLOW_PYTHON
gf_role="${gf_role:-client}"

case "$GEAR_FLOW_PROTOCOL" in
    tls)
        for _gf_f in ca.pem "$gf_role.pem" "$gf_role-key.pem"; do
            if [ ! -r "$GEAR_FLOW_TLS_DIR/$_gf_f" ]; then
                echo "gear_flow env.sh: GEAR_FLOW_PROTOCOL=tls: a $gf_role needs $GEAR_FLOW_TLS_DIR/$_gf_f" \
                     "(copy it from where cluster/tls/make_certs.py wrote the certificates, or set GEAR_FLOW_TLS_DIR)" >&2
                return 2 2>/dev/null || exit 2
            fi
        done
        export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
        export DASK_DISTRIBUTED__COMM__TLS__CA_FILE="$GEAR_FLOW_TLS_DIR/ca.pem"
        for _gf_r in scheduler worker client; do  # the roles whose files are on this node
            if [ -r "$GEAR_FLOW_TLS_DIR/$_gf_r.pem" ] && [ -r "$GEAR_FLOW_TLS_DIR/$_gf_r-key.pem" ]; then
                _gf_v="$(echo "$_gf_r" | tr '[:lower:]' '[:upper:]')"
                export "DASK_DISTRIBUTED__COMM__TLS__${_gf_v}__CERT=$GEAR_FLOW_TLS_DIR/$_gf_r.pem"
                export "DASK_DISTRIBUTED__COMM__TLS__${_gf_v}__KEY=$GEAR_FLOW_TLS_DIR/$_gf_r-key.pem"
            fi
        done
        unset _gf_f _gf_r _gf_v
        ;;
    tcp) ;;
    ucx)
        if [ "$gf_role" = client ]; then  # the launch scripts ask for their own settings
            _gf_out="$("$GEAR_FLOW_PYTHON" -m gear_flow.deploy --role client)" || { return 2 2>/dev/null || exit 2; }
            eval "$_gf_out"
            unset _gf_out
        fi
        ;;
    *)
        echo "gear_flow env.sh: GEAR_FLOW_PROTOCOL ($GEAR_FLOW_PROTOCOL) must be tls, tcp or ucx" >&2
        return 2 2>/dev/null || exit 2
        ;;
esac

# Client() with no address, and gear-flow without --scheduler, use this
if [ -n "${GEAR_FLOW_SCHEDULER_ADDRESS:-}" ]; then
    export DASK_SCHEDULER_ADDRESS="$GEAR_FLOW_SCHEDULER_ADDRESS"
fi

# The launch scripts' listen address, dashboard and UCX variables (python -m gear_flow.deploy):
# sets gf_listen and gf_dashboard, exports UCX_* / DASK_DISTRIBUTED_UCXX__* where UCX needs them.
gf_settings() {  # gf_settings scheduler|worker [SCHEDULER_ADDRESS]
    local out rc=0
    out="$("$GEAR_FLOW_PYTHON" -m gear_flow.deploy --role "$1" ${2:+--scheduler "$2"} \
          $([ "${dry_run:-0}" = 1 ] && echo --dry-run) 2> "${TMPDIR:-/tmp}/gf_settings.$$")" || rc=$?
    if [ "$rc" = 2 ]; then  # a bad setting, already said in one line
        cat "${TMPDIR:-/tmp}/gf_settings.$$" >&2
    elif [ "$rc" != 0 ]; then
        echo "gear_flow env.sh: $GEAR_FLOW_PYTHON cannot run gear_flow.deploy" \
             "($(tail -n 1 "${TMPDIR:-/tmp}/gf_settings.$$")): set GEAR_FLOW_PYTHON to the Python that has gear_flow installed" >&2
    else  # notes (e.g. "listening on 127.0.0.1 only")
        cat "${TMPDIR:-/tmp}/gf_settings.$$" >&2
    fi
    rm -f "${TMPDIR:-/tmp}/gf_settings.$$"
    [ "$rc" = 0 ] || exit 2
    eval "$out"
    # what was exported, for --dry-run to show
    gf_exports=($(printf '%s\n' "$out" | sed -n 's/^export \([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p'))
}

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
        local v
        for v in "${gf_exports[@]}"; do printf '%s=%q ' "$v" "${!v}"; done
        printf '%q ' "${cmd[@]}"
        printf '\n'
        exit 0
    fi
    exec "${cmd[@]}"
}
