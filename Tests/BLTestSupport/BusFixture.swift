import Glibc
import BLCommand

/// A real, private `dbus-daemon` for one test: a session-like configuration that allows everything,
/// listening on a unix socket in a fresh temporary directory. Started with `posix_spawn`
/// (children get the original signal mask: see `Signals.prepareSpawnAttributes`) and killed in
/// `stop()`.
public final class BusFixture {
    public let directory: String
    public let address: String
    public private(set) var pid: pid_t

    public static let daemonPath = "/usr/bin/dbus-daemon"

    public init() throws {
        var template = Array("/tmp/bldbus-test-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw Errno.current }
        directory = String(cString: dir)
        let socket = directory + "/bus"
        let config = """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>session</type>
          <listen>unix:path=\(socket)</listen>
          <auth>EXTERNAL</auth>
          <policy context="default">
            <allow send_destination="*" eavesdrop="true"/>
            <allow eavesdrop="true"/>
            <allow own="*"/>
            <allow user="*"/>
          </policy>
        </busconfig>

        """
        let configPath = directory + "/bus.conf"
        let fd = open(configPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Errno.current }
        try FileIO.writeAll(fd, config)
        FileIO.close(fd)

        // The daemon prints its address on fd 3 once it listens.
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw Errno.current }
        try FileIO.setCloseOnExec(fds[0])
        try FileIO.setCloseOnExec(fds[1])
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[1], 3)
        // The daemon's complaints (e.g. "Failed to set fd limit") go to a log, shown on failure.
        let log = directory + "/daemon.log"
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        try Signals.prepareSpawnAttributes(&attributes)

        let args = [Self.daemonPath, "--config-file=" + configPath, "--nofork", "--nopidfile", "--print-address=3"]
        var cArgs: [UnsafeMutablePointer<CChar>?] = args.map { strdup($0) } + [nil]
        defer { for a in cArgs { free(a) } }
        var child: pid_t = 0
        let rc = posix_spawn(&child, Self.daemonPath, &actions, &attributes, &cArgs, environ)
        FileIO.close(fds[1])
        guard rc == 0 else {
            FileIO.close(fds[0])
            throw Errno(rc)
        }
        pid = child

        var line: [UInt8] = []
        var byte: UInt8 = 0
        while true {
            let n = try withUnsafeMutableBytes(of: &byte) { try FileIO.read(fds[0], into: $0) }
            if n == 0 || byte == UInt8(ascii: "\n") { break }
            line.append(byte)
        }
        FileIO.close(fds[0])
        address = String(decoding: line, as: UTF8.self)
        guard !address.isEmpty else {
            let text = Self.read(log)
            stop()
            throw ToolError(.unavailable, "dbus-daemon printed no address: \(text)")
        }
    }

    /// Kills the daemon (SIGKILL by default: no goodbye to the clients) and reaps it.
    public func kill(signal: Int32 = SIGKILL) {
        guard pid > 0 else { return }
        _ = Glibc.kill(pid, signal)
        var status: Int32 = 0
        _ = waitpid(pid, &status, 0)
        pid = 0
    }

    private static func read(_ path: String) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "" }
        defer { FileIO.close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = (try? buffer.withUnsafeMutableBytes { try FileIO.read(fd, into: $0) }) ?? 0
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }

    public func stop() {
        kill(signal: SIGTERM)
        unlink(directory + "/daemon.log")
        unlink(directory + "/bus.conf")
        unlink(directory + "/bus")
        rmdir(directory)
    }

    deinit { stop() }
}

/// A "bus" that takes connections and never answers, as a hung dbus-daemon would: a unix socket
/// that listens and accepts nothing (the kernel completes connections up to the backlog).
/// `full`: its queue of connections is full already, so that a blocking connect() waits.
public final class SilentBus {
    public let directory: String
    public let address: String
    private let fd: Int32
    private var waiting: Int32 = -1

    public init(full: Bool = false) throws {
        var template = Array("/tmp/bldbus-silent-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw Errno.current }
        directory = String(cString: dir)
        let path = directory + "/bus"
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Errno.current }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { sunPath in
            for (i, byte) in path.utf8.enumerated() { sunPath[i] = byte }
        }
        // bind(2) or connect(2) with that address.
        func using(_ call: (UnsafePointer<sockaddr>, socklen_t) -> Int32) -> Int32 {
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { call($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
        }
        guard using({ bind(fd, $0, $1) }) == 0, listen(fd, full ? 0 : 16) == 0 else {
            let error = Errno.current
            Glibc.close(fd)
            throw error
        }
        self.fd = fd
        self.address = "unix:path=" + path
        if full {
            // A backlog of 0 takes one connection; this one fills the queue.
            waiting = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            let client = waiting
            guard using({ connect(client, $0, $1) }) == 0 else { throw Errno.current }
        }
    }

    deinit {
        if waiting >= 0 { Glibc.close(waiting) }
        Glibc.close(fd)
        unlink(directory + "/bus")
        rmdir(directory)
    }
}
