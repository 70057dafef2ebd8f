#!/usr/bin/python3
"""blserve_connect.py ADAPTER ADDRESS SERVICE_UUID CHAR_UUID: connect ADAPTER to the peripheral
ADDRESS (forgetting it first, then scanning for SERVICE_UUID) with python3-dbus, and wait until
its services are resolved and CHAR_UUID is listed; print the device's object path.

Why: bleak waits for the ServicesResolved *signal*, which bluetoothd on this bench does not
always send (bluez-notes §9.5); every bleak connection to blserve in the first bench runs timed
out that way. bench.py reads the property instead. bleak then attaches to the connected device
(BlueZ's Connect on a connected device returns at once, and bleak's object cache already shows
the services resolved)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Adapter, Bench  # noqa: E402

adapter_name, address, service, char = sys.argv[1:5]
bench = Bench()
adapter = Adapter(bench, adapter_name)
adapter.remove_device(address)
device = adapter.find(address, service, timeout=30)
device.connect(timeout=60)
device.characteristic(service, char, timeout=20)
print(device.path, flush=True)
