import XCTest
import Glibc
import BLCommand
@testable import BLDBus
import BLTestSupport

final class DBusConnectionTests: BusTestCase {
    /// Calls that B keeps unanswered (so that their deinit does not answer them).
    var parked: [IncomingCall] = []

    override func tearDown() {
        parked.removeAll()
        super.tearDown()
    }

    /// B serves /svc with org.example.Svc.
    @discardableResult
    private func exportService(_ configure: (ExportedInterface) -> Void) throws -> ExportedObjectTree {
        let iface = ExportedInterface("org.example.Svc")
        configure(iface)
        let tree = ExportedObjectTree(root: "/svc")
        try tree.add(ExportedObject(path: "/svc", interfaces: [iface]))
        try b.export(tree)
        return tree
    }

    func testConnectionBasics() throws {
        XCTAssertTrue(a.uniqueName.hasPrefix(":"))
        XCTAssertNotEqual(a.uniqueName, b.uniqueName)
        XCTAssertTrue(a.isConnected)
        XCTAssertTrue(a.canSendFDs, "a unix-socket bus passes descriptors")
        XCTAssertEqual(try a.requestName("org.example.A"), .primaryOwner)
        XCTAssertEqual(try a.requestName("org.example.A"), .alreadyOwner)
        XCTAssertEqual(try b.requestName("org.example.A"), .exists)
        XCTAssertEqual(b.nameOwner("org.example.A"), a.uniqueName)
        XCTAssertNil(b.nameOwner("org.example.Nobody"))
    }

    func testAsynchronousCallBetweenTwoConnectionsOnOneLoop() throws {
        try exportService { $0.method("Add", inSignature: "ii") { call in
            call.reply(.int32(call.arguments[0].int32! + call.arguments[1].int32!))
        } }
        var result: Result<[DBusValue], DBusError>?
        var calledSynchronously = true
        a.call(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Add",
               args: [.int32(40), .int32(2)]) { result = $0 }
        calledSynchronously = result != nil
        XCTAssertFalse(calledSynchronously, "the reply callback never runs inside call()")
        runUntil("the reply") { result != nil }
        XCTAssertEqual(try result?.get(), [.int32(42)])
    }

    func testErrorRepliesAndServiceUnknown() throws {
        try exportService { $0.method("Fail") { call in
            call.fail(name: "org.bluez.Error.NotPermitted", message: "Write not permitted")
        } }
        XCTAssertThrowsError(try a.callAndWait(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Fail")) {
            let e = $0 as? DBusError
            XCTAssertEqual(e?.name, "org.bluez.Error.NotPermitted")
            XCTAssertEqual(e?.message, "Write not permitted")
            XCTAssertEqual(e?.shortName, "NotPermitted")
        }
        XCTAssertThrowsError(try a.callAndWait(destination: "org.example.Nobody", path: "/", interface: "org.example.X", member: "Y")) {
            XCTAssertEqual(($0 as? DBusError)?.name, DBusError.Name.serviceUnknown)
        }
    }

    func testTimeoutsBecomeLibdbusMilliseconds() {
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(nil), -1, "libdbus's default")
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(2.5), 2500)
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(0.0001), 1, "rounded up, never 0")
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(.infinity), Int32.max, "DBUS_TIMEOUT_INFINITE")
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(1e12), Int32.max, "DBUS_TIMEOUT_INFINITE")
        // Past or absurd deadlines expire at once instead of trapping in Int32(_:).
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(0), 1)
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(-3e9), 1)
        XCTAssertEqual(DBusConnection.timeoutMilliseconds(-.infinity), 1)
    }

    func testTimeoutYieldsNoReplyWithinTheTimeout() throws {
        try exportService { $0.method("Never") { call in self.parked.append(call) } }
        let t0 = MonotonicClock.seconds()
        XCTAssertThrowsError(try a.callAndWait(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc",
                                               member: "Never", timeout: 0.3)) {
            XCTAssertEqual(($0 as? DBusError)?.name, DBusError.Name.noReply, "\($0)")
        }
        let elapsed = MonotonicClock.seconds() - t0
        XCTAssertGreaterThanOrEqual(elapsed, 0.29)
        XCTAssertLessThan(elapsed, 2.0, "the libdbus timeout must fire (timeout functions serviced), not the backstop")
        XCTAssertEqual(parked.count, 1, "the call did reach B")

        // Asynchronous variant.
        var result: Result<[DBusValue], DBusError>?
        a.call(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Never", timeout: 0.1) { result = $0 }
        runUntil("the NoReply error", timeout: 3) { result != nil }
        guard case .failure(let e) = result else { return XCTFail("expected an error, got \(String(describing: result))") }
        XCTAssertEqual(e.name, DBusError.Name.noReply)
    }

    func testCancelledCallNeverCallsBack() throws {
        try exportService { $0.method("Slow") { call in
            self.loop.schedule(after: 0.05) { call.reply(.bool(true)) }
        } }
        var called = false
        let pending = a.call(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Slow") { _ in called = true }
        pending.cancel()
        XCTAssertTrue(pending.isFinished)
        XCTAssertFalse(loop.run(until: { called }, timeout: 0.2))
    }

    func testDeferredReplyAndNoReplyCalls() throws {
        var noReplySeen: Bool?
        try exportService {
            $0.method("Later") { call in
                XCTAssertTrue(call.expectsReply)
                self.loop.schedule(after: 0.05) { call.reply(.string("late \(call.arguments[0].string!)")) }
            }
            $0.method("Fire") { call in
                noReplySeen = !call.expectsReply
                call.reply(.string("ignored")) // no-op for a no-reply call
            }
        }
        let t0 = MonotonicClock.seconds()
        let r = try a.callAndWait(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc",
                                  member: "Later", args: [.string("answer")])
        XCTAssertEqual(r, [.string("late answer")])
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - t0, 0.05)

        let m = try DBusMessage.methodCall(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Fire")
        m.noReply = true
        try a.send(m)
        runUntil("the no-reply call") { noReplySeen != nil }
        XCTAssertEqual(noReplySeen, true)
    }

    func testAHandlerThatDropsTheCallAnswersWithAnError() throws {
        try exportService { $0.method("Forget") { _ in } }
        XCTAssertThrowsError(try a.callAndWait(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc",
                                               member: "Forget", timeout: 5)) {
            let e = $0 as? DBusError
            XCTAssertEqual(e?.name, DBusError.Name.failed)
            XCTAssertTrue(e?.message.contains("without replying") ?? false, "\($0)")
        }
    }

    /// The RegisterApplication pattern (bluez-notes fact 7): A calls B.Register; before replying,
    /// B calls back into A (GetManagedObjects). With a blocking call this deadlocks.
    func testPeerCallsBackIntoUsBeforeReplying() throws {
        let app = ExportedObjectTree(root: "/app")
        try app.add(ExportedObject(path: "/app/service0", interfaces: [
            ExportedInterface("org.bluez.GattService1").property("UUID") { .string("180d") }.property("Primary") { .bool(true) },
        ]))
        try app.add(ExportedObject(path: "/app/service0/char0", interfaces: [
            ExportedInterface("org.bluez.GattCharacteristic1")
                .property("UUID") { .string("2a37") }
                .property("Service") { .objectPath("/app/service0") }
                .property("Flags") { .stringArray(["notify"]) },
        ]))
        try a.export(app)

        // RegisterApplication: synchronous style (a nested wait inside B's method handler).
        // RegisterAdvertisement: deferred style (an asynchronous call; B replies from its callback).
        try exportService {
            $0.method("RegisterApplication", inSignature: "oa{sv}") { call in
                let root = call.arguments[0].objectPath!
                do {
                    let reply = try self.b.callAndWait(destination: call.sender, path: root,
                                                       interface: "org.freedesktop.DBus.ObjectManager",
                                                       member: "GetManagedObjects", timeout: 5)
                    let objects = reply.first?.managedObjects ?? [:]
                    call.reply(.uint32(UInt32(objects.count)))
                } catch {
                    call.fail(error as! DBusError)
                }
            }
            $0.method("RegisterAdvertisement", inSignature: "oa{sv}") { call in
                self.b.call(destination: call.sender, path: call.arguments[0].objectPath!,
                            interface: "org.freedesktop.DBus.Properties", member: "GetAll",
                            args: [.string("org.bluez.GattService1")]) { result in
                    switch result {
                    case .success(let args): call.reply(.string(args.first?["UUID"]?.string ?? "?"))
                    case .failure(let e): call.fail(e)
                    }
                }
            }
        }
        let t0 = MonotonicClock.seconds()
        let r = try a.callAndWait(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc",
                                  member: "RegisterApplication", args: [.objectPath("/app"), .stringDict([:])], timeout: 5)
        XCTAssertEqual(r, [.uint32(2)])
        let r2 = try a.callAndWait(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc",
                                   member: "RegisterAdvertisement", args: [.objectPath("/app/service0"), .stringDict([:])], timeout: 5)
        XCTAssertEqual(r2, [.string("180d")])
        XCTAssertLessThan(MonotonicClock.seconds() - t0, 2, "must not stall until a timeout")
    }

    func testDaemonKilledReportsDisconnectWithoutExiting() throws {
        try exportService { $0.method("Never") { call in self.parked.append(call) } }
        var disconnectedA = 0
        var disconnectedB = 0
        a.onDisconnect = { disconnectedA += 1 }
        b.onDisconnect = { disconnectedB += 1 }
        var pendingResult: Result<[DBusValue], DBusError>?
        a.call(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Never", timeout: 30) {
            pendingResult = $0
        }
        runUntil("B to receive the call") { self.parked.count == 1 }
        // A name watched through NameOwnerChanged is gone with the bus: no signal could say so.
        var vanished: [String] = []
        _ = try a.subscribeNameOwnerChanged("org.example.Watched") { [weak a = self.a] name, _, new in
            if new == nil, a?.isConnected == false { vanished.append(name) }
        }

        bus.kill()
        runUntil("both disconnections") { disconnectedA == 1 && disconnectedB == 1 }
        XCTAssertEqual(vanished, ["org.example.Watched"])
        XCTAssertFalse(a.isConnected)
        runUntil("the pending call to fail") { pendingResult != nil }
        if case .failure(let e) = pendingResult {
            XCTAssertEqual(e.name, DBusError.Name.disconnected)
        } else {
            XCTFail("expected an error, got \(String(describing: pendingResult))")
        }
        // Still alive, and the connection reports its state instead of exiting.
        XCTAssertThrowsError(try a.send(DBusMessage.signal(path: "/x", interface: "org.example.X", member: "Y"))) {
            XCTAssertEqual(($0 as? DBusError)?.name, DBusError.Name.disconnected)
        }
        XCTAssertThrowsError(try a.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                               interface: "org.freedesktop.DBus", member: "GetId", timeout: 1))
        XCTAssertFalse(loop.run(until: { disconnectedA > 1 }, timeout: 0.05), "reported once")
        XCTAssertEqual(loop.watchCount, 0, "libdbus removed its watches from the loop")
    }

    /// flush() gives up after its timeout when the bus takes nothing (here: stopped), instead
    /// of keeping an ending process for ever.
    func testFlushIsBoundedWhenTheBusTakesNothing() throws {
        kill(bus.pid, SIGSTOP)
        defer { kill(bus.pid, SIGCONT) }
        let value = DBusValue.bytes([UInt8](repeating: 7, count: 60_000))
        for _ in 0..<200 {
            let m = try DBusMessage.signal(path: "/x", interface: "org.example.X", member: "Y")
            try m.append([value])
            _ = try a.send(m)
        }
        let t0 = MonotonicClock.seconds()
        a.flush(timeout: 0.5)
        let took = MonotonicClock.seconds() - t0
        XCTAssertGreaterThanOrEqual(took, 0.4, "12 MB cannot have gone to a stopped bus")
        XCTAssertLessThan(took, 3)
    }

    /// A bus that takes the connection and then says nothing (a hung dbus-daemon): registering
    /// gives up after the timeout, through the loop, instead of blocking for good.
    func testRegisteringWithABusThatSaysNothingTimesOut() throws {
        let silent = try SilentBus()
        let t0 = MonotonicClock.seconds()
        XCTAssertThrowsError(try DBusConnection(address: silent.address, loop: loop, timeout: 0.5)) { error in
            XCTAssertEqual((error as? DBusError)?.name, DBusError.Name.noReply, "\(error)")
        }
        XCTAssertLessThan(MonotonicClock.seconds() - t0, 3)
    }

    /// A signal stops the loop (InterruptWatch): the registration's wait ends at once, as every
    /// other wait does, so that a tool can be stopped while it connects.
    func testRegistrationEndsWhenTheLoopIsStopped() throws {
        let silent = try SilentBus()
        _ = loop.schedule(after: 0.2) { [loop] in loop!.stop() }
        let t0 = MonotonicClock.seconds()
        XCTAssertThrowsError(try DBusConnection(address: silent.address, loop: loop)) { error in
            XCTAssertEqual((error as? DBusError)?.name, DBusError.Name.interrupted, "\(error)")
        }
        XCTAssertLessThan(MonotonicClock.seconds() - t0, 3)
    }

    /// An empty DBUS_SYSTEM_BUS_ADDRESS is no address, as for libdbus: the default is used.
    func testAnEmptySystemBusAddressMeansTheDefault() {
        setenv("DBUS_SYSTEM_BUS_ADDRESS", "", 1)
        defer { unsetenv("DBUS_SYSTEM_BUS_ADDRESS") }
        XCTAssertEqual(DBusConnection.systemBusAddress, DBusConnection.systemBusDefaultAddress)
        setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/x", 1)
        XCTAssertEqual(DBusConnection.systemBusAddress, "unix:path=/x")
    }

    /// Exit-on-disconnect stays off; if it were on, killing the bus would _exit this test
    /// process.
    func testSystemBusHonoursTheAddressVariableAndSurvivesTheBusExiting() throws {
        setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address, 1)
        defer { unsetenv("DBUS_SYSTEM_BUS_ADDRESS") }
        let system = try DBusConnection.system(loop: loop)
        let id = try system.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                        interface: "org.freedesktop.DBus", member: "ListNames")
        XCTAssertTrue(id.first?.stringArray?.contains(a.uniqueName) ?? false, "same bus as the fixture's connections")
        var lost = false
        system.onDisconnect = { lost = true }
        bus.kill()
        runUntil("the disconnection") { lost }
        XCTAssertFalse(system.isConnected)
    }

    func testInvalidCallArgumentsFailAsynchronously() {
        var result: Result<[DBusValue], DBusError>?
        a.call(destination: b.uniqueName, path: "not a path", interface: "org.example.X", member: "Y") { result = $0 }
        XCTAssertNil(result)
        runUntil("the error") { result != nil }
        guard case .failure(let e) = result else { return XCTFail("expected a failure") }
        XCTAssertEqual(e.name, DBusError.Name.invalidArgs)
    }

    func testCloseFailsPendingCallsAndDoesNotReportADisconnect() throws {
        try exportService { $0.method("Never") { call in self.parked.append(call) } }
        var disconnected = false
        a.onDisconnect = { disconnected = true }
        var result: Result<[DBusValue], DBusError>?
        a.call(destination: b.uniqueName, path: "/svc", interface: "org.example.Svc", member: "Never") { result = $0 }
        runUntil("B to receive the call") { self.parked.count == 1 }
        a.close()
        runUntil("the pending call to fail") { result != nil }
        XCTAssertFalse(disconnected)
        XCTAssertFalse(a.isConnected)
    }

    func testDroppingConnectionsReleasesEverything() throws {
        let before = openSocketCount()
        var c: DBusConnection? = try DBusConnection(address: bus.address, loop: loop)
        weak let weakC = c
        var pendingDone = false
        c!.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "GetId") { _ in pendingDone = true }
        XCTAssertGreaterThan(openSocketCount(), before)
        let watchesBefore = loop.watchCount
        c = nil
        XCTAssertNil(weakC, "the loop must not keep the connection alive")
        XCTAssertEqual(openSocketCount(), before)
        XCTAssertLessThan(loop.watchCount, watchesBefore)
        XCTAssertFalse(loop.run(until: { pendingDone }, timeout: 0.05), "callbacks of a dropped connection never run")
    }
}
