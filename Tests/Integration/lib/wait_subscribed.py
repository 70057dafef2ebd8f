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


def find_characteristic():
    for path, interfaces in manager.GetManagedObjects().items():
        chrc = interfaces.get("org.bluez.GattCharacteristic1")
        if path.startswith(prefix) and chrc and str(chrc.get("UUID", "")).lower() == uuid:
            return path
    return None


# The whole object tree only until the characteristic is there (bluetoothd builds all of it for
# every call, which under TCG costs what a poll should not); then its own properties.
path = None
while time.monotonic() < deadline:
    if path is None:
        path = find_characteristic()
        if path is None:
            time.sleep(0.25)
            continue
    try:
        props = dbus.Interface(bus.get_object("org.bluez", path), "org.freedesktop.DBus.Properties") \
            .GetAll("org.bluez.GattCharacteristic1")
    except dbus.DBusException:
        path = None  # gone (disconnected, or its services resolved again): look it up again
        continue
    if props.get("NotifyAcquired", False) or props.get("Notifying", False):
        sys.exit(0)
    time.sleep(0.1)
sys.exit(1)
