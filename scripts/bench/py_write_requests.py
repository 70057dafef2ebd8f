#!/usr/bin/python3
"""py_write_requests.py FILE [CHUNK]: the reference client of scripts/bench-calls. Writes FILE to
the characteristic of scripts/bench/fake_bluetoothd.py's peripheral mode in CHUNK-byte pieces
(default 510) with WriteValue(type=request), one after the other as a BlueZ client must (python3-dbus,
each value passed as one byte string), then reads back how many bytes arrived. Prints one JSON
line: the writes made, the wall-clock and the CPU seconds of this process over them."""
import json
import sys
import time

import dbus

CHRC = "/org/bluez/hci0/dev_00_00_00_00_00_01/service0010/char0011"
data = open(sys.argv[1], "rb").read()
chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 510
chrc = dbus.Interface(dbus.SystemBus().get_object("org.bluez", CHRC), "org.bluez.GattCharacteristic1")
options = dbus.Dictionary({"type": "request"}, signature="sv")
t0, c0 = time.monotonic(), time.process_time()
writes = 0
for i in range(0, len(data), chunk):
    chrc.WriteValue(dbus.ByteArray(data[i:i + chunk]), options)
    writes += 1
wall, cpu = time.monotonic() - t0, time.process_time() - c0
got = int(bytes(chrc.ReadValue({}, byte_arrays=True)))
if got != len(data):
    sys.exit("py_write_requests: the peripheral got %d of %d bytes" % (got, len(data)))
print(json.dumps({"writes": writes, "wall": wall, "cpu": cpu}))
