#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Output to a descriptor whose reader may fall behind (stdout into a pipe), written from an
/// event loop without ever waiting on it.
///
/// Bytes are queued in memory and written as the descriptor takes them: to a pipe, a terminal or
/// a socket in pieces of at most `PIPE_BUF` bytes, and only when `poll` says it has room, so a
/// write never blocks even though the descriptor stays blocking (making a shared stdout
/// non-blocking would change it for every other process using it). Regular files and devices
/// such as /dev/null take everything at once.
///
/// The queue is allowed to grow to ``limit``; the producer checks ``isFull`` and stops taking new
/// data (for blrecv: stops reading the notification socket, which is where the back-pressure
/// always was) until ``onRoom`` says the queue has drained to half.
///
/// While nothing is queued, a pipe whose reader has gone is noticed at once (`POLLERR`), not at
/// the next write: ``onFailure`` then reports `EPIPE`, as a write would have.
public final class QueuedOutput {
    public let fd: Int32
    /// Queued bytes at which ``isFull`` becomes true.
    public let limit: Int
    /// Called (from the loop) when a write failed; nothing more is written after that.
    public var onFailure: ((Errno) -> Void)?
    /// Called (from the loop) once the queue is below half of ``limit`` after having been full.
    public var onRoom: (() -> Void)?
    public private(set) var bytesWritten = 0
    public private(set) var failure: Errno?

    private let loop: EventLoop
    private let takesAnything: Bool
    private var buffer: [UInt8] = []
    private var start = 0
    private var watch: WatchToken?
    private var wasFull = false

    /// Bytes written to a pipe-like descriptor per `write(2)`: a pipe with room (`POLLOUT`) has at
    /// least one free page, so a write this size goes through without waiting.
    static let pieceSize = Int(PIPE_BUF)

    public init(fd: Int32, loop: EventLoop, limit: Int = 16 << 20) {
        self.fd = fd
        self.loop = loop
        self.limit = max(1, limit)
        takesAnything = QueuedOutput.neverWaits(fd)
        if !takesAnything {
            // Idle: only an error (the reader went away) is of interest.
            watch = loop.watch(fd: fd, events: .error) { [weak self] events in self?.ready(events) }
        }
    }

    deinit { close() }

    /// Bytes accepted and not yet written.
    public var queuedCount: Int { buffer.count - start }
    public var isFull: Bool { queuedCount >= limit }

    /// Queues `bytes`; ``flush()`` (or the loop) writes them.
    public func write(_ bytes: [UInt8]) {
        guard failure == nil, !bytes.isEmpty else { return }
        buffer.append(contentsOf: bytes)
        if isFull { wasFull = true }
    }

    /// Writes what the descriptor takes now without waiting; the loop writes the rest as it can.
    /// Throws the error that ended the output, now or earlier.
    public func flush() throws(Errno) {
        pump()
        if let failure { throw failure }
    }

    /// Writes everything queued, waiting as long as the reader needs (when the output ends).
    public func drain() throws(Errno) {
        if let failure { throw failure }
        let pending = queuedCount
        let result = buffer.withUnsafeBytes { raw in
            Result { () throws(Errno) in try FileIO.writeAll(fd, UnsafeRawBufferPointer(rebasing: raw[start...])) }
        }
        if case .failure(let error) = result {
            fail(error)
            throw error
        }
        bytesWritten += pending
        buffer.removeAll(keepingCapacity: false)
        start = 0
        setWatch(.error)
    }

    /// Stops watching the descriptor (it is not closed).
    public func close() {
        if let watch { loop.remove(watch) }
        watch = nil
    }

    // MARK: - Writing

    private func ready(_ events: IOEvents) {
        if failure != nil { return }
        if queuedCount == 0 {
            if events.contains(.error) || events.contains(.hangup) {
                // Nothing to write, so no write to report it: a pipe with no reader says POLLERR,
                // a socket whose peer has gone POLLHUP, a descriptor that is not open POLLNVAL.
                // (Level-triggered: ignoring it would wake the loop on every turn.)
                fail(fcntl(fd, F_GETFD) < 0 ? Errno.current : Errno.pipe)
            }
            return
        }
        pump()
    }

    private func pump() {
        while failure == nil, queuedCount > 0 {
            if !takesAnything && !hasRoom() {
                setWatch([.writable, .error])
                return
            }
            let count = takesAnything ? queuedCount : min(queuedCount, QueuedOutput.pieceSize)
            let written = buffer.withUnsafeBytes { raw in
                Result { () throws(Errno) in try FileIO.write(fd, UnsafeRawBufferPointer(rebasing: raw[start..<start + count])) }
            }
            let n: Int
            switch written {
            case .success(let count):
                n = count
            case .failure(.again):
                // Someone else made the descriptor non-blocking: wait for room.
                setWatch([.writable, .error])
                return
            case .failure(let error):
                fail(error)
                return
            }
            start += n
            bytesWritten += n
        }
        if queuedCount == 0 {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 1 << 20)
            start = 0
        } else if start >= 64 * 1024 && start * 2 >= buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
        if failure == nil {
            setWatch(queuedCount > 0 ? [.writable, .error] : .error)
        }
        if wasFull && queuedCount < limit / 2 {
            wasFull = false
            onRoom?()
        }
    }

    /// Whether the descriptor can take a piece now (or has an error a write would report).
    private func hasRoom() -> Bool {
        var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        while poll(&entry, 1, 0) < 0 {
            if errno != EINTR { return true }
        }
        return entry.revents != 0
    }

    private func setWatch(_ events: IOEvents) {
        guard let watch else { return }
        if loop.events(of: watch) != events { loop.setEvents(watch, events) }
    }

    private func fail(_ error: Errno) {
        guard failure == nil else { return }
        failure = error
        buffer.removeAll()
        start = 0
        close()
        loop.callSoon { [weak self] in self?.onFailure?(error) }
    }

    /// Regular files, block devices and character devices other than terminals (/dev/null) take
    /// a write whole without waiting for a reader.
    static func neverWaits(_ fd: Int32) -> Bool {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return false }
        switch info.st_mode & S_IFMT {
        case S_IFREG, S_IFBLK: return true
        case S_IFCHR: return isatty(fd) == 0
        default: return false
        }
    }
}
