import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// RemoteCharacteristic's calls against a stand-in owning org.bluez on a private bus.
final class RemoteCharacteristicTests: XCTestCase {
    private var bluez: BlueZStandIn!
    private var loop: EventLoop { bluez.loop }
    private var characteristic: RemoteCharacteristic!
    /// How many WriteValue calls are refused with InProgress before one is taken.
    private var busyFor = 0
    private var written: [[UInt8]] = []
    private var calls = 0

    private static let device = "/org/bluez/hci0/dev_00_AA_01_00_00_01"
    private static let char = device + "/service0010/char0011"

    override func setUpWithError() throws {
        try super.setUpWithError()
        bluez = try BlueZStandIn([ExportedObject(path: Self.char, interfaces: [
            ExportedInterface(BlueZ.gattCharacteristicInterface).method("WriteValue") { [unowned self] call in
                self.calls += 1
                if self.busyFor > 0 {
                    self.busyFor -= 1
                    call.fail(name: "org.bluez.Error.InProgress", message: "In Progress")
                    return
                }
                self.written.append(call.arguments.first?.bytes ?? [])
                _ = call.reply([])
            },
        ])])
        characteristic = RemoteCharacteristic(peer: bluez.peer(Self.device), path: Self.char,
                                              properties: ["UUID": .string("0000ffe1-0000-1000-8000-00805f9b34fb"), "Flags": .stringArray(["write"])])
    }

    override func tearDown() {
        characteristic = nil
        bluez?.stop()
        bluez = nil
        super.tearDown()
    }

    private func write(_ bytes: [UInt8], timeout: Double) -> Result<Void, ToolError>? {
        var outcome: Result<Void, ToolError>?
        characteristic.write(bytes, type: .request, timeout: timeout) { outcome = $0 }
        _ = loop.run(until: { outcome != nil }, timeout: timeout + 5)
        return outcome
    }

    /// Another client's write under way on the same characteristic (bluetoothd's InProgress):
    /// the refused write never left, and goes again once that one is done, exactly once.
    func testAWriteRefusedAsInProgressIsSentAgain() throws {
        busyFor = 3
        let outcome = try XCTUnwrap(write([1, 2, 3], timeout: 5))
        XCTAssertNoThrow(try outcome.get())
        XCTAssertEqual(calls, 4)
        XCTAssertEqual(written, [[1, 2, 3]])
    }

    /// A characteristic another client keeps busy: the write gives up at its timeout, saying why.
    func testAWriteKeptBusyGivesUpAtItsTimeout() throws {
        busyFor = .max
        let started = MonotonicClock.seconds()
        let outcome = try XCTUnwrap(write([1], timeout: 0.3))
        XCTAssertLessThan(MonotonicClock.seconds() - started, 2)
        XCTAssertThrowsError(try outcome.get()) { error in
            let failure = error as? ToolError
            XCTAssertEqual(failure?.code, .tempFail)
            XCTAssertTrue(failure?.message.contains("another client kept writing to it") == true, failure?.message ?? "")
        }
        XCTAssertGreaterThan(calls, 2, "it did not try again")
        XCTAssertTrue(written.isEmpty)
    }

    /// A cancelled write (its writer has finished) is not sent again, and says nothing more.
    func testACancelledWriteIsNotSentAgain() throws {
        busyFor = .max
        var outcome: Result<Void, ToolError>?
        let pending = characteristic.write([1], type: .request, timeout: 5) { outcome = $0 }
        XCTAssertTrue(loop.run(until: { self.calls >= 2 }, timeout: 3), "it did not try again")
        pending.cancel()
        let callsThen = calls
        _ = loop.run(until: { false }, timeout: 0.3)
        XCTAssertLessThanOrEqual(calls, callsThen + 1, "sent again after cancel")  // one may be under way
        XCTAssertNil(outcome)
        XCTAssertTrue(written.isEmpty)
    }
}
