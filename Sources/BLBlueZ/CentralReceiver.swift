#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLCommand
import BLDBus
import BLFrame

/// Copies a characteristic's notifications to an output, as they arrive, and follows the seed
/// protocol's read-pull replies: a notification that is exactly `N0000000` is followed by reads
/// until a read returns an empty value, each value written in order. So is an empty
/// notification that arrives while the bytes so far end inside a frame: blserve's way of saying
/// that the rest of a pushed reply waits in the read queue (another central connected).
///
/// It subscribes with AcquireNotify (one datagram per notification; a read does not show up as a
/// notification), falling back to StartNotify where bluetoothd refuses the socket because another
/// client uses StartNotify. Notifications that arrive during a pull are held back until it ends,
/// so a pulled frame is never split by other bytes.
///
/// Output goes through a ``QueuedOutput``: a reader that falls behind does not stop the receiver
/// from taking notifications off the socket (bluetoothd drops those it cannot hand over) until
/// the queue is full; only then does reading (and pulling) wait for the reader.
public final class NotificationReceiver {
    public struct Options {
        /// Follow `N0000000` (and an empty notification inside a frame) with reads until empty.
        public var pull = true
        /// End at a notification equal to "EOM" (not written).
        public var eom = false
        /// End after this many replies. A reply is one notification, or a doorbell together with
        /// the reads it triggered (when they found something); in a stream of frames, a frame
        /// (however many notifications it took; an empty notification is none), and the output
        /// then ends with the last frame wanted, whatever came with it.
        public var count: Int?
        /// End after this many seconds without a notification or read value, once armed.
        public var silence: Double?
        public init() {}
    }

    public let characteristic: RemoteCharacteristic
    public let options: Options
    public let out: QueuedOutput
    public private(set) var replies = 0
    public private(set) var bytesReceived = 0
    /// Called once, when the receiver ends (count reached, EOM, silence, stdout closed, the device
    /// disconnected, or an error); ``ending`` says which.
    public var onFinish: ((Result<Void, ToolError>) -> Void)?

    /// Why the receiver ended.
    public enum Ending: Equatable {
        /// `count` replies came.
        case count
        /// The notification "EOM" came (with `eom`).
        case endOfMessage
        /// `silence` seconds without a notification.
        case silence
        /// Standard output's reader went away (or it failed).
        case output
        /// The device disconnected, bluetoothd stopped, or the characteristic went away: what
        /// happened, in a few words ("ADDR disconnected").
        case disconnected(String)
        /// Anything else: an error, or ``finish(_:)`` called from outside.
        case other
    }

    /// Set when the receiver ends, before ``onFinish`` is called.
    public private(set) var ending: Ending?

    private var loop: EventLoop { characteristic.peer.client.loop }
    private var socket: OwnedFD?
    private var socketWatch: WatchToken?
    private var valueToken: SubscriptionToken?
    /// The link's end, bluetoothd leaving the bus (its objects go without a signal, and a
    /// StartNotify subscription would then wait for ever; an acquired socket is hung up
    /// instead), or the characteristic going away while the link stays.
    private var linkWatch: LinkWatch?
    private var pulling = false
    /// A pull waits for room in the output queue.
    private var pullWaiting = false
    private var ownReadOutstanding = false
    /// StartNotify only: Value changes seen while our read is outstanding. One of them is the
    /// read's own echo (bluetoothd raises Value for a read too), the others are notifications.
    private var duringRead: [[UInt8]] = []
    private var held: [[UInt8]] = []
    /// Bytes in ``held``: they count against the output's limit like queued output.
    private var heldBytes = 0
    private var silenceTimer: TimerToken?
    private var lastActivity = MonotonicClock.seconds()
    private var finished = false
    /// Non-empty values read in the current pull.
    private var pulledValues = 0
    /// Frames the reads of the current pull completed (while the output is frames).
    private var pulledFrames = 0
    /// Follows the output as frames (bodies are not kept), to know whether it ends inside one;
    /// nil once the output turned out not to be frames.
    private var frames: FrameDecoder? = FrameDecoder()
    private let datagram = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 16)

    static let doorbell: [UInt8] = Array("N0000000".utf8)
    static let endOfMessage: [UInt8] = Array("EOM".utf8)

    public init(characteristic: RemoteCharacteristic, options: Options, out: QueuedOutput) {
        self.characteristic = characteristic
        self.options = options
        self.out = out
        out.onFailure = { [weak self] error in self?.stdoutFailed(error) }
        out.onRoom = { [weak self] in self?.outputHasRoom() }
    }

    deinit {
        close()
        datagram.deallocate()
    }

    /// Subscribes. After this returns, every notification is delivered.
    public func start() throws(ToolError) {
        let peer = characteristic.peer
        linkWatch = try peer.watch(characteristics: [characteristic.path]) { [weak self] loss in
            guard let self else { return }
            self.deviceDisconnected(because: loss == .disconnected ? nil : peer.describe(loss, uuid: self.characteristic.uuid))
        }
        guard characteristic.has("notify") || characteristic.has("indicate") else {
            throw ToolError(.unavailable, "characteristic \(characteristic.uuid) does not notify (flags: \(characteristic.flags.joined(separator: ", ")))")
        }
        do {
            let acquired = try characteristic.acquireNotify()
            socket = acquired.fd
            socketWatch = loop.watch(fd: acquired.fd.rawValue, events: .readable) { [weak self] _ in
                self?.socketReady()
            }
        } catch let error where error.message.contains("Notify acquired") {
            throw ToolError(.unavailable, "notifications of \(characteristic.uuid) are already taken by another process"
                            + " (another blrecv, or blsend --reply?)")
        } catch let error where error.message.lowercased().contains("not connected") {
            throw ToolError(.unavailable, "\(characteristic.peer.device.address) disconnected")
        } catch {
            // InProgress: another client uses StartNotify; NotSupported: indications only.
            Tool.note("no notification socket for \(characteristic.uuid) (\(error.message)): subscribing with StartNotify")
            valueToken = try characteristic.startNotify { [weak self] value in
                guard let self else { return }
                if self.ownReadOutstanding {
                    self.duringRead.append(value)
                    return
                }
                self.notification(value)
                self.flush()
            }
        }
        // The waits above run the loop: the receiver may have finished meanwhile (stdout gone),
        // and then what they set up must not stay.
        if finished { close() }
    }

    /// Starts counting silence from now (blsend arms it once its input is sent).
    public func armSilenceTimer() {
        guard let silence = options.silence, silenceTimer == nil, !finished else { return }
        lastActivity = MonotonicClock.seconds()
        scheduleSilenceCheck(after: silence)
    }

    private func scheduleSilenceCheck(after seconds: Double) {
        silenceTimer = loop.schedule(after: seconds) { [weak self] in
            guard let self, let silence = self.options.silence else { return }
            self.silenceTimer = nil
            // Time spent waiting for our own reader (socket unread, pull held back) is not silence,
            // nor is a read of the pull in progress (it has its own timeout): a long value read
            // in many pieces over a slow link must not be cut off as the end of the replies.
            if self.waitingForReader || self.ownReadOutstanding { self.lastActivity = MonotonicClock.seconds() }
            let quiet = MonotonicClock.seconds() - self.lastActivity
            if quiet >= silence - 0.001 {
                if self.eomHeldBack {
                    self.end(.endOfMessage, .success(()))
                } else if self.options.eom && self.bytesReceived > 0 {
                    // EOM says the data is complete; without it, what came may be cut short.
                    self.end(.silence, .failure(ToolError(.tempFail, "no EOM: \(formatSeconds(silence)) s without a notification"
                                                          + self.receivedSoFar)))
                } else if self.bytesReceived > 0 {
                    self.end(.silence, .success(()))
                } else {
                    self.end(.silence, .failure(ToolError(.tempFail, "no notification within \(formatSeconds(silence)) s")))
                }
            } else {
                self.scheduleSilenceCheck(after: silence - quiet)
            }
        }
    }

    /// Unsubscribes and releases the socket. Safe to call twice.
    public func close() {
        if let socketWatch { loop.remove(socketWatch) }
        socketWatch = nil
        socket?.close()
        socket = nil
        if let valueToken { characteristic.stopNotify(valueToken) }
        valueToken = nil
        linkWatch?.cancel()
        linkWatch = nil
        if let silenceTimer { loop.cancel(silenceTimer) }
        silenceTimer = nil
        out.close()
    }

    // MARK: - Events

    private func socketReady() {
        guard let fd = socket?.rawValue else { return }
        if finished {
            close()
            return
        }
        // Every datagram that is there (while the output queue has room), written out together.
        if takeDatagrams(fd, untilQueueFull: true) {
            deviceDisconnected()
            return
        }
        flush()
    }

    /// Takes the datagrams waiting on the socket, in order, as notifications. Returns true when
    /// the socket is at its end: bluetoothd closed it (the link went down) and nothing is left.
    private func takeDatagrams(_ fd: Int32, untilQueueFull: Bool) -> Bool {
        while !finished && !(untilQueueFull && isBehind) {
            let n = recv(fd, datagram.baseAddress, datagram.count, Int32(MSG_DONTWAIT))
            if n > 0 {
                notification(Array(UnsafeRawBufferPointer(rebasing: datagram[0..<n])))
                continue
            }
            if n == 0 {
                // An empty notification, or the end: once closed, every recv returns 0 at once.
                // Queued data first: a socket can hold datagrams after an empty one when closed.
                if Self.isHungUp(fd) && Self.queuedBytes(fd) == 0 { return true }
                notification([])
                continue
            }
            if errno == EINTR { continue }
            return errno != EAGAIN && errno != EWOULDBLOCK
        }
        return false
    }

    /// Bytes still queued on a SOCK_SEQPACKET socket (SIOCINQ sums every datagram).
    static func queuedBytes(_ fd: Int32) -> Int {
        var count: Int32 = 0
        return ioctl(fd, UInt(FIONREAD), &count) == 0 ? Int(count) : 0
    }

    /// The socket's peer has closed it (POLLHUP now).
    static func isHungUp(_ fd: Int32) -> Bool {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 1 && (Int32(entry.revents) & (POLLHUP | POLLERR)) != 0
    }

    private func notification(_ value: [UInt8]) {
        guard !finished else { return }
        lastActivity = MonotonicClock.seconds()
        if pulling {
            held.append(value)
            heldBytes += value.count
            checkBacklog()
            return
        }
        if options.eom && value == NotificationReceiver.endOfMessage {
            end(.endOfMessage, .success(()))
            return
        }
        // `N0000000` is a doorbell only where a frame may begin: inside one it is body bytes (a
        // reply pushed in 8-byte pieces may hold them).
        let doorbell = value == NotificationReceiver.doorbell && !isInsideFrame
        let completed = write(value)
        if options.pull && (doorbell || (value.isEmpty && isInsideFrame)) {
            pulledValues = 0
            pulledFrames = 0
            pull()
        } else if frames != nil {
            // In a stream of frames replies are frames: one notified in pieces (blserve --reply
            // push) is counted at its end, two in one notification are two, and an empty
            // notification (blserve announcing another central's reply tail) is none.
            if completed > 0 { countReply(completed) }
        } else {
            countReply()
        }
        checkBacklog()
    }

    /// How far past the output's limit notifications may pile up where they cannot be left
    /// waiting in bluetoothd's socket (StartNotify: each is a signal, taken as it comes).
    static let signalBacklogFactor = 4

    /// With StartNotify, a reader that stopped (or a pull that never ends while the peer goes on
    /// notifying) would otherwise grow the backlog without bound: past a few times the output's
    /// limit the receiver ends (74), writing what it holds.
    private func checkBacklog() {
        guard socket == nil, !finished else { return }
        let behind = out.queuedCount + heldBytes
        guard behind > Self.signalBacklogFactor * out.limit else { return }
        end(.other, .failure(ToolError(.ioError, "standard output is \(behind) bytes behind, and notifications that come as "
                                       + "signals (StartNotify, no socket) cannot wait: stopped" + receivedSoFar)))
    }

    private func pull() {
        pulling = true
        flush()
        if finished { return }
        if out.isFull {
            pullWaiting = true
            return
        }
        ownReadOutstanding = true
        characteristic.read(timeout: 30) { [weak self] result in
            guard let self, !self.finished else { return }
            self.ownReadOutstanding = false
            self.lastActivity = MonotonicClock.seconds()
            // Value changes during the read: the read's own echo (it arrives just before the
            // answer; the last one with the same bytes) is dropped, the rest were notifications.
            var seen = self.duringRead
            self.duringRead = []
            if case .success(let value) = result, let echo = seen.lastIndex(of: value) { seen.remove(at: echo) }
            self.held += seen
            self.heldBytes += seen.reduce(0) { $0 + $1.count }
            self.checkBacklog()
            if self.finished { return }
            switch result {
            case .success(let value) where value.isEmpty:
                self.pulling = false
                // The notifications that came meanwhile are taken first: if this reply was the
                // last one counted, finish() must not write them.
                let held = self.held
                self.held = []
                self.heldBytes = 0
                // A doorbell whose reads found nothing rang for another central (blserve rings
                // every subscriber): no reply of ours.
                // In a stream of frames every frame pulled is a reply: one pull can bring several
                // (the server queued another before the reads began, and its own doorbell's
                // reads then find nothing).
                if self.frames != nil {
                    if self.pulledFrames > 0 { self.countReply(self.pulledFrames) }
                } else if self.pulledValues > 0 {
                    self.countReply()
                }
                for value in held { self.notification(value) }
                self.flush()
                // Reading may have paused for what was held; the output's own pause ends with
                // its onRoom.
                if !self.finished, !self.out.isFull { self.resumeReading() }
            case .success(let value):
                self.pulledValues += 1
                self.pulledFrames += self.write(value, uncounted: self.pulledFrames)
                if self.frames != nil, let count = self.options.count, self.replies + self.pulledFrames >= count {
                    // The last reply wanted is whole: nothing more is read (or written).
                    self.countReply(self.pulledFrames)
                } else {
                    self.pull()
                }
            case .failure(let error):
                // The link went down under the read: that is a disconnect, not a read error.
                if !self.characteristic.peer.isConnected {
                    self.deviceDisconnected()
                } else {
                    self.finish(.failure(error))
                }
            }
            self.flush()
        }
    }

    private func countReply(_ n: Int = 1) {
        replies += n
        if let count = options.count, replies >= count { end(.count, .success(())) }
    }

    /// Writes `value` out; returns how many frames it completed (while the output is frames).
    /// With a count, the output ends with the frame that reaches it: what `value` holds after
    /// that frame is not written. `uncounted`: frames taken already that count only later (a
    /// pull's, at its end).
    @discardableResult
    private func write(_ value: [UInt8], uncounted: Int = 0) -> Int {
        guard !finished else { return 0 }
        bytesReceived += value.count
        guard frames != nil else {
            out.write(value)
            return 0
        }
        let (completed, used) = followFrames(value, wanted: options.count.map { $0 - replies - uncounted })
        out.write(used == value.count ? value : Array(value[..<used]))
        return completed
    }

    /// The output so far ends inside a frame (in its header or before the end of its body).
    private var isInsideFrame: Bool { frames.map { !$0.isAtFrameBoundary } ?? false }

    /// Returns how many frames `value` completed, and how many of its bytes are wanted: all, or
    /// up to the end of the `wanted`th frame it completes.
    private func followFrames(_ value: [UInt8], wanted: Int?) -> (completed: Int, used: Int) {
        if let wanted, wanted <= 0 { return (0, 0) }
        let before = frames?.framesDecoded ?? 0
        var used = value.count
        value.withUnsafeBytes { raw in
            var input = raw
            do {
                while let event = try frames?.next(&input) {
                    if case .frameEnd = event, let wanted, let done = frames?.framesDecoded, done - before >= wanted {
                        used = raw.count - input.count
                        break
                    }
                }
            } catch {
                frames = nil   // not frames: never "inside" one
            }
        }
        return (frames.map { $0.framesDecoded - before } ?? 0, used)
    }

    /// Writes what stdout takes now; with the queue full, stops reading the socket until
    /// ``outputHasRoom()``.
    private func flush() {
        guard !finished else { return }
        do {
            try out.flush()
        } catch {
            stdoutFailed(error)
            return
        }
        if isBehind, let socketWatch, !socketPaused {
            loop.setEvents(socketWatch, [])
            let during = heldBytes > 0 ? " (\(heldBytes) of them notified during a read-pull)" : ""
            Tool.note("standard output is \(out.queuedCount + heldBytes) bytes behind\(during): notifications wait in bluetoothd's socket")
        }
    }

    /// Reading the socket is paused until the output queue is down to half.
    private var socketPaused: Bool {
        socketWatch.map { loop.events(of: $0) == [] } ?? false
    }

    /// Nothing is taken in until our own reader catches up.
    private var waitingForReader: Bool { out.isFull || pullWaiting || socketPaused }

    /// What waits for our reader (queued output, and notifications held back during a pull)
    /// has reached the output's limit: the socket is not read meanwhile.
    private var isBehind: Bool { out.queuedCount + heldBytes >= out.limit }

    private func outputHasRoom() {
        guard !finished else { return }
        lastActivity = MonotonicClock.seconds()
        resumeReading()
        if pullWaiting {
            pullWaiting = false
            pull()
        }
    }

    /// Reads the socket again, unless what waits is still at the output's limit.
    private func resumeReading() {
        if let socketWatch, socketPaused, !isBehind {
            loop.setEvents(socketWatch, .readable)
            Tool.note("standard output caught up: reading notifications again")
        }
        if pullWaiting {
            pullWaiting = false
            pull()
        }
    }

    private func stdoutFailed(_ error: Errno) {
        // A reader that went away (| head) ends us cleanly.
        end(.output, ToolError.stdout(error).map { .failure($0) } ?? .success(()))
    }

    private func deviceDisconnected(because reason: String? = nil) {
        guard !finished else { return }
        // While the output queue was full the socket was not read: what it still holds came
        // before the disconnect.
        if let fd = socket?.rawValue {
            _ = takeDatagrams(fd, untilQueueFull: false)
            if finished { return }
        }
        let why = reason ?? "\(characteristic.peer.device.address) disconnected"
        if eomHeldBack {
            end(.endOfMessage, .success(()))
        } else if options.eom && bytesReceived > 0 {
            // The data was to end with EOM: what came may be cut short.
            end(.disconnected(why), .failure(ToolError(.ioError, why + " before EOM" + receivedSoFar)))
        } else {
            end(.disconnected(why), bytesReceived > 0 ? .success(()) : .failure(ToolError(.unavailable, why)))
        }
    }

    /// EOM came during a pull and waits for it to end (with `eom`): the data is complete.
    private var eomHeldBack: Bool {
        options.eom && (held.contains(Self.endOfMessage) || duringRead.contains(Self.endOfMessage))
    }

    /// The error for an end that leaves the output inside a frame.
    private func cutShort(_ why: Ending, dropped: Int) -> ToolError {
        let tail = " inside a frame: the output is cut short" + receivedSoFar
            + (dropped > 0 ? "; \(dropped) notifications that came during the read-pull were not written" : "")
        switch why {
        case .silence:
            return ToolError(.tempFail, "\(formatSeconds(options.silence ?? 0)) s without a notification" + tail)
        case .disconnected(let reason):
            return ToolError(.ioError, reason + tail)
        case .endOfMessage:
            return ToolError(.dataError, "EOM came" + tail)
        default:
            return ToolError(.ioError, "the replies ended" + tail)
        }
    }

    /// " (N bytes received)" when some were, for a message about an end without EOM.
    private var receivedSoFar: String {
        bytesReceived > 0 ? " (\(bytesReceived) bytes received)" : ""
    }

    /// Ends the receiver and reports `result` (only the first call counts).
    public func finish(_ result: Result<Void, ToolError>) {
        end(.other, result)
    }

    private func end(_ why: Ending, _ result: Result<Void, ToolError>) {
        guard !finished else { return }
        finished = true
        ending = why
        // What was received is written, also notifications held back during a pull that did
        // not end, and those that came during its last read (StartNotify: a read's own echo
        // among them carries that read's value, whose answer will not be taken now) (a stdout
        // that fails now has nobody left to tell). Not when the count ends it: those came after
        // the last reply wanted.
        held += duringRead
        duringRead = []
        var result = result
        if why != .count && why != .output && isInsideFrame {
            // The output ends inside a frame: it is cut short, whatever ended it, and is not a
            // success. Notifications held back during a pull would land inside that frame's
            // body: they are not written.
            let dropped = held.count
            held = []
            if case .success = result { result = .failure(cutShort(why, dropped: dropped)) }
        }
        for value in held where why != .count {
            if options.eom && value == NotificationReceiver.endOfMessage { break }
            out.write(value)
        }
        held = []
        heldBytes = 0
        // After an interrupt, a reader that takes nothing for a second is not waited for any
        // longer: the signal must end the tool (and let it take down a link it made).
        var interrupted = false
        if case .failure(let failure) = result, failure.code == .interrupted { interrupted = true }
        do {
            try out.drainAtEnd(interrupted: interrupted, dropping: "bytes received")
        } catch {
            // What was received did not all reach stdout: that is not a success.
            if case .success = result, let failure = ToolError.stdout(error) { result = .failure(failure) }
        }
        close()
        onFinish?(result)
    }

    public var isFinished: Bool { finished }
}
