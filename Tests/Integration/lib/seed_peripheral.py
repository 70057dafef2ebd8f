#!/usr/bin/python3
"""Peripherals that reproduce the seed articles' servers, for testing the central tools
(blsend, blrecv, blscan) against code this project did not write in Swift.

    seed_peripheral.py MODE ADAPTER NAME

MODE:
  000   RaspBLE (seed 000): service 54f06857-…, one read/write/notify characteristic. Writes
        of each central are reassembled into frames; a T frame is answered with the Japanese
        "you said" sentence, a U frame by downloading the URL (an image becomes an I frame,
        anything else a T frame with an error text). The reply is queued for that central,
        the doorbell N0000000 is notified, and each read returns the next piece (at most
        min(MTU-3, 512) bytes) of the oldest reply, or an empty value. With
        BL_SEED000_READ_DELAY=S every read is answered only after S seconds (a slow link).
  001   seed 001: read + notify characteristic notifying the Unix time every second; reads
        honour the offset (past the end: InvalidOffset).
  002   seed 002: on subscription, notifies TEXT in 20-byte pieces, then EOM.
  sink  a read/write/write-without-response characteristic that appends every write to
        $BL_SINK (a file); reads return the sha256 hex digest of what was written so far.
        With BL_SINK_ACQUIRE=1 it takes the writes through AcquireWrite's socket rather
        than a WriteValue call per write, so it is not what limits a client's rate.
  flood a notify characteristic (service fff0, characteristic fff2): when a central subscribes,
        notifies the bytes of $BL_FLOOD in 500-byte pieces as fast as bluetoothd takes them,
        then EOM. With BL_FLOOD_RATE=N, N notifications a second at most (in bursts of a
        tenth of that every 100 ms).

Prints "ready" on stdout once the application and the advertisement are registered, then
serves until SIGTERM/SIGINT. SIGUSR1 withdraws the advertisement (the application stays, and
so do the links already made) and prints "advertising stopped": a peripheral that stops
advertising once connected, as many do.
"""
import hashlib
import os
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbus  # noqa: E402
from bench import Adapter, Advertisement, Application, Bench, log  # noqa: E402
from gi.repository import GLib  # noqa: E402

RASPBLE_SERVICE = "54f06857-695e-47e4-aea8-c78184ad6c75"
RASPBLE_CHAR = "30a5f1bb-61dc-45f0-9c52-2218d080fa77"
SEED001_SERVICE = "bf9cb85f-620c-4a67-bdd2-1a64213f74ca"
SEED001_CHAR = "5f83e23f-bca1-42b3-b6f2-ea82be46a93d"
SEED002_SERVICE = "e20a39f4-73f5-4bc4-a12f-17d1ad07a961"
SEED002_CHAR = "08590f7e-db05-467e-8757-72f6faeb13d4"
SINK_SERVICE = "0000fff0-0000-1000-8000-00805f9b34fb"
SINK_CHAR = "0000fff1-0000-1000-8000-00805f9b34fb"
FLOOD_CHAR = "0000fff2-0000-1000-8000-00805f9b34fb"
SEED002_TEXT = (b"Lorem ipsum dolor sit amet, consectetur adipiscing elit. The quick brown fox "
                b"jumps over the lazy dog, and the seed 002 central collects it until EOM.")


class FrameReassembler:
    """The seed server's per-central frame parser (skips bytes that are not N/T/U/I)."""

    def __init__(self):
        self.buf = b""

    def feed(self, data):
        self.buf += data
        frames = []
        while True:
            while self.buf and self.buf[:1] not in (b"N", b"T", b"U", b"I"):
                self.buf = self.buf[1:]
            if len(self.buf) < 8 or not self.buf[1:8].isdigit():
                return frames
            size = int(self.buf[1:8])
            if len(self.buf) < 8 + size:
                return frames
            frames.append((self.buf[:1].decode(), self.buf[8:8 + size]))
            self.buf = self.buf[8 + size:]


def frame(code, body):
    return code.encode() + b"%07d" % len(body) + body


def seed000_reply(code, body):
    if code == "T":
        return frame("T", "あなたは「{}」と言いました".format(body.decode("utf-8", "replace")).encode())
    if code == "U":
        url = body.decode("utf-8", "replace")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                data = response.read()
                kind = response.headers.get("Content-Type", "")
            if kind.startswith("image/"):
                return frame("I", data)
            return frame("T", ("error: not an image: " + kind).encode())
        except Exception as exc:  # the seed server answers every failure with a text
            return frame("T", ("error: " + str(exc)).encode())
    return None


def send_on_subscribe(chrc, data, piece, rate=None):
    """Each time a central subscribes, notify `data` in `piece`-byte notifications as fast as
    bluetoothd takes them (or `rate` a second at most), then EOM (the seed 002 pattern)."""
    pieces = [data[i:i + piece] for i in range(0, len(data), piece)] + [b"EOM"]

    def send():
        if rate is None:
            for value in pieces:
                chrc.notify(value)
            return False
        burst = max(1, rate // 10)
        state = {"next": 0}

        def tick():
            start = state["next"]
            for value in pieces[start:start + burst]:
                chrc.notify(value)
            state["next"] = start + burst
            return state["next"] < len(pieces)
        if tick():
            GLib.timeout_add(100, tick)
        return False

    def watch():
        if chrc.notifying and not getattr(chrc, "sent", False):
            chrc.sent = True
            GLib.timeout_add(300, send)
        if not chrc.notifying:
            chrc.sent = False
        return True

    GLib.timeout_add(50, watch)


def main():
    mode, adapter_name, name = sys.argv[1], sys.argv[2], sys.argv[3]
    bench = Bench()
    adapter = Adapter(bench, adapter_name)
    app = Application(bench)

    if mode == "000":
        service_uuid = RASPBLE_SERVICE
        chrc = app.add_service(RASPBLE_SERVICE).add_characteristic(RASPBLE_CHAR, ("read", "write", "notify"))
        parsers, queues, pieces = {}, {}, {}
        # BL_SEED000_WRITES=FILE: every value written is appended to FILE, one line each (hex).
        writes_path = os.environ.get("BL_SEED000_WRITES")
        writes = open(writes_path, "a") if writes_path else None

        def on_write(central, data, options):
            offset = int(options.get("offset", 0))
            if offset:
                log("write at offset", offset, "from", central)
            if writes:
                writes.write(bytes(data).hex() + "\n")
                writes.flush()
            for code, body in parsers.setdefault(central, FrameReassembler()).feed(data):
                reply = seed000_reply(code, body)
                if reply is not None:
                    queues.setdefault(central, []).append(reply)
                    chrc.notify(b"N0000000")

        read_delay = float(os.environ.get("BL_SEED000_READ_DELAY", "0"))

        def on_read(central, options):
            offset = int(options.get("offset", 0))
            mtu = int(options.get("mtu", 23))
            if read_delay:
                time.sleep(read_delay)
            if offset == 0:
                queue = queues.get(central, [])
                if not queue:
                    pieces[central] = b""
                else:
                    size = min(mtu - 3, 512)
                    pieces[central] = queue[0][:size]
                    queue[0] = queue[0][size:]
                    if not queue[0]:
                        queue.pop(0)
            return pieces.get(central, b"")

        chrc.on_write, chrc.on_read = on_write, on_read

    elif mode == "001":
        service_uuid = SEED001_SERVICE
        chrc = app.add_service(SEED001_SERVICE).add_characteristic(SEED001_CHAR, ("read", "notify"))
        long_value = os.environ.get("BL_SEED001_LONG") == "1"

        def current():
            value = str(int(time.time())).encode()
            return value + b"." * (512 - len(value)) if long_value else value

        def on_read(central, options):
            value = current()
            offset = int(options.get("offset", 0))
            if offset > len(value):
                raise dbus.DBusException("offset past the end", name="org.bluez.Error.InvalidOffset")
            return value

        chrc.on_read = on_read

        def tick():
            if chrc.notifying:
                chrc.notify(str(int(time.time())).encode())
            return True

        GLib.timeout_add(1000, tick)

    elif mode == "002":
        service_uuid = SEED002_SERVICE
        chrc = app.add_service(SEED002_SERVICE).add_characteristic(SEED002_CHAR, ("read", "notify"))
        send_on_subscribe(chrc, SEED002_TEXT, 20)

    elif mode == "sink":
        service_uuid = SINK_SERVICE
        chrc = app.add_service(SINK_SERVICE).add_characteristic(
            SINK_CHAR, ("read", "write", "write-without-response", "notify"),
            acquire_write=os.environ.get("BL_SINK_ACQUIRE") == "1")
        sink_path = os.environ["BL_SINK"]
        digest = hashlib.sha256()
        sink = open(sink_path, "wb")

        paths = {"socket": 0, "WriteValue": 0}
        # BL_SINK_WRITES=FILE: each value written is appended to FILE as a line of hex.
        sink_writes_path = os.environ.get("BL_SINK_WRITES")
        sink_writes = open(sink_writes_path, "a") if sink_writes_path else None

        def on_write(central, data, options):
            sink.write(data)
            sink.flush()
            if sink_writes:
                sink_writes.write(bytes(data).hex() + "\n")
                sink_writes.flush()
            digest.update(data)
            paths["WriteValue" if options else "socket"] += 1

        chrc.on_write = on_write
        chrc.on_read = lambda central, options: digest.copy().hexdigest().encode()
    elif mode == "flood":
        service_uuid = SINK_SERVICE
        chrc = app.add_service(SINK_SERVICE).add_characteristic(FLOOD_CHAR, ("notify",))
        rate = os.environ.get("BL_FLOOD_RATE")
        send_on_subscribe(chrc, open(os.environ["BL_FLOOD"], "rb").read(), 500, int(rate) if rate else None)
    else:
        sys.exit("unknown mode " + mode)

    app.register(adapter)
    adv = Advertisement(bench, [service_uuid], name)
    adv.register(adapter)
    print("ready", flush=True)
    loop = GLib.MainLoop()
    for signo in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signo, loop.quit)

    def stop_advertising():
        adv.unregister()
        print("advertising stopped", flush=True)
        return True

    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGUSR1, stop_advertising)
    loop.run()
    if mode == "sink":
        log("sink: %(socket)d writes through the acquired socket, %(WriteValue)d through WriteValue" % paths)


if __name__ == "__main__":
    main()
