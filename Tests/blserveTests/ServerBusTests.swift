import BLTestSupport
import XCTest
import Glibc
import BLBlueZ
@testable import BLCommand
import BLDBus
import BLFrame
@testable import blserve

/// blserve's server end to end over a private bus: registration, per-central reassembly and reply
/// queues, refusals, handler failures, push and pull, re-registration after a bluetoothd restart.
/// bluetoothd is played by `FakeBluetoothd` (the bench runs the real one).
final class ServerBusTests: XCTestCase {
    private var bus: BusFixture!
    private var loop: EventLoop!
    private var bluez: FakeBluetoothd!
    private var connection: DBusConnection!
    private var server: Server!

    private let a = FakeBluetoothd.device(1)
    private let b = FakeBluetoothd.device(2)

    override func setUpWithError() throws {
        bus = try BusFixture()
        loop = EventLoop()
        bluez = try FakeBluetoothd(address: bus.address, loop: loop)
    }

    override func tearDown() {
        if let server, !server.stopping {
            server.mode.shutdown()
            server.children.terminateAll(signal: SIGKILL, grace: 1)
            server.peripheral.stop(timeout: 1)
        }
        server = nil
        connection = nil
        bluez = nil
        loop = nil
        bus?.stop()
        bus = nil
    }

    private func start(_ args: [String]) throws {
        let config = try ServeConfig(BlserveCommand.spec.parse(args))
        connection = try DBusConnection(address: bus.address, loop: loop)
        server = try Server(config: config, loop: loop, bus: connection, adapterName: "hci0")
        try bluez.watchNotifications(of: connection.uniqueName)
        try server.peripheral.start()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.state == .registered }, timeout: 5),
                      "not registered: \(server.peripheral.state)")
    }

    private func frame(_ code: String, _ body: String) -> [UInt8] {
        let size = String(body.utf8.count)
        return Array(code.utf8) + Array((String(repeating: "0", count: 7 - size.count) + size).utf8) + Array(body.utf8)
    }

    private func ok(_ result: Result<Void, DBusError>, file: StaticString = #filePath, line: UInt = #line) {
        if case .failure(let e) = result { XCTFail("write refused: \(e)", file: file, line: line) }
    }

    private func refusal(_ result: Result<Void, DBusError>) -> String? {
        if case .failure(let e) = result { return e.name == "org.bluez.Error.Failed" ? e.message : e.shortName }
        return nil
    }

    /// Waits until `device` has replies of at least `bytes` bytes (default: any) and returns them
    /// whole (read until empty).
    private func reply(for device: String, bytes: Int = 1, mtu: Int = 185, timeout: Double = 10,
                       file: StaticString = #filePath, line: UInt = #line) -> String {
        var got: [UInt8] = []
        let done = loop.run(until: {
            got += self.bluez.readAll(from: device, mtu: mtu)
            return got.count >= bytes
        }, timeout: timeout)
        if !done { XCTFail("no reply for \(device)", file: file, line: line) }
        return String(decoding: got, as: UTF8.self)
    }

    private func settle(_ seconds: Double) {
        _ = loop.run(until: { false }, timeout: seconds)
    }

    // MARK: - Registration

    func testRegistersTheSeedLayoutAndAdvertisement() throws {
        try start(["-n", "my-raspbverry-pi", "cat"])
        let app = try XCTUnwrap(bluez.applications[connection.uniqueName + "/org/blpipe/blserve"])
        let service = try XCTUnwrap(app["/org/blpipe/blserve/service0"]?[BlueZ.gattServiceInterface])
        XCTAssertEqual(service["UUID"]?.string, KnownUUIDs.raspBLEService)
        XCTAssertEqual(service["Primary"]?.bool, true)
        let chrc = try XCTUnwrap(app[FakeBluetoothd.charPath]?[BlueZ.gattCharacteristicInterface])
        XCTAssertEqual(chrc["UUID"]?.string, KnownUUIDs.raspBLECharacteristic)
        XCTAssertEqual(chrc["Service"]?.objectPath, "/org/blpipe/blserve/service0")
        XCTAssertEqual(chrc["Flags"]?.stringArray, ["read", "write", "notify"])
        XCTAssertNil(chrc["NotifyAcquired"])  // would switch bluetoothd to AcquireNotify
        let ad = try XCTUnwrap(bluez.advertisements[connection.uniqueName + "/org/blpipe/blserve_advertisement"])
        XCTAssertEqual(ad["Type"]?.string, "peripheral")
        XCTAssertEqual(ad["ServiceUUIDs"]?.stringArray, [KnownUUIDs.raspBLEService])
        XCTAssertEqual(ad["LocalName"]?.string, "my-raspbverry-pi")
        XCTAssertEqual(ad["Discoverable"]?.bool, true)
    }

    /// Only the advertisement is registered again: a central connected meanwhile keeps its
    /// session (its request in progress is answered).
    func testAdvertisesAgainAfterBluetoothdReleasedTheAdvertisement() throws {
        try start(["sh", "-c", "sleep 0.5; cat"])
        let key = connection.uniqueName + "/org/blpipe/blserve_advertisement"
        XCTAssertNotNil(bluez.advertisements[key])
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "hi"), from: a))
        bluez.releaseAdvertisement(of: connection.uniqueName, path: "/org/blpipe/blserve_advertisement")
        XCTAssertTrue(loop.run(until: { self.server.peripheral.advertisementsReleased == 1 }, timeout: 5))
        XCTAssertEqual(server.peripheral.state, .registered)
        XCTAssertTrue(loop.run(until: { self.server.peripheral.advertisementsRenewed == 1 }, timeout: 5), "not advertising again")
        XCTAssertNotNil(bluez.advertisements[key])
        XCTAssertEqual(server.peripheral.registrationCount, 1, "the application was registered again too")
        XCTAssertEqual(reply(for: a, bytes: 10), "T0000002hi")
    }

    func testNordicUARTLayout() throws {
        try start(["--nus", "--write-without-response", "--mode", "raw", "cat"])
        let app = try XCTUnwrap(bluez.applications[connection.uniqueName + "/org/blpipe/blserve"])
        let rx = try XCTUnwrap(app["/org/blpipe/blserve/service0/char0"]?[BlueZ.gattCharacteristicInterface])
        let tx = try XCTUnwrap(app["/org/blpipe/blserve/service0/char1"]?[BlueZ.gattCharacteristicInterface])
        XCTAssertEqual(rx["UUID"]?.string, "6e400002-b5a3-f393-e0a9-e50e24dcca9e")
        XCTAssertEqual(rx["Flags"]?.stringArray, ["write", "write-without-response"])
        XCTAssertEqual(tx["UUID"]?.string, "6e400003-b5a3-f393-e0a9-e50e24dcca9e")
        XCTAssertEqual(tx["Flags"]?.stringArray, ["read", "notify"])
    }

    func testRegistersAgainAfterBluetoothdRestarts() throws {
        try start(["cat"])
        XCTAssertEqual(server.peripheral.registrationCount, 1)
        let started = MonotonicClock.seconds()
        try bluez.restart()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.registrationCount == 2 }, timeout: 5), "\(server.peripheral.state)")
        XCTAssertLessThan(MonotonicClock.seconds() - started, 5)
        XCTAssertNotNil(bluez.applications[connection.uniqueName + "/org/blpipe/blserve"])
        ok(bluez.write(frame("T", "after"), from: a))
        XCTAssertEqual(reply(for: a), "T0000005after")
    }

    /// What is known of devices (bonded, BR/EDR) comes again from the new bluetoothd's objects:
    /// devices it no longer has were kept for ever, a little memory per restart.
    func testDevicesTheRestartedBluetoothdNoLongerHasAreForgotten() throws {
        try start(["cat"])
        try bluez.setPaired(a, true)
        try bluez.setDeviceProperties(b, ["Class": .uint32(0x5a020c), "AddressType": .string("public")])
        XCTAssertEqual(server.peripheral.bondedDevices, [a])
        XCTAssertEqual(server.peripheral.classicDevices, [b])
        try bluez.restart()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.registrationCount == 2 }, timeout: 5), "\(server.peripheral.state)")
        XCTAssertEqual(server.peripheral.bondedDevices, [])
        XCTAssertEqual(server.peripheral.classicDevices, [])
    }

    func testRegistersAgainWhenTheAdapterReturns() throws {
        try start(["cat"])
        try bluez.removeAdapter()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.state != .registered }, timeout: 5))
        try bluez.addAdapter()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.registrationCount == 2 }, timeout: 5), "\(server.peripheral.state)")
        XCTAssertNotNil(bluez.applications[connection.uniqueName + "/org/blpipe/blserve"])
        XCTAssertNotNil(bluez.advertisements[connection.uniqueName + "/org/blpipe/blserve_advertisement"])
    }

    /// While the adapter is away blserve asks bluetoothd less and less often (a dongle may stay
    /// unplugged for hours), yet registers at once when the adapter's return is signalled.
    func testRegistersAtOnceWhenTheAdapterReturnsAfterALongAbsence() throws {
        try start(["cat"])
        try bluez.removeAdapter()
        settle(6)  // the retries are 4 s apart by now
        let back = MonotonicClock.seconds()
        try bluez.addAdapter()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.registrationCount == 2 }, timeout: 5), "\(server.peripheral.state)")
        XCTAssertLessThan(MonotonicClock.seconds() - back, 1, "registered by a retry, not by the adapter's return")
    }

    /// --secure: blserve's agent (NoInputNoOutput) is registered before the application, again
    /// after a bluetoothd restart, and unregistered at the end. It accepts a Just Works pairing
    /// only from a central of its adapter that --allow lets in, refuses what needs a person, and
    /// answers bluetoothd only.
    func testSecureRegistersAnAgentThatAcceptsOnlyAllowedCentralsOfItsAdapter() throws {
        try start(["--secure", "--allow", "00:00:00:00:00:01", "cat"])
        let agent = "/org/blpipe/blserve_agent"
        // What bluetoothd is told to enforce: reads, writes and notifications only over an
        // encrypted link (the bench's test 62 pairs before it writes, so it cannot show this).
        let app = try XCTUnwrap(bluez.applications[connection.uniqueName + "/org/blpipe/blserve"])
        let chrc = try XCTUnwrap(app[FakeBluetoothd.charPath]?[BlueZ.gattCharacteristicInterface])
        XCTAssertEqual(chrc["Flags"]?.stringArray, ["read", "encrypt-read", "write", "encrypt-write", "notify", "encrypt-notify"])
        XCTAssertEqual(bluez.agents[connection.uniqueName + agent], "NoInputNoOutput")
        XCTAssertEqual(bluez.registrationOrder, ["agent", "application"], "a central may pair as soon as it finds the service")
        func ask(_ member: String, _ args: [DBusValue]) -> Result<Void, DBusError> {
            bluez.askAgent(of: connection.uniqueName, path: agent, member, args)
        }
        func rejected(_ result: Result<Void, DBusError>) -> Bool { refusal(result) == "Rejected" }
        XCTAssertNoThrow(try ask("RequestAuthorization", [.objectPath(a)]).get())
        XCTAssertTrue(rejected(ask("RequestAuthorization", [.objectPath(b)])), "a central --allow does not list")
        XCTAssertTrue(rejected(ask("RequestAuthorization", [.objectPath("/org/bluez/hci1/dev_00_00_00_00_00_01")])),
                      "another adapter's device")
        XCTAssertTrue(rejected(ask("RequestAuthorization", [.objectPath("/org/bluez/hci00/dev_00_00_00_00_00_01")])),
                      "a device of an adapter whose name starts like this one's")
        XCTAssertTrue(rejected(ask("RequestConfirmation", [.objectPath(a), .uint32(123456)])))
        XCTAssertTrue(rejected(ask("AuthorizeService", [.objectPath(a), .string("0000110b-0000-1000-8000-00805f9b34fb")])))
        let other = try DBusConnection(address: bus.address, loop: loop)
        XCTAssertThrowsError(try other.callAndWait(destination: connection.uniqueName, path: agent, interface: BlueZ.agentInterface,
                                                   member: "RequestAuthorization", args: [.objectPath(a)], timeout: 5)) { error in
            XCTAssertEqual((error as? DBusError)?.name, "org.bluez.Error.Rejected", "a caller other than bluetoothd")
        }

        try bluez.restart()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.registrationCount == 2 }, timeout: 5), "\(server.peripheral.state)")
        XCTAssertEqual(bluez.agents[connection.uniqueName + agent], "NoInputNoOutput", "not registered again")
        XCTAssertNoThrow(try ask("RequestAuthorization", [.objectPath(a)]).get())

        server.shutdown()
        XCTAssertTrue(bluez.agents.isEmpty, "the agent stayed registered")
    }

    /// A refused RegisterAgent does not hold up the service, and the agent alone is registered
    /// again later (after 1 s, then 2 s), without registering the application again.
    func testSecureRegistersTheAgentAgainAfterARefusal() throws {
        bluez.agentRefusals = 2
        try start(["--secure", "cat"])
        XCTAssertTrue(bluez.agents.isEmpty)
        XCTAssertEqual(bluez.registrationOrder, ["agent", "application"])
        let started = MonotonicClock.seconds()
        XCTAssertTrue(loop.run(until: { !self.bluez.agents.isEmpty }, timeout: 6), "the agent was not registered again")
        XCTAssertGreaterThan(MonotonicClock.seconds() - started, 2.5, "retried before 1 s and then 2 s had passed")
        XCTAssertEqual(bluez.registrationOrder, ["agent", "application", "agent", "agent"])
        XCTAssertEqual(server.peripheral.registrationCount, 1)
        settle(1.5)
        XCTAssertEqual(bluez.registrationOrder.count, 4, "registered again once it had succeeded")
        server.shutdown()
        XCTAssertTrue(bluez.agents.isEmpty, "the agent stayed registered")
    }

    /// Stopping ends the agent's retries.
    func testSecureStopsRetryingTheAgentWhenStopped() throws {
        bluez.agentRefusals = .max
        try start(["--secure", "cat"])
        server.shutdown()
        loop.clearStop()
        let calls = bluez.registrationOrder.count
        let started = MonotonicClock.seconds()
        settle(1.5)
        XCTAssertGreaterThan(MonotonicClock.seconds() - started, 1.4)
        XCTAssertEqual(bluez.registrationOrder.count, calls, "RegisterAgent sent after the server stopped")
    }

    /// The agent belongs to bluetoothd, not to the adapter: it is unregistered at the end also
    /// while the adapter is away.
    func testSecureUnregistersTheAgentWhileTheAdapterIsAway() throws {
        try start(["--secure", "cat"])
        XCTAssertEqual(bluez.agents.count, 1)
        try bluez.removeAdapter()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.state != .registered }, timeout: 5))
        server.shutdown()
        XCTAssertTrue(bluez.agents.isEmpty, "the agent stayed registered")
    }

    /// A device known over BR/EDR (it has a Class of Device) pairs for classic profiles, not as
    /// a central of ours: refused without --allow. One that --allow names is agreed to.
    func testSecureRefusesAClassicPairing() throws {
        try start(["--secure", "cat"])
        try bluez.setDeviceProperties(dualMode, ["AddressType": .string("public"), "Class": .uint32(0x240404)])
        XCTAssertEqual(agentAnswer(dualMode), "Rejected")
        XCTAssertEqual(agentAnswer(a), "agreed")
    }

    func testSecureAgreesForADeviceWithAClassThatAllowNames() throws {
        try start(["--secure", "--allow", "00:00:00:00:00:04", "cat"])
        try bluez.setDeviceProperties(dualMode, ["AddressType": .string("public"), "Class": .uint32(0x240404)])
        XCTAssertEqual(agentAnswer(dualMode), "agreed", "a dual-mode central --allow names")
        XCTAssertEqual(agentAnswer(a), "Rejected")
    }

    private var dualMode: String { FakeBluetoothd.device(4) }

    /// blserve's agent's answer to RequestAuthorization for `device`: "agreed" or the error.
    private func agentAnswer(_ device: String) -> String {
        refusal(bluez.askAgent(of: connection.uniqueName, path: "/org/blpipe/blserve_agent", "RequestAuthorization",
                               [.objectPath(device)])) ?? "agreed"
    }

    func testNoAgentWithoutSecure() throws {
        try start(["cat"])
        XCTAssertTrue(bluez.agents.isEmpty)
    }

    func testOnlyBluetoothdMayCall() throws {
        try start(["cat"])
        let other = try DBusConnection(address: bus.address, loop: loop)
        XCTAssertThrowsError(try other.callAndWait(destination: connection.uniqueName, path: FakeBluetoothd.charPath,
                                                   interface: BlueZ.gattCharacteristicInterface, member: "ReadValue",
                                                   args: [.stringDict(["device": .objectPath(a)])], timeout: 5)) { error in
            XCTAssertEqual((error as? DBusError)?.name, "org.bluez.Error.NotPermitted")
        }
    }

    /// bluetoothd's own call to `Release` is taken (the advertisement is registered again, see
    /// above); another process calling it is refused and changes nothing.
    func testOnlyBluetoothdMayReleaseTheAdvertisement() throws {
        try start(["cat"])
        let other = try DBusConnection(address: bus.address, loop: loop)
        XCTAssertThrowsError(try other.callAndWait(destination: connection.uniqueName, path: "/org/blpipe/blserve_advertisement",
                                                   interface: BlueZ.advertisementInterface, member: "Release", timeout: 5)) { error in
            XCTAssertEqual((error as? DBusError)?.name, "org.bluez.Error.NotPermitted")
        }
        settle(0.3)
        XCTAssertEqual(server.peripheral.advertisementsReleased, 0)
        XCTAssertEqual(server.peripheral.advertisementsRenewed, 0)
    }

    /// Everything the application exports answers bluetoothd only: its properties, its objects
    /// and `Confirm` too, and the agent's `Cancel` and `Release`.
    func testNothingTheServerExportsAnswersAnotherCaller() throws {
        try start(["--secure", "cat"])
        let other = try DBusConnection(address: bus.address, loop: loop)
        let calls: [(path: String, interface: String, member: String, args: [DBusValue], refusal: String)] = [
            (FakeBluetoothd.charPath, DBusInterfaceName.properties, "GetAll", [.string(BlueZ.gattCharacteristicInterface)],
             "org.bluez.Error.NotPermitted"),
            (FakeBluetoothd.charPath, BlueZ.gattCharacteristicInterface, "Confirm", [], "org.bluez.Error.NotPermitted"),
            ("/org/blpipe/blserve", DBusInterfaceName.objectManager, "GetManagedObjects", [], "org.bluez.Error.NotPermitted"),
            ("/org/blpipe/blserve_advertisement", DBusInterfaceName.properties, "GetAll", [.string(BlueZ.advertisementInterface)],
             "org.bluez.Error.NotPermitted"),
            ("/org/blpipe/blserve_agent", BlueZ.agentInterface, "Cancel", [], "org.bluez.Error.Rejected"),
            ("/org/blpipe/blserve_agent", BlueZ.agentInterface, "Release", [], "org.bluez.Error.Rejected"),
        ]
        for c in calls {
            XCTAssertThrowsError(try other.callAndWait(destination: connection.uniqueName, path: c.path, interface: c.interface,
                                                       member: c.member, args: c.args, timeout: 5), "\(c.path) \(c.member)") { error in
                XCTAssertEqual((error as? DBusError)?.name, c.refusal, "\(c.path) \(c.member)")
            }
        }
        // bluetoothd itself still reads them.
        XCTAssertNoThrow(try bluez.connection.callAndWait(destination: connection.uniqueName, path: FakeBluetoothd.charPath,
                                                          interface: DBusInterfaceName.properties, member: "GetAll",
                                                          args: [.string(BlueZ.gattCharacteristicInterface)], timeout: 5))
    }

    /// A RegisterApplication that got no answer in time may still be under way in bluetoothd
    /// (5.66 queues the application first, answers another RegisterApplication for it with
    /// AlreadyExists, and drops it if reading its objects fails). Taking that AlreadyExists for
    /// success left blserve "registered" with no service once the first call failed; the
    /// application is now unregistered and registered again.
    func testARegistrationLeftUnansweredIsUnregisteredBeforeTheNext() throws {
        try start(["cat"])
        server.peripheral.registrationTimeout = 1
        bluez.holdNextRegistration = 4
        try bluez.restart()
        XCTAssertTrue(loop.run(until: { self.server.peripheral.state == .registered }, timeout: 10), "\(server.peripheral.state)")
        settle(4)  // past the moment the held call would have been refused
        XCTAssertEqual(server.peripheral.state, .registered)
        XCTAssertEqual(bluez.applications.count, 1, "bluetoothd holds no application")
        XCTAssertEqual(bluez.advertisements.count, 1)
    }

    /// A bluetoothd that keeps refusing: the registration is tried again less and less often,
    /// and the agent (refused too) is tried by one chain of retries, not one more per attempt.
    func testRefusedRegistrationsBackOffAndTheAgentRetriesDoNotPileUp() throws {
        try start(["--secure", "cat"])
        let (registrations, agents) = (bluez.registerCalls, bluez.agentCalls)
        bluez.agentRefusals = .max
        bluez.applicationRefusals = .max
        try bluez.restart()
        settle(12)
        // Attempts at about 0, 1, 3 and 7 s (each refusal doubles the wait, up to 30 s).
        let attempts = bluez.registerCalls - registrations
        XCTAssertGreaterThanOrEqual(attempts, 3)
        XCTAssertLessThanOrEqual(attempts, 4)
        let times = Array(bluez.registerTimes.suffix(attempts))
        for (i, (earlier, later)) in zip(times, times.dropFirst()).enumerated() {
            XCTAssertGreaterThanOrEqual(later - earlier, 0.9 * Double(1 << i), "retry \(i + 1) came too soon: \(times)")
        }
        XCTAssertLessThanOrEqual(bluez.agentCalls - agents, 2 * attempts + 2, "RegisterApplication \(attempts) times")
    }

    /// Stopping while the advertisement is being registered again (bluetoothd released it)
    /// unregisters it: the registration under way would otherwise complete, and bluetoothd hold
    /// the advertisement after blserve has gone.
    func testStoppingWhileTheAdvertisementIsRegisteredAgainUnregistersIt() throws {
        try start(["cat"])
        bluez.releaseAdvertisement(of: connection.uniqueName, path: "/org/blpipe/blserve_advertisement")
        XCTAssertTrue(loop.run(until: { self.server.peripheral.advertisementsReleased == 1 }, timeout: 5))
        server.peripheral.stop(timeout: 2)
        settle(0.5)
        XCTAssertEqual(bluez.advertisements.count, 0, "bluetoothd holds the advertisement after the stop")
        XCTAssertEqual(bluez.applications.count, 0)
    }

    /// SIGINT/SIGTERM after a registration that stopped half way (the application registered,
    /// the advertisement refused) still unregisters the application.
    func testStoppingAfterAHalfRegistrationUnregistersTheApplication() throws {
        try start(["cat"])
        bluez.advertisementRefusals = .max
        try bluez.restart()
        XCTAssertTrue(loop.run(until: { !self.bluez.applications.isEmpty && self.bluez.advertisementCalls > 0 }, timeout: 5))
        settle(0.2)
        XCTAssertNotEqual(server.peripheral.state, .registered)
        server.peripheral.stop(timeout: 2)
        XCTAssertEqual(bluez.applications.count, 0, "the application is still registered")
    }

    // MARK: - Frame mode

    func testReplyIsQueuedForTheAskerAndAnnouncedWithADoorbell() throws {
        try start(["cat"])
        let request = frame("T", "hello, world, again")
        ok(bluez.write(Array(request[0..<5]), from: a))
        ok(bluez.write(Array(request[5...]), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        XCTAssertEqual(bluez.notifications, [Array("N0000000".utf8)])
        // Another central reads nothing.
        XCTAssertEqual(bluez.readAll(from: b), [])
        // The asker reads its reply in pieces of MTU-3.
        XCTAssertEqual(try bluez.read(from: a, mtu: 23).get(), Array("T0000019hello, world".utf8))
        XCTAssertEqual(try bluez.read(from: a, mtu: 23, offset: 4).get(), Array("0019hello, world".utf8))  // a Read Blob of that piece
        XCTAssertEqual(try bluez.read(from: a, mtu: 23).get(), Array(", again".utf8))
        XCTAssertEqual(try bluez.read(from: a, mtu: 23).get(), [])
    }

    func testTheDoorbellRingsOnlyOnceTheReplyIsQueued() throws {
        try start(["--doorbell", "ready", "sh", "-c", "sleep 0.5; cat"])
        let started = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "wait for me"), from: a))
        // A read before the reply is ready finds nothing, and no doorbell has rung yet.
        XCTAssertEqual(try bluez.read(from: a).get(), [])
        XCTAssertEqual(bluez.notifications, [])
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - started, 0.5)
        XCTAssertEqual(String(decoding: bluez.readAll(from: a), as: UTF8.self), "T0000011wait for me")
        XCTAssertEqual(bluez.notifications, [Array("N0000000".utf8)])
    }

    /// --doorbell early: the doorbell rings as the run begins, and the asker's read waits for
    /// the reply; another central's read is answered at once.
    func testAnEarlyDoorbellRingsAsTheRunBeginsAndTheReadWaitsForTheReply() throws {
        try start(["--doorbell", "early", "sh", "-c", "sleep 0.4; cat"])
        let written = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "wait for me"), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        XCTAssertLessThan(MonotonicClock.seconds() - written, 0.35, "the doorbell waited for the run")
        XCTAssertEqual(bluez.notifications, [Array("N0000000".utf8)])
        let other = MonotonicClock.seconds()
        XCTAssertEqual(try bluez.read(from: b).get(), [])
        XCTAssertLessThan(MonotonicClock.seconds() - other, 0.2, "a central with no run under way was kept waiting")
        XCTAssertEqual(try bluez.read(from: a, mtu: 23).get(), Array("T0000011wait for me".utf8))
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - written, 0.4)
        XCTAssertEqual(try bluez.read(from: a, mtu: 23).get(), [])
        settle(0.2)
        XCTAssertEqual(bluez.notifications.count, 1, "the reply rang a second time")
    }

    /// A run slower than the hold: the held read ends empty after about 1 s, the reply rings
    /// once it is queued, and the next request's doorbell waits for its reply; a quick run
    /// brings the early doorbell back. The seed client's parser sees only N frames besides the
    /// replies.
    func testARunSlowerThanTheHoldRingsAgainAndTheNextDoorbellWaitsForItsReply() throws {
        try start(["--doorbell", "early", "sh", "-c", "b=$(cat); case $b in slow) sleep 1.6;; medium) sleep 0.4;; esac; printf %s \"$b\""])
        ok(bluez.write(frame("T", "slow"), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 1), "no early doorbell")
        var stream = try XCTUnwrap(bluez.notifications.first)
        var seen = 1
        let held = MonotonicClock.seconds()
        XCTAssertEqual(try bluez.read(from: a).get(), [])
        let waited = MonotonicClock.seconds() - held
        XCTAssertGreaterThan(waited, 0.8)
        XCTAssertLessThan(waited, 1.5)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count == 2 }, timeout: 5), "the slow reply did not ring")
        stream += try XCTUnwrap(bluez.notifications.dropFirst().first)
        seen = 2
        XCTAssertEqual(readLikeTheSeedClient(a, mtu: 185, stream: &stream, seen: &seen), ["N0000000", "N0000000", "T0000004slow"])

        // After a slow run, the doorbell waits for the reply: a read finds nothing at once.
        let written = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "medium"), from: a))
        XCTAssertEqual(try bluez.read(from: a).get(), [])
        XCTAssertLessThan(MonotonicClock.seconds() - written, 0.35, "the read was held without an early doorbell")
        XCTAssertEqual(bluez.notifications.count, 2)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count == 3 }, timeout: 5))
        XCTAssertGreaterThanOrEqual(MonotonicClock.seconds() - written, 0.4)
        XCTAssertEqual(String(decoding: bluez.readAll(from: a), as: UTF8.self), "T0000006medium")

        // That run was quick: the next rings early again.
        let again = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "medium"), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count == 4 }, timeout: 5))
        XCTAssertLessThan(MonotonicClock.seconds() - again, 0.35, "the doorbell waited for the run")
        XCTAssertEqual(String(decoding: bluez.readAll(from: a), as: UTF8.self), "T0000006medium")
    }

    /// A held read is answered when its central leaves, and when a run ends without a reply.
    func testHeldReadsEndWhenTheCentralLeavesOrNoReplyComes() throws {
        try start(["--doorbell", "early", "--reply-code", "raw", "sh", "-c", "b=$(cat); sleep 0.5; [ \"$b\" = quiet ] || printf %s \"$b\""])
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "quiet"), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        let held = MonotonicClock.seconds()
        XCTAssertEqual(try bluez.read(from: a).get(), [])
        let waited = MonotonicClock.seconds() - held
        XCTAssertGreaterThan(waited, 0.4)
        XCTAssertLessThan(waited, 0.9, "the read waited past the run")

        ok(bluez.write(frame("T", "gone"), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count == 2 }, timeout: 5))
        var answer: Result<[UInt8], DBusError>?
        bluez.startRead(from: a) { answer = $0 }
        settle(0.1)
        XCTAssertNil(answer, "the read was not held")
        let left = MonotonicClock.seconds()
        try bluez.setConnected(a, false)
        XCTAssertTrue(loop.run(until: { answer != nil }, timeout: 2))
        XCTAssertLessThan(MonotonicClock.seconds() - left, 0.3, "the held read outlived its central")
        XCTAssertEqual(try answer?.get(), [])
    }

    /// The RaspBLE client puts every notification and every read value into one stream parser
    /// and reads until an empty value. Reads so for `device`, appending to `stream` each value
    /// and then the notifications that came meanwhile (from `seen` on); returns the frames the
    /// client's parser finds in the stream (seed-protocol.md, client 3 and 4).
    private func readLikeTheSeedClient(_ device: String, mtu: Int, stream: inout [UInt8], seen: inout Int) -> [String] {
        for _ in 0..<10_000 {
            guard case .success(let piece) = bluez.read(from: device, mtu: mtu) else { break }
            stream += piece
            settle(0.05)
            for n in bluez.notifications[seen...] { stream += n }
            seen = bluez.notifications.count
            if piece.isEmpty { break }
        }
        var frames: [String] = []
        var rest = stream[...]
        while true {
            while let byte = rest.first, !Array("NTUI".utf8).contains(byte) { rest = rest.dropFirst() }
            guard rest.count >= 8, let size = Int(String(decoding: rest.dropFirst().prefix(7), as: UTF8.self)),
                  rest.count >= 8 + size else { break }
            frames.append(String(decoding: rest.prefix(8 + size), as: UTF8.self))
            rest = rest.dropFirst(8 + size)
        }
        if !rest.isEmpty { frames.append("left over: " + String(decoding: rest, as: UTF8.self)) }
        return frames
    }

    /// Another central's doorbell waits while a central reads a reply (it would land in that
    /// reply's body for a client like RaspBLE's), also after the reply's last piece (a client
    /// taking notifications through a socket may see it before that piece), until its chain of
    /// reads ends with an empty read.
    func testTheDoorbellWaitsWhileACentralReadsAReply() throws {
        try start(["cat"])
        let long = String(repeating: "y", count: 100)
        ok(bluez.write(frame("T", long), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        var stream = bluez.notifications[0]
        var seen = 1
        // B heard A's doorbell too, and read (nothing: its request has not come yet).
        XCTAssertEqual(try bluez.read(from: b).get(), [])
        stream += try bluez.read(from: a, mtu: 23).get()
        ok(bluez.write(frame("T", "b"), from: b))
        settle(0.5)
        XCTAssertEqual(bluez.notifications.count, 1, "B's doorbell rang while A was inside its reply")
        // The rest of A's reply, piece by piece: no doorbell until a read finds nothing.
        while stream.count < 8 + 108 {
            stream += try bluez.read(from: a, mtu: 23).get()
            settle(0.05)
            XCTAssertEqual(bluez.notifications.count, 1, "B's doorbell rang before A's chain of reads ended")
        }
        let frames = readLikeTheSeedClient(a, mtu: 23, stream: &stream, seen: &seen)
        XCTAssertEqual(frames, ["N0000000", "T0000100" + long, "N0000000"])
        XCTAssertEqual(reply(for: b), "T0000001b")
    }

    /// A central that has not read since the last doorbell may be about to: its first read's
    /// answer would overtake a doorbell given to bluetoothd just before, so the next doorbell
    /// waits for it too.
    func testTheDoorbellWaitsForACentralThatHasNotReadSinceTheLastOne() throws {
        try start(["cat"])
        ok(bluez.write(frame("T", String(repeating: "w", count: 100)), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        XCTAssertEqual(try bluez.read(from: b).get(), [])
        ok(bluez.write(frame("T", "b"), from: b))
        settle(0.5)
        XCTAssertEqual(bluez.notifications.count, 1, "B's doorbell rang before A had read after the one before")
        XCTAssertEqual(bluez.readAll(from: a, mtu: 23).count, 108)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count == 2 }, timeout: 1), "B's doorbell did not follow A's reads")
        XCTAssertEqual(reply(for: b), "T0000001b")
    }

    /// A central's own next reply, ready while it reads the one before, is read in the same
    /// chain of reads; the doorbell comes after it, where the client's parser sees an empty N
    /// frame.
    func testTheDoorbellOfAPipelinedReplyLandsBetweenFrames() throws {
        try start(["sh", "-c", "b=$(cat); [ \"$b\" = second ] && sleep 0.5; printf %s \"$b\""])
        let long = String(repeating: "x", count: 100)
        ok(bluez.write(frame("T", long) + frame("T", "second"), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        var stream = bluez.notifications[0]
        var seen = 1
        stream += try bluez.read(from: a, mtu: 23).get()
        settle(1)
        XCTAssertEqual(bluez.notifications.count, 1, "the second doorbell rang inside the first reply")
        let frames = readLikeTheSeedClient(a, mtu: 23, stream: &stream, seen: &seen)
        XCTAssertEqual(frames, ["N0000000", "T0000100" + long, "T0000006second", "N0000000"])
    }

    /// A central that stops reading before the end holds the doorbell back for about 2 s only.
    func testAStalledReaderHoldsTheDoorbellBackBriefly() throws {
        try start(["cat"])
        ok(bluez.write(frame("T", String(repeating: "z", count: 100)), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        _ = try bluez.read(from: a, mtu: 23).get()
        let readAt = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "b"), from: b))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count == 2 }, timeout: 5), "B's doorbell never rang")
        let waited = MonotonicClock.seconds() - readAt
        XCTAssertGreaterThan(waited, 1.5)
        XCTAssertLessThan(waited, 3.5)
        XCTAssertEqual(reply(for: b), "T0000001b")
    }

    /// Reads at an offset (ATT Read Blob) are no step in a chain of reads: a central repeating
    /// them (a piece always fits one read, so the protocol never needs one) does not keep
    /// another central's doorbell waiting.
    func testReadsAtAnOffsetDoNotHoldTheDoorbell() throws {
        // The doorbell waits for the reply here: rung as the run begins, it would leave before
        // B's reads.
        try start(["--doorbell", "ready", "cat"])
        try bluez.setConnected(a, true)
        try bluez.setConnected(b, true)
        ok(bluez.write(frame("T", "one"), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        XCTAssertEqual(try bluez.read(from: b).get(), [])
        XCTAssertEqual(bluez.readAll(from: a).count, 11)
        // B, which has written nothing, reads at an offset again and again.
        let written = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "two"), from: a))
        var rangAfter: Double?
        for _ in 0..<15 {
            _ = bluez.read(from: b, offset: 1)
            if bluez.notifications.count == 2 {
                rangAfter = MonotonicClock.seconds() - written
                break
            }
            settle(0.2)
        }
        XCTAssertNotNil(rangAfter, "the doorbell was held back for 3 s by reads at an offset")
        XCTAssertLessThan(rangAfter ?? 99, 1.5)
        XCTAssertEqual(reply(for: a), "T0000003two")
    }

    func testEachCentralIsReassembledSeparately() throws {
        try start(["cat"])
        let forA = frame("T", "from A")
        let forB = frame("T", "from B")
        ok(bluez.write(Array(forA[0..<6]), from: a))
        ok(bluez.write(Array(forB[0..<3]), from: b))
        ok(bluez.write(Array(forB[3...]), from: b))
        ok(bluez.write(Array(forA[6...]), from: a))
        XCTAssertEqual(reply(for: b), "T0000006from B")
        XCTAssertEqual(reply(for: a), "T0000006from A")
    }

    func testRequestsOfOneCentralInOrderOthersConcurrently() throws {
        try start(["sh", "-c", "sleep 1; cat"])
        ok(bluez.write(frame("T", "1") + frame("T", "2") + frame("T", "3"), from: a))
        settle(0.2)
        ok(bluez.write(frame("T", "b"), from: b))
        // B's one request finishes while A's three run one after another.
        XCTAssertEqual(reply(for: b, timeout: 5), "T0000001b")
        var gotA = ""
        XCTAssertTrue(loop.run(until: {
            gotA += String(decoding: self.bluez.readAll(from: self.a), as: UTF8.self)
            return gotA.count >= 27
        }, timeout: 10))
        XCTAssertEqual(gotA, "T00000011T00000012T00000013")
    }

    func testOversizedFrameIsRefusedAtOnceAndTheNextRequestWorks() throws {
        try start(["--max-frame", "100", "cat"])
        XCTAssertEqual(refusal(bluez.write(Array("T0000101".utf8), from: a)), "0x80")
        XCTAssertEqual(refusal(bluez.write(Array("I9999999".utf8), from: a)), "0x80")
        ok(bluez.write(frame("T", "fine"), from: a))
        XCTAssertEqual(reply(for: a), "T0000004fine")
    }

    func testMalformedFramesAndBadOffsetsAreRefused() throws {
        try start(["cat"])
        XCTAssertEqual(refusal(bluez.write(Array("hello".utf8), from: a)), "0x81")
        XCTAssertEqual(refusal(bluez.write(Array("T12x".utf8), from: a)), "0x81")
        ok(bluez.write(Array("T0000004ab".utf8), from: a))
        XCTAssertEqual(refusal(bluez.write(Array("cd".utf8), from: a, offset: 3)), "InvalidOffset")
        ok(bluez.write(Array("cd".utf8), from: a, offset: 10))
        XCTAssertEqual(reply(for: a), "T0000004abcd")
    }

    func testAllowListRefusesOtherCentrals() throws {
        try start(["--allow", "00:00:00:00:00:01", "cat"])
        XCTAssertEqual(refusal(bluez.write(frame("T", "x"), from: b)), "NotPermitted")
        guard case .failure(let e) = bluez.read(from: b) else { return XCTFail("read allowed") }
        XCTAssertEqual(e.shortName, "NotPermitted")
        ok(bluez.write(frame("T", "x"), from: a))
        XCTAssertEqual(reply(for: a), "T0000001x")
    }

    /// Every GATT call names its central; a device of another adapter is none of this server's
    /// (bluetoothd never sends one), so it gets neither a handler nor state, and is refused.
    func testACallNamingADeviceOfAnotherAdapterIsRefused() throws {
        try start(["cat"])
        let elsewhere = "/org/bluez/hci7/dev_00_00_00_00_00_09"
        XCTAssertEqual(refusal(bluez.write(frame("T", "x"), from: elsewhere)), "NotPermitted")
        guard case .failure(let e) = bluez.read(from: elsewhere) else { return XCTFail("read allowed") }
        XCTAssertEqual(e.shortName, "NotPermitted")
        ok(bluez.write(frame("T", "x"), from: a))
        XCTAssertEqual(reply(for: a), "T0000001x")
    }

    /// A connected central that --allow refuses can never read, so no doorbell waits for it to
    /// end a chain of reads: one had held every doorbell after the first for 2 s (the wait for a
    /// stalled reader), and any device in range could slow the server down that way.
    func testACentralThatAllowRefusesHoldsNoDoorbellBack() throws {
        try start(["--allow", "00:00:00:00:00:01", "cat"])
        try bluez.startNotify()
        try bluez.setConnected(a, true)
        try bluez.setConnected(b, true)
        for i in 0..<3 {
            XCTAssertLessThan(secondsUntilDoorbell(afterWriting: frame("T", "hi\(i)"), from: a), 1, "doorbell \(i) held back")
            XCTAssertEqual(bluez.notifications.first, Array("N0000000".utf8))
            XCTAssertEqual(reply(for: a), "T0000003hi\(i)")
        }
    }

    /// a asks and reads its reply to the end (its doorbell rang); then b connects.
    private func connectBAfterADoorbellOfA() throws {
        try start(["cat"])
        try bluez.startNotify()
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "a"), from: a))
        XCTAssertEqual(reply(for: a), "T0000001a")
        try bluez.setConnected(b, true)
    }

    /// The seconds from writing `value` as `device` until a notification came (10 at most).
    private func secondsUntilDoorbell(afterWriting value: [UInt8], from device: String,
                                      file: StaticString = #filePath, line: UInt = #line) -> Double {
        bluez.clearNotifications()
        let started = MonotonicClock.seconds()
        ok(bluez.write(value, from: device), file: file, line: line)
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 10), "no doorbell", file: file, line: line)
        return MonotonicClock.seconds() - started
    }

    /// A central that connects after a doorbell rang never heard it, so it owes no chain of
    /// reads: its own first request had waited 2 s (the wait for a stalled reader) for it to
    /// end one, whenever it connected within 2 s of anyone's doorbell.
    func testACentralConnectingAfterADoorbellIsNotWaitedFor() throws {
        try connectBAfterADoorbellOfA()
        XCTAssertLessThan(secondsUntilDoorbell(afterWriting: frame("T", "b"), from: b), 1, "the new central's doorbell held back")
        XCTAssertEqual(reply(for: b), "T0000001b")
    }

    /// b connects after a's doorbell and writes nothing: a's next doorbell does not wait for it.
    func testACentralConnectingAfterADoorbellHoldsNoOtherDoorbellBack() throws {
        try connectBAfterADoorbellOfA()
        XCTAssertLessThan(secondsUntilDoorbell(afterWriting: frame("T", "c"), from: a), 1, "a's doorbell held back by b")
    }

    /// a's 100-byte reply is announced, and b hears that doorbell; b's write comes before its
    /// read does (`beforeItsRead` runs between). b's own doorbell must wait for that read: rung
    /// as soon as a has read its reply, it would land in the middle of the first piece b reads.
    private func assertBWaitedForAfterHearingADoorbell(beforeItsRead: () throws -> Void = {},
                                                       file: StaticString = #filePath, line: UInt = #line) throws {
        ok(bluez.write(frame("T", String(repeating: "w", count: 100)), from: a), file: file, line: line)
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5), file: file, line: line)
        ok(bluez.write(frame("T", "b"), from: b), file: file, line: line)
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 5), file: file, line: line)
        try beforeItsRead()
        settle(0.3)
        XCTAssertEqual(bluez.readAll(from: a, mtu: 23).count, 108, file: file, line: line)
        settle(0.3)
        XCTAssertEqual(bluez.notifications.count, 1, "b's doorbell rang although b had not read since the doorbell it heard",
                       file: file, line: line)
    }

    /// A central whose connection bluetoothd has not signalled yet may have heard a doorbell.
    func testAnUnsignalledCentralThatHeardADoorbellIsWaitedFor() throws {
        try start(["--doorbell", "ready", "cat"])
        try assertBWaitedForAfterHearingADoorbell()
    }

    /// The same when its Connected signal comes after its write (and before its read): that
    /// late signal does not make it one that heard nothing.
    func testALateConnectedSignalDoesNotExemptACentralThatHeardADoorbell() throws {
        try start(["--doorbell", "ready", "cat"])
        try assertBWaitedForAfterHearingADoorbell(beforeItsRead: { try self.bluez.setConnected(self.b, true) })
    }

    /// The same for a dual-mode central (it showed a Class, so it counts as a listener only once
    /// it writes), connected before the doorbell.
    func testADualModeCentralThatHeardADoorbellIsWaitedFor() throws {
        try start(["--doorbell", "ready", "cat"])
        try bluez.startNotify()
        try bluez.setDeviceProperties(b, ["Class": .uint32(0x5a020c), "AddressType": .string("public")])
        try bluez.setConnected(a, true)
        try bluez.setConnected(b, true)
        try assertBWaitedForAfterHearingADoorbell()
    }

    func testCrashingAndHangingHandlersThenAGoodRequest() throws {
        let script = "b=$(cat); case $b in crash) kill -SEGV $$;; hang) sleep 60;; fail) exit 3;; *) printf %s \"$b\";; esac"
        try start(["--handler-timeout", "0.5", "sh", "-c", script])
        ok(bluez.write(frame("T", "crash"), from: a))
        XCTAssertEqual(reply(for: a), "T0000036error: killed by signal 11 (SIGSEGV)")
        ok(bluez.write(frame("T", "fail"), from: a))
        XCTAssertEqual(reply(for: a), "T0000020error: exit status 3")
        let started = MonotonicClock.seconds()
        ok(bluez.write(frame("T", "hang"), from: a))
        XCTAssertEqual(reply(for: a), "T0000028error: timed out after 0.5 s")
        XCTAssertLessThan(MonotonicClock.seconds() - started, 3)
        ok(bluez.write(frame("T", "good"), from: a))
        XCTAssertEqual(reply(for: a), "T0000004good")
    }

    func testQueueCapRefusesTheCentralUntilItReads() throws {
        try start(["--max-queue", "2", "cat"])
        ok(bluez.write(frame("T", "1") + frame("T", "2"), from: a))
        XCTAssertEqual(refusal(bluez.write(frame("T", "3"), from: a)), "0x82")
        // Another central has its own queue.
        ok(bluez.write(frame("T", "b"), from: b))
        XCTAssertEqual(reply(for: a, bytes: 18), "T00000011T00000012")
        ok(bluez.write(frame("T", "3"), from: a))
        XCTAssertEqual(reply(for: a), "T00000013")
    }

    /// --max-buffered bounds what all centrals together make blserve hold: with their replies
    /// at the limit, a central holding its share or more starts no new frame (0x82) and its
    /// request already received waits, until a central reads; one under its share goes on.
    func testMaxBufferedHoldsBackCentralsOverTheirShare() throws {
        // Replies of 88 bytes (cat echoes 80); 170 bytes for three centrals: 56 each.
        try start(["--max-buffered", "170", "cat"])
        let c = FakeBluetoothd.device(3)
        for d in [a, b, c] { try bluez.setConnected(d, true) }
        let body = String(repeating: "x", count: 79)
        let frameMode = try XCTUnwrap(server.mode as? FrameMode)
        ok(bluez.write(frame("T", body + "a"), from: a))
        XCTAssertTrue(loop.run(until: { frameMode.heldReplyBytes == 88 }, timeout: 10))
        // Two frames in one write (taken: 88 bytes were held before it): the first runs, and
        // its reply takes all replies to 176; the second then waits, though b's own replies are
        // far from --max-held.
        ok(bluez.write(frame("T", body + "1") + frame("T", body + "2"), from: b))
        XCTAssertTrue(loop.run(until: { frameMode.heldReplyBytes == 176 }, timeout: 10))
        settle(1)
        XCTAssertEqual(frameMode.heldReplyBytes, 176, "b's second request ran beyond --max-buffered")
        // b, over its share, starts no new frame; c, under it, is served.
        XCTAssertEqual(refusal(bluez.write(frame("T", "3"), from: b)), "0x82")
        ok(bluez.write(frame("T", "c"), from: c))
        XCTAssertEqual(reply(for: c), "T0000001c")
        // a takes its reply: b's waiting request runs.
        XCTAssertEqual(reply(for: a, bytes: 88), "T0000080" + body + "a")
        XCTAssertEqual(reply(for: b, bytes: 176), "T0000080" + body + "1" + "T0000080" + body + "2")
    }

    /// When bluetoothd (or the adapter) goes, every central goes with it: the room one of
    /// them leaves must not start a waiting request of another that is going too.
    func testCentralsGoingTogetherStartNoWaitingRequest() throws {
        let runs = try scratchDirectory() + "/runs"
        try start(["--max-buffered", "100", "sh", "-c", "cat; echo x >> \(runs)"])
        for d in [a, b] { try bluez.setConnected(d, true) }
        let body = String(repeating: "x", count: 80)
        let frameMode = try XCTUnwrap(server.mode as? FrameMode)
        ok(bluez.write(frame("T", body), from: a))
        XCTAssertTrue(loop.run(until: { frameMode.heldReplyBytes == 88 }, timeout: 10))
        ok(bluez.write(frame("T", body) + frame("T", body), from: b))
        XCTAssertTrue(loop.run(until: { frameMode.heldReplyBytes == 176 }, timeout: 10))
        settle(0.5)
        XCTAssertTrue(server.children.isIdle)
        try bluez.removeAdapter()
        XCTAssertFalse(loop.run(until: { !self.server.children.isIdle }, timeout: 1.5),
                       "a request was started for a central that was going")
        XCTAssertEqual(lines(runs).count, 2)
    }

    func testMaxHeldHoldsTheNextRequestUntilTheCentralReads() throws {
        // Replies of 88 bytes: the second request runs (88 of 100 bytes held), the third waits
        // until the central has read.
        try start(["--max-held", "100", "cat"])
        let body = String(repeating: "x", count: 79)
        ok(bluez.write(frame("T", body + "1") + frame("T", body + "2") + frame("T", body + "3"), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 10))
        settle(1)
        XCTAssertEqual(bluez.notifications.count, 2, "the third request ran although 176 reply bytes were held")
        // Another central is not held back by this one.
        ok(bluez.write(frame("T", "b"), from: b))
        XCTAssertEqual(reply(for: b), "T0000001b")
        // Reading the first reply (one piece at MTU 185) lets the third run.
        XCTAssertEqual(String(decoding: try bluez.read(from: a).get(), as: UTF8.self), "T0000080" + body + "1")
        XCTAssertEqual(reply(for: a, bytes: 176), "T0000080" + body + "2" + "T0000080" + body + "3")
    }

    func testEmptyOutputRepliesWithAnNFrameAndAutoDetectsImages() throws {
        try start(["sh", "-c", "b=$(cat); [ \"$b\" = png ] && printf '\\211PNG\\r\\n\\032\\n' || true"])
        ok(bluez.write(frame("T", "quiet"), from: a))
        XCTAssertEqual(reply(for: a), "N0000000")
        ok(bluez.write(frame("T", "png"), from: a))
        XCTAssertEqual(Array(reply(for: a).utf8.prefix(8)), Array("I0000008".utf8))
    }

    func testPushGoesToTheSoleSubscriberAndFallsBackToPull() throws {
        try start(["--reply", "push", "--chunk", "5", "cat"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        ok(bluez.write(frame("T", "pushed"), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 3 }, timeout: 5))
        XCTAssertEqual(bluez.notifications.map { String(decoding: $0, as: UTF8.self) }, ["T0000", "006pu", "shed"])
        XCTAssertEqual(bluez.readAll(from: a), [])
        // A second central connects: replies are pulled again.
        try bluez.setConnected(b, true)
        bluez.clearNotifications()
        ok(bluez.write(frame("T", "pulled"), from: a))
        XCTAssertEqual(reply(for: a), "T0000006pulled")
        XCTAssertEqual(bluez.notifications, [Array("N0000000".utf8)])
    }

    /// A bonded central that subscribed and left keeps its subscription in bluetoothd (no
    /// StopNotify): a central alone now, which never subscribed, must find its reply by reading,
    /// not have it notified to nobody.
    func testPushOnlyToTheCentralThatSubscribed() throws {
        try start(["--reply", "push", "cat"])
        try bluez.setConnected(b, true)
        try bluez.startNotify()
        ok(bluez.write(frame("T", "b"), from: b))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications == [Array("T0000001b".utf8)] }, timeout: 5))
        try bluez.setPaired(b, true)
        try bluez.setConnected(b, false)  // bonded: its subscription stays
        XCTAssertTrue(server.notifyCharacteristic.notifying)
        try bluez.setConnected(a, true)
        bluez.clearNotifications()
        ok(bluez.write(frame("T", "a"), from: a))
        XCTAssertEqual(reply(for: a), "T0000001a")
        XCTAssertEqual(bluez.notifications, [Array("N0000000".utf8)])
        // Nor does a subscription that began while two centrals were connected name either.
        try bluez.stopNotify()
        try bluez.setConnected(b, true)
        try bluez.startNotify()
        try bluez.setConnected(b, false)
        bluez.clearNotifications()
        ok(bluez.write(frame("T", "a2"), from: a))
        XCTAssertEqual(reply(for: a), "T0000002a2")
    }

    /// A bonded central's subscription outlives its link and bluetoothd does not ask again when
    /// it comes back: it is still pushed to. A central subscribing later, alone, is known by
    /// its own StartNotify (bluetoothd makes one for every central that enables notifications).
    func testPushReachesABondedSubscriberBackAloneAndALaterSubscriber() throws {
        try start(["--reply", "push", "cat"])
        try bluez.setPaired(b, true)
        try bluez.setConnected(b, true)
        try bluez.startNotify()
        ok(bluez.write(frame("T", "1"), from: b))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications == [Array("T00000011".utf8)] }, timeout: 5))
        try bluez.setConnected(b, false)
        try bluez.setConnected(b, true)
        bluez.clearNotifications()
        ok(bluez.write(frame("T", "2"), from: b))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications == [Array("T00000012".utf8)] }, timeout: 5),
                      "the bonded central back alone was not pushed to: \(bluez.notifications)")
        XCTAssertEqual(bluez.readAll(from: b), [])

        try bluez.setConnected(b, false)
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        bluez.clearNotifications()
        ok(bluez.write(frame("T", "3"), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications == [Array("T00000013".utf8)] }, timeout: 5),
                      "a central that subscribed alone was not pushed to: \(bluez.notifications)")
    }

    func testDisconnectDropsTheCentralsState() throws {
        try start(["cat"])
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "unread"), from: a))
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 5))
        ok(bluez.write(Array("T00000".utf8), from: a))
        try bluez.setConnected(a, false)
        XCTAssertEqual(bluez.readAll(from: a), [])
        ok(bluez.write(frame("T", "new"), from: a))
        XCTAssertEqual(reply(for: a), "T0000003new")
    }

    func testHandlerEnvironment() throws {
        try start(["sh", "-c", "printf '%s %s %s %s %s' \"$BL_CODE\" \"$BL_SIZE\" \"$BL_DEVICE\" \"$BL_ADAPTER\" \"$BL_MTU\""])
        ok(bluez.write(frame("U", "http://x"), from: a, mtu: 247))
        XCTAssertEqual(reply(for: a), "T0000030U 8 00:00:00:00:00:01 hci0 247")
    }

    // MARK: - --prestart

    private func lines(_ path: String) -> [String] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").map(String.init)
    }

    func testPrestartAnswersEachRequestFromACommandStartedBeforeIt() throws {
        let log = try scratchDirectory() + "/starts"
        try start(["--prestart", "sh", "-c", "echo \"$BL_DEVICE\" >> \(log); printf '%s|' \"${BL_CODE-unset}\"; cat"])
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "one"), from: a))
        XCTAssertEqual(reply(for: a), "T0000009unset|one")
        // The next request's COMMAND is started (and waits for its stdin) before it comes.
        XCTAssertTrue(loop.run(until: { self.lines(log).count == 2 }, timeout: 5), "\(lines(log))")
        // It is tracked once its starting thread has reported, which may come after its first line.
        XCTAssertTrue(loop.run(until: { self.server.children.running.count == 1 }, timeout: 5),
                      "\(server.children.running.count) processes tracked")
        for (body, expected) in [("two", "T0000009unset|two"), ("three", "T0000011unset|three")] {
            let startsBefore = lines(log).count
            ok(bluez.write(frame("U", body), from: a))
            XCTAssertEqual(reply(for: a), expected)
            XCTAssertTrue(loop.run(until: { self.lines(log).count == startsBefore + 1 }, timeout: 5))
        }
        XCTAssertEqual(Set(lines(log)), ["00:00:00:00:00:01"])
        // One waits for the central's next request (tracked once its thread has reported); it
        // ends when the central leaves.
        XCTAssertTrue(loop.run(until: { self.server.children.running.count == 1 }, timeout: 5),
                      "\(server.children.running.count) processes tracked")
        try bluez.setConnected(a, false)
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 5),
                      "a COMMAND started ahead outlived its central")
        XCTAssertEqual(lines(log).count, 4)
    }

    func testPrestartTurnsItselfOffForACommandThatDoesNotWaitForItsRequest() throws {
        let log = try scratchDirectory() + "/starts"
        try start(["--prestart", "sh", "-c", "echo run >> \(log); echo fixed"])
        ok(bluez.write(frame("T", "r1"), from: a))
        XCTAssertEqual(reply(for: a), "T0000006fixed\n")
        XCTAssertTrue(loop.run(until: { self.lines(log).count == 2 && self.server.children.isIdle }, timeout: 5),
                      "the COMMAND started ahead did not run and end")
        for i in 2...3 {
            ok(bluez.write(frame("T", "r\(i)"), from: a))
            XCTAssertEqual(reply(for: a), "T0000006fixed\n")
        }
        settle(0.3)
        // The first request's run, the one started ahead (it ended at once: no more of them),
        // then a run per request.
        XCTAssertEqual(lines(log).count, 4)
        XCTAssertTrue(server.children.isIdle)
    }

    // MARK: - Raw and stream modes

    func testRawModeEchoesPerCentral() throws {
        try start(["--mode", "raw", "cat"])
        try bluez.startNotify()
        try bluez.setConnected(a, true)
        ok(bluez.write(Array("to A ".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 1 }, timeout: 5))
        XCTAssertEqual(bluez.notifications, [Array("to A ".utf8)])
        XCTAssertEqual(bluez.socketNotifications, 1, "raw mode notifies through AcquireNotify's socket")
        // With two centrals connected, output waits in each one's read queue (empty doorbell).
        try bluez.setConnected(b, true)
        bluez.clearNotifications()
        ok(bluez.write(Array("to B".utf8), from: b))
        XCTAssertEqual(reply(for: b), "to B")
        XCTAssertEqual(bluez.notifications, [[]])
        XCTAssertEqual(bluez.readAll(from: a), [])
    }

    /// A long write's pieces must continue the value: a gap or an overlap is refused with
    /// Invalid Offset and reaches no COMMAND.
    func testRawModeRefusesAWriteThatDoesNotContinueTheValue() throws {
        try start(["--mode", "raw", "cat"])
        try bluez.startNotify()
        try bluez.setConnected(a, true)
        ok(bluez.write(Array("AB".utf8), from: a))
        XCTAssertEqual(refusal(bluez.write(Array("XX".utf8), from: a, offset: 10)), "InvalidOffset")
        XCTAssertEqual(refusal(bluez.write(Array("YY".utf8), from: a, offset: 1)), "InvalidOffset")
        ok(bluez.write(Array("CD".utf8), from: a, offset: 2))
        ok(bluez.write(Array("EF".utf8), from: a, offset: 4))
        ok(bluez.write(Array("GH".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.flatMap { $0 }.count >= 8 }, timeout: 5))
        settle(0.3)
        XCTAssertEqual(String(decoding: bluez.notifications.flatMap { $0 }, as: UTF8.self), "ABCDEFGH")
    }

    /// A central back within the 2 s its old COMMAND has to end gets a new COMMAND: what it
    /// writes is not fed to the dying one (whose stdin is closed) and lost.
    /// The size of a file (0 when missing).
    private func fileSize(_ path: String) -> Int {
        var info = stat()
        return stat(path, &info) == 0 ? Int(info.st_size) : 0
    }

    private func contents(_ path: String) -> [UInt8] {
        (try? Array(Data(contentsOf: URL(fileURLWithPath: path)))) ?? []
    }

    /// Waits until the file at `path` has stopped growing for `quiet` seconds (the loop runs
    /// meanwhile, in steps: an idle loop would not look again).
    private func waitUntilSettled(_ path: String, quiet: Double = 0.5, timeout: Double = 20) {
        var size = -1
        var since = MonotonicClock.seconds()
        let deadline = since + timeout
        while MonotonicClock.seconds() < deadline {
            settle(0.05)
            let now = fileSize(path)
            if now != size {
                size = now
                since = MonotonicClock.seconds()
            } else if size > 0 && MonotonicClock.seconds() - since >= quiet {
                return
            }
        }
    }

    func testRawModeWriteRequestsWaitWhileTheCommandDoesNotRead() throws {
        let out = try scratchDirectory() + "/in"
        try start(["--mode", "raw", "sh", "-c", "sleep 2; exec cat > \(out)"])
        try bluez.setConnected(a, true)
        let data = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ $0 >> 8) }
        let started = MonotonicClock.seconds()
        var sent = 0
        while sent < data.count {
            let n = min(510, data.count - sent)
            let result = bluez.write(Array(data[sent..<sent + n]), from: a, mtu: 517)
            ok(result)
            if case .failure = result { return }
            sent += n
        }
        // The pipe and blserve's 64 KiB hold less than this: the central had to wait until
        // COMMAND read (without that, bluetoothd would have been answered at once).
        XCTAssertGreaterThan(MonotonicClock.seconds() - started, 1.5)
        waitUntilSettled(out)
        XCTAssertTrue(contents(out) == data, "COMMAND got \(fileSize(out)) bytes, not the \(data.count) written")
    }

    /// Raw mode with write commands, and a COMMAND that reads nothing until the file `go`
    /// exists, then copies its input to the file `out`.
    private func startRawWaitingForGo() throws -> (out: String, go: String) {
        let dir = try scratchDirectory()
        let out = dir + "/in", go = dir + "/go"
        try start(["--mode", "raw", "--write-without-response", "sh", "-c",
                   "while [ ! -e \(go) ]; do sleep 0.05; done; exec cat > \(out)"])
        return (out, go)
    }

    func testRawModeDropsWriteCommandsBeyondWhatItHolds() throws {
        // COMMAND reads nothing until every write has been taken or dropped.
        let (out, go) = try startRawWaitingForGo()
        try bluez.setConnected(a, true)
        let data = (0..<1_600_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 11) }
        var sent = 0
        while sent < data.count {
            let n = min(510, data.count - sent)
            try bluez.writeCommand(Array(data[sent..<sent + n]), from: a, mtu: 517)
            sent += n
        }
        // Handled in order: once a request after them is answered, every command has been.
        XCTAssertEqual(refusal(bluez.write([0], from: a, mtu: 517)), "0x82")
        XCTAssertTrue(FileManager.default.createFile(atPath: go, contents: nil))
        // Commands cannot be held back: beyond 1 MiB queued (plus what the pipe holds) they are
        // dropped, and COMMAND's input ends there (cat ends): it gets the stream's beginning, in
        // order, never a stream with a hole.
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 30), "COMMAND's input did not end")
        waitUntilSettled(out)
        let got = contents(out)
        XCTAssertGreaterThanOrEqual(got.count, (1 << 20) - 510)
        XCTAssertLessThan(got.count, data.count)
        XCTAssertTrue(got[...] == data[0..<got.count], "what COMMAND got is not the beginning of the stream")
        // The connection takes nothing more: a new COMMAND would get the stream part-way.
        XCTAssertEqual(unlink(out), 0)
        XCTAssertEqual(refusal(bluez.write(Array("more".utf8), from: a)), "0x82")
        settle(0.2)
        XCTAssertTrue(server.children.isIdle, "a COMMAND was started for a broken stream")
        // Connected again, the central starts afresh.
        try bluez.setConnected(a, false)
        try bluez.setConnected(a, true)
        ok(bluez.write(Array("next".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle == false }, timeout: 5))
        waitUntilSettled(out, timeout: 10)
        XCTAssertEqual(contents(out), Array("next".utf8))
    }

    /// A piece of a long write refused because COMMAND has 1 MiB unread (0x82) can be sent
    /// again at the same offset once it reads: the refused piece is not counted in the value.
    func testRawModeAcceptsARefusedPieceAgainAtItsOffset() throws {
        let (out, go) = try startRawWaitingForGo()
        try bluez.setConnected(a, true)
        let raw = try XCTUnwrap(server.mode as? RawMode)
        // Write commands until one more piece would not fit what blserve holds for COMMAND.
        let piece = [UInt8](repeating: 0x61, count: 510)
        var sent = 0
        func queued() -> Int { raw.sessions[a]?.stdin?.queuedCount ?? 0 }
        repeat {
            try bluez.writeCommand(piece, from: a, mtu: 517)
            sent += piece.count
            XCTAssertTrue(loop.run(until: { (raw.sessions[self.a]?.bytesIn ?? 0) + (raw.sessions[self.a]?.held.count ?? 0) >= sent },
                                   timeout: 10))
        } while queued() == 0 || queued() + 2 * piece.count <= RawMode.stdinLimit
        // The value's first piece fits; its second, a write request at offset 510, does not.
        try bluez.writeCommand(piece, from: a, mtu: 517)
        sent += piece.count
        XCTAssertEqual(refusal(bluez.write(piece, from: a, mtu: 517, offset: 510)), "0x82")
        XCTAssertTrue(FileManager.default.createFile(atPath: go, contents: nil))
        XCTAssertTrue(loop.run(until: { queued() < 65536 }, timeout: 20), "COMMAND does not read")
        ok(bluez.write(piece, from: a, mtu: 517, offset: 510))
        sent += piece.count
        waitUntilSettled(out)
        XCTAssertEqual(fileSize(out), sent)
    }

    /// Write commands over the limit while COMMAND is still starting: it gets what was held, then
    /// end of file.
    func testRawModeCutWhileItsCommandStarts() throws {
        let out = try scratchDirectory() + "/in"
        try start(["--mode", "raw", "--write-without-response", "sh", "-c", "exec cat > \(out)"])
        server.children.reportDelay = 1
        try bluez.setConnected(a, true)
        let data = (0..<1_200_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 11) }
        for piece in stride(from: 0, to: data.count, by: 500) {
            try bluez.writeCommand(Array(data[piece..<piece + 500]), from: a, mtu: 517)
        }
        XCTAssertEqual(refusal(bluez.write([0], from: a, mtu: 517)), "0x82")
        let raw = try XCTUnwrap(server.mode as? RawMode)
        XCTAssertNotNil(raw.sessions[a]?.starting, "COMMAND started before the cut: the test proves nothing")
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 10), "COMMAND's input did not end")
        waitUntilSettled(out)
        XCTAssertTrue(contents(out)[...] == data[0..<(1 << 20) / 500 * 500],
                      "COMMAND got \(fileSize(out)) bytes, not the \((1 << 20) / 500 * 500) held for it")
    }

    /// Write commands held for a COMMAND that then cannot start are lost without their central
    /// knowing: the connection takes nothing more (its write request is refused).
    func testRawModeWriteCommandsLostToAFailedStartBreakTheConnection() throws {
        let dir = try scratchDirectory()
        let handler = dir + "/handler"
        try "#!/bin/sh\nexec cat\n".write(toFile: handler, atomically: true, encoding: .utf8)
        XCTAssertEqual(chmod(handler, 0o755), 0)
        try start(["--mode", "raw", "--write-without-response", handler])
        XCTAssertEqual(chmod(handler, 0o644), 0)
        server.children.reportDelay = 0.5
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        try bluez.writeCommand(Array("lost ".utf8), from: a)
        XCTAssertEqual(refusal(bluez.write(Array("then ".utf8), from: a)), "0x83")
        XCTAssertEqual(chmod(handler, 0o755), 0)
        XCTAssertEqual(refusal(bluez.write(Array("more ".utf8), from: a)), "0x82")
        try bluez.setConnected(a, false)
        try bluez.setConnected(a, true)
        server.children.reportDelay = 0
        ok(bluez.write(Array("again".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().count >= 5 }, timeout: 5))
        XCTAssertEqual(String(decoding: bluez.notifications.joined(), as: UTF8.self), "again")
    }

    func testRawModeCentralBackAtOnceGetsANewCommand() throws {
        // Slow to end: ignores SIGHUP and lingers after end of input.
        try start(["--mode", "raw", "sh", "-c", "trap '' HUP; cat; sleep 1"])
        try bluez.setConnected(a, true)
        ok(bluez.write(Array("before ".utf8), from: a))
        XCTAssertEqual(reply(for: a), "before ")
        try bluez.setConnected(a, false)
        try bluez.setConnected(a, true)
        ok(bluez.write(Array("after".utf8), from: a))
        XCTAssertEqual(reply(for: a, timeout: 1.5), "after")
    }

    /// COMMAND starts on a thread of its own: what the central writes meanwhile is held and reaches
    /// it in order, and a write request is answered only once COMMAND runs.
    func testRawModeHoldsWhatComesWhileItsCommandStarts() throws {
        let out = try scratchDirectory() + "/in"
        try start(["--mode", "raw", "--write-without-response", "sh", "-c", "exec cat > \(out)"])
        try bluez.setConnected(a, true)
        let data = (0..<20_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 7) }
        // All sent before the loop runs: the first starts COMMAND, the rest come while it starts.
        for piece in stride(from: 0, to: data.count - 500, by: 500) {
            try bluez.writeCommand(Array(data[piece..<piece + 500]), from: a, mtu: 517)
        }
        let raw = try XCTUnwrap(server.mode as? RawMode)
        XCTAssertTrue(loop.run(until: { raw.sessions[self.a]?.held.isEmpty == false }, timeout: 5),
                      "nothing was held while COMMAND started: the test proves nothing")
        XCTAssertNotNil(raw.sessions[a]?.starting)
        // The last piece as a request: its answer means COMMAND runs and has it.
        ok(bluez.write(Array(data[(data.count - 500)...]), from: a, mtu: 517))
        XCTAssertNotNil(raw.sessions[a]?.process, "a write request was answered before COMMAND ran")
        waitUntilSettled(out)
        XCTAssertTrue(contents(out) == data, "COMMAND got \(fileSize(out)) bytes, not the \(data.count) written")
    }

    /// A COMMAND that cannot be started gets the central's write request refused, not taken and
    /// lost; the next write starts it again.
    func testRawModeRefusesWritesWhenItsCommandCannotStart() throws {
        let dir = try scratchDirectory()
        let handler = dir + "/handler"
        try "#!/bin/sh\nexec cat\n".write(toFile: handler, atomically: true, encoding: .utf8)
        XCTAssertEqual(chmod(handler, 0o755), 0)
        try start(["--mode", "raw", handler])
        XCTAssertEqual(chmod(handler, 0o644), 0)  // found at start-up, no longer executable
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        XCTAssertEqual(refusal(bluez.write(Array("lost? ".utf8), from: a)), "0x83")
        XCTAssertEqual(chmod(handler, 0o755), 0)
        ok(bluez.write(Array("again".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().count >= 5 }, timeout: 5))
        XCTAssertEqual(String(decoding: bluez.notifications.joined(), as: UTF8.self), "again")
    }

    func testRawModeCarriesALargeTransferBothWays() throws {
        try start(["--mode", "raw", "cat"])
        let data = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 9) }
        var sent = 0
        var received: [UInt8] = []
        // Two centrals connected: everything comes back through reads.
        try bluez.setConnected(a, true)
        try bluez.setConnected(b, true)
        while sent < data.count {
            let n = min(510, data.count - sent)
            ok(bluez.write(Array(data[sent..<sent + n]), from: a, mtu: 517))
            sent += n
            received += bluez.readAll(from: a, mtu: 517)
        }
        XCTAssertTrue(loop.run(until: {
            received += self.bluez.readAll(from: self.a, mtu: 517)
            return received.count >= data.count
        }, timeout: 20))
        XCTAssertEqual(received.count, data.count)
        XCTAssertTrue(received == data)
    }

    /// Raw mode's output goes through the notification socket, in order, as fast as bluetoothd
    /// reads it; an empty notification (the doorbell when a second central connects) is a signal
    /// and must not overtake what the socket still holds; when bluetoothd closes the socket (the
    /// last central unsubscribed), output waits in the central's read queue.
    func testRawModeNotifiesThroughTheSocketInOrder() throws {
        try start(["--mode", "raw", "cat"])
        try bluez.startNotify(mtu: 517)
        try bluez.setConnected(a, true)
        XCTAssertEqual(server.notifyCharacteristic.notifySocketCentrals, [a])
        let data = (0..<60_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ $0 >> 8) }
        for start in stride(from: 0, to: data.count, by: 510) {
            ok(bluez.write(Array(data[start..<min(start + 510, data.count)]), from: a, mtu: 517))
        }
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.reduce(0) { $0 + $1.count } >= data.count }, timeout: 20))
        XCTAssertTrue(Array(bluez.notifications.joined()) == data)
        XCTAssertEqual(bluez.socketNotifications, bluez.notifications.count)
        XCTAssertTrue(bluez.notifications.allSatisfy { $0.count <= GattCharacteristic.socketNotificationLimit && $0.count <= 512 })

        // A second central: what comes next waits in A's read queue, announced by an empty
        // notification (a signal), which must not overtake what bluetoothd has not yet read from
        // the socket.
        bluez.clearNotifications()
        bluez.pauseSocketReads(true)
        ok(bluez.write(Array(repeating: 0x61, count: 400), from: a, mtu: 517))
        XCTAssertTrue(loop.run(until: { self.server.notifyCharacteristic.notifySocketBacklog > 0 }, timeout: 5))
        try bluez.setConnected(b, true)
        ok(bluez.write(Array("tail".utf8), from: a, mtu: 517))
        settle(0.5)
        XCTAssertEqual(bluez.notifications, [], "a signal overtook the socket")
        bluez.pauseSocketReads(false)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        XCTAssertEqual(bluez.notifications, [Array(repeating: 0x61, count: 400), []])
        XCTAssertEqual(reply(for: a, bytes: 4, mtu: 517), "tail")

        // The last central unsubscribes: bluetoothd closes the socket; output goes to reads.
        try bluez.setConnected(b, false)
        try bluez.stopNotify()
        XCTAssertTrue(loop.run(until: { !self.server.notifyCharacteristic.notifying }, timeout: 5))
        XCTAssertEqual(server.notifyCharacteristic.notifySocketCentrals, [])
        let throughSocket = bluez.socketNotifications
        ok(bluez.write(Array("after".utf8), from: a, mtu: 517))
        XCTAssertEqual(reply(for: a, bytes: 5, mtu: 517), "after")
        XCTAssertEqual(bluez.socketNotifications, throughSocket)
    }

    /// Output still waiting in the notifier when pushing stops (another central connects) is
    /// moved to the read queue; output that comes after it must go there after it, not before.
    func testRawModeOutputKeepsItsOrderWhenPushingStops() throws {
        try start(["--mode", "raw", "cat"])
        try bluez.startNotify(mtu: 517)
        try bluez.setConnected(a, true)
        bluez.pauseSocketReads(true)
        var data: [UInt8] = []
        // Until output waits in the notifier itself (the socket is full).
        for n in 0..<2000 {
            let piece = (0..<510).map { UInt8(truncatingIfNeeded: ($0 &+ n &* 510) &* 7 &+ n) }
            ok(bluez.write(piece, from: a, mtu: 517))
            data += piece
            settle(0.01)
            // Still there a moment later: held back by the full socket, not just queued before
            // the notifier's next turn (on a busy machine that turn can come after the check).
            if server.notifier.pendingBytes > 0 {
                settle(0.1)
                if server.notifier.pendingBytes > 0 { break }
            }
        }
        XCTAssertGreaterThan(server.notifier.pendingBytes, 0, "nothing waits in the notifier: the test proves nothing")
        try bluez.setConnected(b, true)
        ok(bluez.write(Array("tail".utf8), from: a, mtu: 517))
        settle(0.3)
        XCTAssertGreaterThan(server.notifier.pendingBytes, 0, "the notifier ran dry: the test proves nothing")
        bluez.pauseSocketReads(false)
        XCTAssertTrue(loop.run(until: { self.server.notifier.isIdle }, timeout: 30))
        let notified = Array(bluez.notifications.joined())
        var got = notified
        XCTAssertTrue(loop.run(until: {
            got += self.bluez.readAll(from: self.a, mtu: 517)
            return got.count >= data.count + 4
        }, timeout: 10))
        XCTAssertEqual(got.count, data.count + 4)
        XCTAssertTrue(got == data + Array("tail".utf8), "output out of order")
    }

    /// Output that went to the read queue while another central was connected is notified once
    /// the central is the only one again (a terminal app never reads), and later output after it.
    func testRawModeNotifiesWhatWaitedUnreadOnceTheCentralIsAloneAgain() throws {
        try start(["--mode", "raw", "cat"])
        try bluez.startNotify()
        try bluez.setConnected(a, true)
        try bluez.setConnected(b, true)
        ok(bluez.write(Array("one".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 1 }, timeout: 5))
        XCTAssertEqual(bluez.notifications, [[]], "with two centrals the output waits to be read")
        try bluez.setConnected(b, false)
        ok(bluez.write(Array("two".utf8), from: a))
        // "one" and "two" may go as one notification (output still waiting is joined).
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().count >= 6 }, timeout: 5))
        XCTAssertEqual(String(decoding: bluez.notifications.joined(), as: UTF8.self), "onetwo")
        XCTAssertEqual(bluez.readAll(from: a), [], "the same bytes must not also wait to be read")
    }

    /// What raw mode holds for a central is bounded in bytes, however often pushing stops and
    /// starts: another central coming and going (any device in range can connect) moved output
    /// waiting in the notifier back to the read queue as one piece, and a cap counted in pieces
    /// then let stdout be read again; merged for the next push and diverted back again, the
    /// queue grew by about a megabyte each time.
    func testRawModeHoldsBoundedOutputWhileAnotherCentralComesAndGoes() throws {
        try start(["--mode", "raw", "sh", "-c", "exec cat /dev/zero"])
        try bluez.setConnected(a, true)
        ok(bluez.write(Array("go".utf8), from: a, mtu: 517))
        let raw = try XCTUnwrap(server.mode as? RawMode)
        func held() -> Int { (raw.sessions[a]?.replies.pendingBytes ?? 0) + server.notifier.pendingBytes }
        // Not subscribed: the output waits to be read, up to the cap.
        XCTAssertTrue(loop.run(until: { held() >= RawMode.readQueueBytes }, timeout: 10))
        try bluez.startNotify(device: a, mtu: 517)
        // A bluetoothd slower than blserve: its socket takes a little now and then.
        bluez.pauseSocketReads(true)
        var most = 0
        for _ in 0..<6 {
            settle(0.2)
            try bluez.setConnected(b, true)
            bluez.pauseSocketReads(false)
            settle(0.02)
            bluez.pauseSocketReads(true)
            settle(0.3)
            most = max(most, held())
            try bluez.setConnected(b, false)
            settle(0.2)
            most = max(most, held())
        }
        XCTAssertLessThan(most, RawMode.readQueueBytes + 512 * 1024, "held \(most) bytes for one central")
    }

    /// A socket carries a central's output only while that central is the only one connected
    /// and the socket is its own: from BlueZ 5.76 a socket reaches its central only, up to 5.75
    /// every subscriber (bluez-notes §3.8). Otherwise the output is a signal.
    func testRawModeUsesOnlyTheSoleCentralsOwnSocket() throws {
        try start(["--mode", "raw", "cat"])
        try bluez.startNotify(device: a)
        try bluez.startNotify(device: b)
        XCTAssertEqual(Set(server.notifyCharacteristic.notifySocketCentrals), [a, b])
        try bluez.setConnected(b, true)
        ok(bluez.write(Array("one".utf8), from: b))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 1 }, timeout: 5))
        XCTAssertEqual(bluez.notifications, [Array("one".utf8)])
        XCTAssertEqual(bluez.notificationSources, [b])

        // B's subscription ends; A's socket stays (5.66 keeps the one it made for the first
        // central): B's output must not take A's socket.
        try bluez.stopNotify(device: b)
        XCTAssertTrue(loop.run(until: { self.server.notifyCharacteristic.notifySocketCentrals == [self.a] }, timeout: 5))
        bluez.clearNotifications()
        ok(bluez.write(Array("two".utf8), from: b))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 1 }, timeout: 5))
        XCTAssertEqual(bluez.notifications, [Array("two".utf8)])
        XCTAssertEqual(bluez.notificationSources, ["signal"])

        // The last socket closes: nobody is subscribed.
        try bluez.stopNotify(device: a)
        XCTAssertTrue(loop.run(until: { !self.server.notifyCharacteristic.notifying }, timeout: 5))
    }

    /// Whether `pid` is a live process (not gone, not a zombie).
    /// COMMAND ended, but something it started holds its stdout: stopping blserve ends that too
    /// (the server's terminateAll sees only the processes it has not reaped).
    private func checkStopEndsWhatAReapedCommandLeft(mode: String) throws {
        try start(["--mode", mode, "sh", "-c", "sleep 300 & echo $!"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        if mode == "raw" { ok(bluez.write(Array("x".utf8), from: a)) }
        XCTAssertTrue(loop.run(until: {
            self.bluez.notifications.joined().contains(0x0A) && self.server.children.isIdle
        }, timeout: 5))
        let pid = try notifiedPid()
        XCTAssertTrue(isAlive(pid), "the background sleep is not running: the test proves nothing")
        server.shutdown()
        // The loop is stopped now (its waits return at once): poll.
        for _ in 0..<300 where isAlive(pid) { usleep(10_000) }
        XCTAssertFalse(isAlive(pid), "\(mode) mode: sleep \(pid) still runs")
        if isAlive(pid) { kill(pid, SIGKILL) }
    }

    func testRawModeStopEndsWhatAReapedCommandLeft() throws {
        try checkStopEndsWhatAReapedCommandLeft(mode: "raw")
    }

    func testStreamModeStopEndsWhatAReapedCommandLeft() throws {
        try checkStopEndsWhatAReapedCommandLeft(mode: "stream")
    }

    /// Raw mode: a COMMAND's run ends with it. What it left in its group is killed when it
    /// ends (at once when nothing holds its stdout, after a second's grace otherwise), without
    /// waiting for blserve to stop: a central must not pile up processes by making COMMAND
    /// start and end again and again.
    private func checkRawModeEndsWhatACommandLeft(holdingStdout: Bool) throws {
        let background = holdingStdout ? "sleep 300 &" : "sleep 300 >/dev/null 2>&1 &"
        let pid = try startRawCommandReportingPid("\(background) echo $!")
        XCTAssertTrue(loop.run(until: { !isAlive(pid) }, timeout: 4),
                      "sleep \(pid), left by a COMMAND that ended, still runs (holding stdout: \(holdingStdout))")
        if isAlive(pid) { kill(pid, SIGKILL) }
        // The session is over: the next write starts a new COMMAND.
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 5))
        bluez.clearNotifications()
        ok(bluez.write(Array("y".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().contains(0x0A) }, timeout: 5),
                      "no new COMMAND for the next write")
    }

    /// What a central writes while its ended COMMAND's run waits out the exit grace (something
    /// it started holds its stdout) is not lost: it is the next COMMAND's input.
    func testRawModeWritesDuringTheExitGraceGoToTheNextCommand() throws {
        _ = try startRawCommandReportingPid("sleep 300 & echo $!; read line; echo \"first $line\"")
        ok(bluez.write(Array("one\n".utf8), from: a))
        XCTAssertTrue(loop.run(until: { String(decoding: self.bluez.notifications.joined(), as: UTF8.self).contains("first xone\n") }, timeout: 5))
        // The shell has ended; its sleep holds stdout for up to a second.
        settle(0.3)
        bluez.clearNotifications()
        ok(bluez.write(Array("two\n".utf8), from: a))
        XCTAssertTrue(loop.run(until: { String(decoding: self.bluez.notifications.joined(), as: UTF8.self).contains("first two\n") }, timeout: 6),
                      "what was written during the grace was lost: \(String(decoding: bluez.notifications.joined(), as: UTF8.self))")
    }

    /// A write request made during the exit grace is answered only once the next COMMAND runs:
    /// when that one cannot start, it is refused, not taken and lost.
    func testRawModeWriteRequestDuringTheExitGraceIsRefusedWhenTheNextCommandCannotStart() throws {
        let handler = try scratchDirectory() + "/handler"
        try "#!/bin/sh\nsleep 300 & echo $!; read line; echo \"first $line\"\n".write(toFile: handler, atomically: true, encoding: .utf8)
        XCTAssertEqual(chmod(handler, 0o755), 0)
        try start(["--mode", "raw", handler])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        ok(bluez.write(Array("x\n".utf8), from: a))
        XCTAssertTrue(loop.run(until: { String(decoding: self.bluez.notifications.joined(), as: UTF8.self).contains("first x\n") }, timeout: 5))
        let sleeper = try notifiedPid()
        defer { kill(sleeper, SIGKILL) }
        // The script has ended; its sleep holds stdout for up to a second, and then the next
        // COMMAND, started for what comes meanwhile, cannot be.
        settle(0.3)
        XCTAssertEqual(chmod(handler, 0o644), 0)
        XCTAssertEqual(refusal(bluez.write(Array("two\n".utf8), from: a)), "0x83")
        XCTAssertEqual(chmod(handler, 0o755), 0)
        bluez.clearNotifications()
        ok(bluez.write(Array("three\n".utf8), from: a))
        XCTAssertTrue(loop.run(until: { String(decoding: self.bluez.notifications.joined(), as: UTF8.self).contains("first three\n") }, timeout: 5),
                      String(decoding: bluez.notifications.joined(), as: UTF8.self))
    }

    /// Raw mode running `sh -c SCRIPT`, whose first line of output is a pid: A connects and
    /// subscribes, its first write starts COMMAND; returns the pid once notified.
    private func startRawCommandReportingPid(_ script: String) throws -> pid_t {
        try start(["--mode", "raw", "sh", "-c", script])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        ok(bluez.write(Array("x".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().contains(0x0A) }, timeout: 5))
        return try notifiedPid()
    }

    /// The pid on the first line of what was notified.
    private func notifiedPid() throws -> pid_t {
        let text = String(decoding: bluez.notifications.joined(), as: UTF8.self)
        return try XCTUnwrap(pid_t(text.split(separator: "\n").first.map(String.init) ?? ""), text)
    }

    func testRawModeEndsWhatACommandLeftWhenItEnds() throws {
        try checkRawModeEndsWhatACommandLeft(holdingStdout: false)
    }

    func testRawModeEndsWhatACommandLeftHoldingItsStdoutAfterAGrace() throws {
        try checkRawModeEndsWhatACommandLeft(holdingStdout: true)
    }

    /// A process COMMAND started outside its group (setsid) may go on, but holding COMMAND's
    /// stdout it does not keep the session: after the grace the next write gets a new COMMAND.
    func testRawModeSessionEndsAfterTheGraceEvenIfAnEscapedProcessHoldsStdout() throws {
        let pid = try startRawCommandReportingPid("setsid sleep 300 & echo $!")
        defer { kill(pid, SIGKILL) }
        bluez.clearNotifications()
        settle(2)  // past the grace
        ok(bluez.write(Array("y".utf8), from: a))
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().contains(0x0A) }, timeout: 5),
                      "the session still waits for the stdout an escaped process holds")
        XCTAssertTrue(isAlive(pid), "a process started with setsid is not COMMAND's to end")
    }

    /// BlueZ 5.69 to 5.87 (bluez/bluez#1452): as a subscribed central disconnects, bluetoothd
    /// also closes the socket of another subscribed central, which stays subscribed and is never
    /// asked for again. Whichever comes first, the sockets' end or the disconnect, the central
    /// still connected keeps getting the stream (by signal); a socket that ends alone is an
    /// unsubscription.
    private func checkStreamSurvivesAnotherCentralLeaving(disconnectFirst: Bool) throws {
        try start(["--mode", "stream", "sh", "-c", "while :; do echo x; sleep 0.05; done"])
        try bluez.setConnected(a, true)
        try bluez.setConnected(b, true)
        try bluez.startNotify(device: a)
        try bluez.startNotify(device: b)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        if disconnectFirst { try bluez.setConnected(b, false) }
        try bluez.stopNotify(device: a)
        try bluez.stopNotify(device: b)
        if !disconnectFirst {
            settle(0.3)
            try bluez.setConnected(b, false)
        }
        settle(1.5)
        XCTAssertTrue(server.notifyCharacteristic.notifying, "A, still connected and subscribed, was taken for unsubscribed")
        bluez.clearNotifications()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 3 }, timeout: 5), "the stream stopped for A")
        XCTAssertEqual(Set(bluez.notificationSources), ["signal"])
        // A leaves too: nobody is subscribed.
        try bluez.setConnected(a, false)
        XCTAssertFalse(server.notifyCharacteristic.notifying)
    }

    func testStreamSurvivesBlueZClosingAnotherCentralsSocketOnADisconnect() throws {
        try checkStreamSurvivesAnotherCentralLeaving(disconnectFirst: false)
    }

    func testStreamSurvivesBlueZClosingAnotherCentralsSocketAfterADisconnect() throws {
        try checkStreamSurvivesAnotherCentralLeaving(disconnectFirst: true)
    }

    func testASocketEndingAloneIsAnUnsubscription() throws {
        try start(["--mode", "stream", "sh", "-c", "while :; do echo x; sleep 0.05; done"])
        try bluez.setConnected(a, true)
        try bluez.startNotify(device: a)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        try bluez.stopNotify(device: a)
        XCTAssertTrue(loop.run(until: { !self.server.notifyCharacteristic.notifying }, timeout: 3),
                      "A unsubscribed (its socket ended, nobody disconnected) but is still counted")
        settle(0.3)
        bluez.clearNotifications()
        settle(0.5)
        XCTAssertEqual(bluez.notifications, [], "notified nobody")
    }

    /// Stream mode: the stream ends with COMMAND, as a run does in the other modes. What it
    /// left in its group is killed then (after a second while it holds stdout, whose output
    /// until then is still notified), EOM follows, and blserve ends without waiting for it.
    private func checkStreamModeEndsWhatItsCommandLeft(holdingStdout: Bool) throws {
        let background = holdingStdout ? "sleep 300 &" : "sleep 300 >/dev/null 2>&1 &"
        try start(["--mode", "stream", "--eom", "sh", "-c", "\(background) echo $!"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().contains(0x0A) }, timeout: 5))
        let pid = try notifiedPid()
        let started = MonotonicClock.seconds()
        XCTAssertTrue(loop.run(until: { self.server.stopping }, timeout: 5),
                      "blserve waits for what COMMAND left (holding stdout: \(holdingStdout))")
        if holdingStdout { XCTAssertGreaterThan(MonotonicClock.seconds() - started, 0.5, "no grace") }
        for _ in 0..<300 where isAlive(pid) { usleep(10_000) }
        XCTAssertFalse(isAlive(pid), "sleep \(pid), left by the stream's COMMAND, still runs (holding stdout: \(holdingStdout))")
        if isAlive(pid) { kill(pid, SIGKILL) }
        XCTAssertEqual(bluez.notifications.last, Array("EOM".utf8))
    }

    func testStreamModeEndsWhatItsCommandLeftHoldingStdout() throws {
        try checkStreamModeEndsWhatItsCommandLeft(holdingStdout: true)
    }

    func testStreamModeEndsWhatItsCommandLeftRunning() throws {
        try checkStreamModeEndsWhatItsCommandLeft(holdingStdout: false)
    }

    func testStreamModeChunksAndEOM() throws {
        try start(["--mode", "stream", "--chunk", "20", "--eom", "printf", "abcdefghijklmnopqrstuvwxyz0123456789"])
        XCTAssertEqual(server.application.characteristics[0].flags, ["read", "notify"])
        XCTAssertEqual(server.children.running.count, 0, "started before anyone subscribed")
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        _ = loop.run(until: { self.bluez.notifications.count >= 3 }, timeout: 5)
        XCTAssertEqual(bluez.notifications.map { String(decoding: $0, as: UTF8.self) },
                       ["abcdefghijklmnopqrst", "uvwxyz0123456789", "EOM"])
        XCTAssertEqual(bluez.socketNotifications, 3, "stream mode notifies through AcquireNotify's socket")
        _ = loop.run(until: { self.server.stopping }, timeout: 5)
        XCTAssertTrue(server.stopping, "blserve did not end after the stream")
    }
    /// Stream mode sizes its notifications for every connected central: a subscriber known
    /// only from AcquireNotify gets what its MTU allows, and a second central whose MTU is
    /// smaller (or not known: BlueZ 5.66 names only the first subscriber) brings the size
    /// down, since bluetoothd would cut a longer value short for it without a word.
    func testStreamModeSizesNotificationsForEveryConnectedCentral() throws {
        let text = String(repeating: "0123456789", count: 30)
        let script = "while :; do printf %s \(text); sleep 0.2; done"
        try start(["--mode", "stream", "sh", "-c", script])
        try bluez.setConnected(a, true)
        try bluez.startNotify(device: a, mtu: 517)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        XCTAssertEqual(bluez.notifications.first?.count, 300, "the subscriber's MTU (517) allows 300 bytes at once")

        // A keyboard connected over BR/EDR is no central of ours: the size stays.
        let keyboard = FakeBluetoothd.device(4)
        try bluez.setDeviceProperties(keyboard, ["AddressType": .string("public"), "Class": .uint32(0x2540)])
        try bluez.setConnected(keyboard, true)
        settle(0.5)
        bluez.clearNotifications()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        XCTAssertEqual(bluez.notifications.first?.count, 300, "a BR/EDR device counted as a central")

        // A second central connects: its MTU is not known, so 20 until it shows one.
        try bluez.setConnected(b, true)
        settle(0.5)
        bluez.clearNotifications()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 20 }, timeout: 5))
        XCTAssertEqual(Set(bluez.notifications.map(\.count)), [20], "a connected central of unknown MTU")

        // It reads with an MTU of 100: 95 bytes at most; a larger MTU elsewhere does not count.
        _ = bluez.read(from: b, mtu: 100)
        _ = bluez.read(from: a, mtu: 517)
        settle(0.5)
        bluez.clearNotifications()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 8 }, timeout: 5))
        XCTAssertEqual(bluez.notifications.map(\.count).max(), 95)

        // Once it has gone, the subscriber's own MTU sets the size again.
        try bluez.setConnected(b, false)
        settle(0.5)
        bluez.clearNotifications()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        XCTAssertEqual(bluez.notifications.first?.count, 300)
    }

    // MARK: - Disconnects and push fallback

    func testACommandRunningForACentralThatLeftIsKilled() throws {
        try start(["sleep", "30"])
        for i in 1...5 {
            let d = FakeBluetoothd.device(i)
            try bluez.setConnected(d, true)
            ok(bluez.write(frame("T", "x"), from: d))
            XCTAssertTrue(loop.run(until: { self.server.children.running.count == i }, timeout: 5))
        }
        for i in 1...5 { try bluez.setConnected(FakeBluetoothd.device(i), false) }
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 5),
                      "\(server.children.running.count) commands still run for centrals that left")
    }

    /// bluetoothd can announce a connection that came and went as one Connected=false: the
    /// central's state (here its running COMMAND) goes all the same.
    func testADisconnectOfACentralNeverSeenConnectedEndsItsState() throws {
        try start(["sleep", "30"])
        ok(bluez.write(frame("T", "x"), from: a))
        XCTAssertTrue(loop.run(until: { self.server.children.running.count == 1 }, timeout: 5))
        try bluez.setConnected(a, false)
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 5),
                      "the command of a central that left still runs")
    }

    func testACentralThatReconnectsGetsNoReplyFromItsEarlierConnection() throws {
        try start(["sh", "-c", "sleep 1; cat"])
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "one"), from: a))
        settle(0.2)
        try bluez.setConnected(a, false)
        try bluez.setConnected(a, true)
        ok(bluez.write(frame("T", "two"), from: a))
        XCTAssertEqual(reply(for: a, bytes: 11, timeout: 5), "T0000003two")
        settle(1.5)
        XCTAssertEqual(bluez.readAll(from: a), [])
    }

    /// `--reply push -- cat` with central A subscribed, `backlog` one-byte notifications queued
    /// in the notifier, then A asks "first": its reply waits behind the backlog.
    private func pushFirstReplyBehind(backlog: Int) throws {
        try start(["--reply", "push", "cat"])
        try bluez.startNotify()
        try bluez.setConnected(a, true)
        server.notifier.enqueue(Array(repeating: 0x2E, count: backlog), chunk: 1)
        ok(bluez.write(frame("T", "first"), from: a))
    }

    /// Once a reply went to the read queue, a later one is not pushed past it, even when the
    /// asker is the sole subscriber again.
    func testALaterReplyDoesNotOvertakeADivertedOne() throws {
        try pushFirstReplyBehind(backlog: 20000)
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 10))
        try bluez.setConnected(b, true)
        XCTAssertTrue(loop.run(until: { self.server.notifier.isIdle }, timeout: 30))
        try bluez.setConnected(b, false)
        bluez.clearNotifications()
        ok(bluez.write(frame("T", "second"), from: a))
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle && self.server.notifier.isIdle }, timeout: 10))
        // A did not read after the first doorbell: it holds the next one back for 2 s at most.
        XCTAssertTrue(loop.run(until: { !self.bluez.notifications.isEmpty }, timeout: 3))
        settle(0.2)
        XCTAssertEqual(bluez.notifications, [Array("N0000000".utf8)])
        XCTAssertEqual(String(decoding: bluez.readAll(from: a), as: UTF8.self), "T0000005firstT0000006second")
    }

    /// A reply still being pushed when the asker stops being the sole subscriber: its rest and
    /// every later reply go to the read queue in order, and the central is told to read.
    func testPushFallingBackToPullKeepsRepliesInOrder() throws {
        // Both replies below wait behind the backlog.
        try pushFirstReplyBehind(backlog: 20000)
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle && !self.server.notifier.isIdle }, timeout: 10))
        try bluez.setConnected(b, true)
        ok(bluez.write(frame("T", "second"), from: a))
        settle(0.1)
        XCTAssertTrue(loop.run(until: { self.server.children.isIdle }, timeout: 10))
        XCTAssertFalse(server.notifier.isIdle, "the backlog ran out before the second reply was ready: the test proves nothing")
        XCTAssertTrue(loop.run(until: { self.server.notifier.isIdle }, timeout: 60))
        XCTAssertEqual(String(decoding: bluez.readAll(from: a), as: UTF8.self), "T0000005firstT0000006second")
        let told = bluez.notifications.filter { $0 != [0x2E] }
        XCTAssertTrue(told.contains(Array("N0000000".utf8)), "no doorbell for the diverted reply: \(told)")
    }

    // MARK: - Stream mode while stopping; what waits in the notifier

    private var exitDescription: String {
        server.exitError.map { "\($0.code.rawValue) \($0.message)" } ?? "none"
    }

    /// bluetoothd may subscribe a central while blserve stops (the application stays exported
    /// until it is unregistered, and peripheral.stop runs the loop meanwhile): stream mode must
    /// not start COMMAND then, after every COMMAND was ended; it would outlive blserve.
    func testASubscriptionWhileStoppingStartsNoCommand() throws {
        let pidFile = try scratchDirectory() + "/pid"
        try start(["--mode", "stream", "sh", "-c", "\(writingPID(to: pidFile)); exec sleep 300"])
        try bluez.setConnected(a, true)
        _ = bluez.connection.call(destination: connection.uniqueName, path: FakeBluetoothd.charPath,
                                  interface: BlueZ.gattCharacteristicInterface, member: "StartNotify", timeout: 5) { _ in }
        server.shutdown()
        let pid = waitForPID(pidFile, seconds: 1)
        if let pid { kill(-pid, SIGKILL); kill(pid, SIGKILL) }
        XCTAssertNil(pid, "COMMAND was started after the stop had ended every COMMAND")
    }

    /// A stop (SIGTERM) while COMMAND runs with its stdout already closed: its death by the
    /// stop's SIGTERM is not the stream's end. blserve exits 0, and --eom sends nothing.
    func testAStopAfterTheOutputEndedExitsCleanly() throws {
        try checkStopAfterTheOutputEnded(eom: false)
    }

    func testAStopAfterTheOutputEndedSendsNoEOM() throws {
        try checkStopAfterTheOutputEnded(eom: true)
    }

    private func checkStopAfterTheOutputEnded(eom: Bool) throws {
        try start(["--mode", "stream"] + (eom ? ["--eom"] : []) + ["sh", "-c", "printf abc; exec >&-; exec sleep 300"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        XCTAssertTrue(loop.run(until: { Array(self.bluez.notifications.joined()) == Array("abc".utf8) }, timeout: 5))
        settle(0.3)
        let sent = server.notifier.sentCount
        server.shutdown()
        XCTAssertNil(server.exitError, "after a stop blserve would exit with: \(exitDescription)")
        XCTAssertEqual(server.notifier.sentCount, sent, "notified while stopping on a signal")
    }

    /// The same with stdout open (the usual case) and bluetoothd slow to answer the
    /// unregistration: the exit grace must not fire inside the stop and end the stream.
    func testAStopWithASlowBluetoothdExitsCleanly() throws {
        try start(["--mode", "stream", "--eom", "sh", "-c", "echo hi; exec sleep 300"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().contains(0x0A) }, timeout: 5))
        bluez.unregisterDelay = 1.8
        let sent = server.notifier.sentCount
        server.shutdown()
        XCTAssertNil(server.exitError, "after a stop blserve would exit with: \(exitDescription)")
        XCTAssertEqual(server.notifier.sentCount, sent, "notified (EOM) while stopping on a signal")
    }

    /// Output read in small pieces while a slow central holds the notifier back is joined: it
    /// goes out in whole notifications, not one per read.
    func testSmallWritesQueuedBehindASlowCentralGoOutInWholePieces() throws {
        let count = 20000
        try start(["--mode", "stream", "sh", "-c", "i=0; while [ $i -lt \(count) ]; do printf x; i=$((i+1)); done; exec sleep 300"])
        try bluez.setConnected(a, true)
        try bluez.startNotify(mtu: 185)  // 180 bytes a notification
        bluez.pauseSocketReads(true)
        settle(4)
        bluez.pauseSocketReads(false)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.joined().count >= count }, timeout: 120))
        XCTAssertEqual(bluez.notifications.joined().count, count)
        let sizes = bluez.notifications.map(\.count)
        XCTAssertLessThan(sizes.count, count / 180 + 600, "a backlog of small reads was notified read by read: \(sizes.count) notifications")
    }

    /// Notifications queued before a central with a smaller (here unknown) MTU connected are cut
    /// for the links as they are when sent: bluetoothd would otherwise cut them short for it.
    func testQueuedNotificationsFitACentralThatConnectsMeanwhile() throws {
        let text = String(repeating: "0123456789", count: 50)
        try start(["--mode", "stream", "sh", "-c", "while :; do printf %s \(text); done"])
        try bluez.setConnected(a, true)
        try bluez.startNotify(device: a, mtu: 517)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.count >= 2 }, timeout: 5))
        bluez.pauseSocketReads(true)
        settle(1)
        XCTAssertFalse(server.notifier.isIdle, "nothing waits in the notifier: the test proves nothing")
        try bluez.setConnected(b, true)  // MTU unknown: 20 bytes from now on
        bluez.clearNotifications()
        bluez.pauseSocketReads(false)
        XCTAssertTrue(loop.run(until: { self.bluez.notificationSources.filter { $0 == "signal" }.count >= 50 }, timeout: 20))
        let sizes = zip(bluez.notifications, bluez.notificationSources).filter { $0.1 == "signal" }.map { $0.0.count }
        XCTAssertLessThanOrEqual(sizes.max() ?? 0, 20, "notified whole to a central whose MTU allows 20 bytes")
    }

    /// A subscriber that stops reading bounds what blserve holds, also with 1-byte pieces; and
    /// so does nobody subscribing (the output is read and dropped).
    func testAStalledSubscriberBoundsTheQueue() throws {
        try start(["--mode", "stream", "--chunk", "1", "sh", "-c", "exec cat /dev/zero"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        bluez.pauseSocketReads(true)
        var most = 0
        for _ in 0..<20 { settle(0.1); most = max(most, server.notifier.pendingBytes) }
        XCTAssertLessThan(most, 200_000)
        try bluez.stopNotify()
        for _ in 0..<10 { settle(0.1); most = max(most, server.notifier.pendingBytes) }
        XCTAssertLessThan(most, 200_000)
    }

    /// Raw mode's EOM is a notification of its own also when the run's output still waits in
    /// the notifier as it ends (blrecv --eom ends at a value equal to EOM).
    func testRawModeEOMIsItsOwnNotificationBehindWaitingOutput() throws {
        try start(["--mode", "raw", "--eom", "sh", "-c", "head -c 60000 /dev/zero | tr '\\0' x"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        bluez.pauseSocketReads(true)
        ok(bluez.write(Array("go".utf8), from: a))
        settle(1.5)
        XCTAssertFalse(server.notifier.isIdle, "nothing waits in the notifier: the test proves nothing")
        bluez.pauseSocketReads(false)
        XCTAssertTrue(loop.run(until: { self.bluez.notifications.last == Array("EOM".utf8) }, timeout: 20),
                      "no notification equal to EOM; the last: \(String(decoding: bluez.notifications.last ?? [], as: UTF8.self).suffix(10))")
        let before = bluez.notifications.dropLast()
        XCTAssertEqual(before.joined().count, 60000)
        XCTAssertTrue(before.allSatisfy { $0.allSatisfy { $0 == UInt8(ascii: "x") } }, "EOM was joined into the output")
    }

    /// A stream COMMAND that failed makes blserve exit 1 even when a signal comes while its
    /// last notifications are still being sent (the stop does not turn the failure into 0).
    func testAStreamCommandsFailureOutlivesASignalDuringTheLastNotifications() throws {
        try start(["--mode", "stream", "sh", "-c", "head -c 40000 /dev/zero; exit 3"])
        try bluez.setConnected(a, true)
        try bluez.startNotify()
        bluez.pauseSocketReads(true)
        settle(1.5)
        XCTAssertFalse(server.stopping, "the stream's end was sent already: the test proves nothing")
        server.shutdown()
        XCTAssertEqual(server.exitError?.code, .failure, "exit status after the signal: \(exitDescription)")
    }
}
