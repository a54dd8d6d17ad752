#!/usr/bin/env bash
# Rehearse a multi-host deployment on one machine: one network namespace per host, each with
# its own address on a bridge of its own, so every component reaches the others only over the
# network, as on separate machines (docs/deployment.md, "Rehearsing on one machine").
#
#   deploy/multihost.sh up ID [HOST...]     make the hosts (default: redis-a redis-b sentinel brain-a brain-b
#                                           pool pool-batch gateway workstation)
#   deploy/multihost.sh addr ID HOST        print HOST's address
#   deploy/multihost.sh exec ID HOST CMD... run CMD on HOST (in its namespace, its hostname HOST)
#   deploy/multihost.sh kill ID HOST        SIGKILL every process on HOST: the host "dies"
#   deploy/multihost.sh down ID             kill every process on the hosts, remove it all
#
# ID (1-6 letters or digits) names everything made: bridge vtmh-ID, namespaces vtmh-ID-HOST,
# links vtmh-ID-N. Two rehearsals with different IDs do not collide. The subnet is
# 10.77.S.0/24, the first S from one chosen by ID that no address here uses yet (set
# VTMH_SUBNET=10.x.y to choose it); the bridge, in the root namespace, is .1, so an operator's
# shell there reaches every host. Needs root and `ip`; with `unshare` (util-linux) each command
# also sees its host's name as its hostname, so Celery node names (brain@%h) differ per host.
# `down` removes whatever of ID exists and never fails for what is already gone.
set -euo pipefail

DEFAULT_HOSTS=(redis-a redis-b sentinel brain-a brain-b pool pool-batch gateway workstation)

usage() {
    sed -n '2,18p' "$0" >&2
    exit 2
}

check_id() {
    [[ "$1" =~ ^[a-z0-9]{1,6}$ ]] || { echo "multihost: ID must be 1-6 lowercase letters or digits, not '$1'" >&2; exit 2; }
}

# The subnet `up` chose for ID (kept beside its hosts list).
subnet() {
    local file="/run/vtmh-$1.subnet"
    [[ -f "$file" ]] || { echo "multihost: no rehearsal '$1' here; make it: $0 up $1" >&2; exit 2; }
    cat "$file"
}

# VTMH_SUBNET, else the first 10.77.S not in use on this machine, starting from one chosen by ID.
choose_subnet() {
    if [[ -n "${VTMH_SUBNET:-}" ]]; then
        echo "$VTMH_SUBNET"
        return
    fi
    local start s n
    start=$(( $(printf '%s' "$1" | cksum | cut -d' ' -f1) % 250 ))
    for n in $(seq 0 249); do
        s=$(( (start + n) % 250 + 2 ))
        if ! ip -o addr show | grep -q " inet 10\.77\.$s\."; then
            echo "10.77.$s"
            return
        fi
    done
    echo "multihost: no free subnet 10.77.S.0/24 left; set VTMH_SUBNET=10.x.y" >&2
    exit 1
}

ns_name() { echo "vtmh-$1-$2"; }

# The hosts of ID, in the order they were made (their index is their address).
hosts_of() {
    local file="/run/vtmh-$1.hosts"
    [[ -f "$file" ]] && cat "$file"
}

host_index() {
    local i=0 h
    for h in $(hosts_of "$1"); do
        if [[ "$h" == "$2" ]]; then
            echo "$i"
            return
        fi
        i=$((i + 1))
    done
    echo "multihost: no host '$2' in rehearsal '$1' (hosts: $(hosts_of "$1" | tr '\n' ' '))" >&2
    exit 2
}

addr() { echo "$(subnet "$1").$(( $(host_index "$1" "$2") + 2 ))"; }

up() {
    local id="$1"
    shift
    local hosts=("$@")
    [[ ${#hosts[@]} -gt 0 ]] || hosts=("${DEFAULT_HOSTS[@]}")
    # Link names vtmh-ID-pN must fit Linux's 15 characters: N has at most two digits.
    [[ ${#hosts[@]} -le 99 ]] || { echo "multihost: at most 99 hosts" >&2; exit 2; }
    if ip link show "vtmh-$id" >/dev/null 2>&1; then
        echo "multihost: rehearsal '$id' exists already; run: $0 down $id" >&2
        exit 1
    fi
    local net
    net="$(choose_subnet "$id")"
    printf '%s\n' "${hosts[@]}" >"/run/vtmh-$id.hosts"
    echo "$net" >"/run/vtmh-$id.subnet"
    ip link add "vtmh-$id" type bridge
    ip addr add "$net.1/24" dev "vtmh-$id"
    ip link set "vtmh-$id" up
    local i=0 h ns
    for h in "${hosts[@]}"; do
        ns="$(ns_name "$id" "$h")"
        ip netns add "$ns"
        ip link add "vtmh-$id-$i" type veth peer name "vtmh-$id-p$i"
        ip link set "vtmh-$id-p$i" netns "$ns"
        ip -n "$ns" link set "vtmh-$id-p$i" name eth0
        ip -n "$ns" addr add "$net.$((i + 2))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip link set "vtmh-$id-$i" master "vtmh-$id"
        ip link set "vtmh-$id-$i" up
        echo "$h $net.$((i + 2)) $ns"
        i=$((i + 1))
    done
}

# CMD in HOST's network namespace and, where unshare can make one, a UTS namespace named HOST.
run_on() {
    local ns host="$2"
    ns="$(ns_name "$1" "$host")"
    shift 2
    if command -v unshare >/dev/null && unshare --uts true 2>/dev/null; then
        # shellcheck disable=SC2016 # $0 and $@ are the inner shell's
        exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
    fi
    exec ip netns exec "$ns" "$@"
}

kill_host() {
    local ns pids
    ns="$(ns_name "$1" "$2")"
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    if [[ -n "$pids" ]]; then
        # shellcheck disable=SC2086 # one pid per word
        kill -KILL $pids 2>/dev/null || true
    fi
}

down() {
    local id="$1" ns link
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^vtmh-$id-" || true); do
        kill_host "$id" "${ns#vtmh-"$id"-}"
        ip netns delete "$ns" 2>/dev/null || true
    done
    for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^vtmh-$id(-|$)" || true); do
        ip link delete "$link" 2>/dev/null || true
    done
    rm -f "/run/vtmh-$id.hosts" "/run/vtmh-$id.subnet"
}

[[ $# -ge 2 ]] || usage
cmd="$1"
id="$2"
check_id "$id"
shift 2
case "$cmd" in
    up) up "$id" "$@" ;;
    addr) [[ $# -eq 1 ]] || usage; addr "$id" "$1" ;;
    exec) [[ $# -ge 2 ]] || usage; host_index "$id" "$1" >/dev/null; run_on "$id" "$@" ;;
    kill) [[ $# -eq 1 ]] || usage; host_index "$id" "$1" >/dev/null; kill_host "$id" "$1" ;;
    down) down "$id" ;;
    *) usage ;;
esac
