import XCTest
import Glibc
import BLCommand
@testable import BLDBus

final class DBusFDPassingTests: BusTestCase {
    private func socketPair() throws -> (OwnedFD, OwnedFD) {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw Errno.current
        }
        return (OwnedFD(taking: fds[0]), OwnedFD(taking: fds[1]))
    }

    private func send(_ fd: Int32, _ text: String) throws {
        try FileIO.writeAll(fd, text)
    }

    private func receive(_ fd: Int32) throws -> String {
        var buffer = [UInt8](repeating: 0, count: 512)
        let n = try buffer.withUnsafeMutableBytes { try FileIO.read(fd, into: $0) }
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }

    /// A sends a socketpair end to B (B writes into it), and B hands a socketpair end back in its
    /// reply, AcquireNotify-style `(h fd, q mtu)`; then data flows both ways and no descriptor leaks.
    func testDescriptorsCrossTheBusBothWaysWithoutLeaking() throws {
        let tree = ExportedObjectTree(root: "/fd")
        var bKeeps: OwnedFD?
        let iface = ExportedInterface("org.example.FD")
            .method("Ping", inSignature: "h") { call in
                guard let fd = call.arguments[0].fd else { return call.fail(.invalidArgs("no fd")) }
                XCTAssertTrue(fd.isValid)
                do { try FileIO.writeAll(fd.rawValue, "pong") } catch { return call.fail(.failed("\(error)")) }
                call.reply()
            }
            .method("AcquireNotify", inSignature: "a{sv}") { [unowned self] call in
                do {
                    let (mine, theirs) = try self.socketPair()
                    bKeeps = mine
                    // Appending duplicates `theirs`; dropping the value afterwards closes our copy,
                    // so the peer sees EOF when B closes `mine` (bluez-notes §3.8).
                    call.reply(.unixFD(theirs), .uint16(517))
                } catch {
                    call.fail(.failed("\(error)"))
                }
            }
        try tree.add(ExportedObject(path: "/fd/char", interfaces: [iface]))
        try b.export(tree)
        try roundTrip(a)

        let before = openSocketCount()
        do {
            // A → B.
            let (local, remote) = try socketPair()
            try autoreleasing {
                _ = try a.callAndWait(destination: b.uniqueName, path: "/fd/char", interface: "org.example.FD",
                                      member: "Ping", args: [.unixFD(remote)])
            }
            remote.close() // our copy of the end we sent
            XCTAssertEqual(try receive(local.rawValue), "pong")

            // B → A.
            let reply = try a.callAndWait(destination: b.uniqueName, path: "/fd/char", interface: "org.example.FD",
                                          member: "AcquireNotify", args: [.stringDict([:])])
            XCTAssertEqual(reply.count, 2)
            let acquired = try XCTUnwrap(reply[0].fd)
            XCTAssertEqual(reply[1].uint16, 517)
            let bEnd = try XCTUnwrap(bKeeps)
            try send(bEnd.rawValue, "notification")
            XCTAssertEqual(try receive(acquired.rawValue), "notification")
            try send(acquired.rawValue, "write")
            XCTAssertEqual(try receive(bEnd.rawValue), "write")
            // When B closes its end, A sees EOF: nobody else holds a copy.
            bEnd.close()
            bKeeps = nil
            XCTAssertEqual(try receive(acquired.rawValue), "", "EOF: no stray duplicate of B's end")
        }
        // Every message, value and OwnedFD is gone now.
        XCTAssertEqual(openSocketCount(), before, "descriptor leak")
    }

    func testReadingTheSameArgumentTwiceGivesTwoOwnedDuplicates() throws {
        let tree = ExportedObjectTree(root: "/fd")
        var seen: [Int32] = []
        try tree.add(ExportedObject(path: "/fd", interfaces: [
            ExportedInterface("org.example.FD").method("Take") { call in
                let first = call.message.arguments[0].fd!
                let second = call.message.arguments[0].fd!
                seen = [first.rawValue, second.rawValue]
                call.reply()
            },
        ]))
        try b.export(tree)
        try roundTrip(a)
        let before = openSocketCount()
        let (x, y) = try socketPair()
        _ = try a.callAndWait(destination: b.uniqueName, path: "/fd", interface: "org.example.FD", member: "Take", args: [.unixFD(x)])
        XCTAssertEqual(seen.count, 2)
        XCTAssertNotEqual(seen[0], seen[1], "each read is a new duplicate")
        x.close()
        y.close()
        XCTAssertEqual(openSocketCount(), before)
    }

    func testTakingAnOwnedFDTransfersOwnership() throws {
        let (x, y) = try socketPair()
        let raw = y.take()
        XCTAssertFalse(y.isValid)
        XCTAssertEqual(y.take(), -1)
        XCTAssertEqual(fcntl(raw, F_GETFD) >= 0, true, "still open after take()")
        FileIO.close(raw)
        let dup = try OwnedFD.duplicating(x.rawValue)
        XCTAssertNotEqual(dup.rawValue, x.rawValue)
        let dupRaw = dup.rawValue
        dup.close()
        XCTAssertEqual(fcntl(dupRaw, F_GETFD), -1, "closed")
    }
}

/// Runs `body` so that temporaries it creates are released at its end.
private func autoreleasing<T>(_ body: () throws -> T) rethrows -> T { try body() }
