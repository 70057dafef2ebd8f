#!/usr/bin/python3
"""wait_subscribed.py ADAPTER ADDRESS CHAR_UUID [TIMEOUT]: exit 0 once a client on ADAPTER has
subscribed to the characteristic CHAR_UUID of device ADDRESS (NotifyAcquired or Notifying true),
1 after TIMEOUT seconds (default 30)."""
import sys
import time

import dbus

adapter, address, uuid = sys.argv[1], sys.argv[2].upper(), sys.argv[3].lower()
timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0
if len(uuid) == 4:
    uuid = "0000%s-0000-1000-8000-00805f9b34fb" % uuid
prefix = "/org/bluez/%s/dev_%s/" % (adapter, address.replace(":", "_"))
bus = dbus.SystemBus()
manager = dbus.Interface(bus.get_object("org.bluez", "/"), "org.freedesktop.DBus.ObjectManager")
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    for path, interfaces in manager.GetManagedObjects().items():
        chrc = interfaces.get("org.bluez.GattCharacteristic1")
        if path.startswith(prefix) and chrc and str(chrc.get("UUID", "")).lower() == uuid:
            if chrc.get("NotifyAcquired", False) or chrc.get("Notifying", False):
                sys.exit(0)
    time.sleep(0.1)
sys.exit(1)
