#!/usr/bin/python3
"""blserve_connect.py ADAPTER ADDRESS SERVICE_UUID CHAR_UUID: connect ADAPTER to the peripheral
ADDRESS (forgetting it first, then scanning for SERVICE_UUID) with python3-dbus, and wait until
its services are resolved and CHAR_UUID is listed; print the device's object path.

Test 62 uses it to make a link that blsend then finds up. The bleak centrals link the same way
inside their own process (blserve_client.link(), over dbus-fast): a process of this kind costs
seconds of the emulated CPU to start."""
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
