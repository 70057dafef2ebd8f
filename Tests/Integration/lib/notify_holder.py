#!/usr/bin/python3
"""Another client of a characteristic: connects ADAPTER to ADDRESS (unless the link is up),
subscribes with StartNotify, prints "subscribed" and keeps the subscription for up to 600 s.

    notify_holder.py ADAPTER ADDRESS SERVICE_UUID CHAR_UUID

Holding the subscription first makes a later blrecv (or blsend --reply) get no notification
socket from bluetoothd (AcquireNotify: InProgress) and subscribe with StartNotify too.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Adapter, Bench, pump  # noqa: E402

adapter_name, address, service, char = sys.argv[1:5]
bench = Bench()
device = Adapter(bench, adapter_name).find(address, timeout=20)
if not device.connected():
    device.connect()
device.characteristic(service, char).start_notify()
print("subscribed", flush=True)
pump(600)
