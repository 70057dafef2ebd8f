"""Helpers for the integration tests on the virtual-controller bench.

Everything talks to the real bluetoothd on the system bus (python3-dbus with the GLib main
loop; run with /usr/bin/python3). Every wait is bounded and raises BenchError with a
sentence saying what did not happen.

The bench (scripts/bench/vm-run) exports BL_ADAPTER_A, BL_ADAPTER_B, ... (hciN names),
BL_ADDR_A, BL_ADDR_B, ... (their addresses) and BL_BENCH_OUT (the output directory).
"""

import collections
import os
import socket
import sys
import time
import traceback
import uuid as _uuid

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

from benchlog import check, fail, log  # noqa: F401 (the tests import them from here too)

dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)

BLUEZ = "org.bluez"
OM_IFACE = "org.freedesktop.DBus.ObjectManager"
PROPS_IFACE = "org.freedesktop.DBus.Properties"
ADAPTER_IFACE = "org.bluez.Adapter1"
DEVICE_IFACE = "org.bluez.Device1"
SERVICE_IFACE = "org.bluez.GattService1"
CHRC_IFACE = "org.bluez.GattCharacteristic1"
GATT_MANAGER_IFACE = "org.bluez.GattManager1"
ADV_MANAGER_IFACE = "org.bluez.LEAdvertisingManager1"
ADV_IFACE = "org.bluez.LEAdvertisement1"


class BenchError(Exception):
    """A bench step did not happen as expected (the message says which)."""


def run(main):
    """Run a test's main(); a BenchError or D-Bus error ends it with status 1 and a
    one-line reason (the traceback follows, for debugging)."""
    try:
        main()
    except (BenchError, dbus.DBusException) as exc:
        log("FAILED:", exc)
        traceback.print_exc(file=sys.stdout)
        sys.exit(1)


def new_uuid():
    """A fresh 128-bit UUID, so nothing cached from another run can match."""
    return str(_uuid.uuid4())


# ---------------------------------------------------------------------------------------
# Main loop and calls

_ctx = GLib.MainContext.default()


def _iterate(seconds):
    """Dispatch main-loop events; returns after one event or after `seconds`."""
    fired = []
    source = GLib.timeout_add(max(1, int(seconds * 1000)), lambda: fired.append(1) and False)
    _ctx.iteration(True)
    if not fired:
        GLib.source_remove(source)


def pump(seconds):
    """Run the main loop for `seconds` (serves calls into our exported objects)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        _iterate(min(left, 0.1))


def wait_for(predicate, timeout, what, poll=None):
    """Run the main loop until predicate() returns something true; return it.

    `poll`, if given, is called about every 0.5 s (to re-read state that may change
    without a signal). Raises BenchError after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    next_poll = time.monotonic() + 0.5
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise BenchError("timed out after %gs waiting for %s" % (timeout, what))
        if poll is not None and now >= next_poll:
            poll()
            next_poll = now + 0.5
        _iterate(min(deadline - now, 0.05))


def call(method, *args, timeout=10.0, what=None):
    """Call a D-Bus proxy method asynchronously while the main loop runs.

    A blocking call would stall registrations, because bluetoothd calls back into this
    process before it answers (bluez-notes §0.7). Returns the reply (None, one value, or
    a tuple); raises dbus.DBusException for an error reply, BenchError on timeout.
    """
    result = {}

    def ok(*reply):
        result["ok"] = reply

    def err(error):
        result["err"] = error

    method(*args, reply_handler=ok, error_handler=err, timeout=timeout)
    name = what or getattr(method, "_method_name", "call")
    wait_for(lambda: result, timeout + 1.0, "the reply to %s" % name)
    if "err" in result:
        raise result["err"]
    reply = result["ok"]
    if not reply:
        return None
    return reply[0] if len(reply) == 1 else reply


def error_name(exc):
    return exc.get_dbus_name() if isinstance(exc, dbus.DBusException) else type(exc).__name__


# ---------------------------------------------------------------------------------------
# The bus and a mirror of bluetoothd's objects


class Bench:
    """One system-bus connection and a mirror of bluetoothd's object tree, kept current by
    InterfacesAdded/InterfacesRemoved/PropertiesChanged signals."""

    def __init__(self):
        self.bus = dbus.SystemBus()
        self.objects = {}
        self.prop_changes = []  # (time, path, interface, changed dict), for tests to inspect
        self.bus.add_signal_receiver(self._added, "InterfacesAdded", OM_IFACE, BLUEZ, "/")
        self.bus.add_signal_receiver(self._removed, "InterfacesRemoved", OM_IFACE, BLUEZ, "/")
        self.bus.add_signal_receiver(self._changed, "PropertiesChanged", PROPS_IFACE, BLUEZ,
                                     path_keyword="path")
        self.refresh()

    # signals
    def _added(self, path, interfaces):
        entry = self.objects.setdefault(str(path), {})
        for iface, props in interfaces.items():
            entry.setdefault(str(iface), {}).update(props)

    def _removed(self, path, interfaces):
        entry = self.objects.get(str(path))
        if entry is None:
            return
        for iface in interfaces:
            entry.pop(str(iface), None)
        if not entry:
            del self.objects[str(path)]

    def _changed(self, iface, changed, invalidated, path=None):
        entry = self.objects.get(str(path))
        if entry is None:
            return
        props = entry.setdefault(str(iface), {})
        props.update(changed)
        for name in invalidated:
            props.pop(str(name), None)
        self.prop_changes.append((time.monotonic(), str(path), str(iface), dict(changed)))

    def refresh(self):
        """Replace the mirror with a fresh GetManagedObjects."""
        manager = dbus.Interface(self.bus.get_object(BLUEZ, "/"), OM_IFACE)
        objects = call(manager.GetManagedObjects, timeout=20, what="GetManagedObjects")
        self.objects = {
            str(p): {str(i): dict(props) for i, props in ifaces.items()} for p, ifaces in objects.items()
        }

    def prop(self, path, iface, name, default=None):
        return self.objects.get(path, {}).get(iface, {}).get(name, default)

    def get(self, path, iface, name, timeout=10):
        """Read a property from bluetoothd (not the mirror) and update the mirror."""
        props = dbus.Interface(self.bus.get_object(BLUEZ, path), PROPS_IFACE)
        value = call(props.Get, iface, name, timeout=timeout, what="Get %s.%s" % (iface, name))
        self.objects.setdefault(path, {}).setdefault(iface, {})[name] = value
        return value

    def set(self, path, iface, name, value, timeout=10):
        props = dbus.Interface(self.bus.get_object(BLUEZ, path), PROPS_IFACE)
        call(props.Set, iface, name, value, timeout=timeout, what="Set %s.%s" % (iface, name))

    def adapter(self, letter):
        """The bench adapter BL_ADAPTER_<letter>."""
        name = os.environ.get("BL_ADAPTER_" + letter)
        if not name:
            raise BenchError("BL_ADAPTER_%s is not set: run under scripts/bench/vm-run "
                             "(with --adapters large enough)" % letter)
        return Adapter(self, name)

    def wait_prop(self, path, iface, name, value, timeout, what=None):
        """Wait until property `name` equals `value`, by signal or by re-reading it."""
        def poll():
            try:
                self.get(path, iface, name, timeout=5)
            except (dbus.DBusException, BenchError):
                pass
        return wait_for(lambda: self.prop(path, iface, name) == value or None, timeout,
                        what or "%s %s=%r" % (path, name, value), poll=poll) and True


# ---------------------------------------------------------------------------------------
# Central side: adapter, device, remote characteristic


class Adapter:
    def __init__(self, bench, name):
        self.bench = bench
        self.name = name
        self.path = "/org/bluez/" + name
        self.obj = bench.bus.get_object(BLUEZ, self.path)
        self.iface = dbus.Interface(self.obj, ADAPTER_IFACE)

    @property
    def address(self):
        return str(self.bench.get(self.path, ADAPTER_IFACE, "Address"))

    def powered(self):
        return bool(self.bench.get(self.path, ADAPTER_IFACE, "Powered"))

    def power_on(self, timeout=10):
        if not self.powered():
            self.bench.set(self.path, ADAPTER_IFACE, "Powered", dbus.Boolean(True), timeout=timeout)
        self.bench.wait_prop(self.path, ADAPTER_IFACE, "Powered", True, timeout,
                             "%s to be powered" % self.name)

    def device_path(self, address):
        return "%s/dev_%s" % (self.path, address.upper().replace(":", "_"))

    def set_discovery_filter(self, uuids=(), transport="le", **extra):
        flt = {"Transport": dbus.String(transport)}
        if uuids:
            flt["UUIDs"] = dbus.Array([dbus.String(u) for u in uuids], signature="s")
        flt.update(extra)
        call(self.iface.SetDiscoveryFilter, dbus.Dictionary(flt, signature="sv"),
             what="SetDiscoveryFilter on " + self.name)

    def start_discovery(self):
        call(self.iface.StartDiscovery, what="StartDiscovery on " + self.name)

    def stop_discovery(self):
        try:
            call(self.iface.StopDiscovery, what="StopDiscovery on " + self.name)
        except dbus.DBusException as exc:
            log("StopDiscovery on %s: %s" % (self.name, exc.get_dbus_message()))

    def remove_device(self, address):
        """RemoveDevice; no error if bluetoothd does not know the device."""
        path = self.device_path(address)
        try:
            call(self.iface.RemoveDevice, dbus.ObjectPath(path), timeout=15,
                 what="RemoveDevice %s on %s" % (address, self.name))
        except dbus.DBusException as exc:
            if error_name(exc) not in ("org.bluez.Error.DoesNotExist", "org.freedesktop.DBus.Error.UnknownObject",
                                       "org.bluez.Error.InvalidArguments"):
                raise
        wait_for(lambda: path not in self.bench.objects, 10, "%s to be removed from %s" % (address, self.name),
                 poll=self.bench.refresh)

    def discover(self, address, uuid=None, timeout=10):
        """Wait (discovery must be running) until the device with `address` is known to this
        adapter, and advertises `uuid` if given. Returns a Device."""
        path = self.device_path(address)

        def seen():
            if DEVICE_IFACE not in self.bench.objects.get(path, {}):
                return None
            if uuid is not None:
                uuids = [str(u).lower() for u in self.bench.prop(path, DEVICE_IFACE, "UUIDs", [])]
                if uuid.lower() not in uuids:
                    return None
            return Device(self.bench, path)

        what = "%s to see %s%s" % (self.name, address, " advertising " + uuid if uuid else "")
        return wait_for(seen, timeout, what)

    def find(self, address, uuid=None, timeout=10):
        """Start discovery (filtered on `uuid`), wait for the device, stop discovery."""
        self.set_discovery_filter([uuid] if uuid else [])
        self.start_discovery()
        try:
            return self.discover(address, uuid, timeout)
        finally:
            self.stop_discovery()


class Device:
    def __init__(self, bench, path):
        self.bench = bench
        self.path = path
        self.iface = dbus.Interface(bench.bus.get_object(BLUEZ, path), DEVICE_IFACE)

    def connected(self):
        return bool(self.bench.get(self.path, DEVICE_IFACE, "Connected"))

    def connect(self, timeout=40):
        """Connect and wait until services are resolved (both read back, not only signalled)."""
        call(self.iface.Connect, timeout=timeout, what="Connect " + self.path)
        self.bench.wait_prop(self.path, DEVICE_IFACE, "Connected", True, 10)
        self.bench.wait_prop(self.path, DEVICE_IFACE, "ServicesResolved", True, timeout)

    def disconnect(self, timeout=15):
        try:
            call(self.iface.Disconnect, timeout=timeout, what="Disconnect " + self.path)
        except dbus.DBusException as exc:
            if error_name(exc) != "org.bluez.Error.NotConnected":
                raise

    def characteristic(self, service_uuid, chrc_uuid, timeout=15):
        """Find the remote characteristic (re-reading the object tree, bounded)."""
        service_uuid, chrc_uuid = service_uuid.lower(), chrc_uuid.lower()

        def lookup():
            for path, ifaces in self.bench.objects.items():
                chrc = ifaces.get(CHRC_IFACE)
                if not path.startswith(self.path + "/") or chrc is None:
                    continue
                if str(chrc.get("UUID", "")).lower() != chrc_uuid:
                    continue
                service = str(chrc.get("Service", ""))
                if str(self.bench.prop(service, SERVICE_IFACE, "UUID", "")).lower() == service_uuid:
                    return RemoteCharacteristic(self.bench, path)
            return None

        return wait_for(lookup, timeout, "characteristic %s of service %s under %s" %
                        (chrc_uuid, service_uuid, self.path), poll=self.bench.refresh)


class RemoteCharacteristic:
    def __init__(self, bench, path):
        self.bench = bench
        self.path = path
        self.iface = dbus.Interface(bench.bus.get_object(BLUEZ, path), CHRC_IFACE)
        self.notifications = []
        self._receiver = None

    def mtu(self):
        return int(self.bench.get(self.path, CHRC_IFACE, "MTU"))

    def read(self, timeout=10):
        return bytes(call(self.iface.ReadValue, dbus.Dictionary({}, signature="sv"),
                          timeout=timeout, what="ReadValue " + self.path))

    def read_async(self, done):
        """Start a ReadValue; done(bytes or exception) is called from the main loop."""
        self.iface.ReadValue(dbus.Dictionary({}, signature="sv"), timeout=10,
                             reply_handler=lambda v: done(bytes(v)), error_handler=done)

    def _write_args(self, value, kind):
        return (dbus.Array(value, signature="y"),
                dbus.Dictionary({"type": dbus.String(kind)}, signature="sv"))

    def write(self, value, kind="request", timeout=10):
        call(self.iface.WriteValue, *self._write_args(value, kind), timeout=timeout,
             what="WriteValue " + self.path)

    def write_async(self, value, done, kind="request"):
        """Start a WriteValue; done(None or exception) is called from the main loop."""
        self.iface.WriteValue(*self._write_args(value, kind), timeout=10,
                              reply_handler=lambda: done(None), error_handler=done)

    def start_notify(self, timeout=10):
        """StartNotify; notifications (Value changes) are appended to self.notifications.
        Note that a ReadValue result also shows up there (bluez-notes §0.4)."""
        if self._receiver is None:
            self._receiver = self.bench.bus.add_signal_receiver(
                self._on_changed, "PropertiesChanged", PROPS_IFACE, BLUEZ, self.path)
        call(self.iface.StartNotify, timeout=timeout, what="StartNotify " + self.path)
        self.bench.wait_prop(self.path, CHRC_IFACE, "Notifying", True, timeout)

    def _on_changed(self, iface, changed, invalidated):
        if iface == CHRC_IFACE and "Value" in changed:
            self.notifications.append(bytes(changed["Value"]))


# ---------------------------------------------------------------------------------------
# Peripheral side: advertisement and GATT application exported by this process

_serial = [0]


def _next_path(kind):
    _serial[0] += 1
    return "/org/blbench/%s%d_%d" % (kind, os.getpid(), _serial[0])


class Advertisement(dbus.service.Object):
    """An org.bluez.LEAdvertisement1 object; register() hands it to an adapter."""

    def __init__(self, bench, service_uuids=(), local_name=None, kind="peripheral"):
        self.bench = bench
        self.path = _next_path("adv")
        self.props = {
            "Type": dbus.String(kind),
            "ServiceUUIDs": dbus.Array([dbus.String(u) for u in service_uuids], signature="s"),
        }
        if local_name:
            self.props["LocalName"] = dbus.String(local_name)
        self.released = False
        self.adapter = None
        super().__init__(bench.bus, self.path)

    @dbus.service.method(PROPS_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface):
        if interface != ADV_IFACE:
            raise dbus.exceptions.DBusException("no such interface", name="org.freedesktop.DBus.Error.InvalidArgs")
        return dbus.Dictionary(self.props, signature="sv")

    @dbus.service.method(ADV_IFACE, in_signature="", out_signature="")
    def Release(self):
        self.released = True

    def register(self, adapter, timeout=15):
        manager = dbus.Interface(adapter.obj, ADV_MANAGER_IFACE)
        call(manager.RegisterAdvertisement, dbus.ObjectPath(self.path), dbus.Dictionary({}, signature="sv"),
             timeout=timeout, what="RegisterAdvertisement on " + adapter.name)
        self.adapter = adapter

    def unregister(self, timeout=10):
        if self.adapter is None:
            return
        manager = dbus.Interface(self.adapter.obj, ADV_MANAGER_IFACE)
        call(manager.UnregisterAdvertisement, dbus.ObjectPath(self.path), timeout=timeout,
             what="UnregisterAdvertisement on " + self.adapter.name)
        self.adapter = None


def device_address(device_path):
    """'/org/bluez/hci0/dev_AA_BB_..' -> 'AA:BB:..'"""
    return str(device_path).rsplit("/", 1)[-1][len("dev_"):].replace("_", ":")


_DGRAM_QLEN = "/proc/sys/net/unix/max_dgram_qlen"


def _deep_socketpair():
    """A SEQPACKET pair whose receiving end can hold thousands of messages.

    bluetoothd drops a write command it cannot hand to an acquired socket at once, and a
    socket takes only net.unix.max_dgram_qlen (10 by default) unread messages, fixed when it
    is created: raised just for this pair, as root (the bench runs as root)."""
    try:
        with open(_DGRAM_QLEN) as f:
            old = f.read().strip()
        with open(_DGRAM_QLEN, "w") as f:
            f.write("4096")
    except OSError:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    finally:
        with open(_DGRAM_QLEN, "w") as f:
            f.write(old)
    for sock in pair:  # and the bytes to go with them
        try:
            sock.setsockopt(socket.SOL_SOCKET, 32, 16 << 20)  # SO_SNDBUFFORCE
            sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE
        except OSError:
            pass
    return pair


class Characteristic(dbus.service.Object):
    """A local characteristic with flags read, write and notify.

    By default it keeps the last value written by each central (by the `device` option)
    and a read returns b"<central address>|<that value>", so each central can check that
    it got an answer meant for it. Set on_read / on_write to change that.
    """

    def __init__(self, bench, service, uuid, flags=("read", "write", "notify"), acquire_write=False,
                 acquire_notify=False):
        self.bench = bench
        # With acquire_notify, bluetoothd asks for a socket when a central subscribes
        # (AcquireNotify, bluez-notes §3.8) and notify() writes each value to it, as blserve's raw
        # and stream modes do, instead of a PropertiesChanged signal through dbus-daemon.
        self.acquire_notify = acquire_notify
        self.notify_socket = None
        self.notify_backlog = collections.deque()
        self.notify_watch = None  # waiting for room in the socket
        self.notify_closed_watch = None  # the socket's end (bluetoothd closed it)
        # With acquire_write, bluetoothd hands every write to a socket (AcquireWrite, bluez-notes
        # §3.8) instead of one WriteValue call each; on_write then sees empty options.
        self.acquire_write = acquire_write
        self.write_sockets = []
        self.path = service.path + "/char%d" % (len(service.characteristics))
        self.uuid = uuid
        self.service = service
        self.flags = list(flags)
        self.value = b""
        self.per_device = {}
        self.writes = []  # (central address, value, options)
        self.reads = []  # (central address, options)
        self.notifying = False
        self.on_read = None
        self.on_write = None
        super().__init__(bench.bus, self.path)

    def properties(self):
        props = {
            "UUID": dbus.String(self.uuid),
            "Service": dbus.ObjectPath(self.service.path),
            "Flags": dbus.Array(self.flags, signature="s"),
        }
        if self.acquire_write:
            props["WriteAcquired"] = dbus.Boolean(bool(self.write_sockets))
        if self.acquire_notify:
            props["NotifyAcquired"] = dbus.Boolean(self.notify_socket is not None)
        return props

    @dbus.service.method(PROPS_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface):
        return dbus.Dictionary(self.properties(), signature="sv")

    @dbus.service.method(CHRC_IFACE, in_signature="a{sv}", out_signature="ay")
    def ReadValue(self, options):
        # Writes still waiting on an acquired socket came before this read.
        for sock, writer in list(self.write_sockets):
            self._take_writes(sock, writer)
        central = device_address(options.get("device", ""))
        self.reads.append((central, dict(options)))
        if self.on_read is not None:
            value = self.on_read(central, options)
        else:
            value = central.encode() + b"|" + self.per_device.get(central, b"")
        offset = int(options.get("offset", 0))
        return dbus.ByteArray(bytes(value[offset:]))

    # byte_arrays: the value arrives as one bytes object, not a dbus.Byte per byte (which costs
    # about 0.3 ms for 512 bytes: a reference peripheral must not be slowed by that).
    @dbus.service.method(CHRC_IFACE, in_signature="aya{sv}", out_signature="", byte_arrays=True)
    def WriteValue(self, value, options):
        self._written(device_address(options.get("device", "")), bytes(value), options)

    def _take_writes(self, sock, central):
        """Handles every write waiting on an acquired socket; False once it is closed."""
        if (sock, central) not in self.write_sockets:
            return False
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                self.write_sockets.remove((sock, central))
                sock.close()
                return False
            self._written(central, data, {})

    def _written(self, central, data, options):
        self.writes.append((central, data, dict(options)))
        if self.on_write is not None:
            self.on_write(central, data, options)
        else:
            self.per_device[central] = data
            self.value = data

    @dbus.service.method(CHRC_IFACE, in_signature="a{sv}", out_signature="hq")
    def AcquireWrite(self, options):
        if not self.acquire_write:
            raise dbus.DBusException("no AcquireWrite here", name="org.bluez.Error.NotSupported")
        central = device_address(options.get("device", ""))
        ours, theirs = _deep_socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)  # bluetoothd must never block on it (bluez-notes §3.8)
        self.write_sockets.append((ours, central))
        GLib.io_add_watch(ours.fileno(), GLib.PRIORITY_DEFAULT, GLib.IO_IN | GLib.IO_HUP | GLib.IO_ERR,
                          lambda _fd, _condition: self._take_writes(ours, central))
        fd = dbus.types.UnixFd(theirs)  # duplicates the descriptor
        theirs.close()
        return fd, dbus.UInt16(int(options.get("mtu", 23)))

    @dbus.service.method(CHRC_IFACE, in_signature="a{sv}", out_signature="hq")
    def AcquireNotify(self, options):
        if not self.acquire_notify:
            raise dbus.DBusException("no AcquireNotify here", name="org.bluez.Error.NotSupported")
        self._drop_notify_socket()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        theirs.setblocking(False)  # bluetoothd must never block on it (bluez-notes §3.8)
        self.notify_socket = ours
        # bluetoothd writes nothing to it for notifications: readable means closed.
        self.notify_closed_watch = GLib.io_add_watch(
            ours.fileno(), GLib.PRIORITY_DEFAULT, GLib.IO_IN | GLib.IO_HUP | GLib.IO_ERR,
            lambda _fd, _condition: self._notify_socket_closed(ours))
        self.notifying = True
        fd = dbus.types.UnixFd(theirs)  # duplicates the descriptor
        theirs.close()
        return fd, dbus.UInt16(int(options.get("mtu", 23)))

    def _notify_socket_closed(self, sock):
        if sock is self.notify_socket:
            self.notify_closed_watch = None  # this watch ends by returning False
            self._drop_notify_socket()
            self.notifying = False
        return False

    def _drop_notify_socket(self):
        # Both watches go before the descriptor is closed (a watch on a closed one spins).
        for watch in (self.notify_watch, self.notify_closed_watch):
            if watch is not None:
                GLib.source_remove(watch)
        self.notify_watch = self.notify_closed_watch = None
        if self.notify_socket is not None:
            self.notify_socket.close()
            self.notify_socket = None
        self.notify_backlog.clear()

    def _send_backlog(self, *_):
        """Writes waiting values to the notification socket until it is full; True while some wait."""
        sock, backlog = self.notify_socket, self.notify_backlog
        while backlog and sock is not None:
            if not backlog[0]:
                # An empty value cannot go through the socket (bluetoothd reads it as its end):
                # it goes by signal, in its turn.
                self.PropertiesChanged(CHRC_IFACE, {"Value": dbus.ByteArray(b"")}, [])
                backlog.popleft()
                continue
            try:
                sock.send(backlog[0])
            except BlockingIOError:
                if self.notify_watch is None:
                    self.notify_watch = GLib.io_add_watch(sock.fileno(), GLib.PRIORITY_DEFAULT, GLib.IO_OUT,
                                                          self._send_backlog)
                return True
            except OSError:
                self.notify_watch = None  # returning False ends it, if it is the caller
                self._drop_notify_socket()
                return False
            backlog.popleft()
        self.notify_watch = None
        return False

    @dbus.service.method(CHRC_IFACE, in_signature="", out_signature="")
    def StartNotify(self):
        self.notifying = True

    @dbus.service.method(CHRC_IFACE, in_signature="", out_signature="")
    def StopNotify(self):
        self.notifying = False

    @dbus.service.signal(PROPS_IFACE, signature="sa{sv}as")
    def PropertiesChanged(self, interface, changed, invalidated):
        pass

    def notify(self, value):
        """Send a notification to every subscribed central (5.66 cannot target one)."""
        self.value = bytes(value)
        if self.notify_socket is not None:
            # In order behind what waits.
            self.notify_backlog.append(self.value)
            if self.notify_watch is None:
                self._send_backlog()
            return
        self.PropertiesChanged(CHRC_IFACE, {"Value": dbus.ByteArray(self.value)}, [])


class Service(dbus.service.Object):
    def __init__(self, bench, app, uuid, primary=True):
        self.bench = bench
        self.path = app.path + "/service%d" % len(app.services)
        self.uuid = uuid
        self.primary = primary
        self.characteristics = []
        super().__init__(bench.bus, self.path)

    def add_characteristic(self, uuid, flags=("read", "write", "notify"), acquire_write=False, acquire_notify=False):
        chrc = Characteristic(self.bench, self, uuid, flags, acquire_write, acquire_notify)
        self.characteristics.append(chrc)
        return chrc

    def properties(self):
        return {"UUID": dbus.String(self.uuid), "Primary": dbus.Boolean(self.primary)}

    @dbus.service.method(PROPS_IFACE, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface):
        return dbus.Dictionary(self.properties(), signature="sv")


class Application(dbus.service.Object):
    """A GATT application (ObjectManager root) for GattManager1.RegisterApplication."""

    def __init__(self, bench):
        self.bench = bench
        self.path = _next_path("app")
        self.services = []
        self.adapter = None
        super().__init__(bench.bus, self.path)

    def add_service(self, uuid, primary=True):
        service = Service(self.bench, self, uuid, primary)
        self.services.append(service)
        return service

    @dbus.service.method(OM_IFACE, out_signature="a{oa{sa{sv}}}")
    def GetManagedObjects(self):
        objects = {}
        for service in self.services:
            objects[dbus.ObjectPath(service.path)] = {SERVICE_IFACE: service.properties()}
            for chrc in service.characteristics:
                objects[dbus.ObjectPath(chrc.path)] = {CHRC_IFACE: chrc.properties()}
        return objects

    def register(self, adapter, timeout=15):
        manager = dbus.Interface(adapter.obj, GATT_MANAGER_IFACE)
        call(manager.RegisterApplication, dbus.ObjectPath(self.path), dbus.Dictionary({}, signature="sv"),
             timeout=timeout, what="RegisterApplication on " + adapter.name)
        self.adapter = adapter


def peripheral(bench, adapter, service_uuid, chrc_uuid, local_name="blbench"):
    """Register on `adapter` a GATT app with one service and one read/write/notify
    characteristic, and a connectable advertisement of the service UUID.
    Returns (application, characteristic, advertisement)."""
    app = Application(bench)
    chrc = app.add_service(service_uuid).add_characteristic(chrc_uuid)
    app.register(adapter)
    adv = Advertisement(bench, [service_uuid], local_name)
    adv.register(adapter)
    return app, chrc, adv


# ---------------------------------------------------------------------------------------
# Logs


def bluetoothd_log_path():
    """The bench's bluetoothd log as it is written (guest-init mirrors it to BL_BENCH_OUT)."""
    path = os.environ.get("BL_BENCH_BLUETOOTHD_LOG")
    if path:
        return path
    return os.path.join(os.environ["BL_BENCH_OUT"], "bluetoothd.log")


def bluetoothd_log_size():
    """Current size of the bench's bluetoothd log (to read what a test caused)."""
    try:
        return os.path.getsize(bluetoothd_log_path())
    except (KeyError, OSError):
        return 0


def bluetoothd_log_since(offset):
    try:
        with open(bluetoothd_log_path(), "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except (KeyError, OSError):
        return ""
