#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// Thin, Foundation-free wrappers over the file-descriptor system calls the tools use.
/// Each retries on EINTR and reports failure as an `Errno` rather than through a global.
public struct Errno: Error, Equatable, Sendable, CustomStringConvertible {
    public var rawValue: Int32
    public init(_ rawValue: Int32) { self.rawValue = rawValue }
    /// The calling thread's current `errno`.
    public static var current: Errno { Errno(errno) }
    public static let again = Errno(EAGAIN)
    public static let pipe = Errno(EPIPE)
    public static let interrupted = Errno(EINTR)
    public static let timedOut = Errno(ETIMEDOUT)
    /// The C library's text for this error, e.g. "Broken pipe".
    public var description: String { String(cString: strerror(rawValue)) }
}

public enum FileIO {
    /// Alignment for I/O buffers. The kernel copies pipe data into a buffer that is only 16-byte
    /// aligned about three times slower than into a page-aligned one (measured here: 64 KiB reads
    /// from a pipe into malloc's mmap'd chunks, which start 16 bytes into a page).
    public static let bufferAlignment = 4096

    /// Reads up to `buffer.count` bytes. Returns 0 at end of file.
    @inlinable
    public static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        while true {
            let n = Glibc.read(fd, buffer.baseAddress, buffer.count)
            if n >= 0 { return n }
            if errno != EINTR { throw Errno.current }
        }
    }

    /// Reads up to `buffer.count` bytes, waiting for them even if `fd` is non-blocking (a standard
    /// input inherited with O_NONBLOCK, left so by another program sharing it). Returns 0 at end
    /// of file. For tools that read their input in a plain loop rather than through ``EventLoop``.
    public static func readWaiting(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        while true {
            do {
                return try read(fd, into: buffer)
            } catch .again {
                _ = try pollReadable(fd, milliseconds: -1)
            }
        }
    }

    /// Writes once (a short count is possible on pipes and non-blocking descriptors).
    @inlinable
    public static func write(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(Errno) -> Int {
        while true {
            let n = Glibc.write(fd, bytes.baseAddress, bytes.count)
            if n >= 0 { return n }
            if errno != EINTR { throw Errno.current }
        }
    }

    /// Sends `bytes` as one message on a socket without waiting (and without SIGPIPE). Returns
    /// false when the socket has no room now; throws the error that ended it.
    public static func sendNow(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(Errno) -> Bool {
        while true {
            if send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) >= 0 { return true }
            let error = Errno.current
            if error == .interrupted { continue }
            if error == .again { return false }  // EWOULDBLOCK is EAGAIN on Linux
            throw error
        }
    }

    /// Writes every byte, looping over short writes. Meant for blocking descriptors; one that
    /// is non-blocking all the same (a standard output inherited with O_NONBLOCK) is waited for.
    @inlinable
    public static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(Errno) {
        var offset = 0
        while offset < bytes.count {
            do {
                offset += try write(fd, UnsafeRawBufferPointer(rebasing: bytes[offset...]))
            } catch .again {
                _ = try pollWritable(fd, milliseconds: -1)
            }
        }
    }

    /// Waits up to `milliseconds` (-1: for as long as it takes, 0: not at all) until `fd` can
    /// take data, or has an error a write would report. True if it can (or has).
    @usableFromInline
    static func pollWritable(_ fd: Int32, milliseconds: Int32) throws(Errno) -> Bool {
        try pollFor(Int16(POLLOUT), fd, milliseconds: milliseconds)
    }

    /// Waits up to `milliseconds` (-1: for as long as it takes) until `fd` has data, its end, or
    /// an error a read would report. True if it has.
    static func pollReadable(_ fd: Int32, milliseconds: Int32) throws(Errno) -> Bool {
        try pollFor(Int16(POLLIN), fd, milliseconds: milliseconds)
    }

    /// poll(2) on one descriptor for `events`, retried on EINTR. True when it is ready.
    @usableFromInline
    static func pollFor(_ events: Int16, _ fd: Int32, milliseconds: Int32) throws(Errno) -> Bool {
        var entry = pollfd(fd: fd, events: events, revents: 0)
        while true {
            let n = poll(&entry, 1, milliseconds)
            if n >= 0 { return n > 0 }
            if errno != EINTR { throw Errno.current }
        }
    }

    /// Writes `first` then `second` with writev(2), looping over short writes.
    public static func writeAll(_ fd: Int32, _ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer) throws(Errno) {
        var a = first, b = second
        while !a.isEmpty || !b.isEmpty {
            var vectors = [
                iovec(iov_base: UnsafeMutableRawPointer(mutating: a.baseAddress), iov_len: a.count),
                iovec(iov_base: UnsafeMutableRawPointer(mutating: b.baseAddress), iov_len: b.count),
            ]
            let n = writev(fd, &vectors, 2)
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN {
                    _ = try pollWritable(fd, milliseconds: -1)
                    continue
                }
                throw Errno.current
            }
            let fromA = min(n, a.count)
            a = UnsafeRawBufferPointer(rebasing: a[fromA...])
            b = UnsafeRawBufferPointer(rebasing: b[(n - fromA)...])
        }
    }

    @inlinable
    public static func writeAll(_ fd: Int32, _ bytes: [UInt8]) throws(Errno) {
        // withUnsafeBytes only rethrows untyped errors, so carry the typed one out in a Result.
        try bytes.withUnsafeBytes { raw in Result { () throws(Errno) in try writeAll(fd, raw) } }.get()
    }

    @inlinable
    public static func writeAll(_ fd: Int32, _ text: String) throws(Errno) {
        var text = text
        try text.withUTF8 { utf8 in Result { () throws(Errno) in try writeAll(fd, UnsafeRawBufferPointer(utf8)) } }.get()
    }

    /// Why `fd` cannot be written at all: not open (EBADF and the like), or open read-only
    /// (EBADF, what a write would fail with; a closed stdout gets /dev/null so, see
    /// ``Tool/reserveStandardDescriptors()``). Nil when it is open for writing.
    public static func unwritable(_ fd: Int32) -> Errno? {
        let mode = fcntl(fd, F_GETFL)
        if mode < 0 { return Errno(errno) }
        return mode & O_ACCMODE == O_RDONLY ? Errno(EBADF) : nil
    }

    /// Why `fd` cannot be read at all: not open, open write-only (EBADF; a closed stdin gets
    /// /dev/null so, see ``Tool/reserveStandardDescriptors()``), or a directory (EISDIR, what a
    /// read would fail with). Nil when it can be read.
    public static func unreadable(_ fd: Int32) -> Errno? {
        let mode = fcntl(fd, F_GETFL)
        if mode < 0 { return Errno(errno) }
        if mode & O_ACCMODE == O_WRONLY { return Errno(EBADF) }
        var info = stat()
        if fstat(fd, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR { return Errno(EISDIR) }
        return nil
    }

    /// A pipe whose ends are both close-on-exec from the start: (read end, write end).
    ///
    /// The corresponding C function is `pipe2(2)` with `O_CLOEXEC`.
    public static func pipe() throws(Errno) -> (read: Int32, write: Int32) {
        var fds: [Int32] = [-1, -1]
        guard cl_pipe_cloexec(&fds) == 0 else { throw Errno.current }
        return (fds[0], fds[1])
    }

    /// Sets or clears O_NONBLOCK.
    public static func setNonBlocking(_ fd: Int32, _ on: Bool = true) throws(Errno) {
        let flags = fcntl(fd, F_GETFL)
        if flags < 0 { throw Errno.current }
        let wanted = on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK
        if wanted != flags, fcntl(fd, F_SETFL, wanted) < 0 { throw Errno.current }
    }

    /// Sets FD_CLOEXEC so the descriptor does not leak into child processes.
    public static func setCloseOnExec(_ fd: Int32) throws(Errno) {
        let flags = fcntl(fd, F_GETFD)
        if flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0 { throw Errno.current }
    }

    /// Closes a descriptor, ignoring EINTR (on Linux the descriptor is released regardless).
    public static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }

    /// True when `fd` refers to a terminal.
    public static func isTerminal(_ fd: Int32) -> Bool { isatty(fd) == 1 }

    /// Bytes written to a local socket that the other end has not read yet (SIOCOUTQ; 0 when
    /// it cannot be told).
    public static func unreadBytes(_ fd: Int32) -> Int {
        var queued: Int32 = 0
        return ioctl(fd, UInt(TIOCOUTQ), &queued) == 0 ? Int(queued) : 0
    }
}
