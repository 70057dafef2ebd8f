"""Central side of scripts/bench-blserve, with bleak (run with the bleak venv's python).

  blserve_bench.py latency ADAPTER ADDRESS COUNT [PAUSE]
      COUNT requests of a 10-byte T frame (T0000002hi), each written as the seed client does and
      answered through the doorbell and reads; prints one JSON line with every latency (seconds).
      With PAUSE (seconds), each request after a reply waits that long first, as a person using
      the app would: the latency of a request made to an idle server, not one of a stream.
  blserve_bench.py bulk ADAPTER ADDRESS SIZE [down]
      NUS layout: writes SIZE random bytes to RX with write commands and waits for the notification
      "done SHA256HEX" (checked against the bytes sent); then writes "GO" and collects SIZE bytes of
      notifications from TX (checked against benchlog.payload). Notifications come through
      AcquireNotify's socket, as blrecv takes them. Prints one JSON line with both durations
      (seconds, from the first write to the last byte). With down, only the download."""
import asyncio
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blserve_client import MAX_PIECE, NUS_RX, NUS_SERVICE, NUS_TX, SeedClient, check, connect_bleak, fail, run  # noqa: E402
from benchlog import payload  # noqa: E402


async def latency(adapter, address, count, pause=0.0):
    client = SeedClient(adapter, address)
    await client.connect()
    times = []
    try:
        for i in range(count + 3):
            if pause:
                await asyncio.sleep(pause)
            start = time.monotonic()
            code, body = await client.request("T", "hi", timeout=30)
            took = time.monotonic() - start
            check(code == "T" and body.endswith(b"hi"), "request %d: got %s %r" % (i, code, body))
            if i >= 3:  # the first requests warm up caches on both sides
                times.append(took)
    finally:
        await client.disconnect()
    print(json.dumps({"latencies": times}), flush=True)


LIMIT = 300  # seconds each way of bulk may take


STALL = 15  # seconds without progress that end a wait given a progress measure


async def wait_for(event, failure, progress=None):
    """Waits LIMIT seconds at most for EVENT; else exits saying FAILURE (a string, or a function
    giving one, called then). With PROGRESS (a function giving a count that grows while things
    go well), it also exits once that count has not grown for STALL seconds: the Python
    peripheral notifies without flow control, and bluetoothd drops a notification that the
    central's socket has no room for (its log: "notify_io_cb() sendmsg: Resource temporarily
    unavailable"), so a central slower than the stream can lose bytes for good."""
    deadline = time.monotonic() + LIMIT
    seen, since = None, time.monotonic()
    while not event.is_set():
        now = time.monotonic()
        count = progress() if progress else None
        if count != seen:
            seen, since = count, now
        stalled = progress is not None and now - since >= STALL
        if stalled or now >= deadline:
            why = failure() if callable(failure) else failure
            fail("%s; nothing more for %.0f s (lost)" % (why, now - since) if stalled else why)
        try:
            await asyncio.wait_for(event.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def bulk(adapter, address, size, up=True):
    data = os.urandom(size)
    received = bytearray()
    done = asyncio.Event()
    full = asyncio.Event()
    mode = ["upload"]
    digest = [b""]

    def on_notify(_char, value):
        if mode[0] == "upload":
            if bytes(value).startswith(b"done "):
                digest[0] = bytes(value)[5:]
                done.set()
            return
        received.extend(value)
        if len(received) >= size:
            full.set()

    client = await connect_bleak(adapter, address, NUS_SERVICE, NUS_RX)
    try:
        rx = client.services.get_characteristic(NUS_RX)
        tx = client.services.get_characteristic(NUS_TX)
        await client.start_notify(tx, on_notify, bluez={"use_start_notify": False})
        piece = min(rx.max_write_without_response_size, MAX_PIECE)
        upload = None
        if up:
            start = time.monotonic()
            for i in range(0, size, piece):
                await client.write_gatt_char(rx, data[i:i + piece], response=False)
            await wait_for(done, "upload: no \"done\" from the peripheral within %d s" % LIMIT)
            upload = time.monotonic() - start
        mode[0] = "download"
        start = time.monotonic()
        await client.write_gatt_char(rx, b"GO", response=False)
        await wait_for(full, lambda: "download: got %d of %d bytes" % (len(received), size), progress=lambda: len(received))
        download = time.monotonic() - start
        await asyncio.sleep(0.5)  # anything beyond SIZE would show now
    finally:
        await client.disconnect()
    check(not up or digest[0] == hashlib.sha256(data).hexdigest().encode(), "upload: the peripheral got other bytes")
    check(bytes(received) == payload(size), "download: got %d bytes, not the %d sent" % (len(received), size))
    print(json.dumps({"upload": upload, "download": download, "piece": piece, "bytes": len(received)}), flush=True)


def main():
    what, adapter, address, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if what == "latency":
        pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
        run(latency(adapter, address, n, pause), 900 + (n + 3) * pause)
    elif what == "bulk":
        run(bulk(adapter, address, n, up=sys.argv[5:6] != ["down"]), 900)
    else:
        sys.exit("latency or bulk")


if __name__ == "__main__":
    main()
