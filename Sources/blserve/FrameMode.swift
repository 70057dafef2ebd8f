#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLBlueZ
import BLCommand
import BLDBus
import BLFrame

/// Frame mode: each complete frame a central writes runs COMMAND once; the reply waits in that
/// central's queue (pull) or is notified to it (push, only while it is the sole subscriber).
final class FrameMode: ServeMode {
    /// Everything blserve holds for one central.
    final class Central {
        let device: String
        var reassembler: FrameReassembler
        var pending: [FrameRequest] = []
        var running: HandlerRun?
        /// --prestart: COMMAND started for this central's next request.
        var startedAhead: HandlerStart?
        var replies: ReplyQueue
        /// Replies handed to the notifier and not yet sent (push), and their bytes.
        var pushing = 0
        var pushingBytes = 0
        /// Its next request is waiting for it to take its replies (--max-held), logged once.
        var waitingForRoom = false
        /// Disconnected: its state was dropped; a running COMMAND's reply is discarded.
        var gone = false
        /// The run under way had its doorbell rung before it finished (``FrameMode/ring()``):
        /// `earlyDoorbell` asks for that, `announced` says a doorbell has gone out since.
        var earlyDoorbell = false
        var announced = false
        /// Reads (from the start) that came after that doorbell and before the reply: answered
        /// when the run ends, or empty after ``FrameMode/readHold``.
        var heldReads: [(call: IncomingCall, mtu: Int)] = []
        var holdTimer: TimerToken?

        init(device: String, maxFrame: Int, maxQueue: Int) {
            self.device = device
            reassembler = FrameReassembler(maxFrame: maxFrame)
            replies = ReplyQueue(capacity: maxQueue)
        }

        /// Requests and replies counted against --max-queue.
        var outstanding: Int { pending.count + (running == nil ? 0 : 1) + replies.count + pushing }
        var isIdle: Bool { outstanding == 0 && reassembler.isAtFrameBoundary }
        /// Reply bytes held for it, counted against --max-held.
        var heldBytes: Int { replies.pendingBytes + pushingBytes }
        /// Request bytes held for it: the frame being written and those waiting to run.
        var requestBytes: Int { reassembler.bufferedBytes + pending.reduce(0) { $0 + $1.body.count } }
    }

    unowned let server: Server
    private(set) var centrals: [String: Central] = [:]
    /// The state of disconnected centrals is dropped; this bounds what stays when a disconnect
    /// was never signalled.
    static let maxIdleCentrals = 64
    static let doorbell: [UInt8] = Array("N0000000".utf8)
    /// --prestart, until a COMMAND ended before its request came.
    private var prestart: Bool
    private var readChains = ReadChains()
    /// A doorbell waits for every central to end its chain of reads: see ``ring()``.
    private var doorbellWaiting = false
    private var doorbellWaitingSince = 0.0
    private var doorbellTimer: TimerToken?
    private var doorbellHeldLogged = false
    /// A central that has neither read nor heard a doorbell for this long no longer holds one
    /// back.
    static let stalledReader = 2.0
    /// The longest a doorbell waits for centrals reading replies.
    static let longestDoorbellWait = 30.0
    /// `--doorbell early`: the longest a central's read waits for the reply of a run whose
    /// doorbell rang before it ended. Well under ``stalledReader``, so that the held central
    /// keeps other doorbells waiting (it may be about to read its reply's first piece), and
    /// far under bluetoothd's 25 s for a ReadValue answer and ATT's 30 s.
    static let readHold = 1.0
    /// A run took ``readHold`` or longer: the next ones ring once their reply is queued, until
    /// a run is quick again.
    private var handlerSlow = false

    init(server: Server) {
        self.server = server
        prestart = server.config.prestart
    }

    private var config: ServeConfig { server.config }

    private func central(for device: String) -> Central {
        // A central that disconnected and came back starts afresh: nothing of its earlier
        // connection (a diverted push tail) may reach the new one.
        if let c = centrals[device], !c.gone {
            return c
        }
        if centrals.count >= Self.maxIdleCentrals { prune() }
        let c = Central(device: device, maxFrame: config.maxFrame, maxQueue: config.maxQueue)
        centrals[device] = c
        return c
    }

    /// Drops the idle state of centrals that are not connected.
    private func prune() {
        for (device, c) in centrals where c.isIdle && !server.peripheral.connectedDevices.contains(device) {
            discardStartedAhead(c)
            centrals[device] = nil
        }
    }

    func write(_ value: [UInt8], _ options: GattRequestOptions, _ call: IncomingCall) {
        let device = options.device!
        let c = central(for: device)
        if options.prepareAuthorize {
            call.reply([])
            return
        }
        // All centrals together may not make blserve hold more than --max-buffered: then a
        // central holding its share or more starts no new frame (the one being written may
        // end), as when its queue is full. Centrals under their share are not held back.
        // (This central's share first: all centrals' totals are summed only when it is reached.)
        let full = c.requestBytes + c.heldBytes >= fairShare && heldRequestBytes + heldReplyBytes >= config.maxBuffered
        let slots = full ? 0 : config.maxQueue - c.outstanding
        switch c.reassembler.write(value, offset: options.offset, slots: slots, retryable: call.expectsReply) {
        case .failure(let refusal):
            let why = refusal == .busy && full
                ? "blserve holds --max-buffered \(config.maxBuffered) bytes for all centrals, \(c.requestBytes + c.heldBytes) of them for this one" : "\(refusal)"
            server.debug("\(Server.centralName(device)): write of \(value.count) bytes refused: \(why)")
            call.fail(refusal.dbusError)
        case .success(let requests):
            call.reply([])
            if requests.isEmpty { return }
            c.pending.append(contentsOf: requests)
            dispatch(c)
        }
    }

    func read(_ options: GattRequestOptions, _ call: IncomingCall) {
        let device = options.device!
        // Only a read from the start of the value (offset 0) is a step in a chain of reads: a
        // piece always fits one ATT response, so a central following the protocol never reads
        // at an offset, and one that repeats such reads must not keep every doorbell waiting.
        let fromStart = options.offset == 0
        guard let c = centrals[device] else {
            call.reply(.bytes([]))
            if fromStart {
                readChains.read(by: device, gotNothing: true)
                if doorbellWaiting { ringIfClear() }
            }
            return
        }
        if fromStart, c.replies.isEmpty, c.announced, c.running != nil {
            // Its doorbell rang before its reply was ready: the read waits for the reply (and the
            // central, inside its chain of reads, keeps other doorbells waiting meanwhile).
            hold(call, mtu: options.mtu, for: c)
            return
        }
        answer(call, offset: options.offset, mtu: options.mtu, for: c)
    }

    /// Answers a read of `c` from its reply queue.
    private func answer(_ call: IncomingCall, offset: Int, mtu: Int, for c: Central) {
        switch c.replies.read(offset: offset, mtu: mtu) {
        case .success(let piece):
            call.reply(.bytes(piece))
            guard offset == 0 else { return }
            readChains.read(by: c.device, gotNothing: piece.isEmpty)
            // A chain of reads that has ended may let a waiting doorbell ring.
            if piece.isEmpty && doorbellWaiting { ringIfClear() }
            if !piece.isEmpty { dispatchWaiting(c) }
        case .failure(let refusal):
            call.fail(refusal.dbusError)
        }
    }

    private func hold(_ call: IncomingCall, mtu: Int, for c: Central) {
        c.heldReads.append((call, mtu))
        readChains.read(by: c.device, gotNothing: false)
        guard c.holdTimer == nil else { return }
        c.holdTimer = server.loop.schedule(after: Self.readHold) { [weak self, weak c] in
            guard let self, let c else { return }
            c.holdTimer = nil
            // Slower than the hold: the read ends the central's chain empty, and the reply
            // rings again once it is queued (a doorbell and an empty read are what a central
            // hears whenever another central's reply is announced).
            self.handlerSlow = true
            c.earlyDoorbell = false
            c.announced = false
            self.server.debug("\(Server.centralName(c.device)): no reply \(formatSeconds(Self.readHold)) s after its doorbell; it rings again when ready")
            self.answerHeldReads(c)
        }
    }

    /// Answers the reads `c` made after its early doorbell, in order, from its reply queue
    /// (empty reads when nothing is queued).
    private func answerHeldReads(_ c: Central) {
        if let timer = c.holdTimer { server.loop.cancel(timer) }
        c.holdTimer = nil
        let held = c.heldReads
        c.heldReads = []
        for read in held { answer(read.call, offset: 0, mtu: read.mtu, for: c) }
    }

    func connectionChanged(device: String, connected: Bool) {
        guard !connected else {
            // Not when its write came first: its connection was signalled late, and it may
            // have heard a doorbell meanwhile.
            if centrals[device].map(\.gone) ?? true { readChains.joined(device) }
            return
        }
        readChains.forget(device)
        if let c = centrals[device] { drop(c) } else if doorbellWaiting { ringIfClear() }
    }

    /// The centrals whose chains of reads a doorbell waits for: those connected, and those with
    /// requests or replies (a connection bluetoothd has not signalled yet). Not one that --allow
    /// refuses: it can never read, and any device in range could otherwise hold every doorbell
    /// back by connecting.
    private var listeners: Set<String> {
        server.peripheral.connectedCentrals.filter(server.isAllowed)
            .union(centrals.values.lazy.filter { !$0.gone }.map(\.device))
    }

    func notifyingChanged(_ on: Bool) {}

    func centralsLost() {
        // Nobody is left to hear a doorbell.
        doorbellWaiting = false
        if let doorbellTimer { server.loop.cancel(doorbellTimer) }
        doorbellTimer = nil
        // The notifier dropped its jobs (Server resets it first): nothing is being pushed.
        for c in centrals.values {
            c.pushing = 0
            c.pushingBytes = 0
            drop(c)
        }
    }

    /// Forgets a central that disconnected. Its running COMMAND is killed: nobody is left to
    /// read the reply, and a central that connects again and again must not pile up processes.
    private func drop(_ c: Central) {
        c.gone = true
        c.running?.cancel()
        c.running = nil
        c.earlyDoorbell = false
        c.announced = false
        discardStartedAhead(c)
        // Its replies still waiting in the notifier must not reach a new connection.
        server.notifier.drop(target: c.device)
        c.pending.removeAll()
        c.replies.removeAll()
        c.reassembler.reset()
        // Reads still held end empty (bluetoothd may be waiting for them yet).
        answerHeldReads(c)
        forgetIfDone(c)
        ringIfClear()
        // Its room goes to requests waiting for it, once every central that goes now has gone
        // (bluetoothd leaving drops them one after the other).
        server.loop.callSoon { [weak self] in self?.dispatchWaiting() }
    }

    /// Removes a dropped central once nothing refers to it any more (push jobs in the notifier).
    private func forgetIfDone(_ c: Central) {
        if c.gone && c.running == nil && c.pushing == 0 && centrals[c.device] === c { centrals[c.device] = nil }
    }

    func shutdown() {
        // The server's shutdown ends the commands (SIGTERM, then SIGKILL); no reply is sent.
        for c in centrals.values {
            c.running?.detach()
            c.running = nil
            c.pending.removeAll()
            discardStartedAhead(c)
            answerHeldReads(c)
        }
    }

    // MARK: - Running COMMAND

    /// Request bytes held for all centrals (counted against --max-buffered with the replies).
    var heldRequestBytes: Int { centrals.values.reduce(0) { $0 + $1.requestBytes } }
    /// Reply bytes held for all centrals: from --max-buffered on, the requests of centrals
    /// holding their share or more wait.
    var heldReplyBytes: Int { centrals.values.reduce(0) { $0 + $1.heldBytes } }
    /// A connected central's share of --max-buffered.
    var fairShare: Int { max(1, config.maxBuffered / max(1, server.peripheral.connectedCentrals.count)) }

    /// Runs the next request of `first`, then of every central whose request waits for room
    /// (a read or a disconnect may have brought all centrals' replies under --max-buffered).
    private func dispatchWaiting(_ first: Central? = nil) {
        if let first { dispatch(first) }
        for c in centrals.values where c.waitingForRoom && c !== first && !c.gone { dispatch(c) }
    }

    private func dispatch(_ c: Central) {
        guard c.running == nil, !c.pending.isEmpty, !server.stopping else { return }
        // A central that does not take its replies must not make blserve hold ever more of them:
        // its next request waits (still counted against --max-queue) until it reads. So does
        // that of a central holding its share or more while all centrals' replies together
        // reach --max-buffered.
        let overHeld = c.heldBytes >= config.maxHeld
        guard !overHeld && !(c.heldBytes >= fairShare && heldReplyBytes >= config.maxBuffered) else {
            if !c.waitingForRoom {
                c.waitingForRoom = true
                let whose = overHeld ? "" : " (all centrals: \(heldReplyBytes), --max-buffered)"
                server.debug("\(Server.centralName(c.device)): \(c.heldBytes) reply bytes unsent\(whose); its next request waits")
            }
            return
        }
        c.waitingForRoom = false
        let request = c.pending.removeFirst()
        var env = server.environment(device: c.device)
        if !config.prestart {
            // A COMMAND started ahead cannot know these; with --prestart no run gets them, so
            // that every run of one COMMAND sees the same variables.
            env.append(("BL_CODE", request.code.description))
            env.append(("BL_SIZE", String(request.body.count)))
        }
        let limit = config.replyCode == .raw ? FrameFormat.headerSize + FrameFormat.maxBodySize : FrameFormat.maxBodySize
        let run = HandlerRun(command: server.handler, environment: env, input: request.body, outputLimit: limit,
                             timeout: config.handlerTimeout, children: server.children, buffer: server.buffer) {
            [unowned self, unowned c] outcome in
            self.finished(c, request, outcome)
        }
        c.running = run
        c.earlyDoorbell = config.doorbell == .early && config.reply == .pull && !handlerSlow
        let ahead = c.startedAhead
        c.startedAhead = nil
        ahead?.onStarted = nil
        ahead?.process?.onExit = nil
        run.start(with: ahead)
        // --doorbell early: the doorbell's way to the central and the central's read coming
        // back overlap the run; the read waits for the reply if it comes first.
        if c.earlyDoorbell, c.running === run { ring() }
        // Started now, on a thread of its own, its start-up overlaps this run, the reply's way
        // out and the next request's way in.
        startAhead(c)
    }

    /// --prestart: starts COMMAND for the central's next request, with the environment it would
    /// get then, so that the request finds it started. A failure to start is left for the request
    /// to meet and report.
    private func startAhead(_ c: Central) {
        guard prestart, c.startedAhead == nil, !c.gone, !server.stopping else { return }
        guard let ahead = try? HandlerRun.startProcess(server.handler, server.children,
                                                       environment: server.environment(device: c.device)) else { return }
        ahead.onStarted = { [weak self, weak c, weak ahead] _ in
            guard let self, let c, let ahead, c.startedAhead === ahead else { return }
            guard let child = ahead.process else {
                // The request will start COMMAND itself, and say why it cannot.
                c.startedAhead = nil
                return
            }
            child.onExit = { [weak self, weak c, weak ahead, weak child] status in
                guard let self, let c, let ahead, let child, c.startedAhead === ahead else { return }
                // It ended without a request: whatever it wrote answers nothing, and starting it
                // ahead again would only repeat that. Requests start it themselves from now on.
                c.startedAhead = nil
                child.killGroupJustReaped()
                child.closeStdin()
                child.closeStdout()
                if self.prestart {
                    self.prestart = false
                    Tool.warn("\(self.server.handler.name) ended (\(status)) before a request came to it; --prestart is off")
                }
            }
        }
        c.startedAhead = ahead
    }

    /// Ends the COMMAND started ahead for `c` (it has had no request: nothing is lost).
    private func discardStartedAhead(_ c: Central) {
        guard let ahead = c.startedAhead else { return }
        c.startedAhead = nil
        ahead.cancel()
    }

    private func finished(_ c: Central, _ request: FrameRequest, _ outcome: HandlerRun.Outcome) {
        c.running = nil
        let announced = c.announced
        c.earlyDoorbell = false
        c.announced = false
        handlerSlow = outcome.duration >= Self.readHold
        let reply = Self.reply(for: outcome, code: config.replyCode)
        if config.verbose {
            let ms = Int((outcome.duration * 1000).rounded())
            let result = outcome.failure.map { "failed (\($0))" } ?? (outcome.status?.description ?? "")
            let what = reply.isEmpty ? "no reply" : "reply \(Self.describe(reply))"
            Tool.warn("\(Server.centralName(c.device)): \(request.code) \(request.body.count) bytes: \(result), \(what), \(ms) ms")
        }
        if c.gone {
            forgetIfDone(c)
            return
        }
        deliver(reply, to: c, announced: announced)
        dispatch(c)
    }

    /// Queues or pushes a finished run's reply. `announced`: a doorbell rang for it already
    /// (`--doorbell early`), so only the reads waiting for it are answered.
    private func deliver(_ reply: [UInt8], to c: Central, announced: Bool) {
        if reply.isEmpty {
            // No reply (--reply-code raw, no output): a read waiting for one finds nothing.
            answerHeldReads(c)
            return
        }
        let notifier = server.notifier
        // While an earlier reply is still being pushed, later ones follow it through the
        // notifier even if pushing is no longer possible: the notifier diverts them in order.
        // A tail diverted earlier still waits in the read queue: later replies wait behind it.
        if config.reply == .push, (server.canPush(to: c.device) && c.replies.isEmpty) || c.pushing > 0 {
            c.pushing += 1
            c.pushingBytes += reply.count
            notifier.enqueue(reply, target: c.device,
                             divert: { [weak self, weak c] rest in
                                 guard let self, let c, !c.gone else { return }
                                 self.server.debug("\(Server.centralName(c.device)): \(reply.count - rest.count) of \(reply.count) reply bytes notified, the rest waits to be read")
                                 c.replies.append(rest)
                                 if rest.count < reply.count {
                                     // The central is inside this frame and reads its rest
                                     // next, as if it had read its start: doorbells wait.
                                     self.readChains.read(by: c.device, gotNothing: false)
                                 }
                                 if rest.count == reply.count {
                                     // Nothing of it was notified: ring as a pulled reply does.
                                     self.ring()
                                 } else {
                                     // The central is inside this frame: an empty notification
                                     // (no bytes for its parser) makes it read the rest.
                                     self.server.notifier.enqueue([], chunk: 1)
                                 }
                             },
                             done: { [weak self, weak c] in
                                 guard let self, let c else { return }
                                 c.pushing = max(0, c.pushing - 1)
                                 c.pushingBytes = max(0, c.pushingBytes - reply.count)
                                 self.forgetIfDone(c)
                                 self.dispatchWaiting(c.gone ? nil : c)
                             })
            return
        }
        // The seed server's order: queue the reply, then ring ("a reply is ready"); with
        // --doorbell early it rang when the run began, and the reads it brought wait for this.
        c.replies.append(reply)
        if announced {
            answerHeldReads(c)
        } else {
            ring()
        }
    }

    /// Announces a queued reply with the doorbell, which every subscribed central hears
    /// (bluez-notes §3.8). A central parsing every notification and read as one stream, as the
    /// RaspBLE client does, would take its 8 bytes for body bytes if it came while that central
    /// reads a reply (its own earlier one, or another's); and bluetoothd sends a read's answer
    /// ahead of a notification still queued, so a doorbell given to it just before a central's
    /// first read of a chain is answered still reaches that central after the first piece. So
    /// it waits until every connected central has ended its chain of reads (a read that found
    /// nothing) since the doorbell before, and rings once for every reply queued meanwhile. A
    /// central that has not read for ``stalledReader`` seconds (since its last read, or since
    /// the doorbell before) holds it back no longer, nor do all together for more than
    /// ``longestDoorbellWait``.
    private func ring() {
        if !doorbellWaiting {
            doorbellWaiting = true
            doorbellWaitingSince = MonotonicClock.seconds()
        }
        ringIfClear()
    }

    private func ringIfClear() {
        guard doorbellWaiting else { return }
        let now = MonotonicClock.seconds()
        let waited = now - doorbellWaitingSince
        let listeners = self.listeners
        if waited < Self.longestDoorbellWait {
            let holding = readChains.holding(listeners, now: now, stalled: Self.stalledReader)
            if let soonest = holding.map({ $0.holdsFor }).min() {
                if !doorbellHeldLogged {
                    doorbellHeldLogged = true
                    server.debug("doorbell held back: \(holding.map { Server.centralName($0.device) }.sorted().joined(separator: ", ")) reading replies")
                }
                if let doorbellTimer { server.loop.cancel(doorbellTimer) }
                let delay = min(soonest, Self.longestDoorbellWait - waited) + 0.01
                doorbellTimer = server.loop.schedule(after: delay) { [weak self] in
                    self?.doorbellTimer = nil
                    self?.ringIfClear()
                }
                return
            }
        }
        doorbellWaiting = false
        doorbellHeldLogged = false
        if let doorbellTimer { server.loop.cancel(doorbellTimer) }
        doorbellTimer = nil
        if server.stopping { return }
        if config.verbose {
            let still = readChains.unfinished(listeners)
            if !still.isEmpty {
                server.debug("doorbell rings after \(Int(waited * 1000)) ms although \(still.map(Server.centralName).sorted().joined(separator: ", ")) did not read to the end")
            }
        }
        readChains.rang(at: now, keeping: listeners)
        // Runs under way that asked for an early doorbell have had it: their central's reads
        // from now on wait for their replies.
        for c in centrals.values where c.earlyDoorbell && c.running != nil && !c.gone { c.announced = true }
        server.notifier.enqueue(Self.doorbell, chunk: Self.doorbell.count)
    }

    /// The reply frame for a finished run (what the central will read).
    static func reply(for outcome: HandlerRun.Outcome, code: ServeConfig.ReplyCode) -> [UInt8] {
        if let failure = outcome.failure {
            return errorFrame(failure)
        }
        let output = outcome.output
        do {
            switch code {
            case .raw:
                return output
            case .auto:
                if output.isEmpty { return try FrameEncoder.encode(.notify, body: []) }
                let image = ImageFormat(signature: output.prefix(ImageFormat.signatureLength)) != nil
                return try FrameEncoder.encode(image ? .image : .text, body: output)
            case .fixed(let frameCode):
                return try FrameEncoder.encode(frameCode, body: output)
            }
        } catch {
            return errorFrame("reply over \(FrameFormat.maxBodySize) bytes")
        }
    }

    /// A T frame "error: <reason>".
    static func errorFrame(_ reason: String) -> [UInt8] {
        let body = Array(("error: " + reason).utf8)
        // The body is short; encoding a T frame cannot fail.
        return (try? FrameEncoder.encode(.text, body: body)) ?? []
    }

    /// "T 34 bytes" for a frame, "34 bytes" otherwise.
    static func describe(_ reply: [UInt8]) -> String {
        if reply.count >= FrameFormat.headerSize, let code = FrameCode(rawValue: reply[0]) {
            return "\(code) \(reply.count - FrameFormat.headerSize) bytes"
        }
        return "\(reply.count) bytes"
    }
}

/// Where each central is in its chains of reads, for the doorbell (see `FrameMode.ring()`).
struct ReadChains {
    private var lastRead: [String: Double] = [:]
    /// When each central's last chain ended (a read without an offset that found nothing).
    private var lastEnd: [String: Double] = [:]
    private var lastRing = -Double.infinity

    mutating func read(by device: String, gotNothing: Bool, at now: Double = MonotonicClock.seconds()) {
        lastRead[device] = now
        if gotNothing { lastEnd[device] = now }
    }

    /// A doorbell went out. What is kept of centrals no longer connected goes (a disconnect
    /// bluetoothd never signalled must not leave it for ever).
    mutating func rang(at now: Double, keeping listeners: Set<String>) {
        lastRing = now
        lastRead = lastRead.filter { listeners.contains($0.key) }
        lastEnd = lastEnd.filter { listeners.contains($0.key) }
    }

    /// `device` connected: it heard no doorbell rung before, so it owes no chain of reads for
    /// one (a central that had read is left as it is). Not when a central is first seen by its
    /// write: one whose connection bluetoothd has not signalled yet may have heard one.
    mutating func joined(_ device: String, at now: Double = MonotonicClock.seconds()) {
        if lastRead[device] == nil && lastEnd[device] == nil { lastEnd[device] = now }
    }

    mutating func forget(_ device: String) {
        lastRead[device] = nil
        lastEnd[device] = nil
    }

    /// A central is in a chain when it read a piece after its chain last ended, or has not
    /// ended one since the last doorbell (its first read may be on its way). One that connected
    /// after the last doorbell counts as having ended its chain as it connected.
    private func inChain(_ device: String) -> Bool {
        let ended = lastEnd[device] ?? -Double.infinity
        return (lastRead[device] ?? -Double.infinity) > ended || lastRing > ended
    }

    /// The connected centrals in a chain that are not stalled, each with the seconds until it
    /// would count as stalled.
    func holding(_ connected: Set<String>, now: Double, stalled: Double) -> [(device: String, holdsFor: Double)] {
        connected.compactMap { device in
            guard inChain(device) else { return nil }
            let active = max(lastRead[device] ?? -Double.infinity, lastRing)
            let left = stalled - (now - active)
            return left > 0 ? (device, left) : nil
        }
    }

    /// The connected centrals still in a chain (stalled or not).
    func unfinished(_ connected: Set<String>) -> [String] { connected.filter(inChain) }
}
