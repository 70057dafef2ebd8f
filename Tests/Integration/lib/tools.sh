# Shell helpers for integration tests of the built tools on the bench (source it).
# BL_BIN: where the tools are (default .build/debug, which `swift build` and `swift test` fill).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
BL_BIN=${BL_BIN:-$PWD/.build/debug}
export PATH=$BL_BIN:$PATH
ROOT=$PWD
LIB=$PWD/Tests/Integration/lib
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/bltest.XXXXXX)
# bluetoothd's log on the bench, as it is written (guest-init mirrors it to BL_BENCH_OUT).
BLUETOOTHD_LOG=${BL_BENCH_BLUETOOTHD_LOG:-${BL_BENCH_OUT:-/nonexistent}/bluetoothd.log}
_pids=()

# nap SECONDS: sleep without starting a process (a read that times out on a FIFO nobody
# writes). Under TCG every exec costs the emulated CPUs about 0.15 s, so a loop polling with
# `sleep 0.1` and grep kept one of the two busy, slowing down what it waited for.
mkfifo "$WORK/.nap"
exec {_nap_fd}<>"$WORK/.nap"
nap() { read -r -t "$1" -u "$_nap_fd" _ || true; }

# file_has FILE PATTERN: FILE's text matches *PATTERN* (a bash pattern; the text starts with a
# newline, so $'\n'WORD finds WORD at the start of a line). Read by bash itself: no process.
file_has() {
    local text
    [[ -f $1 ]] || return 1
    text=$'\n'$(<"$1")
    # shellcheck disable=SC2053 # a pattern on purpose
    [[ $text == *$2* ]]
}

cleanup() {
    local pid
    loud_logs
    for pid in "${_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# (The clock read by bash itself, $EPOCHREALTIME: a `date` per line cost an exec, see nap.)
log() {
    local t=${EPOCHREALTIME/,/.} frac
    frac=${t#*.}
    printf '[%(%T)T.%s] %s\n' "${t%.*}" "${frac:0:3}" "$*"
}
fail() { log "FAILED: $*"; exit 1; }
# skip REASON: the test cannot run here (run-integration counts it skipped; --strict, failed).
skip() { echo "skip: $*"; exit 77; }
check() { # CONDITION-COMMAND... ; message in $MSG
    "$@" || fail "${MSG:-check failed: $*}"
}

# start_peripheral MODE ADAPTER NAME [ARGS]: a seed_peripheral.py in the background, waiting
# (at most 30 s) until it has registered. Its output goes to $WORK/peripheral-MODE.log.
start_peripheral() {
    local mode=$1 out=$WORK/peripheral-$1.log
    $PY "$LIB/seed_peripheral.py" "$@" >"$out" 2>&1 &
    _pids+=($!)
    PERIPHERAL_PID=$!
    for _ in {1..300}; do
        file_has "$out" $'\n'ready && { log "peripheral $mode ready on $2"; return 0; }
        kill -0 "$PERIPHERAL_PID" 2>/dev/null || { cat "$out"; fail "peripheral $mode exited"; }
        nap 0.1
    done
    cat "$out"
    fail "peripheral $mode not ready within 30 s"
}

# background CMD...: run in the background, remembered for cleanup; its pid in $BG_PID.
background() {
    "$@" &
    BG_PID=$!
    _pids+=("$BG_PID")
}

# start_blserve ARGS...: `blserve -v ARGS` in the background, stderr in $WORK/blserve.log and
# its pid in $SERVER, waiting (at most 30 s) until it has registered. The log's tail is shown
# when the test ends.
start_blserve() {
    background blserve -v "$@" 2>"$WORK/blserve.log"
    SERVER=$BG_PID
    for _ in {1..300}; do file_has "$WORK/blserve.log" 'registered on' && break; nap 0.1; done
    file_has "$WORK/blserve.log" 'registered on' || { cat "$WORK/blserve.log"; fail "blserve did not register"; }
    trap 'echo "---- blserve log (last 40 lines)"; tail -n 40 "$WORK/blserve.log"; cleanup' EXIT
}

# wait_subscribed ADAPTER ADDRESS CHAR_UUID: until a central on ADAPTER has subscribed to
# the characteristic of ADDRESS (NotifyAcquired or Notifying), at most 30 s.
wait_subscribed() {
    $PY "$LIB/wait_subscribed.py" "$@" || fail "no subscription to $3 on $2 from $1"
}

# hold_notify ADAPTER ADDRESS SERVICE CHAR: another client subscribed with StartNotify (see
# notify_holder.py) in the background, waiting (at most 30 s) until it is.
hold_notify() {
    background $PY "$LIB/notify_holder.py" "$@" >"$WORK/holder.log" 2>&1
    for _ in {1..300}; do file_has "$WORK/holder.log" $'\n'subscribed && return 0; nap 0.1; done
    fail "the StartNotify client did not subscribe: $(cat "$WORK/holder.log")"
}

# bluez_call PATH INTERFACE.METHOD ARGS...: a method call to bluetoothd with dbus-send (a
# Python process with python3-dbus costs about a second of the emulated CPU; this a tenth of it).
# The reply is printed (dbus-send's literal form); the status is dbus-send's.
bluez_call() {
    dbus-send --system --print-reply=literal --reply-timeout=25000 --dest=org.bluez "$@"
}

# forget ADAPTER ADDRESS: make ADAPTER's bluetoothd forget a device (so it must be scanned).
forget() {
    bluez_call "/org/bluez/$1" org.bluez.Adapter1.RemoveDevice "objpath:/org/bluez/$1/dev_${2//:/_}" >/dev/null 2>&1 || true
}

# bluez_true PATH INTERFACE PROPERTY: true when bluetoothd says the boolean is true.
bluez_true() {
    local reply
    reply=$(bluez_call "$1" org.freedesktop.DBus.Properties.Get "string:$2" "string:$3" 2>/dev/null) || return 1
    [[ $reply == *"boolean true"* ]]
}

# link ADAPTER ADDRESS: "yes" when bluetoothd says ADAPTER is connected to ADDRESS, else "no".
link() {
    if bluez_true "/org/bluez/$1/dev_${2//:/_}" org.bluez.Device1 Connected; then echo yes; else echo no; fi
}

# disconnect ADAPTER ADDRESS: Device1.Disconnect (the link drops, whoever uses it; errors ignored).
disconnect() {
    bluez_call "/org/bluez/$1/dev_${2//:/_}" org.bluez.Device1.Disconnect >/dev/null 2>&1 || true
}

# power ADAPTER on|off
power() {
    local value=false
    [[ $2 == on ]] && value=true
    bluez_call "/org/bluez/$1" org.freedesktop.DBus.Properties.Set string:org.bluez.Adapter1 string:Powered \
        "variant:boolean:$value" >/dev/null
}

# quiet_logs REASON ... loud_logs: btmon and most of bluetoothd's debug log paused for the
# span of a bulk transfer (scripts/bench/bulk-logs; the test's exit resumes them too). _quiet
# spares every other test's exit a bulk-logs process.
_quiet=
quiet_logs() {
    "$ROOT/scripts/bench/bulk-logs" quiet "$*" && _quiet=1
}
loud_logs() {
    [[ -z $_quiet ]] || "$ROOT/scripts/bench/bulk-logs" loud || true
    _quiet=
}

# elapsed_since START_NS
elapsed_since() {
    local t=${EPOCHREALTIME/,/.}
    echo $(( (${t%.*}${t#*.}000 - $1) / 1000000 ))
}

RASPBLE_SERVICE=54f06857-695e-47e4-aea8-c78184ad6c75
RASPBLE_CHAR=30a5f1bb-61dc-45f0-9c52-2218d080fa77
SINK_SERVICE=fff0
SINK_CHAR=fff1
