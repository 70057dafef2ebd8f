import XCTest
import Glibc
import BLCommand
import BLDBus
import BLTestSupport

/// The number of sockets this process has open. Only sockets are counted: the test runtime's
/// own threads open other descriptors (event fds, pipes) at moments of their choosing, which
/// made a count of every descriptor fail now and then under load, and everything these tests
/// watch for leaks (bus connections, passed descriptors) is a socket.
func openSocketCount() -> Int {
    guard let names = try? DirectoryListing.names(in: "/proc/self/fd") else { return -1 }
    var count = 0
    var target = [CChar](repeating: 0, count: 64)
    for name in names {
        let n = readlink("/proc/self/fd/" + name, &target, target.count - 1)
        if n > 0, String(decoding: target[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self).hasPrefix("socket:") {
            count += 1
        }
    }
    return count
}

/// Base class: a bus, a loop, and two connections to the bus.
class BusTestCase: XCTestCase {
    var bus: BusFixture!
    var loop: EventLoop!
    var a: DBusConnection!
    var b: DBusConnection!

    override func setUpWithError() throws {
        try super.setUpWithError()
        bus = try BusFixture()
        loop = EventLoop()
        a = try DBusConnection(address: bus.address, loop: loop)
        b = try DBusConnection(address: bus.address, loop: loop)
    }

    override func tearDown() {
        a = nil
        b = nil
        loop = nil
        bus?.stop()
        bus = nil
        super.tearDown()
    }

    /// Runs the loop until `condition` holds; fails the test on timeout.
    @discardableResult
    func runUntil(_ what: String, timeout: Double = 5, file: StaticString = #filePath, line: UInt = #line,
                  _ condition: () -> Bool) -> Bool {
        let ok = loop.run(until: condition, timeout: timeout)
        if !ok { XCTFail("timed out waiting for \(what)", file: file, line: line) }
        return ok
    }

    /// A round trip to the bus on `connection`: everything sent before it has been processed.
    func roundTrip(_ connection: DBusConnection) throws {
        _ = try connection.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                       interface: "org.freedesktop.DBus", member: "GetId")
    }
}
