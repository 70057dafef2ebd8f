import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// BlueZClient.connect against a stand-in Device1 on a private bus: whose link it is.
final class ConnectTests: XCTestCase {
    private var bluez: BlueZStandIn!
    private var connected = false
    private var connectCalls = 0
    /// What each Connect call does: nil answers success (bluetoothd does so at once for a link
    /// already up), an error fails it; either may bring the link up first.
    private var answers: [(fail: DBusError?, linkUp: Bool)] = []
    /// Connect calls are left unanswered (a device out of range: bluetoothd's own attempt runs on).
    private var holdConnect = false
    private var heldCalls: [IncomingCall] = []
    private var disconnectCalls = 0

    private static let device = "/org/bluez/hci0/dev_00_AA_01_00_00_01"

    override func setUpWithError() throws {
        try super.setUpWithError()
        bluez = try BlueZStandIn([ExportedObject(path: Self.device, interfaces: [
            ExportedInterface(BlueZ.deviceInterface)
                .property("Address") { .string("00:AA:01:00:00:01") }
                .property("Connected") { [unowned self] in .bool(self.connected) }
                .property("ServicesResolved") { [unowned self] in .bool(self.connected) }
                .method("Connect") { [unowned self] call in
                    self.connectCalls += 1
                    if self.holdConnect { return self.heldCalls.append(call) }
                    let answer = self.answers.isEmpty ? (fail: nil, linkUp: true) : self.answers.removeFirst()
                    if answer.linkUp { self.connected = true }
                    if let error = answer.fail { return call.fail(error) }
                    call.reply([])
                }
                .method("Disconnect") { [unowned self] call in
                    self.disconnectCalls += 1
                    self.connected = false
                    call.reply([])
                },
        ])])
    }

    override func tearDown() {
        heldCalls = []
        bluez?.stop()
        bluez = nil
        super.tearDown()
    }

    private func connect() throws -> Peer {
        let info = DeviceInfo(path: Self.device, properties: ["Address": .string("00:AA:01:00:00:01")])
        return try bluez.client.connect(info, timeout: 5)
    }

    func testALinkItBringsUpIsItsOwn() throws {
        let peer = try connect()
        XCTAssertTrue(peer.madeConnection)
        XCTAssertEqual(connectCalls, 1)
    }

    func testALinkFoundUpIsNotItsOwn() throws {
        connected = true
        let peer = try connect()
        XCTAssertFalse(peer.madeConnection)
        XCTAssertEqual(connectCalls, 0)
    }

    /// Its attempt failed while another process's link came up: the retry would "succeed" on
    /// that link (bluetoothd answers Connect so for a link already up), which is not its own to
    /// end at exit.
    func testALinkAnotherBroughtUpDuringARetryIsNotItsOwn() throws {
        answers = [(fail: DBusError(name: "org.bluez.Error.Failed", message: "le-connection-abort-by-local"), linkUp: true)]
        let peer = try connect()
        XCTAssertFalse(peer.madeConnection, "another's link taken as its own")
        XCTAssertEqual(connectCalls, 1)
    }

    /// --connect-timeout: a device that never answers is given up after the time given (75),
    /// and the attempt still pending in bluetoothd is cancelled, or the link would come up
    /// after the tool had gone and stay.
    func testAConnectionThatDoesNotComeUpIsGivenUpInTime() throws {
        holdConnect = true
        let info = DeviceInfo(path: Self.device, properties: ["Address": .string("00:AA:01:00:00:01")])
        let started = MonotonicClock.seconds()
        XCTAssertThrowsError(try bluez.client.connect(info, timeout: 1.5)) { error in
            let failure = error as? ToolError
            XCTAssertEqual(failure?.code, .tempFail)
            XCTAssertTrue(failure?.message.hasPrefix("could not connect to 00:AA:01:00:00:01 within 1.5 s") == true, failure?.message ?? "")
        }
        let took = MonotonicClock.seconds() - started
        XCTAssertGreaterThan(took, 1.4)
        XCTAssertLessThan(took, 4, "the timeout was not kept")
        XCTAssertEqual(connectCalls, 1)
        XCTAssertEqual(disconnectCalls, 1, "the pending attempt was not cancelled")
    }

    func testAFailedAttemptIsRetried() throws {
        answers = [(fail: DBusError(name: "org.bluez.Error.Failed", message: "le-connection-abort-by-local"), linkUp: false)]
        let peer = try connect()
        XCTAssertTrue(peer.madeConnection)
        XCTAssertEqual(connectCalls, 2)
    }
}
