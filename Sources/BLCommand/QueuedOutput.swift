#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Output to a descriptor whose reader may fall behind (stdout into a pipe or a terminal),
/// written from an event loop without ever waiting on it.
///
/// Bytes are queued in memory and written as the descriptor takes them. The descriptor itself
/// stays as it is: making a shared stdout non-blocking would change it for every other process
/// using it. Instead a pipe or terminal is opened a second time through /proc/self/fd with
/// O_NONBLOCK (an open file description of our own), a socket is written with MSG_DONTWAIT, and
/// regular files and devices such as /dev/null, which take a write whole, are written directly.
/// Where /proc cannot help, pieces of at most `PIPE_BUF` bytes are written only when `poll`
/// reports room (which, for a pipe, is a free page).
///
/// The queue may grow to ``limit``; the producer checks ``isFull`` and stops taking data (blrecv
/// stops reading the notification socket, where the back-pressure always was) until ``onRoom``
/// says the queue has drained to half.
///
/// While nothing is queued, a pipe whose reader has gone is noticed at once (`POLLERR`), not at
/// the next write: ``onFailure`` then reports `EPIPE`, as a write would have.
public final class QueuedOutput {
    public let fd: Int32
    /// Queued bytes at which ``isFull`` becomes true.
    public let limit: Int
    /// Called (from the loop) when writing failed; nothing more is written after that.
    public var onFailure: ((Errno) -> Void)?
    /// Called once the queue is down to half of ``limit`` after having been full.
    public var onRoom: (() -> Void)?
    /// Called once, when a write has left nothing queued (set it again to hear of the next time).
    public var onEmpty: (() -> Void)?
    public private(set) var bytesWritten = 0
    public private(set) var failure: Errno?

    enum Path: Equatable {
        /// Regular files, block devices, /dev/null: a write goes through whole.
        case whole
        /// Our own non-blocking open file description of a pipe or terminal.
        case nonBlocking(Int32)
        /// A socket: send(MSG_DONTWAIT).
        case socket
        /// PIPE_BUF pieces after poll says there is room.
        case pieces
    }

    let path: Path
    private let loop: EventLoop
    private var buffer = ByteChunks()
    private var watch: WatchToken?
    private var wasFull = false
    private var closed = false
    private let idleEvents: IOEvents

    /// What the tools hold for a slow reader unless told otherwise.
    public static let defaultLimit = 16 << 20

    public init(fd: Int32, loop: EventLoop, limit: Int = QueuedOutput.defaultLimit) {
        self.fd = fd
        self.loop = loop
        self.limit = max(1, limit)
        path = QueuedOutput.path(for: fd)
        // Idle: only an error (the reader went away) is of interest; files have none to report.
        idleEvents = path == .whole ? [] : .error
        watch = loop.watch(fd: fd, events: idleEvents) { [weak self] events in self?.ready(events) }
        // Not open for writing (or not open): say so now, not at the first write.
        if let problem = FileIO.unwritable(fd) { fail(problem) }
    }

    deinit { close() }

    /// Bytes accepted and not yet written.
    public var queuedCount: Int { buffer.count }
    public var isFull: Bool { queuedCount >= limit }
    /// The memory the queue holds for its bytes.
    var heldBytes: Int { buffer.held }

    /// Queues `bytes`; ``flush()`` (or the loop) writes them.
    public func write(_ bytes: [UInt8]) {
        guard failure == nil, !bytes.isEmpty else { return }
        buffer.append(bytes)
        if isFull { wasFull = true }
    }

    /// Writes what the descriptor takes now without waiting; the loop writes the rest as it can.
    /// Throws the error that ended the output, now or earlier.
    public func flush() throws(Errno) {
        pump()
        if let failure { throw failure }
    }

    /// Writes everything queued, waiting for the reader (when the output ends). Gives up with
    /// `EINTR` when SIGINT, SIGTERM or SIGHUP is pending: the loop holds those back, so a reader
    /// that never reads must not make the process deaf to them. With an `idleTimeout` (seconds),
    /// gives up with `ETIMEDOUT` once the reader has taken nothing for that long (after an
    /// interrupt already taken: a reader that is reading gets everything, a stalled one a
    /// moment, not for ever).
    public func drain(idleTimeout: Double? = nil) throws(Errno) {
        var deadline = idleTimeout.map { MonotonicClock.seconds() + $0 }
        while failure == nil, queuedCount > 0, !closed {
            let before = bytesWritten
            if writeNow() { break }
            if failure != nil { break }
            if QueuedOutput.terminationPending() { throw .interrupted }
            if let idleTimeout, bytesWritten != before { deadline = MonotonicClock.seconds() + idleTimeout }
            var wait: Int32 = 200
            if let deadline {
                let left = deadline - MonotonicClock.seconds()
                if left <= 0 { throw .timedOut }
                wait = Int32(min(200, max(1, left * 1000)))
            }
            _ = try? FileIO.pollWritable(fd, milliseconds: wait)
        }
        if let failure { throw failure }
        compact()
        setWatch(idleEvents)
    }

    /// How long a reader may take nothing, once a signal has ended the run, before what is
    /// still queued for it is dropped (``drainAtEnd(interrupted:dropping:)``).
    public static let drainAfterInterrupt = 1.0

    /// Writes what is queued when a tool's run ends: what was accepted is not lost. After an
    /// interrupt a reader that takes nothing for ``drainAfterInterrupt`` seconds is not waited
    /// for any longer (the signal must end the tool): that is said on stderr, naming what was
    /// dropped (`dropping`, e.g. "bytes received"), and is no error. Other failures are thrown.
    public func drainAtEnd(interrupted: Bool, dropping: String) throws(Errno) {
        do {
            try drain(idleTimeout: interrupted ? Self.drainAfterInterrupt : nil)
        } catch where error == .timedOut && interrupted {
            Tool.warn("standard output took nothing for \(formatSeconds(Self.drainAfterInterrupt)) s after the signal: "
                      + "\(queuedCount) \(dropping) were not written")
        }
    }

    /// Stops watching the descriptor and closes our own description of it (`fd` stays open).
    public func close() {
        if let watch { loop.remove(watch) }
        watch = nil
        if !closed, case .nonBlocking(let own) = path, own != fd { Glibc.close(own) }
        closed = true
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
        guard failure == nil, !closed else { return }
        let everything = writeNow()
        compact()
        if failure == nil { setWatch(everything ? idleEvents : [.writable, .error]) }
        if wasFull && queuedCount <= limit / 2 {
            wasFull = false
            onRoom?()
        }
        if queuedCount == 0, failure == nil, let onEmpty {
            self.onEmpty = nil
            onEmpty()
        }
    }

    /// Writes without waiting; true when nothing is left queued, false when the descriptor has
    /// no room now (or writing failed).
    private func writeNow() -> Bool {
        while failure == nil, queuedCount > 0, !closed {
            if path == .pieces {
                // Room, or an error the write will report.
                if !((try? FileIO.pollWritable(fd, milliseconds: 0)) ?? true) { return false }
            }
            let n = buffer.withFirstRun { run -> Int in
                let bytes = run.baseAddress!
                let count = path == .pieces ? min(run.count, Int(PIPE_BUF)) : run.count
                switch path {
                case .whole, .pieces: return Glibc.write(fd, bytes, count)
                case .nonBlocking(let own): return Glibc.write(own, bytes, count)
                case .socket: return send(fd, bytes, count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                }
            }
            if n < 0 {
                let error = Errno.current
                if error == .interrupted { continue }
                if error == .again { return false }
                fail(error)
                return false
            }
            if n == 0 { return false }   // took nothing: wait for room rather than spin
            buffer.removeFirst(n)
            bytesWritten += n
        }
        return queuedCount == 0
    }

    private func compact() { buffer.compact() }

    private func setWatch(_ events: IOEvents) {
        guard let watch else { return }
        if loop.events(of: watch) != events { loop.setEvents(watch, events) }
    }

    private func fail(_ error: Errno) {
        guard failure == nil else { return }
        failure = error
        buffer = ByteChunks()
        if let watch { loop.remove(watch) }
        watch = nil
        loop.callSoon { [weak self] in self?.onFailure?(error) }
    }

    /// How writes to `fd` avoid waiting (see the type's description).
    static func path(for fd: Int32) -> Path {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .pieces }
        switch info.st_mode & S_IFMT {
        case S_IFREG, S_IFBLK: return .whole
        case S_IFSOCK: return .socket
        case S_IFCHR where isatty(fd) == 0: return .whole
        default: break
        }
        // A pipe, FIFO or terminal: already non-blocking (someone else's choice), or our own
        // non-blocking description of it. Not for a descriptor that cannot write (init fails
        // it), nor a pty master: opening that again through /proc opens /dev/ptmx, a new pty.
        let flags = fcntl(fd, F_GETFL)
        if flags < 0 || flags & O_ACCMODE == O_RDONLY { return .pieces }
        if flags & O_NONBLOCK != 0 { return .nonBlocking(fd) }
        var ptyNumber: UInt32 = 0
        if ioctl(fd, QueuedOutput.getPtyNumber, &ptyNumber) == 0 { return .pieces }
        let own = open("/proc/self/fd/\(fd)", O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
        return own >= 0 ? .nonBlocking(own) : .pieces
    }

    /// TIOCGPTN: succeeds only on a pty master.
    static let getPtyNumber: UInt = 0x8004_5430

    /// SIGINT, SIGTERM or SIGHUP is waiting to be delivered (one ignored at start does not count:
    /// it may wait, blocked and ignored, for ever).
    static func terminationPending() -> Bool {
        var pending = sigset_t()
        guard sigpending(&pending) == 0 else { return false }
        return Signals.notIgnoredAtStart(Signals.interruptSignals).contains { sigismember(&pending, $0) == 1 }
    }
}

/// Queued bytes in chunks of ``chunkSize``: the memory held follows what is queued, within a
/// chunk or two. (One array that grew by doubling, and kept what was written until it was
/// compacted, had held 2.5 times the queue's limit under a slow reader.)
struct ByteChunks {
    static let chunkSize = 64 * 1024
    private var chunks: [[UInt8]] = []
    /// The first chunk in use, and how much of it was taken.
    private var first = 0
    private var offset = 0
    /// A drained chunk kept for the next one (no allocation per chunk while bytes flow).
    private var spare: [UInt8]?
    private(set) var count = 0

    var held: Int { chunks[first...].reduce(0) { $0 + $1.capacity } + (spare?.capacity ?? 0) }

    mutating func append(_ bytes: [UInt8]) {
        var from = 0
        while from < bytes.count {
            if first == chunks.count || chunks[chunks.count - 1].count == Self.chunkSize {
                var chunk = spare ?? []
                spare = nil
                chunk.removeAll(keepingCapacity: true)
                chunk.reserveCapacity(Self.chunkSize)
                chunks.append(chunk)
            }
            let last = chunks.count - 1
            let n = min(Self.chunkSize - chunks[last].count, bytes.count - from)
            chunks[last].append(contentsOf: bytes[from..<from + n])
            from += n
        }
        count += bytes.count
    }

    /// Calls `body` with the oldest queued bytes that lie together (at most a chunk). Only when
    /// ``count`` is not 0.
    func withFirstRun<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        chunks[first].withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[offset...])) }
    }

    /// Drops the `n` oldest bytes, at most those ``withFirstRun(_:)`` gave.
    mutating func removeFirst(_ n: Int) {
        offset += n
        count -= n
        guard offset == chunks[first].count else { return }
        offset = 0
        if first == chunks.count - 1 {
            // Empty: the chunk is kept for what comes next.
            chunks[first].removeAll(keepingCapacity: true)
        } else {
            if spare == nil { spare = chunks[first] }
            chunks[first] = []
            first += 1
        }
    }

    /// Gives back the slots of drained chunks.
    mutating func compact() {
        if first > 0 && (first >= 64 || first == chunks.count - 1) {
            chunks.removeFirst(first)
            first = 0
        }
    }
}
