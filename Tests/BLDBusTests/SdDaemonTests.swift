import XCTest
import Glibc
import CLinux

/// The sd-daemon functions a fully static libdbus-1 links against (Sources/CLinux/SdDaemon.c):
/// they must behave as libsystemd's do, since libdbus trusts their answers.
final class SdDaemonTests: XCTestCase {
    private let names = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"]

    override func tearDown() {
        for name in names { unsetenv(name) }
        super.tearDown()
    }

    private func environment(pid: String?, fds: String?) {
        for name in names { unsetenv(name) }
        if let pid { setenv("LISTEN_PID", pid, 1) }
        if let fds { setenv("LISTEN_FDS", fds, 1) }
        setenv("LISTEN_FDNAMES", "bus", 1)
    }

    private func isSet(_ name: String) -> Bool { getenv(name) != nil }

    func testListenFdsIsZeroWhenNothingWasPassedToThisProcess() {
        for name in names { unsetenv(name) }
        XCTAssertEqual(bl_sd_listen_fds(0), 0)
        // Meant for another process (the parent that was activated, say): not ours.
        environment(pid: String(getpid() + 1), fds: "2")
        XCTAssertEqual(bl_sd_listen_fds(0), 0)
        XCTAssertTrue(isSet("LISTEN_PID"), "variables are kept unless asked to unset them")
        environment(pid: String(getpid()), fds: nil)
        XCTAssertEqual(bl_sd_listen_fds(0), 0)
        environment(pid: String(getpid()), fds: "0")
        XCTAssertEqual(bl_sd_listen_fds(0), 0)
    }

    func testListenFdsRejectsMalformedVariables() {
        for (pid, fds) in [("x", "1"), ("", "1"), ("-5", "1"), ("0", "1"), (String(getpid()), "one"),
                           (String(getpid()), "-1"), (String(getpid()), "1x"), ("99999999999999999999", "1")] {
            environment(pid: pid, fds: fds)
            XCTAssertEqual(bl_sd_listen_fds(0), -EINVAL, "LISTEN_PID=\(pid) LISTEN_FDS=\(fds)")
        }
    }

    func testListenFdsUnsetsTheVariablesWhenAskedWhateverTheOutcome() {
        for (pid, fds) in [(String(getpid()), "0"), ("x", "1"), (String(getpid() + 1), "1")] {
            environment(pid: pid, fds: fds)
            _ = bl_sd_listen_fds(1)
            for name in names { XCTAssertFalse(isSet(name), "\(name) after LISTEN_PID=\(pid)") }
        }
    }

    func testListenFdsCountsThePassedDescriptorsAndMarksThemCloseOnExec() throws {
        // Descriptor 3 is where passed sockets start. Borrow it (or fill it) for the test.
        var borrowed = fcntl(3, F_GETFD)
        var filler: [Int32] = [-1, -1]
        if borrowed < 0 {
            XCTAssertEqual(pipe(&filler), 0)
            XCTAssertEqual(dup2(filler[0], 3), 3)
            borrowed = -1
        }
        defer {
            if borrowed >= 0 { _ = fcntl(3, F_SETFD, borrowed) } else { close(3) }
            for fd in filler where fd >= 0 { close(fd) }
        }
        XCTAssertEqual(fcntl(3, F_SETFD, 0), 0)
        environment(pid: String(getpid()), fds: "1")
        XCTAssertEqual(bl_sd_listen_fds(1), 1)
        XCTAssertNotEqual(fcntl(3, F_GETFD) & FD_CLOEXEC, 0)
        XCTAssertFalse(isSet("LISTEN_FDS"))
        // More descriptors announced than are open: the error of the first one missing.
        let first = Int32(3 + 4096)
        XCTAssertLessThan(fcntl(first, F_GETFD), 0, "descriptor \(first) is expected to be closed")
        environment(pid: String(getpid()), fds: String(first - 3 + 1))
        XCTAssertEqual(bl_sd_listen_fds(0), -EBADF)
    }

    func testIsSocketChecksKindTypeStateAndFamily() throws {
        var pair: [Int32] = [-1, -1]
        XCTAssertEqual(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair), 0)
        var pipeFDs: [Int32] = [-1, -1]
        XCTAssertEqual(pipe(&pipeFDs), 0)
        let listener = socket(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0)
        XCTAssertGreaterThanOrEqual(listener, 0)
        defer { for fd in pair + pipeFDs + [listener] { close(fd) } }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0[0] = 0 }  // autobind: an abstract name
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sa_family_t>.size)) }
        }
        XCTAssertEqual(bound, 0)
        XCTAssertEqual(listen(listener, 1), 0)

        let stream = Int32(SOCK_STREAM.rawValue), seqpacket = Int32(SOCK_SEQPACKET.rawValue)
        XCTAssertEqual(bl_sd_is_socket(pair[0], 0, 0, -1), 1)
        XCTAssertEqual(bl_sd_is_socket(pair[0], AF_UNIX, stream, 0), 1)
        XCTAssertEqual(bl_sd_is_socket(pair[0], AF_UNIX, stream, 1), 0, "connected, not listening")
        XCTAssertEqual(bl_sd_is_socket(pair[0], AF_UNIX, seqpacket, -1), 0, "wrong type")
        XCTAssertEqual(bl_sd_is_socket(pair[0], AF_INET, 0, -1), 0, "wrong family")
        XCTAssertEqual(bl_sd_is_socket(listener, AF_UNIX, seqpacket, 1), 1)
        XCTAssertEqual(bl_sd_is_socket(listener, 0, 0, 0), 0, "listening")
        XCTAssertEqual(bl_sd_is_socket(pipeFDs[0], 0, 0, -1), 0, "a pipe")
        XCTAssertEqual(bl_sd_is_socket(-1, 0, 0, -1), -EBADF)
        XCTAssertEqual(bl_sd_is_socket(pair[0], -1, 0, -1), -EINVAL)
        let closed = Int32(3 + 4096)
        XCTAssertEqual(bl_sd_is_socket(closed, 0, 0, -1), -EBADF)
    }
}
