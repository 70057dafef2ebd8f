#!/usr/bin/python3
"""A stand-in for bluetoothd on a private bus, for scripts/bench-calls only (tests on the bench use
the real one). It owns org.bluez with adapter hci0 and one connected central, takes a GATT
application's registration the way bluetoothd does (GetManagedObjects before the reply), then calls
the application's characteristic the way bluetoothd does for that central, and measures.

  fake_bluetoothd.py requests N      N seed-protocol requests (a T frame with a 10-byte body written, the
                                     doorbell awaited, the reply read until a read comes back
                                     empty, as the seed client does), one after the other
  fake_bluetoothd.py commands N SIZE N write commands of SIZE bytes (no reply expected), then a
                                     Ping to the application, which it answers after all of them
  fake_bluetoothd.py peripheral      the other side: the connected device is a peripheral with
                                     service fff0 and characteristic fff1 (read, write), whose
                                     WriteValue answers at once, for a central tool to write to

Prints "ready" once it owns org.bluez, then (not in peripheral mode) one JSON line with the round-trip times (requests) and
the CPU seconds the application's process ("cpu") and its reaped children ("children") used
during the calls."""
import json
import os
import sys
import time

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)

ADAPTER = "/org/bluez/hci0"
DEVICE = ADAPTER + "/dev_00_00_00_00_00_01"
CHRC_IFACE = "org.bluez.GattCharacteristic1"
PROPS_IFACE = "org.freedesktop.DBus.Properties"
OPTIONS = {"device": dbus.ObjectPath(DEVICE), "mtu": dbus.UInt16(517), "link": "LE"}

bus = dbus.SystemBus()
loop = GLib.MainLoop()
mode = sys.argv[1]
count = int(sys.argv[2]) if mode != "peripheral" else 0
app = {}


def fail(text):
    print("fake_bluetoothd: " + text, file=sys.stderr, flush=True)
    os._exit(1)


def cpu_seconds(pid):
    """(own, children): the CPU seconds of pid's threads (scheduler statistics, to the nanosecond)
    and of its reaped children (cutime + cstime, in clock ticks)."""
    own = 0
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/schedstat" % (pid, task)) as f:
            own += int(f.read().split()[0])
    with open("/proc/%d/stat" % pid) as f:
        fields = [int(x) for x in f.read().rsplit(")", 1)[1].split()[13:15]]
    return own / 1e9, sum(fields) / os.sysconf("SC_CLK_TCK")


adapter_props = {"Address": "00:AA:01:00:00:00", "Name": "fake", "Alias": "fake", "Powered": True,
                 "Discoverable": False, "Discovering": False, "UUIDs": dbus.Array([], signature="s")}
device_props = {"Address": "00:00:00:00:00:01", "Adapter": dbus.ObjectPath(ADAPTER), "Connected": True,
                "Name": "central", "Alias": "central", "ServicesResolved": True}


# peripheral mode: the device's GATT database as bluetoothd presents a remote one.
SERVICE = DEVICE + "/service0010"
REMOTE_CHRC = SERVICE + "/char0011"
service_props = {"UUID": "0000fff0-0000-1000-8000-00805f9b34fb", "Primary": True, "Device": dbus.ObjectPath(DEVICE)}
remote_chrc_props = {"UUID": "0000fff1-0000-1000-8000-00805f9b34fb", "Service": dbus.ObjectPath(SERVICE),
                     "Flags": dbus.Array(["read", "write"], signature="s"), "MTU": dbus.UInt16(517),
                     "Value": dbus.Array([], signature="y")}


class Root(dbus.service.Object):
    @dbus.service.method("org.freedesktop.DBus.ObjectManager", out_signature="a{oa{sa{sv}}}")
    def GetManagedObjects(self):
        objects = {dbus.ObjectPath(ADAPTER): {"org.bluez.Adapter1": adapter_props, "org.bluez.GattManager1": {},
                                              "org.bluez.LEAdvertisingManager1": {}},
                   dbus.ObjectPath(DEVICE): {"org.bluez.Device1": device_props}}
        if mode == "peripheral":
            objects[dbus.ObjectPath(SERVICE)] = {"org.bluez.GattService1": service_props}
            objects[dbus.ObjectPath(REMOTE_CHRC)] = {CHRC_IFACE: remote_chrc_props}
        return objects


class Props(dbus.service.Object):
    def __init__(self, path, iface, props):
        super().__init__(bus, path)
        self.iface, self.props = iface, props

    @dbus.service.method(PROPS_IFACE, in_signature="ss", out_signature="v")
    def Get(self, iface, name):
        return self.props[name]

    @dbus.service.method(PROPS_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, iface):
        return self.props if iface == self.iface else {}

    @dbus.service.method(PROPS_IFACE, in_signature="ssv")
    def Set(self, iface, name, value):
        self.props[name] = value


class Adapter(Props):
    def __init__(self):
        super().__init__(ADAPTER, "org.bluez.Adapter1", adapter_props)

    @dbus.service.method("org.bluez.GattManager1", in_signature="oa{sv}", sender_keyword="sender",
                         async_callbacks=("ok", "err"))
    def RegisterApplication(self, path, options, sender=None, ok=None, err=None):
        def got(objects):
            app.update(sender=sender, objects=objects)
            ok()
            GLib.timeout_add(500, start)
        bus.get_object(sender, path).GetManagedObjects(dbus_interface="org.freedesktop.DBus.ObjectManager",
                                                       reply_handler=got, error_handler=lambda e: err(e))

    @dbus.service.method("org.bluez.GattManager1", in_signature="o")
    def UnregisterApplication(self, path):
        pass

    @dbus.service.method("org.bluez.LEAdvertisingManager1", in_signature="oa{sv}")
    def RegisterAdvertisement(self, path, options):
        pass

    @dbus.service.method("org.bluez.LEAdvertisingManager1", in_signature="o")
    def UnregisterAdvertisement(self, path):
        pass


class RemoteCharacteristic(Props):
    """A characteristic of the connected peripheral: writes are taken at once, reads say how many
    bytes were written."""

    def __init__(self):
        super().__init__(REMOTE_CHRC, CHRC_IFACE, remote_chrc_props)
        self.received = 0

    @dbus.service.method(CHRC_IFACE, in_signature="aya{sv}", byte_arrays=True)
    def WriteValue(self, value, options):
        self.received += len(value)

    @dbus.service.method(CHRC_IFACE, in_signature="a{sv}", out_signature="ay", byte_arrays=True)
    def ReadValue(self, options):
        return dbus.ByteArray(b"%d" % self.received)


def characteristic(flag):
    for path, interfaces in app["objects"].items():
        chrc = interfaces.get(CHRC_IFACE)
        if chrc is not None and flag in chrc["Flags"]:
            return path
    fail("the application has no characteristic with " + flag)


def start():
    sender = app["sender"]
    pid = int(bus.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus").GetConnectionUnixProcessID(
        sender, dbus_interface="org.freedesktop.DBus"))
    app["cpu0"] = cpu_seconds(pid)
    app["pid"] = pid
    app["t0"] = time.monotonic()
    if mode == "requests":
        Requests(sender, characteristic("write"), characteristic("notify")).next()
    else:
        commands(sender, characteristic("write-without-response"), int(sys.argv[3]))
    return False


def report(extra):
    own, children = cpu_seconds(app["pid"])
    extra.update(calls=count, cpu=own - app["cpu0"][0], children=children - app["cpu0"][1],
                 wall=time.monotonic() - app["t0"])
    print(json.dumps(extra), flush=True)
    loop.quit()


def commands(sender, path, size):
    value = dbus.Array(os.urandom(size), signature="y")
    for _ in range(count):
        message = dbus.lowlevel.MethodCallMessage(sender, path, CHRC_IFACE, "WriteValue")
        message.append(value, dbus.Dictionary(OPTIONS, signature="sv"), signature="aya{sv}")
        message.set_no_reply(True)
        bus.send_message(message)
    # The application handles its calls in order: the Ping's reply comes after the last write.
    bus.get_object(sender, "/").Ping(dbus_interface="org.freedesktop.DBus.Peer", timeout=600)
    report({})


class Requests:
    """One request at a time: write, then read once a doorbell has come (it may come before the
    write's reply), until the whole reply frame is in."""

    def __init__(self, sender, write_path, notify_path):
        self.write = bus.get_object(sender, write_path)
        self.read = bus.get_object(sender, notify_path)
        self.doorbells = 0
        self.waiting = False
        self.complete = False
        self.times = []
        bus.add_signal_receiver(self.changed, "PropertiesChanged", PROPS_IFACE, sender, notify_path)
        self.read.StartNotify(dbus_interface=CHRC_IFACE)

    def next(self):
        if len(self.times) == count:
            self.times.sort()
            report({"median_ms": self.times[len(self.times) // 2] * 1000,
                    "p95_ms": self.times[int(len(self.times) * 0.95)] * 1000})
            return
        self.reply = b""
        self.t0 = time.monotonic()
        frame = dbus.Array(b"T0000010" + b"0123456789", signature="y")
        self.write.WriteValue(frame, OPTIONS, dbus_interface=CHRC_IFACE,
                              reply_handler=self.written, error_handler=lambda e: fail("WriteValue: %s" % e))

    def changed(self, iface, changed, invalidated):
        if "Value" in changed:
            self.doorbells += 1
            self.pull()

    def written(self):
        self.waiting = True
        self.pull()

    def pull(self):
        if not self.waiting or self.doorbells == 0:
            return
        self.doorbells -= 1
        self.read.ReadValue(OPTIONS, dbus_interface=CHRC_IFACE, reply_handler=self.got,
                            error_handler=lambda e: fail("ReadValue: %s" % e))

    def got(self, value):
        if not value:
            if self.complete:  # the read that ends the chain, as the seed client reads
                self.complete = False
                self.times.append(time.monotonic() - self.t0)
                self.next()
            return  # else a doorbell for nothing of ours: wait for the next one
        self.reply += bytes(value)
        if len(self.reply) >= 8 and len(self.reply) >= 8 + int(self.reply[1:8]):
            if self.reply != b"T0000010" + b"0123456789":
                fail("wrong reply %r" % self.reply)
            # The seed client reads until a read comes back empty; blserve holds its next
            # doorbell back until a central has ended its chain of reads.
            self.waiting = False
            self.complete = True
            self.read.ReadValue(OPTIONS, dbus_interface=CHRC_IFACE, reply_handler=self.got,
                                error_handler=lambda e: fail("ReadValue: %s" % e))
        else:
            self.doorbells += 1  # the rest of this reply is still queued
            self.pull()


name = dbus.service.BusName("org.bluez", bus)
Root(bus, "/")
Adapter()
Props(DEVICE, "org.bluez.Device1", device_props)
if mode == "peripheral":
    Props(SERVICE, "org.bluez.GattService1", service_props)
    RemoteCharacteristic()
print("ready", flush=True)
loop.run()
