#if canImport(Glibc)
import Glibc
#endif
import BLCommand
import CTestSupport
import Foundation

/// A child process for tests, started with `posix_spawn` and reaped with a blocking `waitpid`.
///
/// Foundation's `Process` is not used: on Linux its `waitUntilExit()` can miss the child's
/// end and wait for ever (seen here: a test run hung in it with the child long gone).
public final class Spawned: @unchecked Sendable {
    public enum Stream {
        /// A new pipe; the parent's end is in `stdin`/`stdout`/`stderr`.
        case pipe
        /// This descriptor (the parent keeps its own).
        case fd(Int32)
        /// stderr only: the same pipe as stdout.
        case stdout
        /// The test process's own.
        case inherit
    }

    public let pid: pid_t
    /// The parent's ends of the pipes asked for (-1 otherwise, or once closed).
    public private(set) var stdin: Int32 = -1
    public private(set) var stdout: Int32 = -1
    public private(set) var stderr: Int32 = -1
    private var status: Int32?

    public init(_ path: String, _ arguments: [String], environment: [String: String]? = nil, cwd: String? = nil,
                stdin stdinStream: Stream = .pipe, stdout stdoutStream: Stream = .pipe,
                stderr stderrStream: Stream = .pipe) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var childEnds: [Int32] = []
        defer { for fd in childEnds { close(fd) } }

        /// The child's end for `target` (0, 1, 2), and the parent's end of a new pipe.
        func setUp(_ stream: Stream, _ target: Int32, stdoutChild: Int32?) throws -> Int32 {
            switch stream {
            case .inherit:
                return -1
            case .fd(let fd):
                posix_spawn_file_actions_adddup2(&actions, fd, target)
                return -1
            case .stdout:
                posix_spawn_file_actions_adddup2(&actions, stdoutChild ?? 1, target)
                return -1
            case .pipe:
                let (readEnd, writeEnd) = try Self.pipe()
                let (child, parent) = target == 0 ? (readEnd, writeEnd) : (writeEnd, readEnd)
                childEnds.append(child)
                posix_spawn_file_actions_adddup2(&actions, child, target)
                return parent
            }
        }
        stdin = try setUp(stdinStream, 0, stdoutChild: nil)
        stdout = try setUp(stdoutStream, 1, stdoutChild: nil)
        let stdoutChild: Int32? = switch stdoutStream {
        case .pipe: childEnds.last
        case .fd(let fd): fd
        case .stdout, .inherit: nil
        }
        stderr = try setUp(stderrStream, 2, stdoutChild: stdoutChild)
        if let cwd { cts_spawn_addchdir(&actions, cwd) }
        // Nothing else of the test process's (pipes of other tests, bus sockets) is inherited.
        cts_spawn_addclosefrom(&actions, 3)

        let env = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        let argv = [path] + arguments
        var cArgs = argv.map { strdup($0) } + [nil]
        var cEnv = env.map { strdup($0) } + [nil]
        defer {
            for p in cArgs { free(p) }
            for p in cEnv { free(p) }
        }
        // The child starts with no signal blocked (an event loop in the test process blocks some)
        // and the usual dispositions (the test process may ignore SIGPIPE).
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signo in [SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGCHLD] { sigaddset(&defaults, signo) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var child = pid_t()
        let rc = posix_spawn(&child, path, &actions, &attributes, &cArgs, &cEnv)
        guard rc == 0 else {
            for fd in [stdin, stdout, stderr] where fd >= 0 { close(fd) }
            throw POSIXError(.init(rawValue: rc) ?? .EIO)
        }
        pid = child
    }

    deinit {
        for fd in [stdin, stdout, stderr] where fd >= 0 { close(fd) }
        if status == nil {
            kill(pid, SIGKILL)
            _ = wait()
        }
    }

    /// Writes all of `data` to stdin (stopping at EPIPE: the test process ignores SIGPIPE),
    /// then closes it.
    public func feed(_ data: Data) {
        send(data)
        closeStdin()
    }

    /// Writes all of `data` to stdin (stopping at EPIPE) and leaves it open.
    public func send(_ data: Data) {
        if stdin < 0 { return }
        ignoreSIGPIPE()
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = write(stdin, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                offset += n
            }
        }
    }

    public func closeStdin() {
        if stdin >= 0 { close(stdin) }
        stdin = -1
    }

    /// A pipe whose ends are closed on exec: (read end, write end).
    public static func pipe() throws -> (Int32, Int32) {
        do {
            return try FileIO.pipe()
        } catch {
            throw POSIXError(.init(rawValue: error.rawValue) ?? .EIO)
        }
    }

    /// Reads `fd` (one of the parent's ends) to its end.
    public static func readAll(_ fd: Int32) -> Data {
        var result = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while fd >= 0 {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            result.append(contentsOf: buffer[0..<n])
        }
        return result
    }

    /// Waits for the child; its exit status, or 128 + the signal that ended it.
    @discardableResult
    public func wait() -> Int32 {
        if let status { return status }
        var raw: Int32 = 0
        while waitpid(pid, &raw, 0) < 0 && errno == EINTR {}
        let code = (raw & 0x7F) == 0 ? (raw >> 8) & 0xFF : 128 + (raw & 0x7F)
        status = code
        return code
    }

    /// Whether the child has ended (reaping it if so), without waiting.
    public var hasEnded: Bool {
        if status != nil { return true }
        var raw: Int32 = 0
        guard waitpid(pid, &raw, WNOHANG) == pid else { return false }
        status = (raw & 0x7F) == 0 ? (raw >> 8) & 0xFF : 128 + (raw & 0x7F)
        return true
    }

    public func terminate() {
        if status == nil { kill(pid, SIGTERM) }
    }
}
