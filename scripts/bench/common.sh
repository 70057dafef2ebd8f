# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables here are used by the scripts that source this file
# Shared by the bench scripts, on the host and inside the VM. Source it, do not run it.
# The caller sets BENCH_TOOL (the name used in messages) before sourcing.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT_DIR=$(cd "$BENCH_DIR/../.." && pwd)
# BL_BENCH_CACHE: vm-run hands it to the guest, whose HOME is /root whoever started the VM.
BENCH_CACHE=${BL_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blbench}

note() { printf '%s: %s\n' "${BENCH_TOOL:-bench}" "$*"; }
die() { printf '%s: error: %s\n' "${BENCH_TOOL:-bench}" "$*" >&2; exit 1; }

# btvirt_path: where setup caches the patched btvirt. The key covers the installed bluez
# version, the patch and setup itself (the build recipe), so a change to any rebuilds it.
btvirt_path() {
    local key
    key=$({
        dpkg-query -W -f='${Version}' bluez-test-tools
        cat "$BENCH_DIR/btvirt.patch" "$BENCH_DIR/setup"
    } | sha256sum | cut -c1-16)
    echo "$BENCH_CACHE/btvirt-$key"
}

# setup_lock: makes the setup scripts of one cache take turns, so that two first runs at once
# (CI and a developer, two vm-runs) do not fill the same venvs or build the same btvirt
# together. Held until the calling script exits. The scripts it runs (setup runs setup-bleak)
# see BL_BENCH_SETUP_LOCKED and do not take it again: a second flock on the file would wait
# for its own caller.
setup_lock() {
    [ -z "${BL_BENCH_SETUP_LOCKED:-}" ] || return 0
    mkdir -p "$BENCH_CACHE"
    exec {setup_lock_fd}>>"$BENCH_CACHE/.setup.lock"
    if ! flock -n "$setup_lock_fd"; then
        note "waiting for another setup of $BENCH_CACHE to finish" >&2
        flock -w 1800 "$setup_lock_fd" || die "another setup of $BENCH_CACHE held it for 30 minutes"
    fi
    export BL_BENCH_SETUP_LOCKED=1
}

# Seconds since the epoch with centiseconds, for durations.
now() { date +%s.%N | cut -c1-13; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- inside the VM -------------------------------------------------------------------------

# Runtime state of the bench inside the VM (a tmpfs there).
BENCH_RUN=/run/blbench
# The logs written while tests run (bluetoothd's debug log: two lines per ATT PDU; btmon's
# capture: a write per packet) are written here, on the VM's tmpfs, and copied to
# $BL_BENCH_OUT by mirror_logs. Written straight into $BL_BENCH_OUT (9p: every write a round
# trip to the host under TCG), they held a 1 MiB transfer to less than half its rate.
BENCH_LOGS=$BENCH_RUN/logs
BLUETOOTHD_LOG=$BENCH_LOGS/bluetoothd.log
MIRRORED_LOGS=(bluetoothd.log btmon.btsnoop)
# Present while a test has paused the logs for a bulk transfer (scripts/bench/bulk-logs).
QUIET_LOGS_STATE=$BENCH_RUN/logs-quiet

# mirror_logs: appends to each log in $BL_BENCH_OUT what its live copy in $BENCH_LOGS has
# beyond it (the live logs only grow). Run by one process at a time: guest-init's mirror loop,
# then its cleanup.
mirror_logs() {
    local name have
    for name in "${MIRRORED_LOGS[@]}"; do
        [ -f "$BENCH_LOGS/$name" ] || continue
        have=$(stat -c %s "$BL_BENCH_OUT/$name" 2>/dev/null || echo 0)
        tail -c +$((have + 1)) "$BENCH_LOGS/$name" >>"$BL_BENCH_OUT/$name" || return 1
    done
}
# BL_BENCH_BLUETOOTHD=PATH: another bluetoothd (e.g. a newer BlueZ built elsewhere).
BLUETOOTHD=${BL_BENCH_BLUETOOTHD:-/usr/libexec/bluetooth/bluetoothd}
SYSTEM_BUS=unix:path=/run/dbus/system_bus_socket

# alive PID: true while PID runs (a zombie counts as gone).
alive() {
    local _pid _comm state
    read -r _pid _comm state _ 2>/dev/null <"/proc/$1/stat" || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# btvirt_ended: how btvirt ended ("signal 11", "status 1"), from the status file that
# guest-init's wrapper writes when btvirt exits; "unknown" without one.
btvirt_ended() {
    local code
    code=$(cat "$BENCH_RUN/btvirt.status" 2>/dev/null) || { echo unknown; return; }
    if [ "$code" -gt 128 ]; then echo "signal $((code - 128))"; else echo "status $code"; fi
}

# stop_pid PID SIGNAL SECONDS: send SIGNAL, wait up to SECONDS, then SIGKILL.
stop_pid() {
    local pid=$1 sig=$2 limit=$3 i
    alive "$pid" || return 0
    kill "-$sig" "$pid" 2>/dev/null || return 0
    for ((i = 0; i < limit * 10; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

# bus_has_name NAME: true when NAME has an owner on the system bus.
bus_has_name() {
    local reply
    reply=$(timeout 5 dbus-send --system --print-reply --dest=org.freedesktop.DBus / \
        org.freedesktop.DBus.NameHasOwner "string:$1" 2>/dev/null) || return 1
    [[ $reply == *'boolean true'* ]]
}

# adapter_prop HCI NAME: print org.bluez.Adapter1.NAME of /org/bluez/HCI (boolean or string).
adapter_prop() {
    local reply
    reply=$(timeout 5 dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" \
        org.freedesktop.DBus.Properties.Get string:org.bluez.Adapter1 "string:$2" 2>/dev/null) || return 1
    reply=${reply##* }
    printf '%s\n' "${reply//\"/}"
}

# power_on HCI: ask bluetoothd to power the adapter (does not wait for it).
power_on() {
    timeout 5 dbus-send --system --print-reply --dest=org.bluez "/org/bluez/$1" \
        org.freedesktop.DBus.Properties.Set string:org.bluez.Adapter1 string:Powered \
        variant:boolean:true >/dev/null 2>&1
}

# start_bluetoothd: start bluetoothd with the bench config, log appended to $BLUETOOTHD_LOG
# (mirrored to $BL_BENCH_OUT/bluetoothd.log); waits (bounded) until it owns org.bluez.
start_bluetoothd() {
    local log=$BLUETOOTHD_LOG pid i debug=(-d) level=debug
    # -d: debug log, unless BL_BENCH_BLUETOOTHD_DEBUG=0 (benchmarks: a production bluetoothd's
    # setting; the debug log costs CPU time even on tmpfs).
    mkdir -p "$BENCH_LOGS"
    [ "${BL_BENCH_BLUETOOTHD_DEBUG:-1}" != 0 ] || { debug=(); level="no debug log"; }
    mkdir -p "$BENCH_RUN"
    printf '=== blbench: bluetoothd starting at %s (uptime %s, %s) ===\n' \
        "$(date '+%H:%M:%S.%N' | cut -c1-12)" "$(cut -d' ' -f1 /proc/uptime)" "$level" >>"$log"
    printf '=== blbench: %s version %s ===\n' "$BLUETOOTHD" "$("$BLUETOOTHD" --version 2>&1)" >>"$log"
    # setsid: its own session, so a test's timeout (which kills the test's process group)
    # never takes bluetoothd down with it. Not -E (see bluez-notes.md §9).
    setsid "$BLUETOOTHD" -n "${debug[@]}" -f "$BENCH_DIR/main.conf" </dev/null >>"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$BENCH_RUN/bluetoothd.pid"
    for ((i = 0; i < 200; i++)); do
        alive "$pid" || die "bluetoothd exited at start; see $log"
        bus_has_name org.bluez && return 0
        sleep 0.1
    done
    die "bluetoothd did not take org.bluez within 20 s; see $log"
}

# bluetoothd_down: true when the bench's bluetoothd is not running: it crashed (BlueZ 5.66 has
# been seen to segfault once as a central disconnected), or something stopped it for good.
bluetoothd_down() {
    local pid
    pid=$(cat "$BENCH_RUN/bluetoothd.pid" 2>/dev/null) || return 0
    ! alive "$pid"
}

# bluetoothd_end: what the kernel said as the bench's bluetoothd ended (a segfault's line), or
# that it said nothing.
bluetoothd_end() {
    local pid line=
    if pid=$(cat "$BENCH_RUN/bluetoothd.pid" 2>/dev/null); then
        line=$(dmesg 2>/dev/null | grep -F "bluetoothd[$pid]: " | tail -n 1 | sed 's/^\[[ 0-9.]*\] //')
    fi
    echo "${line:-no kernel message about it}"
}

# stop_bluetoothd: SIGTERM, bounded wait, then SIGKILL.
stop_bluetoothd() {
    local pid
    pid=$(cat "$BENCH_RUN/bluetoothd.pid" 2>/dev/null) || return 0
    stop_pid "$pid" TERM 5
    rm -f "$BENCH_RUN/bluetoothd.pid"
}
