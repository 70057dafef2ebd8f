#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLBlueZ
import BLCommand
import BLDBus
import BLFrame

/// blsend's job: connect, then stream standard input into the characteristic.
///
/// Standard input is read only when there is room in a fixed buffer, so a slow link slows the
/// reader (backpressure) instead of growing memory. Whatever has arrived is sent at once, in
/// pieces of at most the write limit, so interactive input goes out line by line.
/// - Write requests go through WriteValue, one at a time (bluetoothd refuses a second one on the
///   same characteristic while one is pending), each acknowledged by the peer.
/// - Write commands go through AcquireWrite's socket when the characteristic allows it (one
///   datagram per Write Command, flow-controlled by the socket), else through WriteValue.
/// - Input that is frames is cut as the seed iOS client cuts it: a frame header never spans two
///   writes (the seed's server reads a header only from within one write).
struct Send {
    struct Options {
        var writeType: RemoteCharacteristic.WriteType?
        var eom = false
        var progress = false
        var reply: NotificationReceiver.Options?
    }

    let target: CentralTarget
    let options: Options

    func run() throws {
        try BlueZClient.session { client, interrupted in
            try target.withPeer(client, interrupted) { peer in try send(peer, interrupted) }
        }
    }

    private func send(_ peer: Peer, _ interrupted: InterruptWatch) throws {
        let loop = peer.client.loop
        let characteristic = try peer.characteristic(
            service: target.service, uuid: target.writeCharacteristic,
            preferring: options.writeType == .request ? ["write"]
                : options.writeType == .command ? ["write-without-response"] : ["write", "write-without-response"])
        let type = try writeType(for: characteristic)

        var receiver: NotificationReceiver?
        var replyOutcome: Result<Void, ToolError>?
        var writer: Writer?
        if let replyOptions = options.reply {
            let notifying = target.notifyCharacteristic == target.writeCharacteristic
                && (characteristic.has("notify") || characteristic.has("indicate"))
                ? characteristic : try peer.characteristic(service: target.service, uuid: target.notifyCharacteristic,
                                                           preferring: ["notify", "indicate"])
            let r = NotificationReceiver(characteristic: notifying, options: replyOptions, out: QueuedOutput(fd: 1, loop: loop))
            r.onFinish = { [unowned r] outcome in
                replyOutcome = outcome
                if let writer { Self.repliesEnded(r, outcome, writer) }
            }
            try r.start()
            receiver = r
        }

        let w = try Writer(characteristic: characteristic, type: type, eom: options.eom, progress: options.progress)
        writer = w
        var sendOutcome: Result<Void, ToolError>?
        w.onFinish = { result in
            sendOutcome = result
            receiver?.armSilenceTimer()
        }
        interrupted.onInterrupt = {
            w.interrupt()
            receiver?.finish(.failure(ToolError.quiet(.interrupted)))
        }
        try w.start()
        // The replies ended while the writer was being made (their reader was gone at once).
        if let receiver, let replyOutcome { Self.repliesEnded(receiver, replyOutcome, w) }
        _ = loop.run(until: { sendOutcome != nil }, timeout: nil)
        if case .failure(let error) = sendOutcome ?? .failure(ToolError.quiet(.interrupted)) {
            // Replies already received still go out (finish writes what the output holds).
            receiver?.finish(.failure(error))
            throw error
        }
        if let receiver {
            _ = loop.run(until: { replyOutcome != nil }, timeout: nil)
            receiver.close()
            try (replyOutcome ?? .failure(ToolError.quiet(.interrupted))).get()
        }
    }

    /// What the end of the replies means for the writing.
    private static func repliesEnded(_ r: NotificationReceiver, _ outcome: Result<Void, ToolError>, _ writer: Writer) {
        if case .failure(let error) = outcome {
            // Replies cannot be delivered any more (stdout failed, a pull read was
            // refused): what stdin still holds would be sent for nothing.
            if error.code != .interrupted { writer.fail(error) }
            return
        }
        switch r.ending {
        case .output?:
            // The replies' reader went away (`| head -1`): standard input not read yet is left
            // unread (what was read is still written).
            writer.endInput()
        case .count?:
            // --count replies came in answer to what was written: the same, so that
            // `cat | blsend --reply --count 1` ends with its reply. Notifications that came
            // before anything was written answer nothing of ours: all of stdin still goes.
            if writer.hasBegun { writer.endInput() }
        case .disconnected(let reason)?:
            // Replies came, but what stdin still holds cannot go now.
            writer.linkLost(reason)
        default:
            break
        }
    }

    /// Request when the characteristic allows it and nothing else was asked for.
    private func writeType(for characteristic: RemoteCharacteristic) throws -> RemoteCharacteristic.WriteType {
        let canRequest = characteristic.has("write")
        let canCommand = characteristic.has("write-without-response")
        switch options.writeType {
        case .request?:
            guard canRequest else {
                throw ToolError(.unavailable, "\(characteristic.uuid) does not accept write requests (flags: \(characteristic.flags.joined(separator: ", ")))")
            }
            return .request
        case .command?:
            // bluetoothd sends a Write Command even when the flag is missing; the peer decides.
            return .command
        case nil:
            if canRequest { return .request }
            if canCommand { return .command }
            throw ToolError(.unavailable, "\(characteristic.uuid) is not writable (flags: \(characteristic.flags.joined(separator: ", ")))")
        }
    }
}

/// Moves standard input into the characteristic; see `Send`.
final class Writer {
    let characteristic: RemoteCharacteristic
    let type: RemoteCharacteristic.WriteType
    /// EOM goes after the input; not after input left unread (``endInput()``).
    private(set) var eom: Bool
    var onFinish: ((Result<Void, ToolError>) -> Void)?

    private let loop: EventLoop
    private let limit: Int
    private var socket: OwnedFD?
    private var socketWatch: WatchToken?
    private var stdinWatch: WatchToken?
    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: FileIO.bufferAlignment)
    static let readChunk = 16 * 1024
    /// Write commands: after this many, a read goes through the same link before
    /// more are sent. bluetoothd queues commands without limit and, flooded, stops answering
    /// D-Bus for seconds; the read is queued behind the commands, so its answer means they left.
    static let fenceEvery = 64
    /// How long a fence waits for bluetoothd to take the datagrams before it (it then reads
    /// anyway, confirming only what the fence before had).
    static let fenceDrainWait = 1.0
    /// Write commands nothing can confirm: how long one may take to go over a slow link (one a
    /// connection event of 30 ms), and the longest wait for them before a link blsend made is
    /// ended rather than left up.
    static let slowLinkWriteInterval = 0.03
    static let longestUnconfirmedWait = 60.0
    /// Socket path: how long the socket may refuse data before blsend gives up.
    static let stallLimit = 30.0
    private let fenceRead: RemoteCharacteristic.OrderingRead?
    private var sinceFence = 0
    private var fencing = false
    private var stallTimer: TimerToken?
    private var lastTaken = MonotonicClock.seconds()
    private var head = 0, end = 0
    private var inputEnded = false
    private var eomSent = false
    /// Where frames (if the input is frames) may be cut.
    private var cutter = FrameCutter()
    private var inFlight = 0
    /// The WriteValue under way (it may wait to be sent again).
    private var pendingWrite: RemoteCharacteristic.PendingWrite?
    /// Bytes handed over: acknowledged requests, commands bluetoothd queued, or datagrams the
    /// socket took.
    private var written = 0
    /// Bytes known to have left: acknowledged requests, or commands before an answered fence.
    private var confirmed = 0
    private var finished = false
    /// All input is written: the last writes are being confirmed.
    private var finishing = false
    /// Ends the writer as soon as the link goes, also while it waits for input.
    private var linkWatch: LinkWatch?
    private let progress: Progress?
    private let started = MonotonicClock.seconds()
    private let startedCPU = ProcessCPUClock.seconds()

    init(characteristic: RemoteCharacteristic, type: RemoteCharacteristic.WriteType, eom: Bool, progress: Bool) throws(ToolError) {
        self.characteristic = characteristic
        self.type = type
        self.eom = eom
        loop = characteristic.peer.client.loop
        var mtu = characteristic.mtu
        if type == .command && characteristic.has("write-without-response") {
            let acquired = try characteristic.acquireWrite()
            socket = acquired.fd
            mtu = acquired.mtu
        }
        // Commands through WriteValue are acknowledged once queued in bluetoothd, not sent: they
        // are confirmed by the final read too.
        fenceRead = type == .command ? characteristic.orderingRead() : nil
        limit = RemoteCharacteristic.writeLimit(mtu: mtu)
        self.progress = progress ? Progress(loop: loop) : nil
        Tool.note("writing \(type == .request ? "requests" : "commands") through \(socket == nil ? "WriteValue" : "AcquireWrite's socket"), MTU \(mtu), pieces of up to \(limit) bytes")
    }

    deinit {
        buffer.deallocate()
    }

    func start() throws(ToolError) {
        guard !finished else { return }  // an interrupt that came before ended it already
        let peer = characteristic.peer
        let watch = try peer.watch(characteristics: [characteristic.path]) { [weak self] loss in
            guard let self else { return }
            self.linkLost(peer.describe(loss, uuid: self.characteristic.uuid))
        }
        // Setting the watch up waits for bluetoothd's answers, and an interrupt or the reply
        // reader's end may have finished the writer meanwhile: then no input is taken.
        guard !finished else {
            watch.cancel()
            return
        }
        linkWatch = watch
        stdinWatch = loop.watch(fd: 0, events: .readable) { [weak self] _ in self?.readInput() }
        if let socket {
            socketWatch = loop.watch(fd: socket.rawValue, events: []) { [weak self] events in self?.socketWritable(events) }
            stallTimer = loop.schedule(after: 1, repeating: 1) { [weak self] in self?.checkStall() }
        }
    }

    // MARK: Input

    private var pending: Int { end - head }

    /// Takes no more of standard input: what was read already is written, then the writer
    /// finishes as at end of input.
    func endInput() {
        guard !finished, !inputEnded else { return }
        inputEnded = true
        // EOM says "the message is complete", which it is not: the peer is not told so.
        if eom {
            eom = false
            Tool.warn("standard input was not read to its end: no EOM is written")
        }
        // A frame header whose rest will not be read now is left out, not sent cut short.
        if pending > 0 {
            let whole = cutter.nextWrite(UnsafeRawBufferPointer(rebasing: buffer[head..<end]),
                                         limit: max(pending, FrameFormat.headerSize))
            end = head + min(whole, pending)
        }
        updateInputWatch()
        pump()
    }

    /// A piece of input (or the EOM marker) has been handed over.
    private(set) var hasBegun = false

    private func readInput() {
        if head > 0 && head == end {
            head = 0
            end = 0
        }
        if buffer.count - end < Writer.readChunk && head > 0 {
            let count = pending
            buffer.baseAddress!.copyMemory(from: buffer.baseAddress! + head, byteCount: count)
            head = 0
            end = count
        }
        let n: Int
        do {
            n = try FileIO.read(0, into: UnsafeMutableRawBufferPointer(rebasing: buffer[end...]))
        } catch .again {
            // A non-blocking stdin shared with another reader that took the data first.
            return
        } catch {
            fail(.ioError, "stdin: \(error)")
            return
        }
        if n == 0 {
            inputEnded = true
        } else {
            end += n
        }
        updateInputWatch()
        pump()
    }

    /// Reads standard input only while there is room in the buffer for a good piece of it, so
    /// the buffer is not moved around for every few bytes written.
    private func updateInputWatch() {
        guard let stdinWatch else { return }
        let room = buffer.count - pending >= Writer.readChunk
        if inputEnded {
            loop.remove(stdinWatch)
            self.stdinWatch = nil
        } else {
            loop.setEvents(stdinWatch, room ? .readable : [])
        }
    }

    // MARK: Output

    private func pump() {
        guard !finished else { return }
        if socket != nil {
            let more = canWriteNow
            if let socketWatch { loop.setEvents(socketWatch, more && !fencing ? .writable : []) }
        } else {
            sendNextValue()
        }
        if inputEnded && pending == 0 && inFlight == 0 && !fencing && (!eom || eomSent) {
            drainThenFinish()
        }
    }

    /// How much input the next piece takes: up to `limit` bytes, ending before a frame header
    /// that would not fit whole; 0 while input begins with a header not all read yet.
    private var nextInputPiece: Int {
        guard pending > 0 else { return 0 }
        let n = cutter.nextWrite(UnsafeRawBufferPointer(rebasing: buffer[head..<end]), limit: limit)
        // At the end of the input, a partial header goes as it is.
        return n == 0 && inputEnded ? min(limit, pending) : n
    }

    /// There is a piece to write now (input, or the EOM marker once input is done).
    private var canWriteNow: Bool { nextInputPiece > 0 || (pending == 0 && inputEnded && eom && !eomSent) }

    /// The next piece: up to `limit` bytes of input, or the EOM marker once input is done.
    private func nextPiece() -> [UInt8]? {
        if pending > 0 {
            let n = nextInputPiece
            if n == 0 { return nil }  // the rest of a header is still to come
            return Array(UnsafeRawBufferPointer(rebasing: buffer[head..<(head + n)]))
        }
        if inputEnded && eom && !eomSent { return Array("EOM".utf8) }
        return nil
    }

    private func consume(_ piece: [UInt8]) {
        hasBegun = true
        if pending > 0 {
            piece.withUnsafeBytes { cutter.consume($0) }
            head += piece.count
        } else {
            eomSent = true
        }
        progress?.add(piece.count)
        updateInputWatch()
    }

    /// WriteValue path: one write in flight at a time.
    private func sendNextValue() {
        guard inFlight == 0, !fencing, let piece = nextPiece() else { return }
        inFlight = 1
        hasBegun = true
        pendingWrite = characteristic.write(piece, type: type) { [weak self] result in
            guard let self, !self.finished else { return }
            self.inFlight = 0
            switch result {
            case .success:
                self.written += piece.count
                self.consume(piece)
                if self.type == .request {
                    self.confirmed += piece.count
                } else {
                    // bluetoothd answers a command once it is queued, not sent: commands are
                    // confirmed by a read behind them, which also keeps its queue short.
                    self.sinceFence += 1
                    if self.sinceFence >= Writer.fenceEvery, self.fenceRead != nil {
                        self.fence()
                        return
                    }
                }
                self.pump()
            case .failure(let error):
                self.fail(error)
            }
        }
    }

    /// AcquireWrite path: one datagram per Write Command, as long as the socket takes them.
    private func socketWritable(_ events: IOEvents) {
        guard let fd = socket?.rawValue, !finished, !fencing else { return }
        while let piece = nextPiece() {
            if sinceFence >= Writer.fenceEvery, fenceRead != nil {
                fence()
                return
            }
            do {
                let sent = try piece.withUnsafeBytes { raw in
                    try Result { () throws(Errno) in try FileIO.sendNow(fd, raw) }.get()
                }
                if !sent { return }
            } catch {
                fail(.unavailable, "\(characteristic.peer.device.address) went away: \(error)")
                return
            }
            written += piece.count
            lastTaken = MonotonicClock.seconds()
            sinceFence += 1
            consume(piece)
        }
        pump()
    }

    private func fence(then next: (() -> Void)? = nil) {
        guard fenceRead != nil else { return }
        fencing = true
        if let socketWatch { loop.setEvents(socketWatch, []) }
        // Only what bluetoothd has taken from the socket is queued ahead of the fence's read,
        // and right after a burst the last datagrams are usually still in the socket: wait
        // (bluetoothd takes them as fast as it runs, nothing else is written meanwhile) until
        // it has taken all, so that the answer confirms every byte written, not only those of
        // the fence before (a failure then says how much got through).
        whenSocketDrained(within: Writer.fenceDrainWait) { [weak self] allTaken in
            self?.readFence(covering: allTaken ? self?.written : nil, then: next)
        }
    }

    /// The fence's read; its answer confirms `covered` bytes (nil: those confirmed before).
    private func readFence(covering covered: Int?, then next: (() -> Void)?) {
        guard let fenceRead, !finished else { return }
        let covered = covered ?? confirmed
        fenceRead.read(timeout: 30) { [weak self] result in
            guard let self, !self.finished else { return }
            self.fencing = false
            self.sinceFence = 0
            self.lastTaken = MonotonicClock.seconds()
            if case .failure(let error) = result {
                self.fail(error)
                return
            }
            self.confirmed = covered
            if let next { next() } else { self.pump() }
        }
    }

    /// Calls `then(true)` once bluetoothd has taken every datagram written to AcquireWrite's
    /// socket (at once without a socket), or `then(false)` after `limit` seconds. Nothing
    /// signals that moment: it looks every millisecond.
    private func whenSocketDrained(within limit: Double, since: Double = MonotonicClock.seconds(),
                                   then: @escaping (Bool) -> Void) {
        guard !finished else { return }
        let drained = socket.map { FileIO.unreadBytes($0.rawValue) == 0 } ?? true
        if drained || MonotonicClock.seconds() - since >= limit {
            then(drained)
            return
        }
        _ = loop.schedule(after: 0.001) { [weak self] in
            self?.whenSocketDrained(within: limit, since: since, then: then)
        }
    }

    /// The socket refused data for too long: bluetoothd stopped taking writes.
    private func checkStall() {
        guard !finished, !fencing, canWriteNow else {
            lastTaken = MonotonicClock.seconds()
            return
        }
        if MonotonicClock.seconds() - lastTaken >= Writer.stallLimit {
            fail(.tempFail, "bluetoothd took no write for \(Int(Writer.stallLimit)) s")
        }
    }

    /// Every byte is written; for the socket, wait until bluetoothd has taken all of it, then let
    /// a read go through the same link: it is queued behind the commands, so its answer means
    /// they went out (and ending our connection next cannot cut them off).
    private func drainThenFinish() {
        guard !finished, !finishing else { return }
        finishing = true
        if let socketWatch { loop.remove(socketWatch) }
        socketWatch = nil
        whenSocketDrained(within: Writer.stallLimit) { [weak self] drained in
            guard let self, !self.finished else { return }
            guard drained else {
                self.fail(.tempFail, "bluetoothd did not take the last writes within \(Int(Writer.stallLimit)) s")
                return
            }
            self.confirmLastWrites()
        }
    }

    /// Every byte is written and bluetoothd has taken them all: confirm the commands, then
    /// finish.
    private func confirmLastWrites() {
        // Set for write commands only.
        if fenceRead != nil {
            fence { [weak self] in self?.finish(.success(())) }
            return
        }
        // Nothing on the device can be read to learn when the commands have left. Ending a
        // connection we made would throw away those still queued in bluetoothd (through the
        // socket or through WriteValue: either way a command is answered once it is queued,
        // not sent). Wait as long as a slow link would take to send them, then end it; when
        // that would be more than a minute, leave it up.
        if type == .command && characteristic.peer.madeConnection {
            let address = characteristic.peer.device.address
            let wait = max(1, Double(sinceFence) * Writer.slowLinkWriteInterval)
            if wait <= Writer.longestUnconfirmedWait {
                let message = "nothing to read on \(address) to confirm the last \(sinceFence) writes; waiting \(Int(wait.rounded(.up))) s before disconnecting"
                // A wait long enough to look like a hang is said without -v.
                if wait > 2 { Tool.warn(message) } else { Tool.note(message) }
                _ = loop.run(until: { [unowned self] in self.finished }, timeout: wait)
            } else {
                characteristic.peer.leaveUp(because: "nothing on it can be read to learn when bluetoothd has sent the last \(sinceFence) write commands")
            }
        }
        finish(.success(()))
    }

    /// The link went (`reason`; seen here or by whoever else watches it): what is not written
    /// yet cannot go.
    func linkLost(_ reason: String) {
        fail(.unavailable, reason)
    }

    /// SIGINT or SIGTERM: stop, saying how much got through.
    func interrupt() {
        fail(.interrupted, "interrupted")
    }

    /// Ends with `error`, saying how much got through (also when the replies to what is
    /// written can no longer be delivered).
    func fail(_ error: ToolError) {
        fail(error.code, error.message)
    }

    private func fail(_ code: ExitCode, _ message: String) {
        finish(.failure(ToolError(code, "\(message) (\(confirmed) bytes confirmed)")))
    }

    func finish(_ result: Result<Void, ToolError>) {
        guard !finished else { return }
        finished = true
        let elapsed = max(0.001, MonotonicClock.seconds() - started)
        let cpu = ProcessCPUClock.seconds() - startedCPU
        progress?.end()
        Tool.note("\(written) bytes in \(Int(elapsed * 1000)) ms (\(Progress.size(Double(written) / elapsed))/s), CPU \(Int(cpu * 1000)) ms")
        linkWatch?.cancel()
        linkWatch = nil
        if let stallTimer { loop.cancel(stallTimer) }
        stallTimer = nil
        pendingWrite?.cancel()  // a write waiting to go again after InProgress stays unsent
        if let stdinWatch { loop.remove(stdinWatch) }
        if let socketWatch { loop.remove(socketWatch) }
        stdinWatch = nil
        socketWatch = nil
        socket?.close()
        onFinish?(result)
    }
}

/// "sent 12.3 KiB, 4.5 KiB/s" on stderr, redrawn at most twice a second, and only when more
/// went out (a terminal the input is typed on is not drawn over while nothing is sent).
final class Progress {
    private let loop: EventLoop
    private var bytes = 0
    private var drawn = -1
    private let started = MonotonicClock.seconds()
    private var timer: TimerToken?

    init(loop: EventLoop) {
        self.loop = loop
        timer = loop.schedule(after: 0.5, repeating: 0.5) { [weak self] in self?.draw(final: false) }
    }

    func add(_ count: Int) { bytes += count }

    func end() {
        if let timer { loop.cancel(timer) }
        timer = nil
        draw(final: true)
    }

    private func draw(final: Bool) {
        // An update behind one the terminal has not taken yet is already out of date.
        if !final && (Tool.stderrIsBehind || bytes == drawn) { return }
        drawn = bytes
        let elapsed = max(0.001, MonotonicClock.seconds() - started)
        let line = "\rsent \(Progress.size(Double(bytes))), \(Progress.size(Double(bytes) / elapsed))/s   " + (final ? "\n" : "")
        Tool.writeStderr(line)
    }

    static func size(_ bytes: Double) -> String {
        let units = ["B", "KiB", "MiB", "GiB"]
        var value = bytes, unit = 0
        while value >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        let tenths = Int((value * 10).rounded())
        return unit == 0 ? "\(Int(bytes)) B" : "\(tenths / 10).\(tenths % 10) \(units[unit])"
    }
}
