#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLBlueZ
import BLCommand
import BLDBus

/// Raw mode (inetd style): one COMMAND per central, started by its first write (on a thread of its
/// own, so other centrals are served meanwhile; what the central writes until COMMAND runs is
/// held for it, and its write requests are answered once COMMAND runs, or refused when it
/// cannot be started). What the central writes goes to COMMAND's stdin; COMMAND's stdout goes
/// back to that central as notifications while it is the sole subscriber, otherwise into its
/// read queue (announced by an empty notification, which adds no bytes to anyone's stream).
///
/// Flow control both ways: a write request is answered only once COMMAND's stdin has room (the
/// central then waits, as ATT allows one write request at a time); COMMAND's stdout is read only
/// while the notifier and the read queue have room.
final class RawMode: ServeMode {
    final class Session {
        let device: String
        var process: Subprocess?
        /// COMMAND while it is being started.
        var starting: HandlerStart?
        /// What the central wrote while COMMAND was being started, or while the ended one's run
        /// waited out its exit grace: the stdin of the COMMAND being (or to be) started.
        var held: [UInt8] = []
        /// Write requests whose bytes are in ``held``: answered once that COMMAND runs, refused
        /// if it cannot be started.
        var heldCalls: [IncomingCall] = []
        var started = 0.0
        /// COMMAND's stdin, with what it has not taken yet.
        var stdin: QueuedOutput?
        var stdoutWatch: WatchToken?
        /// Write requests answered once stdin has room again.
        var deferred: [IncomingCall] = []
        var replies: ReplyQueue
        var bytesIn = 0
        var bytesOut = 0
        var gone = false
        var droppedWarned = false
        /// Bytes of the central's stream were lost without it being told (write commands dropped,
        /// or held for a COMMAND that could not start): nothing more is taken from this connection,
        /// so no COMMAND sees a stream with a hole in it or one that begins part-way.
        var broken = false
        /// Bytes of the attribute value being written (a long write comes in pieces at offsets).
        var valueLength = 0
        /// Some of ``held`` came in write commands (bluetoothd has acknowledged them).
        var heldUnanswered = false
        /// How output went last (for the log): true by notification, false through reads.
        var pushed: Bool?
        /// Pieces of output handed to the notifier and not yet sent or diverted.
        var pushing = 0
        var killTimer: TimerToken?
        /// COMMAND has exited while something it started still holds its stdout.
        var graceTimer: TimerToken?

        init(device: String) {
            self.device = device
            // Bounded in bytes by ``RawMode/outputHasRoom(_:)``, not in pieces.
            replies = ReplyQueue(capacity: .max)
        }
    }

    unowned let server: Server
    private(set) var sessions: [String: Session] = [:]
    /// Sessions of centrals that disconnected, kept until their COMMAND has ended.
    private var ending: [ObjectIdentifier: Session] = [:]
    /// Stdin bytes held before write requests wait (answered again once half of it is left).
    static let stdinHighWater = 64 * 1024
    /// Stdin bytes held at most; write commands beyond it are dropped (bluetoothd acknowledged
    /// them already, so there is no way to push back).
    static let stdinLimit = 1 << 20
    /// Stdout bytes held for reads before stdout waits. Counted in bytes, also what comes back
    /// from the notifier when pushing stops: counted in pieces, output merged for a push and
    /// diverted back as one piece made room for more each time another central came and went.
    static let readQueueBytes = 1 << 20

    init(server: Server) {
        self.server = server
        server.notifier.onDrain = { [unowned self] in
            for s in self.sessions.values { self.updateStdoutWatch(s) }
        }
    }

    private var loop: EventLoop { server.loop }

    func write(_ value: [UInt8], _ options: GattRequestOptions, _ call: IncomingCall) {
        let device = options.device!
        if let old = sessions[device], old.gone {
            // Back before its old COMMAND has ended (SIGHUP, SIGKILL 2 s later): a new
            // connection gets a new COMMAND, and nothing of the old one.
            ending[ObjectIdentifier(old)] = old
            sessions[device] = nil
        }
        let s = sessions[device] ?? {
            let s = Session(device: device)
            sessions[device] = s
            return s
        }()
        if options.prepareAuthorize {
            call.reply([])
            return
        }
        if s.broken {
            call.fail(GattError.application(0x82))
            return
        }
        // The pieces of a long write come at growing offsets, each continuing the value: one
        // that leaves a gap or overlaps would give COMMAND a stream the central did not send.
        if options.offset != 0 && options.offset != s.valueLength {
            server.debug("\(Server.centralName(device)): write of \(value.count) bytes refused: \(WriteRefusal.invalidOffset(offset: options.offset, expected: s.valueLength))")
            call.fail(WriteRefusal.invalidOffset(offset: options.offset, expected: s.valueLength).dbusError)
            return
        }
        // A piece refused below leaves the value as it was: the central may send it again at
        // the same offset.
        let lengthBefore = s.valueLength
        s.valueLength = (options.offset == 0 ? 0 : s.valueLength) + value.count
        if s.process == nil && s.starting == nil {
            guard start(s) else {
                s.valueLength = lengthBefore
                call.fail(GattError.application(0x83))
                return
            }
        }
        // COMMAND is being started; or it has ended, and its run ends within the exit grace
        // (something it started still holds its stdout): what comes meanwhile is the next
        // COMMAND's input, as a write after the run would be, and that COMMAND starts as the
        // run ends.
        if s.starting != nil || s.process?.status != nil {
            if !hold(s, value, call) { s.valueLength = lengthBefore }
            return
        }
        // Once COMMAND has closed its stdin, what the central writes goes nowhere: that is its
        // business, as when it ignores its input.
        if !value.isEmpty, let stdin = s.stdin {
            if stdin.queuedCount + value.count > Self.stdinLimit {
                s.valueLength = lengthBefore
                dropping(s, call)
                return
            }
            s.bytesIn += value.count
            stdin.write(value)
            // What the pipe takes goes now; the queue writes the rest as COMMAND reads.
            try? stdin.flush()
        }
        if call.expectsReply, let stdin = s.stdin, stdin.isFull {
            s.deferred.append(call)
        } else {
            call.reply([])
        }
    }

    /// Keeps a write for the COMMAND being (or to be) started; false when it was refused.
    private func hold(_ s: Session, _ value: [UInt8], _ call: IncomingCall) -> Bool {
        if !value.isEmpty {
            guard s.held.count + value.count <= Self.stdinLimit else {
                dropping(s, call)
                return false
            }
            s.held += value
            if !call.expectsReply { s.heldUnanswered = true }
        }
        if call.expectsReply {
            s.heldCalls.append(call)
        } else {
            call.reply([])
        }
        return true
    }

    /// What was held goes nowhere (its COMMAND cannot start, or its central left): write
    /// requests are answered with `refusal`, or as done when there is none.
    private func dropHeld(_ s: Session, refusal: UInt8?) {
        s.held = []
        s.heldUnanswered = false
        let calls = s.heldCalls
        s.heldCalls.removeAll()
        for call in calls {
            if let refusal { call.fail(GattError.application(refusal)) } else { call.reply([]) }
        }
    }

    /// A write that would take what COMMAND has not read yet over ``stdinLimit``. A write request
    /// is refused (the central may send it again later). A write command cannot be: bluetoothd
    /// has acknowledged it already. Rather than go on with a hole in the stream, COMMAND's input
    /// then ends (end of file) after what it has taken, and the connection takes nothing more
    /// (``Session/broken``).
    private func dropping(_ s: Session, _ call: IncomingCall) {
        if !call.expectsReply {
            s.broken = true
            // What is held goes to a COMMAND being started; held for one that would start
            // (exit grace), it goes nowhere: nothing starts for it now.
            let taken = s.bytesIn + (s.starting != nil ? s.held.count : 0)
            if s.process?.status != nil { dropHeld(s, refusal: 0x82) }
            Tool.warn("\(Server.centralName(s.device)): \(server.handler.name) is not reading: its input "
                      + "ends after \(taken) bytes; writes are dropped until the central connects again")
            if s.stdin != nil { endInputOnceWritten(s) }
        } else if !s.droppedWarned {
            Tool.warn("\(Server.centralName(s.device)): \(server.handler.name) is not reading; refusing writes")
            s.droppedWarned = true
        }
        call.fail(GattError.application(0x82))
    }

    /// Closes COMMAND's stdin once what is queued for it has been written.
    private func endInputOnceWritten(_ s: Session) {
        guard let stdin = s.stdin else { return }
        let end = { [weak self, weak s] in
            guard let self, let s else { return }
            self.closeStdin(s)
            self.answerDeferred(s)
        }
        if stdin.queuedCount == 0 { end() } else { stdin.onEmpty = end }
    }

    func read(_ options: GattRequestOptions, _ call: IncomingCall) {
        guard let s = sessions[options.device!] else {
            call.reply(.bytes([]))
            return
        }
        switch s.replies.read(offset: options.offset, mtu: options.mtu) {
        case .success(let piece): call.reply(.bytes(piece))
        case .failure(let refusal): call.fail(refusal.dbusError)
        }
        updateStdoutWatch(s)
    }

    func connectionChanged(device: String, connected: Bool) {
        guard !connected else { return }
        if let s = sessions[device] { hangUp(s) }
        // Another central left: the one still connected may be pushed to again.
        for s in sessions.values { resumePushing(s) }
    }

    func notifyingChanged(_ on: Bool) {
        for s in sessions.values {
            resumePushing(s)
            updateStdoutWatch(s)
        }
    }

    func centralsLost() {
        for s in sessions.values { hangUp(s) }
    }

    func shutdown() {
        for s in Array(sessions.values) + Array(ending.values) {
            s.starting?.cancel()
            s.starting = nil
            dropHeld(s, refusal: 0x83)
            answerDeferred(s)
            closeStdin(s)
            // COMMAND was reaped, but what it started still holds its stdout: the server's
            // terminateAll no longer sees that group (nor waits for a hang-up's SIGKILL timer).
            s.process?.killLeftovers()
        }
    }

    // MARK: - The process

    /// Starts COMMAND for the session on a thread of its own; false when it cannot be (said why).
    private func start(_ s: Session) -> Bool {
        s.started = MonotonicClock.seconds()
        s.bytesIn = 0
        s.bytesOut = 0
        s.droppedWarned = false
        let starting: HandlerStart
        do {
            starting = try server.handler.start(server.children, environment: server.environment(device: s.device),
                                                stdin: .pipe, stdout: .pipe, stderr: .inherit)
        } catch {
            Tool.warn("cannot run \(server.handler.name): \(error)")
            return false
        }
        s.starting = starting
        starting.onStarted = { [weak self, weak s] result in
            guard let self, let s else {
                if case .success(let child) = result { child.discard() }
                return
            }
            self.started(s, result)
        }
        return true
    }

    /// COMMAND could not be started: what was held goes nowhere. The central's write requests
    /// are refused, and its next write tries again, unless write commands were lost (their
    /// central was not told).
    private func startFailed(_ s: Session) {
        if s.heldUnanswered {
            s.broken = true
            Tool.warn("\(Server.centralName(s.device)): \(s.held.count) bytes lost; "
                      + "writes are dropped until the central connects again")
        }
        dropHeld(s, refusal: 0x83)
    }

    /// COMMAND has started, or could not be.
    private func started(_ s: Session, _ result: Result<Subprocess, Errno>) {
        s.starting = nil
        let process: Subprocess
        switch result {
        case .success(let child):
            process = child
        case .failure(let error):
            Tool.warn("cannot run \(server.handler.name): \(error)")
            startFailed(s)
            return
        }
        s.process = process
        process.onExit = { [unowned self, unowned s] _ in self.exited(s) }
        let stdin = QueuedOutput(fd: process.stdinFD, loop: loop, limit: Self.stdinHighWater)
        stdin.onRoom = { [unowned self, unowned s] in self.answerDeferred(s) }
        // COMMAND closed its stdin: nothing more can go in, and nobody waits for room.
        stdin.onFailure = { [unowned self, unowned s] _ in
            self.closeStdin(s)
            self.answerDeferred(s)
        }
        s.stdin = stdin
        server.debug("\(Server.centralName(s.device)): started \(server.handler.name) (pid \(process.pid))")
        if !s.held.isEmpty {
            s.bytesIn += s.held.count
            stdin.write(s.held)
            s.held = []
            try? stdin.flush()
        }
        s.heldUnanswered = false
        s.deferred += s.heldCalls
        s.heldCalls.removeAll()
        if s.broken { endInputOnceWritten(s) }
        // Write requests that came meanwhile are answered now, or once COMMAND has read enough.
        if s.stdin?.isFull != true { answerDeferred(s) }
        updateStdoutWatch(s)
    }

    private func answerDeferred(_ s: Session) {
        let calls = s.deferred
        s.deferred.removeAll()
        for call in calls { call.reply([]) }
    }

    /// Ends COMMAND's stdin; what it has not taken yet is dropped.
    private func closeStdin(_ s: Session) {
        s.stdin?.close()
        s.stdin = nil
        s.process?.closeStdin()
    }

    /// Whether COMMAND's stdout may be read now.
    private func outputHasRoom(_ s: Session) -> Bool {
        if s.gone { return true }  // read and discard, so COMMAND can finish
        if server.notifier.pendingBytes >= server.notifier.lowWater { return false }
        return s.replies.pendingBytes < Self.readQueueBytes
    }

    private func updateStdoutWatch(_ s: Session) {
        guard let process = s.process, process.stdoutFD >= 0 else { return }
        let want = outputHasRoom(s)
        if want, s.stdoutWatch == nil {
            s.stdoutWatch = loop.watch(fd: process.stdoutFD, events: .readable) { [unowned self, unowned s] _ in self.drain(s) }
        } else if !want, let w = s.stdoutWatch {
            loop.remove(w)
            s.stdoutWatch = nil
        }
    }

    private func drain(_ s: Session) {
        guard let fd = s.process?.stdoutFD, fd >= 0 else { return }
        let buffer = server.buffer.bytes
        let n: Int
        do {
            n = try FileIO.read(fd, into: buffer)
        } catch {
            if error == .again { return }
            n = 0
        }
        if n == 0 {
            // Once COMMAND has exited, what it left in its group ends with it (while the pipe is
            // open the group id is safe).
            s.process?.killLeftovers()
            closeStdout(s)
            checkEnded(s)
            return
        }
        if !s.gone {
            s.bytesOut += n
            deliver(Array(UnsafeRawBufferPointer(rebasing: buffer[0..<n])), to: s)
        }
        updateStdoutWatch(s)
    }

    private func deliver(_ bytes: [UInt8], to s: Session, join: Bool = true) {
        resumePushing(s)
        // Output keeps its order: while earlier output waits in the notifier, later output
        // follows it there even if pushing is no longer possible (the notifier diverts both in
        // order); while output waits in the read queue, later output waits behind it.
        let push = (server.canPush(to: s.device) && s.replies.isEmpty) || s.pushing > 0
        if s.pushed != push {
            s.pushed = push
            server.debug("\(Server.centralName(s.device)): output " + (push ? "by notifications"
                : "queued for reads (notifications \(server.notifyCharacteristic.notifying ? "on" : "off"), \(server.peripheral.connectedDevices.count) centrals connected)"))
        }
        if push {
            pushOutput(bytes, to: s, join: join)
        } else {
            queueForRead(bytes, s)
        }
    }

    /// Once pushing to the central is possible again, what waits unread in its read queue is
    /// notified, ahead of later output: a central that only takes notifications (a terminal
    /// app, blrecv on a stream that is not frames) would otherwise never see it, nor anything
    /// after it.
    private func resumePushing(_ s: Session) {
        guard !s.gone, s.pushing == 0, !s.replies.isEmpty, server.canPush(to: s.device) else { return }
        let unread = s.replies.takeUnread()
        server.debug("\(Server.centralName(s.device)): the only central again: \(unread.count) unread bytes notified")
        pushOutput(unread, to: s)
        updateStdoutWatch(s)
    }

    private func pushOutput(_ bytes: [UInt8], to s: Session, join: Bool = true) {
        // Joined to the output queued before it when that waits still (one job, one `done`).
        let joined = server.notifier.enqueue(bytes, target: s.device, joinKey: join ? ObjectIdentifier(s) : nil,
                                             divert: { [weak self, weak s] rest in
                                                 if let self, let s { self.queueForRead(rest, s) }
                                             },
                                             done: { [weak s] in
                                                 if let s { s.pushing = max(0, s.pushing - 1) }
                                             })
        if !joined { s.pushing += 1 }
    }

    private func queueForRead(_ bytes: [UInt8], _ s: Session) {
        if s.gone || bytes.isEmpty { return }
        let wasEmpty = s.replies.isEmpty
        // Stdout is read only while there is room, but output diverted from the notifier was
        // read earlier: it may go over the cap, by what was pushed (which came from under the
        // cap, or from the notifier's low-water mark), and stdout then waits until it is read.
        s.replies.append(bytes, evenIfFull: true)
        if wasEmpty {
            // The doorbell of raw mode: an empty notification adds no bytes to anyone's stream.
            server.notifier.enqueue([], chunk: 1)
        }
    }

    /// COMMAND was reaped. A run ends with its COMMAND, as in frame mode: what it left running
    /// in its process group is killed now, or, while something still holds its stdout, after
    /// a grace of a second (its output until then still reaches the central).
    private func exited(_ s: Session) {
        // What it writes during the grace still goes to the central.
        s.graceTimer = s.process?.endGroupOnExit(loop: loop, drain: { [weak self, weak s] in
            if let self, let s { self.drain(s) }
        }, close: { [weak self, weak s] in
            guard let self, let s else { return }
            s.graceTimer = nil
            self.closeStdout(s)
            self.checkEnded(s)
        })
        checkEnded(s)
    }

    private func closeStdout(_ s: Session) {
        if let w = s.stdoutWatch { loop.remove(w) }
        s.stdoutWatch = nil
        s.process?.closeStdout()
    }

    /// COMMAND's stdout ended and it was reaped: the session can take a new COMMAND.
    private func checkEnded(_ s: Session) {
        guard let process = s.process, let status = process.status, process.stdoutFD < 0 else { return }
        for timer in [s.killTimer, s.graceTimer].compactMap({ $0 }) { loop.cancel(timer) }
        s.killTimer = nil
        s.graceTimer = nil
        closeStdin(s)
        answerDeferred(s)
        s.process = nil
        // One notification of its own (blrecv --eom ends at a value equal to it), never joined
        // to the output still waiting before it, nor the next run's output to it.
        if server.config.eom && !s.gone { deliver(Array("EOM".utf8), to: s, join: false) }
        if server.config.verbose {
            let ms = Int(((MonotonicClock.seconds() - s.started) * 1000).rounded())
            Tool.warn("\(Server.centralName(s.device)): \(server.handler.name) ended: \(status), \(s.bytesIn) bytes in, \(s.bytesOut) bytes out, \(ms) ms")
        }
        if s.gone {
            forget(s)
        } else if !s.held.isEmpty {
            // Written during the exit grace: the next COMMAND's input.
            if !start(s) { startFailed(s) }
        } else {
            dropHeld(s, refusal: nil)  // empty write requests: nothing for a COMMAND to take
        }
    }

    private func forget(_ s: Session) {
        if sessions[s.device] === s { sessions[s.device] = nil }
        ending[ObjectIdentifier(s)] = nil
    }

    /// The central disconnected: COMMAND gets end of file and SIGHUP, then SIGKILL after 2 s.
    private func hangUp(_ s: Session) {
        s.gone = true
        server.notifier.drop(target: s.device)
        s.replies.removeAll()
        answerDeferred(s)
        s.starting?.cancel()
        s.starting = nil
        dropHeld(s, refusal: nil)
        guard let process = s.process else {
            forget(s)
            return
        }
        closeStdin(s)
        process.signalGroup(SIGHUP)
        updateStdoutWatch(s)
        s.killTimer = loop.schedule(after: 2) { [weak process] in process?.signalGroup(SIGKILL) }
    }
}
