#!/usr/bin/env bash
# Local Valkey/Redis servers for the remote-tier tests, on 127.0.0.1 only.
#
#   eval "$(scripts/redis.sh start)"   # one server + a 3-node cluster; prints exports
#   scripts/redis.sh stop              # stops them by PID, removes their files
#
# Installs redis-server from Debian packages when missing. Ports: 16379
# (single), 17001-17003 (cluster); files under $MLA_CACHE_REDIS_DIR
# (default: a directory under ${TMPDIR:-/tmp}). Each node's files are in
# $DIR/<port>/ (redis.conf, redis.pid), so a test can kill and restart one.
set -euo pipefail

DIR=${MLA_CACHE_REDIS_DIR:-${TMPDIR:-/tmp}/mla-cache-redis}
SINGLE=16379
CLUSTER=(17001 17002 17003)

log() { echo "redis.sh: $*" >&2; }

install() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        log "installing redis-server"
        (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server) >&2
    fi
}

# node PORT CLUSTER(yes|no): writes the node's config and starts it.
node() {
    local port=$1 cluster=$2 dir="$DIR/$1"
    mkdir -p "$dir"
    cat > "$dir/redis.conf" <<CONF
port $port
bind 127.0.0.1
daemonize yes
dir $dir
pidfile $dir/redis.pid
logfile $dir/redis.log
save ""
appendonly no
maxmemory 512mb
maxmemory-policy allkeys-lru
cluster-enabled $cluster
cluster-config-file nodes.conf
cluster-node-timeout 2000
CONF
    redis-server "$dir/redis.conf"
}

wait_for() { # wait_for DESCRIPTION COMMAND...
    local what=$1; shift
    for _ in $(seq 1 100); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    log "timed out waiting for $what"; exit 1
}

ping() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }
cluster_ok() { for p in "${CLUSTER[@]}"; do redis-cli -p "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok" || return 1; done; }

start() {
    install
    if [ -d "$DIR" ]; then stop; fi
    mkdir -p "$DIR"
    node $SINGLE no
    for p in "${CLUSTER[@]}"; do node "$p" yes; done
    for p in $SINGLE "${CLUSTER[@]}"; do wait_for "port $p" ping "$p"; done
    local nodes=()
    for p in "${CLUSTER[@]}"; do nodes+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2
    wait_for "the cluster" cluster_ok
    local urls=()
    for p in "${CLUSTER[@]}"; do urls+=("redis://127.0.0.1:$p/"); done
    echo "export MLA_CACHE_REDIS_DIR=$DIR"
    echo "export MLA_CACHE_REDIS_URL=redis://127.0.0.1:$SINGLE/"
    echo "export MLA_CACHE_REDIS_CLUSTER=$(IFS=,; echo "${urls[*]}")"
}

stop() {
    for pidfile in "$DIR"/*/redis.pid; do
        [ -f "$pidfile" ] || continue
        local pid
        pid=$(cat "$pidfile")
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    rm -rf "$DIR"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
