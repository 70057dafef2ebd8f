import Foundation
import XCTest
import BLCommand
import BLDBus
import BLTestSupport
@testable import BLBlueZ

/// How a NotificationReceiver ends, against a stand-in owning org.bluez on a private bus that
/// notifies through StartNotify (PropertiesChanged of Value) and drops the link: with `eom`
/// only EOM is a complete transfer; without it, data then a disconnect or silence is success.
final class ReceiverEndTests: XCTestCase {
    private var bluez: BlueZStandIn!
    private var loop: EventLoop { bluez.loop }
    private var connected = true
    private var receiver: NotificationReceiver!
    private var outcome: Result<Void, ToolError>?
    private var output: (read: Int32, write: Int32) = (-1, -1)
    /// What ReadValue answers, in turn; once they are used up, reads are left unanswered.
    private var readValues: [String] = []
    /// Notified just before the first read is answered (it then comes during the read).
    private var notifyDuringRead: String?
    private var unansweredReads: [IncomingCall] = []

    private static let device = "/org/bluez/hci0/dev_00_AA_01_00_00_01"
    private static let char = device + "/service0010/char0011"

    override func setUpWithError() throws {
        try super.setUpWithError()
        bluez = try BlueZStandIn([
            ExportedObject(path: Self.device, interfaces: [
                ExportedInterface(BlueZ.deviceInterface).property("Connected") { [unowned self] in .bool(self.connected) },
            ]),
            ExportedObject(path: Self.char, interfaces: [
                ExportedInterface(BlueZ.gattCharacteristicInterface)
                    .property("Notifying") { .bool(false) }
                    .property("Value") { .bytes([]) }
                    .method("AcquireNotify") { call in call.fail(name: "org.bluez.Error.NotSupported", message: "Not Supported") }
                    .method("StartNotify") { call in _ = call.reply([]) }
                    .method("StopNotify") { call in _ = call.reply([]) }
                    .method("ReadValue") { [unowned self] call in self.read(call) },
            ]),
        ])
        output = try FileIO.pipe()
        try FileIO.setNonBlocking(output.read)
    }

    override func tearDown() {
        receiver?.close()
        receiver = nil
        unansweredReads = []
        for fd in [output.read, output.write] where fd >= 0 { _ = Glibc.close(fd) }
        bluez?.stop()
        bluez = nil
        super.tearDown()
    }

    /// bluetoothd's ReadValue: a notification may come while it is under way, and the read
    /// raises a Value change of its own (StartNotify's subscribers see both).
    private func read(_ call: IncomingCall) {
        guard !readValues.isEmpty else {
            unansweredReads.append(call)
            return
        }
        let value = readValues.removeFirst()
        if let during = notifyDuringRead {
            notifyDuringRead = nil
            try? notify(during)
        }
        try? notify(value)
        _ = call.reply([.bytes(Array(value.utf8))])
    }

    private func start(eom: Bool, silence: Double? = nil, count: Int? = nil, limit: Int = QueuedOutput.defaultLimit) throws {
        var options = NotificationReceiver.Options()
        options.eom = eom
        options.silence = silence
        options.count = count
        let characteristic = RemoteCharacteristic(peer: bluez.peer(Self.device), path: Self.char, properties: [
            "UUID": .string("0000fff2-0000-1000-8000-00805f9b34fb"), "Flags": .stringArray(["read", "notify"]),
        ])
        receiver = NotificationReceiver(characteristic: characteristic, options: options,
                                        out: QueuedOutput(fd: output.write, loop: loop, limit: limit))
        receiver.onFinish = { [unowned self] in self.outcome = $0 }
        try receiver.start()
        receiver.armSilenceTimer()
    }

    private func notify(_ text: String) throws {
        try notify(bytes: Array(text.utf8))
    }

    private func notify(bytes: [UInt8]) throws {
        try bluez.tree.emitPropertiesChanged(path: Self.char, interface: BlueZ.gattCharacteristicInterface,
                                             changed: ["Value": .bytes(bytes)])
    }

    private func disconnect() throws {
        connected = false
        try bluez.tree.emitPropertiesChanged(path: Self.device, interface: BlueZ.deviceInterface, changed: ["Connected": .bool(false)])
    }

    /// Runs until the receiver ends; returns what it wrote.
    private func finish() throws -> String {
        XCTAssertTrue(loop.run(until: { self.outcome != nil }, timeout: 5), "the receiver did not end")
        receiver.close()
        _ = Glibc.close(output.write)
        output.write = -1
        return String(decoding: readPipe(output.read, on: loop, timeout: 5) ?? [], as: UTF8.self)
    }

    private func failure() -> ToolError? {
        guard case .failure(let error)? = outcome else { return nil }
        return error
    }

    func testEOMEndsItWithSuccessAndIsNotWritten() throws {
        try start(eom: true)
        try notify("abc")
        try notify("EOM")
        XCTAssertEqual(try finish(), "abc")
        XCTAssertNoThrow(try outcome?.get())
        XCTAssertEqual(receiver.ending, .endOfMessage)
    }

    /// The link dropping before EOM: what came is written, and the exit says it is incomplete.
    func testADisconnectBeforeEOMIsAnIncompleteTransfer() throws {
        try start(eom: true)
        try notify("abc")
        try notify("def")
        _ = loop.run(until: { false }, timeout: 0.2)
        try disconnect()
        XCTAssertEqual(try finish(), "abcdef")
        XCTAssertEqual(failure()?.code, .ioError)
        XCTAssertEqual(failure()?.message, "00:AA:01:00:00:01 disconnected before EOM (6 bytes received)")
    }

    func testSilenceBeforeEOMIsATimeout() throws {
        try start(eom: true, silence: 1.5)
        try notify("abc")
        XCTAssertEqual(try finish(), "abc")
        XCTAssertEqual(failure()?.code, .tempFail)
        XCTAssertEqual(failure()?.message, "no EOM: 1.5 s without a notification (3 bytes received)")
    }

    /// EOM notified while a pull's read was under way waits for the pull to end; the link
    /// dropping meanwhile does not make the transfer incomplete: EOM came.
    func testEOMHeldBackByAPullCountsWhenTheLinkDrops() throws {
        readValues = ["T0000003abc"]
        notifyDuringRead = "EOM"
        try start(eom: true)
        try notify("N0000000")
        XCTAssertTrue(loop.run(until: { !self.unansweredReads.isEmpty }, timeout: 5), "the pull did not read again")
        try disconnect()
        XCTAssertEqual(try finish(), "N0000000T0000003abc")
        XCTAssertNoThrow(try outcome?.get())
        XCTAssertEqual(receiver.ending, .endOfMessage)
    }

    /// Without --eom a stream has no end of its own: data, then the link's end, is success.
    func testWithoutEOMADisconnectAfterDataIsSuccess() throws {
        try start(eom: false)
        try notify("abc")
        _ = loop.run(until: { false }, timeout: 0.2)
        try disconnect()
        XCTAssertEqual(try finish(), "abc")
        XCTAssertNoThrow(try outcome?.get())
    }

    /// A device cutting a stream of frames into notifications of its own size: the output ends
    /// with the last frame counted, not inside the next one.
    func testTheCountEndsTheOutputWithTheLastFrameWanted() throws {
        try start(eom: false, count: 1)
        try notify("T0000003abcT0000003d")
        try notify("ef")
        XCTAssertEqual(try finish(), "T0000003abc")
        XCTAssertNoThrow(try outcome?.get())
        XCTAssertEqual(receiver.ending, .count)
        XCTAssertEqual(receiver.replies, 1)
    }

    func testTheCountCutsANotificationHoldingMoreWholeFrames() throws {
        try start(eom: false, count: 2)
        try notify("T0000001a")
        try notify("T0000001bT0000001cN0000000")
        XCTAssertEqual(try finish(), "T0000001aT0000001b")
        XCTAssertEqual(receiver.replies, 2)
    }

    /// A pull whose reads bring the last frame wanted and the start of another: the reads stop
    /// there, and what the read held after that frame is not written.
    func testTheCountReachedInsideAPullEndsIt() throws {
        readValues = ["T0000003abcT00000", "03def", ""]
        try start(eom: false, count: 1)
        try notify("N0000000")
        XCTAssertEqual(try finish(), "N0000000T0000003abc")
        XCTAssertEqual(receiver.ending, .count)
        XCTAssertEqual(readValues, ["03def", ""], "it read on after the last reply wanted")
    }

    /// Notifications that come while a pull reads are written after it, and none of them once
    /// the pull has brought the last reply wanted.
    func testNotificationsDuringAPullAreNotWrittenAfterTheLastReplyWanted() throws {
        readValues = ["T0000003abc", ""]
        notifyDuringRead = "T0000003xyz"
        try start(eom: false, count: 1)
        try notify("N0000000")
        XCTAssertEqual(try finish(), "N0000000T0000003abc")
        XCTAssertEqual(receiver.ending, .count)
    }

    /// Output that ends inside a frame is cut short, not a success: a truncated image saved by
    /// `blrecv > out` must not look complete. The link's end says 74, silence 75.
    func testADisconnectInsideAFrameIsAnIncompleteTransfer() throws {
        try start(eom: false)
        try notify("T0000010abc")
        _ = loop.run(until: { false }, timeout: 0.2)
        try disconnect()
        XCTAssertEqual(try finish(), "T0000010abc")
        XCTAssertEqual(failure()?.code, .ioError)
        XCTAssertEqual(failure()?.message, "00:AA:01:00:00:01 disconnected inside a frame: the output is cut short (11 bytes received)")
    }

    func testSilenceInsideAFrameIsATimeout() throws {
        try start(eom: false, silence: 0.5)
        try notify("T0000001aT0000010abc")
        XCTAssertEqual(try finish(), "T0000001aT0000010abc")
        XCTAssertEqual(failure()?.code, .tempFail)
        XCTAssertEqual(failure()?.message, "0.5 s without a notification inside a frame: the output is cut short (20 bytes received)")
    }

    /// A stream that is not frames has no inside: its end after data is still a success.
    func testAStreamThatIsNotFramesEndsWithSuccess() throws {
        try start(eom: false, silence: 0.5)
        try notify("hello T0000010")
        XCTAssertEqual(try finish(), "hello T0000010")
        XCTAssertNoThrow(try outcome?.get())
    }

    /// The link dropping while a pull has read half a frame: a notification held back meanwhile
    /// is not written into that frame's body (where it would look like body bytes).
    func testADisconnectInsideAPulledFrameWritesNothingHeldIntoIt() throws {
        readValues = ["T0000010abc"]
        notifyDuringRead = "T0000001x"
        try start(eom: false)
        try notify("N0000000")
        XCTAssertTrue(loop.run(until: { !self.unansweredReads.isEmpty }, timeout: 5), "the pull did not read again")
        try disconnect()
        XCTAssertEqual(try finish(), "N0000000T0000010abc")
        XCTAssertEqual(failure()?.code, .ioError)
        XCTAssertEqual(failure()?.message, "00:AA:01:00:00:01 disconnected inside a frame: the output is cut short (19 bytes "
                       + "received); 1 notifications that came during the read-pull were not written")
    }

    /// `N0000000` inside a frame's body (a reply pushed in 8-byte pieces) is body bytes, not a
    /// doorbell: no pull starts there.
    func testADoorbellLookalikeInsideAFrameIsBody() throws {
        readValues = ["T0000001z", ""]
        try start(eom: false, count: 1)
        try notify("T0000024abcdefgh")
        try notify("N0000000")
        try notify("ijklmnop")
        XCTAssertEqual(try finish(), "T0000024abcdefghN0000000ijklmnop")
        XCTAssertNoThrow(try outcome?.get())
        XCTAssertEqual(readValues, ["T0000001z", ""], "a pull started inside the frame")
    }

    /// Notifications through StartNotify cannot wait in bluetoothd's socket: with a reader that
    /// stopped, the receiver ends (74) once a few times the output's limit is behind, rather than
    /// hold a flood without bound.
    func testAFloodWithoutASocketAndAStoppedReaderEndsTheReceiver() throws {
        try start(eom: false, limit: 64 * 1024)
        // The reader comes back a second later: at its end the receiver writes what it holds.
        let late = dup(output.read)
        let reader = Thread {
            usleep(1_000_000)
            var buffer = [UInt8](repeating: 0, count: 65536)
            var entry = pollfd(fd: late, events: Int16(POLLIN), revents: 0)
            while poll(&entry, 1, 5000) > 0, Glibc.read(late, &buffer, buffer.count) > 0 {}
            Glibc.close(late)
        }
        reader.start()
        let piece = [UInt8](repeating: 0x41, count: 500)
        var most = 0
        for i in 0..<4000 where outcome == nil {
            try notify(bytes: piece)
            if i % 100 == 0 { _ = loop.run(until: { false }, timeout: 0.001) }
            most = max(most, receiver.out.queuedCount)
        }
        XCTAssertTrue(loop.run(until: { self.outcome != nil }, timeout: 5), "still taking notifications in")
        XCTAssertEqual(failure()?.code, .ioError)
        XCTAssertTrue(failure()?.message.hasPrefix("standard output is ") == true, failure()?.message ?? "")
        XCTAssertLessThanOrEqual(most, NotificationReceiver.signalBacklogFactor * 64 * 1024 + 500)
    }

    func testADisconnectBeforeAnyDataIsUnavailable() throws {
        try start(eom: true)
        try disconnect()
        XCTAssertEqual(try finish(), "")
        XCTAssertEqual(failure()?.code, .unavailable)
    }
}
