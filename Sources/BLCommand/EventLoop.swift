#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What a descriptor watch waits for, and what it reports.
///
/// `readable` and `writable` are requested; `error` and `hangup` are always reported by `poll(2)`
/// for a watched descriptor, whether requested or not.
public struct IOEvents: OptionSet, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// `POLLIN`: data (or end of file) can be read without blocking.
    public static let readable = IOEvents(rawValue: 1 << 0)
    /// `POLLOUT`: data can be written without blocking.
    public static let writable = IOEvents(rawValue: 1 << 1)
    /// `POLLERR` (and `POLLNVAL`, a descriptor that is not open).
    public static let error = IOEvents(rawValue: 1 << 2)
    /// `POLLHUP`: the peer hung up. Reading may still return buffered data before end of file.
    public static let hangup = IOEvents(rawValue: 1 << 3)

    public var description: String {
        var parts: [String] = []
        if contains(.readable) { parts.append("readable") }
        if contains(.writable) { parts.append("writable") }
        if contains(.error) { parts.append("error") }
        if contains(.hangup) { parts.append("hangup") }
        return "[" + parts.joined(separator: ", ") + "]"
    }

    @inlinable
    var pollEvents: Int16 {
        var e: Int16 = 0
        if contains(.readable) { e |= Int16(POLLIN) }
        if contains(.writable) { e |= Int16(POLLOUT) }
        return e
    }

    @inlinable
    init(pollRevents r: Int16) {
        var e: IOEvents = []
        if r & Int16(POLLIN | POLLPRI) != 0 { e.insert(.readable) }
        if r & Int16(POLLOUT) != 0 { e.insert(.writable) }
        if r & Int16(POLLERR | POLLNVAL) != 0 { e.insert(.error) }
        if r & Int16(POLLHUP) != 0 { e.insert(.hangup) }
        self = e
    }
}

/// Identifies a descriptor watch; pass it to ``EventLoop/setEvents(_:_:)`` or ``EventLoop/remove(_:)``.
public struct WatchToken: Hashable, Sendable {
    let id: UInt64
}

/// Identifies a timer; pass it to ``EventLoop/cancel(_:)``.
public struct TimerToken: Hashable, Sendable {
    let id: UInt64
}

/// Why ``EventLoop/wait(timeout:_:)`` gave up.
public enum EventLoopError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The operation did not complete within the timeout (seconds).
    case timedOut(Double)
    /// ``EventLoop/stop()`` was called while waiting.
    case stopped

    public var description: String {
        switch self {
        case .timedOut(let s): return "timed out after \(s) s"
        case .stopped: return "interrupted"
        }
    }
}

/// A single-threaded `poll(2)` event loop: descriptor watches (level-triggered), monotonic timers,
/// deferred blocks and signals (through `signalfd`).
///
/// Everything runs on the thread that calls ``run()`` or ``run(until:timeout:)``; the loop is **not**
/// `Sendable` and must not be touched from other threads.
///
/// ## Turns
/// One turn of the loop: run the blocks queued with ``callSoon(_:)`` before the turn began, then
/// `poll()` every active watch (timeout = the nearest timer, zero if more blocks are queued), then
/// call the handlers of the ready watches, then fire the due timers in deadline order.
///
/// ## Nested runs
/// Any handler may call ``run(until:timeout:)`` or ``wait(timeout:_:)``: the loop then runs nested
/// turns that keep serving every other watch, timer and block until the condition holds. This is how
/// sequential setup code is written ("call, then wait for the reply"). While a watch's or a timer's
/// handler is running, nested turns do not poll that watch or fire that timer again (no recursion
/// into the same handler; GLib's sources behave the same way). A watch whose readiness was already
/// consumed by a nested turn is not called again with the stale result of the outer turn.
///
/// ## Cost
/// The `pollfd` array and the per-turn work lists are reused; a steady-state turn does not allocate.
/// Watches and timers are kept in small arrays scanned linearly, which suits the handful a tool has.
public final class EventLoop {
    // MARK: - Watches

    final class Watch {
        let id: UInt64
        let fd: Int32
        var events: IOEvents
        var handler: (IOEvents) -> Void
        var removed = false
        var busy = false
        /// The turn whose readiness this watch last reacted to.
        var lastTurn: UInt64 = 0
        init(id: UInt64, fd: Int32, events: IOEvents, handler: @escaping (IOEvents) -> Void) {
            self.id = id
            self.fd = fd
            self.events = events
            self.handler = handler
        }
    }

    final class Timer {
        let id: UInt64
        var deadline: UInt64
        let interval: UInt64?
        let handler: () -> Void
        var cancelled = false
        var busy = false
        init(id: UInt64, deadline: UInt64, interval: UInt64?, handler: @escaping () -> Void) {
            self.id = id
            self.deadline = deadline
            self.interval = interval
            self.handler = handler
        }
    }

    struct Ready {
        let watch: Watch
        let revents: Int16
    }

    private var nextID: UInt64 = 1
    private var watches: [Watch] = []
    private var timers: [Timer] = []

    // Reused per turn. The pollfd array is shared (rebuilt each turn); results are copied into the
    // work list of the current nesting depth before any handler runs, so nested turns can't clobber them.
    private var pollFDs: [pollfd] = []
    private var pollWatches: [Watch] = []
    private var readyByDepth: [[Ready]] = []
    private var dueByDepth: [[Timer]] = []
    private var depth = 0
    private var turnCounter: UInt64 = 0

    // callSoon queue with absolute indices so that nested turns can consume it safely.
    private var soonQueue: [(() -> Void)?] = []
    private var soonFirst = 0   // absolute index of soonQueue[0]
    private var soonNext = 0    // absolute index of the next block to run

    private var stopRequested = false
    private var runDepth = 0

    // Signal state (see EventLoopSignals.swift).
    var signalFD: Int32 = -1
    var signalWatch: WatchToken?
    var signalMask = sigset_t()
    var signalHandlers: [(id: UInt64, signal: Int32, handler: (SignalInfo) -> Void)] = []
    var signalBuffer: UnsafeMutableRawBufferPointer?

    public init() {
        sigemptyset(&signalMask)
    }

    deinit {
        tearDownSignals()
    }

    func makeID() -> UInt64 {
        defer { nextID += 1 }
        return nextID
    }

    /// Watches `fd` for `events` (level-triggered) and calls `handler` with what `poll` reported,
    /// on every turn in which the condition holds.
    ///
    /// An empty `events` set pauses the watch: the descriptor is not polled at all (so no
    /// error or hangup is reported either). The loop never closes `fd`; remove the watch **before**
    /// closing the descriptor. Removing any watch (including this one) from inside a handler is safe.
    ///
    /// The corresponding C function is `poll(2)`.
    @discardableResult
    public func watch(fd: Int32, events: IOEvents, _ handler: @escaping (IOEvents) -> Void) -> WatchToken {
        let w = Watch(id: makeID(), fd: fd, events: events, handler: handler)
        watches.append(w)
        return WatchToken(id: w.id)
    }

    /// Changes what a watch waits for (an empty set pauses it). Unknown tokens are ignored.
    public func setEvents(_ token: WatchToken, _ events: IOEvents) {
        for w in watches where w.id == token.id {
            w.events = events
            return
        }
    }

    /// The events a watch currently waits for, or nil if the token is not (or no longer) registered.
    public func events(of token: WatchToken) -> IOEvents? {
        for w in watches where w.id == token.id { return w.events }
        return nil
    }

    /// Removes a watch. Safe inside any handler; its handler will not be called again, even if it
    /// was already found ready in the current turn. Unknown tokens are ignored.
    public func remove(_ token: WatchToken) {
        if let i = watches.firstIndex(where: { $0.id == token.id }) {
            watches[i].removed = true
            watches.remove(at: i)
        }
    }

    /// The number of registered watches (for tests and diagnostics).
    public var watchCount: Int { watches.count }

    // MARK: - Timers

    /// Calls `handler` after `seconds` (monotonic clock), then every `repeating` seconds if given.
    ///
    /// Timers due in the same turn fire in deadline order (ties in scheduling order). A repeating
    /// timer that falls behind skips the missed periods instead of firing in a burst, and fires at
    /// most once per period even when a nested run inside another handler has fired it already.
    @discardableResult
    public func schedule(after seconds: Double, repeating: Double? = nil, _ handler: @escaping () -> Void) -> TimerToken {
        let now = MonotonicClock.nanoseconds()
        let t = Timer(
            id: makeID(),
            deadline: now &+ Self.nanoseconds(seconds),
            interval: repeating.map { max(Self.nanoseconds($0), 1_000) },
            handler: handler
        )
        timers.append(t)
        return TimerToken(id: t.id)
    }

    /// Cancels a timer; safe inside any handler (including the timer's own). Unknown or already fired
    /// one-shot timers are ignored.
    public func cancel(_ token: TimerToken) {
        if let i = timers.firstIndex(where: { $0.id == token.id }) {
            timers[i].cancelled = true
            timers.remove(at: i)
        }
    }

    /// The number of pending timers (for tests and diagnostics).
    public var timerCount: Int { timers.count }

    static func nanoseconds(_ seconds: Double) -> UInt64 {
        if !(seconds > 0) { return 0 }
        if seconds >= 1e9 { return UInt64(1e18) }
        return UInt64((seconds * 1e9).rounded(.up))
    }

    // MARK: - Deferred blocks

    /// Runs `block` at the start of the next turn, before the loop blocks in `poll`. Blocks run in
    /// the order they were queued; a block queued by a block runs on the turn after.
    public func callSoon(_ block: @escaping () -> Void) {
        soonQueue.append(block)
    }

    private func runSoonBlocks() {
        let end = soonFirst + soonQueue.count
        while soonNext < end {
            let index = soonNext - soonFirst
            let block = soonQueue[index]
            soonQueue[index] = nil
            soonNext += 1
            block?()
        }
        if soonNext == soonFirst + soonQueue.count, !soonQueue.isEmpty {
            soonFirst = soonNext
            soonQueue.removeAll(keepingCapacity: true)
        }
    }

    private var hasSoonBlocks: Bool { soonNext < soonFirst + soonQueue.count }

    // MARK: - Running

    /// Runs turns until ``stop()`` is called. `stop()` also ends every nested
    /// ``run(until:timeout:)``. Call `run()` once, at the top level.
    public func run() {
        runDepth += 1
        defer {
            runDepth -= 1
            if runDepth == 0 { stopRequested = false }
        }
        while !stopRequested {
            runSoonBlocks()
            if stopRequested { break }
            turn(deadline: nil)
        }
    }

    /// Runs turns until `condition` returns true (checked before every turn and before blocking),
    /// the timeout passes, or ``stop()`` is called.
    ///
    /// - Parameter timeout: seconds; nil waits without limit.
    /// - Returns: true if the condition holds; false on timeout or stop (see ``isStopping``).
    @discardableResult
    public func run(until condition: () -> Bool, timeout: Double?) -> Bool {
        let deadline = timeout.map { MonotonicClock.nanoseconds() &+ Self.nanoseconds($0) }
        while true {
            if condition() { return true }
            if stopRequested { return false }
            if let d = deadline, MonotonicClock.nanoseconds() >= d { return false }
            runSoonBlocks()
            if condition() { return true }
            if stopRequested { return false }
            turn(deadline: deadline)
        }
    }

    /// Runs the loop for `seconds`; everything else keeps being served meanwhile.
    public func sleep(_ seconds: Double) {
        _ = run(until: { false }, timeout: seconds)
    }

    /// Starts an asynchronous operation and runs the loop until it completes.
    ///
    /// `start` receives a completion to call exactly once (later ones are ignored; so is one that
    /// comes after the wait gave up). The loop keeps serving every other watch, timer and block
    /// meanwhile, so the operation may depend on them.
    ///
    /// - Throws: the operation's error, ``EventLoopError/timedOut(_:)`` or ``EventLoopError/stopped``.
    public func wait<T, E: Error>(
        timeout: Double?,
        _ start: (@escaping (Result<T, E>) -> Void) -> Void
    ) throws -> T {
        let slot = WaitSlot<T, E>()
        start { result in
            if slot.open, slot.result == nil { slot.result = result }
        }
        let done = run(until: { slot.result != nil }, timeout: timeout)
        slot.open = false
        if done, let result = slot.result { return try result.get() }
        if stopRequested { throw EventLoopError.stopped }
        throw EventLoopError.timedOut(timeout ?? .infinity)
    }

    /// Asks ``run()`` to return, and every ``run(until:timeout:)`` in progress to return false, after
    /// the current handler. The request is cleared when the outermost `run()` returns.
    public func stop() {
        stopRequested = true
    }

    /// Withdraws a ``stop()`` request so waits work again, e.g. to clean up (unsubscribe,
    /// disconnect) after an interrupt stopped a wait in progress.
    public func clearStop() {
        stopRequested = false
    }

    /// True between ``stop()`` and the return of the outermost ``run()``.
    public var isStopping: Bool { stopRequested }

    /// One turn: poll the active watches (blocking until the nearest timer, the deadline, or
    /// forever; not at all if blocks are queued), then call ready watches, then due timers.
    private func turn(deadline: UInt64?) {
        depth += 1
        defer { depth -= 1 }
        let d = depth
        if readyByDepth.count < d {
            readyByDepth.append([])
            dueByDepth.append([])
        }

        // Build the poll set.
        pollFDs.removeAll(keepingCapacity: true)
        pollWatches.removeAll(keepingCapacity: true)
        for w in watches where !w.busy && !w.events.isEmpty {
            pollFDs.append(pollfd(fd: w.fd, events: w.events.pollEvents, revents: 0))
            pollWatches.append(w)
        }

        // Poll timeout: nothing if blocks are queued, else until the nearest timer or deadline.
        let now = MonotonicClock.nanoseconds()
        var wake: UInt64? = deadline
        for t in timers where !t.busy {
            if wake == nil || t.deadline < wake! { wake = t.deadline }
        }
        var timeoutMS: Int32 = -1
        if hasSoonBlocks {
            timeoutMS = 0
        } else if let wake {
            if wake <= now {
                timeoutMS = 0
            } else {
                // Round up so that we never wake before the deadline and spin.
                let ms = (wake - now + 999_999) / 1_000_000
                timeoutMS = Int32(clamping: ms)
            }
        }

        let n = pollFDs.withUnsafeMutableBufferPointer { buffer in
            Glibc.poll(buffer.baseAddress, nfds_t(buffer.count), timeoutMS)
        }
        turnCounter += 1
        let thisTurn = turnCounter
        if n < 0 {
            let e = errno
            precondition(e == EINTR || e == EAGAIN || e == ENOMEM, "poll: \(Errno(e))")
        }

        // Copy the results before any handler runs (a nested turn reuses pollFDs).
        readyByDepth[d - 1].removeAll(keepingCapacity: true)
        if n > 0 {
            for i in 0..<pollFDs.count where pollFDs[i].revents != 0 {
                readyByDepth[d - 1].append(Ready(watch: pollWatches[i], revents: pollFDs[i].revents))
            }
        }
        // Drop the references held by the shared arrays early (watches may be removed meanwhile).
        pollWatches.removeAll(keepingCapacity: true)

        var i = 0
        while i < readyByDepth[d - 1].count {
            let r = readyByDepth[d - 1][i]
            i += 1
            let w = r.watch
            if w.removed || w.busy || w.lastTurn > thisTurn || w.events.isEmpty { continue }
            var reported = IOEvents(pollRevents: r.revents)
            reported.formIntersection(w.events.union([.error, .hangup]))
            if reported.isEmpty { continue }
            w.lastTurn = thisTurn
            w.busy = true
            w.handler(reported)
            w.busy = false
        }
        readyByDepth[d - 1].removeAll(keepingCapacity: true)

        fireDueTimers(depthIndex: d - 1)
    }

    private func fireDueTimers(depthIndex: Int) {
        let now = MonotonicClock.nanoseconds()
        dueByDepth[depthIndex].removeAll(keepingCapacity: true)
        for t in timers where !t.busy && t.deadline <= now {
            dueByDepth[depthIndex].append(t)
        }
        if dueByDepth[depthIndex].isEmpty { return }
        if dueByDepth[depthIndex].count > 1 {
            // IDs grow with scheduling order, so they break deadline ties deterministically.
            dueByDepth[depthIndex].sort { ($0.deadline, $0.id) < ($1.deadline, $1.id) }
        }
        var i = 0
        while i < dueByDepth[depthIndex].count {
            let t = dueByDepth[depthIndex][i]
            i += 1
            // A handler before this one may have run a nested turn that fired this timer already
            // (a one-shot one is then cancelled, a repeating one is due again only later).
            if t.cancelled || t.busy || t.deadline > now { continue }
            if let interval = t.interval {
                var next = t.deadline &+ interval
                if next <= now { next = now &+ interval }
                t.deadline = next
            } else {
                cancel(TimerToken(id: t.id))
            }
            t.busy = true
            t.handler()
            t.busy = false
        }
        dueByDepth[depthIndex].removeAll(keepingCapacity: true)
    }
}

/// The completion state of one ``EventLoop/wait(timeout:_:)``.
private final class WaitSlot<T, E: Error> {
    var result: Result<T, E>?
    var open = true
}
