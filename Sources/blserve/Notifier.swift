import BLBlueZ
import BLCommand
import BLDBus

/// Sends notifications with flow control.
///
/// A notification goes through the socket bluetoothd acquired for the characteristic when there
/// is one (raw and stream modes offer it): one message each, and a full socket holds the
/// notifier back until bluetoothd has read more. Otherwise, and always for an empty value, it is
/// a `PropertiesChanged(Value)` signal. Nothing in BlueZ drops signals, but nothing pushes back
/// either, so the notifier keeps at most ``window`` of them unconfirmed: after that many it sends
/// `org.freedesktop.DBus.Peer.Ping` to bluetoothd and waits for the answer, which comes only once
/// bluetoothd has read everything sent before it (the bus keeps one sender's messages in order).
/// The two ways keep their order: a signal waits until bluetoothd has read everything from the
/// socket, and the socket waits after a signal until a Ping is answered. Data waits in the
/// notifier's queue meanwhile; its producers (a handler's stdout) check ``pendingBytes`` and stop
/// reading while it is high.
///
/// A job aimed at one central is sent only while `canPush(target)` holds (5.66 delivers every
/// notification to every subscriber, bluez-notes §3.8); when it stops holding, the rest of the
/// job goes to the job's `divert` closure (the central's read queue) instead.
///
/// A piece's size is worked out as it is sent (``pieceSize``), not when it was queued: a central
/// that connects meanwhile with a smaller MTU gets pieces that fit it. Output queued in small
/// reads (a slow central, a COMMAND writing a byte at a time) is joined into the job before it
/// where the producer allows it, so that it still goes out in whole pieces.
final class Notifier {
    struct Job {
        var target: String?
        var bytes: [UInt8]
        var position = 0
        /// A fixed size (a doorbell, EOM); nil: ``pieceSize`` for the target as it is sent.
        var chunk: Int?
        /// Later output queued with the same key (and target) may be joined to this job.
        var joinKey: ObjectIdentifier?
        var divert: (([UInt8]) -> Void)?
        /// Called once the job is fully sent or diverted (not when dropped by ``reset()``).
        var done: (() -> Void)?
        var sentEmpty = false
    }

    let characteristic: GattCharacteristic
    let bus: DBusConnection
    /// Notifications sent before waiting for bluetoothd.
    let window: Int
    /// Whether a notification now would reach only `target`.
    var canPush: (String) -> Bool = { _ in false }
    /// The size of a piece for `target` (nil: every subscriber) on the links as they are now.
    var pieceSize: (String?) -> Int = { _ in 20 }
    /// The only central connected, if exactly one is (a device object path).
    var soleCentral: () -> String? = { nil }
    /// Called when ``pendingBytes`` has dropped below ``lowWater`` after being above it.
    var onDrain: (() -> Void)?
    /// Called with every value sent (stream mode answers reads with the last one).
    var onSent: (([UInt8]) -> Void)?
    /// Diagnostics (-v).
    var log: ((String) -> Void)?

    private var jobs: [Job] = []
    private var sentSincePing = 0
    private var pinging = false
    /// A signal went to bluetoothd after which the socket was used: not yet confirmed by a Ping.
    private var signalUnconfirmed = false
    /// The socket was full; its watch calls back when it takes more.
    private var waitingForSocket = false
    /// A signal waits until bluetoothd has read what was written to the socket before it.
    private var waitingForBacklog = false
    private var pumpScheduled = false
    private(set) var pendingBytes = 0
    private(set) var sentCount = 0
    let lowWater = 64 * 1024
    private var aboveLowWater = false
    private var generation = 0

    init(characteristic: GattCharacteristic, bus: DBusConnection, window: Int = 64) {
        self.characteristic = characteristic
        self.bus = bus
        self.window = window
        characteristic.onNotifySocketWritable = { [weak self] in
            guard let self, self.waitingForSocket else { return }
            self.waitingForSocket = false
            self.schedulePump()
        }
    }

    var isIdle: Bool { jobs.isEmpty }

    /// A joined job holds at most this much (what it has sent included, which stays in memory
    /// until the job ends).
    static let joinLimit = 16 * 1024

    /// Queues `bytes` as notifications of at most `chunk` bytes, or of ``pieceSize`` when nil
    /// (an empty value: one empty notification). With a `target`, see the type's description.
    /// With a `joinKey` (the producer: a session, the stream), the bytes are added to the last
    /// job when that was queued with the same key and target and has room: its `divert` and
    /// `done` then stand for both, and the call returns true (the caller's own closures are not
    /// kept).
    @discardableResult
    func enqueue(_ bytes: [UInt8], chunk: Int? = nil, target: String? = nil, joinKey: ObjectIdentifier? = nil,
                 divert: (([UInt8]) -> Void)? = nil, done: (() -> Void)? = nil) -> Bool {
        pendingBytes += bytes.count
        if pendingBytes >= lowWater { aboveLowWater = true }
        let key = chunk == nil && !bytes.isEmpty ? joinKey : nil
        if let key, let last = jobs.indices.last, jobs[last].joinKey == key, jobs[last].target == target,
           jobs[last].bytes.count + bytes.count <= Self.joinLimit {
            jobs[last].bytes.append(contentsOf: bytes)
            schedulePump()
            return true
        }
        jobs.append(Job(target: target, bytes: bytes, chunk: chunk, joinKey: key,
                        divert: divert, done: done))
        schedulePump()
        return false
    }

    /// Drops the jobs aimed at `target` (that central disconnected); their `done` is called.
    func drop(target: String) {
        var kept: [Job] = []
        var dropped: [Job] = []
        for job in jobs {
            if job.target == target { dropped.append(job) } else { kept.append(job) }
        }
        if dropped.isEmpty { return }
        jobs = kept
        for job in dropped {
            pendingBytes -= job.bytes.count - job.position
            job.done?()
        }
        checkDrain()
    }

    /// Drops everything queued (bluetoothd went away; the centrals are gone with it).
    func reset() {
        jobs.removeAll()
        pendingBytes = 0
        sentSincePing = 0
        pinging = false
        signalUnconfirmed = false
        waitingForSocket = false
        waitingForBacklog = false
        generation += 1
        checkDrain()
    }

    private func schedulePump() {
        if pumpScheduled || pinging || waitingForSocket || waitingForBacklog { return }
        pumpScheduled = true
        bus.loop.callSoon { [weak self] in
            guard let self else { return }
            self.pumpScheduled = false
            self.pump()
        }
    }

    private func pump() {
        while !pinging, !waitingForSocket, !waitingForBacklog, !jobs.isEmpty {
            var job = jobs[0]
            if let target = job.target, !canPush(target) {
                jobs.removeFirst()
                let rest = Array(job.bytes[job.position...])
                pendingBytes -= rest.count
                job.divert?(rest)
                job.done?()
                continue
            }
            let end = min(job.position + max(1, job.chunk ?? pieceSize(job.target)), job.bytes.count)
            let value = Array(job.bytes[job.position..<end])
            if value.isEmpty && job.sentEmpty {
                jobs.removeFirst()
                job.done?()
                continue
            }
            if GattCharacteristic.socketCanCarry(value), let central = socketCentral(for: job.target) {
                if signalUnconfirmed {
                    ping()
                    return
                }
                switch characteristic.sendThroughSocket(value, to: central) {
                case .sent:
                    break
                case .full:
                    waitingForSocket = true
                    return
                case .unavailable:
                    continue  // the socket is gone: this value goes as a signal
                }
            } else {
                if sentSincePing >= window {
                    ping()
                    return
                }
                if characteristic.notifySocketBacklog > 0 {
                    waitForBacklog()
                    return
                }
                do {
                    try characteristic.notify(value)
                } catch {
                    // Not exported any more (shutting down): nothing can be sent.
                    reset()
                    return
                }
                sentSincePing += 1
                if characteristic.hasNotifySockets { signalUnconfirmed = true }
            }
            sentCount += 1
            onSent?(value)
            pendingBytes -= value.count
            job.position = end
            job.sentEmpty = true
            if job.position >= job.bytes.count {
                jobs.removeFirst()
                job.done?()
            } else {
                jobs[0] = job
            }
        }
        checkDrain()
    }

    /// The central whose notification socket carries a notification for `target` (nil: every
    /// subscriber) to exactly the centrals meant: the only one connected, with a socket of its
    /// own. Any other case takes a signal (bluez-notes §3.8: who a socket reaches depends on
    /// the BlueZ version, but with one central connected it is that one).
    private func socketCentral(for target: String?) -> String? {
        guard let sole = soleCentral(), target == nil || target == sole,
              characteristic.hasNotifySocket(for: sole) else { return nil }
        return sole
    }

    /// Polls until bluetoothd has read everything written to the socket (a few notifications'
    /// worth at most: a full socket already holds the notifier back).
    private func waitForBacklog() {
        waitingForBacklog = true
        let gen = generation
        bus.loop.schedule(after: 0.002) { [weak self] in
            guard let self, gen == self.generation, self.waitingForBacklog else { return }
            self.waitingForBacklog = false
            self.pump()
        }
    }

    /// Calls `completion` once everything queued has been sent and bluetoothd has read it.
    func flush(_ completion: @escaping () -> Void) {
        if !jobs.isEmpty || pinging || characteristic.notifySocketBacklog > 0 {
            bus.loop.schedule(after: 0.05) { [weak self] in self?.flush(completion) }
            return
        }
        bus.call(destination: BlueZ.service, path: "/", interface: DBusInterfaceName.peer, member: "Ping",
                 timeout: 5) { _ in completion() }
    }

    private func ping() {
        pinging = true
        let gen = generation
        bus.call(destination: BlueZ.service, path: "/", interface: DBusInterfaceName.peer, member: "Ping",
                 timeout: 10) { [weak self] result in
            guard let self, gen == self.generation else { return }
            if case .failure(let error) = result { self.log?("flow control: Ping to bluetoothd: \(error.oneLine)") }
            self.pinging = false
            self.sentSincePing = 0
            self.signalUnconfirmed = false
            self.pump()
        }
    }

    private func checkDrain() {
        if aboveLowWater && pendingBytes < lowWater {
            aboveLowWater = false
            onDrain?()
        }
    }
}
