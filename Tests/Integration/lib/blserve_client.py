"""Helpers for the blserve integration tests: a central that behaves like the seed 000 iOS app,
built on bleak (a BLE library this project did not write), and a way to run blserve.

Run with the bleak venv's python (scripts/bench/setup-bleak prints it); tests re-execute
themselves with it through ensure_bleak(). Every wait is bounded.

The seed client (seed-protocol.md, 000 client):
  * writes a frame in pieces, each a write with response;
  * appends every notification and every read response to one stream parser, and after each
    value update reads the characteristic again until a read returns an empty value;
  * the parser skips bytes that are not N/T/U/I, reads 7 size digits, then the body; an N frame
    (size 0) completes at once.
"""

import asyncio
import contextlib
import fcntl
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchlog import check, fail, log  # noqa: F401 (the tests import them from here too)

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ from Python 3.10

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SETUP_BLEAK = os.path.join(PROJECT, "scripts", "bench", "setup-bleak")

SEED_SERVICE = "54f06857-695e-47e4-aea8-c78184ad6c75"
SEED_CHAR = "30a5f1bb-61dc-45f0-9c52-2218d080fa77"
NUS_SERVICE = "6e400001-b5a3-f393-e0a9-e50e24dcca9e"
NUS_RX = "6e400002-b5a3-f393-e0a9-e50e24dcca9e"
NUS_TX = "6e400003-b5a3-f393-e0a9-e50e24dcca9e"

# A BlueZ 5.66 peripheral refuses single writes over 510 bytes (bluez-notes §9.1), so pieces are
# min(MTU-3, 510): what the seed client's "MTU-3 pieces" become on this bench.
MAX_PIECE = 510


def ensure_bleak():
    """Re-execute this test under the bleak venv's python unless bleak imports already."""
    try:
        import bleak  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("BL_BLEAK_REEXEC"):
        fail("bleak does not import even in the bleak venv")
    try:
        out = subprocess.run([SETUP_BLEAK], check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        skip("cannot install bleak: %s" % exc)
    python = out.stdout.strip().splitlines()[-1]
    os.environ["BL_BLEAK_REEXEC"] = "1"
    os.execv(python, [python] + sys.argv)


@contextlib.contextmanager
def quiet_logs(reason):
    """`with quiet_logs("what"):` btmon and most of bluetoothd's debug log paused for the span
    of a bulk transfer (scripts/bench/bulk-logs, which also decides whether to)."""
    tool = os.path.join(PROJECT, "scripts", "bench", "bulk-logs")
    subprocess.run([tool, "quiet", reason])
    try:
        yield
    finally:
        subprocess.run([tool, "loud"])


def skip(reason):
    """The test cannot run here: its last line says so, and run-integration counts it skipped
    (exit status 77 alone is a failure there)."""
    sys.stdout.flush()
    print("skip: " + reason, file=sys.stderr, flush=True)
    sys.exit(77)


def env_adapter(letter):
    name = os.environ.get("BL_ADAPTER_" + letter)
    addr = os.environ.get("BL_ADDR_" + letter)
    if not name or not addr:
        skip("needs adapter %s: run under scripts/bench/vm-run --adapters N" % letter)
    return name, addr


def build_dir():
    """Where the built tools are (.build/debug unless BL_BIN says otherwise)."""
    d = os.environ.get("BL_BIN") or os.path.join(PROJECT, ".build", "debug")
    if not os.path.exists(os.path.join(d, "blserve")):
        fail("no blserve in %s: run swift build first" % d)
    return d


def remove_device(adapter, address):
    """Make `adapter` forget `address` (its GATT cache too), so every test starts clean."""
    path = "/org/bluez/%s/dev_%s" % (adapter, address.upper().replace(":", "_"))
    subprocess.run(["timeout", "15", "dbus-send", "--system", "--print-reply", "--dest=org.bluez",
                    "/org/bluez/" + adapter, "org.bluez.Adapter1.RemoveDevice", "objpath:" + path],
                   capture_output=True)


# ---------------------------------------------------------------------------------------
# blserve


class Blserve:
    """A running blserve (its stderr goes to a log file, shown on failure).

    With stalled_log=True its stderr is instead a one-page pipe that is read until blserve says
    it registered and then not at all until resume_log(): a log reader that has stopped reading
    must not stop the server."""

    def __init__(self, adapter, command, options=(), env=None, name="blserve-test", stalled_log=False):
        self.adapter = adapter
        bindir = build_dir()
        self.log_path = tempfile.mktemp(prefix="blserve-", suffix=".log")
        self.log_file = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env["PATH"] = bindir + ":" + os.path.join(PROJECT, "examples") + ":" + full_env.get("PATH", "")
        if env:
            full_env.update(env)
        argv = [os.path.join(bindir, "blserve"), "-v", "-a", adapter, "-n", name] + list(options) + ["--"] + list(command)
        log("starting:", " ".join(argv[1:]))
        stderr = self.log_file
        self._copier = None
        if stalled_log:
            read_end, stderr = os.pipe()
            fcntl.fcntl(stderr, F_SETPIPE_SZ, 4096)
            self._resume = threading.Event()
            self._copier = threading.Thread(target=self._copy_log, args=(read_end,), daemon=True)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=stderr, env=full_env, start_new_session=True)
        if self._copier:
            os.close(stderr)
            self._copier.start()

    def _copy_log(self, fd):
        """Copies blserve's stderr into the log file, pausing after the registration line."""
        seen = b""
        while True:
            if b"registered on" in seen and not self._resume.is_set():
                log("blserve's stderr is no longer read")
                self._resume.wait()
                seen = b""
            data = os.read(fd, 65536)
            if not data:
                break
            self.log_file.write(data)
            self.log_file.flush()
            seen = (seen + data)[-4096:]
        os.close(fd)

    def resume_log(self, timeout=30):
        """Reads blserve's stderr again (stalled_log) and waits until what it queued has come."""
        self._resume.set()
        deadline = time.monotonic() + timeout
        size = -1
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = os.path.getsize(self.log_path)
            if now == size:
                return
            size = now

    def log_text(self):
        if not self.log_file.closed:
            self.log_file.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_registered(self, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_text()
            if "registered on" in text:
                return
            if self.proc.poll() is not None:
                fail("blserve exited with %s before registering:\n%s" % (self.proc.returncode, text))
            time.sleep(0.1)
        fail("blserve did not register within %ss:\n%s" % (timeout, self.log_text()))

    def wait_log(self, needle, timeout, after=0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log_text()[after:]:
                return True
            time.sleep(0.1)
        return False

    def stop(self, sig=signal.SIGTERM, timeout=10):
        """Signal it and wait; returns the exit status."""
        if self._copier:
            self._resume.set()   # blserve writes what it queued before it exits
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                fail("blserve did not stop within %ss of %s:\n%s" % (timeout, sig, self.log_text()))
        if self._copier:
            self._copier.join(10)
        self.log_file.close()
        return self.proc.returncode

    def dump(self):
        print("---- blserve log ----")
        print(self.log_text())
        print("----")


# ---------------------------------------------------------------------------------------
# The seed client


class _Bluez:
    """A few calls to bluetoothd over dbus-fast (which bleak is built on), for linking a central
    before bleak sees it; every call and wait is bounded."""

    def __init__(self, bus):
        self.bus = bus

    async def call(self, path, interface, member, signature="", body=(), timeout=15):
        from dbus_fast import Message, MessageType
        reply = await asyncio.wait_for(self.bus.call(Message(
            destination="org.bluez", path=path, interface=interface, member=member,
            signature=signature, body=list(body))), timeout)
        if reply.message_type == MessageType.ERROR:
            raise _BluezError(reply.error_name, "%s.%s on %s: %s: %s" % (
                interface, member, path, reply.error_name, reply.body[0] if reply.body else ""))
        return reply.body

    async def prop(self, path, interface, name):
        """A property's value, or None if the object or property does not exist (yet)."""
        try:
            (value,) = await self.call(path, "org.freedesktop.DBus.Properties", "Get", "ss", (interface, name))
        except _BluezError as exc:
            if exc.name in ("org.freedesktop.DBus.Error.UnknownObject", "org.freedesktop.DBus.Error.UnknownMethod",
                            "org.freedesktop.DBus.Error.InvalidArgs"):
                return None
            raise
        return value.value

    async def wait(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            result = await predicate()
            if result:
                return result
            if time.monotonic() >= deadline:
                fail("timed out after %s s waiting for %s" % (timeout, what))
            await asyncio.sleep(0.1)


class _BluezError(Exception):
    def __init__(self, name, message):
        super().__init__(message)
        self.name = name


async def link(adapter, address, service, char, timeout=60):
    """Connect `adapter` to the peripheral `address` the way bench.py does (forget it, scan for
    `service`, Connect, then poll Connected, ServicesResolved and the characteristic `char`),
    and return the device's object path. Why not bleak's own connect: bleak waits for the
    ServicesResolved *signal*, which bluetoothd on this bench does not always send (bluez-notes
    §9.5); every bleak connection to blserve in the first bench runs timed out that way. bleak
    then attaches to the connected device (Connect on a connected device returns at once)."""
    from dbus_fast import BusType, Variant
    from dbus_fast.aio import MessageBus
    bus = await asyncio.wait_for(MessageBus(bus_type=BusType.SYSTEM).connect(), 15)
    try:
        z = _Bluez(bus)
        adapter_path = "/org/bluez/" + adapter
        path = "%s/dev_%s" % (adapter_path, address.upper().replace(":", "_"))
        device = "org.bluez.Device1"
        try:
            await z.call(adapter_path, "org.bluez.Adapter1", "RemoveDevice", "o", (path,))
        except _BluezError as exc:
            if exc.name not in ("org.bluez.Error.DoesNotExist", "org.freedesktop.DBus.Error.UnknownObject",
                                "org.bluez.Error.InvalidArguments"):
                raise

        async def gone():
            return await z.prop(path, device, "Address") is None
        await z.wait(gone, 10, "%s to be removed from %s" % (address, adapter))
        await z.call(adapter_path, "org.bluez.Adapter1", "SetDiscoveryFilter", "a{sv}",
                     ({"Transport": Variant("s", "le"), "UUIDs": Variant("as", [service])},))
        await z.call(adapter_path, "org.bluez.Adapter1", "StartDiscovery")
        try:
            async def seen():
                return service.lower() in [u.lower() for u in (await z.prop(path, device, "UUIDs") or [])]
            await z.wait(seen, 30, "%s to see %s advertising %s" % (adapter, address, service))
        finally:
            try:
                await z.call(adapter_path, "org.bluez.Adapter1", "StopDiscovery")
            except _BluezError as exc:
                log("StopDiscovery on %s: %s" % (adapter, exc))
        found = time.monotonic()
        # One central at a time connects to a given peripheral: when two connection attempts
        # reach one advertiser together on this bench, one link comes up and the other central's
        # attempts all end in "le-connection-abort-by-local" (the kernel's "Connection refused"),
        # again and again (test 52 in a CI run of 2026-12-03). Other centrals' processes wait on
        # this lock (bounded by the caller's timeout); a failure that is transient still gets
        # another attempt, as blsend gives it.
        lock = os.open("/tmp/blbench-connect-%s.lock" % address.replace(":", ""), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.1)
            for attempt in range(1, 4):
                try:
                    await z.call(path, device, "Connect", timeout=timeout)
                    break
                except _BluezError as exc:
                    if attempt == 3 or exc.name != "org.bluez.Error.Failed" or not any(
                            text in str(exc) for text in ("abort-by-local", "in progress", "failed to be established")):
                        raise
                    log("%s: Connect attempt %d: %s; trying again" % (adapter, attempt, exc))
                    await asyncio.sleep(random.uniform(0.5, 1.5))
            for name in ("Connected", "ServicesResolved"):
                async def true(name=name):
                    return await z.prop(path, device, name)
                await z.wait(true, timeout, "%s of %s on %s" % (name, address, adapter))
        finally:
            os.close(lock)  # releases the lock

        async def characteristic():
            (objects,) = await z.call("/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")
            for chrc_path, interfaces in objects.items():
                chrc = interfaces.get("org.bluez.GattCharacteristic1")
                if not chrc_path.startswith(path + "/") or chrc is None or chrc["UUID"].value.lower() != char.lower():
                    continue
                owner = objects.get(chrc["Service"].value, {}).get("org.bluez.GattService1", {})
                if "UUID" in owner and owner["UUID"].value.lower() == service.lower():
                    return True
            return False
        await z.wait(characteristic, 20, "characteristic %s of service %s under %s" % (char, service, path))
        return path, found
    finally:
        bus.disconnect()


async def connect_bleak(adapter, address, service, char, timeout=60):
    """A connected BleakClient for `address` on `adapter`, linked first by link()."""
    started = time.monotonic()
    from bleak import BleakClient
    from bleak.backends.device import BLEDevice
    imported = time.monotonic()
    path, found = await asyncio.wait_for(link(adapter, address, service, char, timeout), timeout + 60)
    linked = time.monotonic()
    # bleak's object cache (one per process: a D-Bus connection and GetManagedObjects), timed
    # apart from the connect that uses it.
    from bleak.backends.bluezdbus.manager import get_global_bluez_manager
    await asyncio.wait_for(get_global_bluez_manager(), 30)
    cached = time.monotonic()
    client = BleakClient(BLEDevice(address, None, {"path": path, "props": None}), timeout=timeout,
                         bluez={"adapter": adapter})
    await asyncio.wait_for(client.connect(), timeout + 5)
    log("%s: bleak imported in %.1f s, found the peripheral in %.1f s, linked in %.1f s, bleak's cache %.1f s, "
        "bleak attached in %.1f s" % (adapter, imported - started, found - imported, linked - found,
                                      cached - linked, time.monotonic() - cached))
    return client


class FrameParser:
    """The seed app's stream parser."""

    CODES = b"NTUI"

    def __init__(self):
        self.buffer = bytearray()
        self.frames = []  # (code, body) with code a str

    def feed(self, data):
        self.buffer += data
        while True:
            # Skip bytes that cannot start a frame.
            while self.buffer and self.buffer[0] not in self.CODES:
                del self.buffer[0]
            if len(self.buffer) < 8:
                return
            digits = bytes(self.buffer[1:8])
            if not digits.isdigit():
                del self.buffer[0]
                continue
            size = int(digits)
            if len(self.buffer) < 8 + size:
                return
            code = chr(self.buffer[0])
            body = bytes(self.buffer[8:8 + size])
            del self.buffer[:8 + size]
            self.frames.append((code, body))


class SeedClient:
    """One central, as the seed iOS app: connect, subscribe, write frames, read until empty."""

    def __init__(self, adapter, server_address, service=SEED_SERVICE, char=SEED_CHAR, notify_char=None):
        self.adapter = adapter
        self.server_address = server_address
        self.service = service
        self.char_uuid = char
        self.notify_uuid = notify_char or char
        self.parser = FrameParser()
        self.client = None
        self.reading = False
        self.read_again = False
        self.reads = 0
        self.notifications = 0
        self.errors = []
        self.frame_event = asyncio.Event()

    async def connect(self, timeout=60):
        self.client = await connect_bleak(self.adapter, self.server_address, self.service, self.char_uuid, timeout)
        services = self.client.services
        self.char = services.get_characteristic(self.char_uuid)
        self.notify_char = services.get_characteristic(self.notify_uuid)
        if self.char is None or self.notify_char is None:
            fail("characteristic %s/%s not found on %s" % (self.char_uuid, self.notify_uuid, self.server_address))
        self.piece = min(self.char.max_write_without_response_size, MAX_PIECE)
        # AcquireNotify: a read's result then does not also arrive as a notification (bluez-notes §0.4).
        await asyncio.wait_for(self.client.start_notify(self.notify_char, self._on_notify,
                                                        bluez={"use_start_notify": False}), 15)
        log("%s connected to %s, pieces of %d bytes" % (self.adapter, self.server_address, self.piece))

    async def disconnect(self):
        # Let the chain of reads end first: BlueZ 5.66 can die when a central disconnects while
        # one of its reads is still waiting for the peripheral's answer (seen on the bench: the
        # bluetoothd log stops at "Read Complete: err -110").
        deadline = time.monotonic() + 10
        while self.reading and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.client is not None:
            # Give the AcquireNotify socket back while the link is up: bluetoothd 5.66 died on
            # the bench when a central's notify socket closed after its link was gone
            # (the log ends in gatt-client.c sock_hup()).
            try:
                await asyncio.wait_for(self.client.stop_notify(self.notify_char), 10)
            except Exception as exc:  # noqa: BLE001 - only matters for the log
                log("stop_notify:", exc)
            try:
                await asyncio.wait_for(self.client.disconnect(), 15)
            except Exception as exc:  # noqa: BLE001 - a failed disconnect only matters for the log
                log("disconnect:", exc)

    def _on_notify(self, _char, data):
        self.notifications += 1
        self._value(bytes(data))

    def _value(self, data):
        before = len(self.parser.frames)
        self.parser.feed(data)
        if len(self.parser.frames) != before:
            self.frame_event.set()
        # After every value update the app reads again (one chain at a time here).
        if self.reading:
            self.read_again = True
        else:
            asyncio.get_running_loop().create_task(self._read_chain())

    async def _read_chain(self):
        self.reading = True
        try:
            while True:
                try:
                    value = await asyncio.wait_for(self.client.read_gatt_char(self.notify_char), 20)
                except Exception as exc:  # noqa: BLE001 - recorded, the test decides
                    self.errors.append("read: %s" % exc)
                    return
                self.reads += 1
                if value:
                    before = len(self.parser.frames)
                    self.parser.feed(bytes(value))
                    if len(self.parser.frames) != before:
                        self.frame_event.set()
                    continue
                if self.read_again:
                    self.read_again = False
                    continue
                return
        finally:
            self.reading = False

    async def write_frame(self, frame):
        for i in range(0, len(frame), self.piece):
            await asyncio.wait_for(self.client.write_gatt_char(self.char, frame[i:i + self.piece], response=True), 20)

    async def write_raw(self, data):
        """One write with response; returns None or the exception."""
        try:
            await asyncio.wait_for(self.client.write_gatt_char(self.char, data, response=True), 20)
            return None
        except Exception as exc:  # noqa: BLE001 - returned for the test to check
            return exc

    async def next_frame(self, timeout=30, skip_n=True):
        """The next frame parsed (N frames skipped unless skip_n is false)."""
        deadline = time.monotonic() + timeout
        while True:
            while self.parser.frames:
                code, body = self.parser.frames.pop(0)
                if code == "N" and skip_n:
                    continue
                return code, body
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply frame within %ss (reads %d, notifications %d, errors %s)" %
                                   (timeout, self.reads, self.notifications, self.errors))
            self.frame_event.clear()
            try:
                await asyncio.wait_for(self.frame_event.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    async def request(self, code, body, timeout=30):
        if isinstance(body, str):
            body = body.encode()
        frame = code.encode() + b"%07d" % len(body) + body
        await self.write_frame(frame)
        return await self.next_frame(timeout)


def op_request(code, body, timeout=30):
    if isinstance(body, str):
        body = body.encode()
    return {"op": "request", "code": code, "body": body.hex(), "timeout": timeout}


def op_write(data):
    return {"op": "write", "data": data.hex()}


def op_read():
    return {"op": "read"}


def op_wait(seconds):
    return {"op": "wait", "seconds": seconds}


async def run_central(adapter, address, ops, timeout=300):
    """Run `ops` as one central in its own process (blserve_central.py); returns the results, one
    dict per operation, with request bodies decoded back to bytes."""
    proc = await asyncio.create_subprocess_exec(sys.executable, os.path.join(HERE, "blserve_central.py"),
                                                adapter, address, __import__("json").dumps(ops),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        fail("central %s took more than %ss" % (adapter, timeout))
    import json
    results = []
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            if "body" in result:
                result["body"] = bytes.fromhex(result["body"])
            if "value" in result:
                result["value"] = bytes.fromhex(result["value"])
            results.append(result)
        else:
            print("  %s| %s" % (adapter, line))
    if proc.returncode != 0 or len(results) < len(ops):
        fail("central %s ended with status %s after %d of %d operations: %s" %
             (adapter, proc.returncode, len(results), len(ops), results[-1:] if results else out.decode()[-2000:]))
    return results


def frame(code, body):
    if isinstance(body, str):
        body = body.encode()
    return code.encode() + b"%07d" % len(body) + body


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def make_png(width=64, height=48, seed=1):
    """A small valid PNG made here (zlib + CRCs), different for each seed."""
    import struct
    import zlib
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            rows += bytes(((x * 7 + seed) & 255, (y * 5 + seed * 3) & 255, ((x ^ y) + seed) & 255))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b"")


class HTTPServer:
    """python -m http.server on 127.0.0.1 serving a temporary directory."""

    def __init__(self, files):
        self.dir = tempfile.mkdtemp(prefix="blserve-http-")
        for name, data in files.items():
            with open(os.path.join(self.dir, name), "wb") as f:
                f.write(data)
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(self.port)],
                                     cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                c = socket.create_connection(("127.0.0.1", self.port), 0.5)
                c.close()
                return
            except OSError:
                time.sleep(0.1)
        fail("the HTTP server did not start")

    def url(self, name):
        return "http://127.0.0.1:%d/%s" % (self.port, name)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def run(coro, timeout):
    """Run the test's coroutine with an overall bound."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())
