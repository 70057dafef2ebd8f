#!/usr/bin/python3
"""The baseline peripheral for scripts/bench-blserve: the seed 000 protocol in one Python process
(python3-dbus, real bluetoothd), answering in-process instead of running a command per request.

  blserve_pyecho.py ADAPTER frame [push]
                                    T frames are echoed back as T frames: per-central reassembly,
                                    a per-central reply queue, an N0000000 doorbell, reads in
                                    pieces of min(MTU-3, 512) — what blserve does, minus the process.
                                    With push, the reply is notified instead (pieces of
                                    min(MTU-3, 512)), as blserve --reply push does.
  blserve_pyecho.py ADAPTER bulk N [signals]
                                    NUS layout with write-without-response: hashes what is written
                                    to RX and notifies "done SHA256HEX" on TX once N bytes have come;
                                    the write "GO" makes it notify payload(N) on TX in pieces of
                                    min(MTU-5, 512), written to the socket bluetoothd acquires for
                                    notifications (AcquireNotify), as blserve does; with signals, a
                                    PropertiesChanged signal per notification instead, as bless and
                                    BlueZ's example-gatt-server notify.

Prints "ready" once registered and advertising; runs until SIGTERM."""
import hashlib
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbus  # noqa: E402
from bench import Adapter, Advertisement, Application, Bench  # noqa: E402
from benchlog import payload  # noqa: E402
from gi.repository import GLib  # noqa: E402

SEED_SERVICE = "54f06857-695e-47e4-aea8-c78184ad6c75"
SEED_CHAR = "30a5f1bb-61dc-45f0-9c52-2218d080fa77"
NUS_SERVICE = "6e400001-b5a3-f393-e0a9-e50e24dcca9e"
NUS_RX = "6e400002-b5a3-f393-e0a9-e50e24dcca9e"
NUS_TX = "6e400003-b5a3-f393-e0a9-e50e24dcca9e"


class Central:
    def __init__(self):
        self.buffer = bytearray()
        self.replies = []  # bytes, oldest first
        self.piece = b""


def frame_server(bench, adapter, push=False):
    app = Application(bench)
    chrc = app.add_service(SEED_SERVICE).add_characteristic(SEED_CHAR)
    centrals = {}

    def on_write(central, data, options):
        state = centrals.setdefault(central, Central())
        state.buffer += data
        while len(state.buffer) >= 8:
            size = int(bytes(state.buffer[1:8]))
            if len(state.buffer) < 8 + size:
                break
            body = bytes(state.buffer[8:8 + size])
            del state.buffer[:8 + size]
            reply = b"T%07d" % len(body) + body
            if push:
                n = min(int(options.get("mtu", 23)) - 3, 512)
                for i in range(0, len(reply), n):
                    chrc.notify(reply[i:i + n])
            else:
                state.replies.append(reply)
                chrc.notify(b"N0000000")

    def on_read(central, options):
        state = centrals.setdefault(central, Central())
        offset = int(options.get("offset", 0))
        if offset:
            return state.piece  # the characteristic slices it at the offset
        if not state.replies:
            state.piece = b""
            return b""
        n = min(int(options.get("mtu", 23)) - 3, 512)
        state.piece, state.replies[0] = state.replies[0][:n], state.replies[0][n:]
        if not state.replies[0]:
            state.replies.pop(0)
        return state.piece

    chrc.on_write = on_write
    chrc.on_read = on_read
    app.register(adapter)
    adv = Advertisement(bench, [SEED_SERVICE], "pyecho")
    adv.register(adapter)
    return app, adv


def bulk_server(bench, adapter, total, signals=False):
    app = Application(bench)
    service = app.add_service(NUS_SERVICE)
    rx = service.add_characteristic(NUS_RX, ("write", "write-without-response"))
    # Notified through bluetoothd's socket (AcquireNotify), as blserve's raw mode does.
    tx = service.add_characteristic(NUS_TX, ("read", "notify"), acquire_notify=not signals)
    received = [0, hashlib.sha256()]

    def on_write(central, data, options):
        if data == b"GO":
            mtu = int(options.get("mtu", 23))
            piece = min(mtu - 5, 512)
            data = payload(total)
            for i in range(0, total, piece):
                tx.notify(data[i:i + piece])
            return
        received[0] += len(data)
        received[1].update(data)
        if received[0] >= total:
            tx.notify(b"done " + received[1].hexdigest().encode())
            received[0], received[1] = 0, hashlib.sha256()

    rx.on_write = on_write
    tx.on_read = lambda central, options: b"%d" % received[0]
    app.register(adapter)
    adv = Advertisement(bench, [NUS_SERVICE], "pybulk")
    adv.register(adapter)
    return app, adv


def main():
    adapter_name, mode = sys.argv[1], sys.argv[2]
    bench = Bench()
    adapter = Adapter(bench, adapter_name)
    if mode == "frame":
        keep = frame_server(bench, adapter, push=sys.argv[3:4] == ["push"])
    elif mode == "bulk":
        keep = bulk_server(bench, adapter, int(sys.argv[3]), signals=sys.argv[4:5] == ["signals"])
    else:
        sys.exit("mode must be frame or bulk")
    print("ready", flush=True)
    loop = GLib.MainLoop()
    signal.signal(signal.SIGTERM, lambda *_: loop.quit())
    signal.signal(signal.SIGINT, lambda *_: loop.quit())
    # Let Python see the signals while GLib waits.
    GLib.timeout_add(200, lambda: True)
    loop.run()
    del keep


if __name__ == "__main__":
    main()
