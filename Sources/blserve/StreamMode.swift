#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLBlueZ
import BLCommand
import BLDBus

/// Stream mode (seeds 001 and 002): one COMMAND for the server's life, started when the first
/// central subscribes. Its stdout is notified to every subscriber in pieces of at most --chunk
/// bytes, with flow control: stdout is read only while the notifier has room. While nobody is
/// subscribed the output is read and discarded, as from a live feed. When the run ends (the
/// output has ended and COMMAND has exited), --eom notifies "EOM"; once everything is sent
/// blserve exits with COMMAND's result. A stop (a signal) ends COMMAND without either: its
/// death by blserve's SIGTERM is not the stream's end.
///
/// A read returns the last value notified (from its offset; past its end: Invalid Offset).
final class StreamMode: ServeMode {
    unowned let server: Server
    private var process: Subprocess?
    /// COMMAND while it is being started (on a thread of its own).
    private var starting: HandlerStart?
    private var stdoutWatch: WatchToken?
    /// COMMAND has ended while something it started still holds its stdout.
    private var graceTimer: TimerToken?
    private var started = false
    private var finishing = false
    private(set) var lastValue: [UInt8] = []
    private var bytesOut = 0
    private var startTime = 0.0

    init(server: Server) {
        self.server = server
        server.notifier.onDrain = { [unowned self] in self.updateWatch() }
        server.notifier.onSent = { [unowned self] value in self.lastValue = value }
    }

    private var loop: EventLoop { server.loop }
    private var subscribed: Bool { server.notifyCharacteristic.notifying }

    func write(_ value: [UInt8], _ options: GattRequestOptions, _ call: IncomingCall) {
        call.fail(GattError.notSupported("Stream mode takes no writes"))
    }

    func read(_ options: GattRequestOptions, _ call: IncomingCall) {
        if options.offset > lastValue.count {
            call.fail(GattError.invalidOffset())
            return
        }
        call.reply(.bytes(Array(lastValue[options.offset...])))
    }

    func connectionChanged(device: String, connected: Bool) {}

    func notifyingChanged(_ on: Bool) {
        // While blserve stops, bluetoothd may still subscribe a central (the application is
        // exported until it is unregistered): a COMMAND started then would outlive blserve.
        if on && !started && !server.stopping { start() }
        updateWatch()
    }

    func centralsLost() {
        updateWatch()
    }

    func shutdown() {
        finishing = true
        starting?.cancel()
        starting = nil
        if let w = stdoutWatch { loop.remove(w) }
        stdoutWatch = nil
        if let graceTimer { loop.cancel(graceTimer) }
        graceTimer = nil
        // COMMAND was reaped, but what it started still holds its stdout: the server's
        // terminateAll no longer sees that group.
        process?.killLeftovers()
    }

    private func start() {
        started = true
        startTime = MonotonicClock.seconds()
        let starting: HandlerStart
        do {
            starting = try server.handler.start(server.children, environment: server.environment(device: nil),
                                                stdin: .null, stdout: .pipe, stderr: .inherit)
        } catch {
            cannotRun(error)
            return
        }
        self.starting = starting
        starting.onStarted = { [weak self] result in
            guard let self else {
                if case .success(let child) = result { child.discard() }
                return
            }
            self.starting = nil
            switch result {
            case .success(let child):
                process = child
                server.debug("started \(server.handler.name) (pid \(child.pid))")
                child.onExit = { [unowned self] _ in self.exited() }
                updateWatch()
            case .failure(let error):
                cannotRun(error)
            }
        }
    }

    private func cannotRun(_ error: Errno) {
        server.shutdown(ToolError(.unavailable, "cannot run \(server.handler.name): \(error)"))
    }

    private func updateWatch() {
        guard let process, process.stdoutFD >= 0, !server.stopping else { return }
        let want = !subscribed || server.notifier.pendingBytes < server.notifier.lowWater
        if want, stdoutWatch == nil {
            stdoutWatch = loop.watch(fd: process.stdoutFD, events: .readable) { [unowned self] _ in self.drain() }
        } else if !want, let w = stdoutWatch {
            loop.remove(w)
            stdoutWatch = nil
        }
    }

    /// Reads what stdout has (one buffer); false once nothing more can be read now.
    @discardableResult
    private func drain() -> Bool {
        guard let process, process.stdoutFD >= 0 else { return false }
        let buffer = server.buffer.bytes
        let n: Int
        do {
            n = try FileIO.read(process.stdoutFD, into: buffer)
        } catch {
            if error == .again { return false }
            n = 0
        }
        if n == 0 {
            // Ended within the exit grace: what it left in its group ends too (while the pipe
            // is open the group id is safe).
            process.killLeftovers()
            closeStdout()
            checkEnded()
            return false
        }
        if subscribed {
            bytesOut += n
            server.notifier.enqueue(Array(UnsafeRawBufferPointer(rebasing: buffer[0..<n])),
                                    joinKey: ObjectIdentifier(self))
        }
        updateWatch()
        return true
    }

    /// COMMAND was reaped. The stream ends with it, as a run does in the other modes: what it
    /// left running in its process group is killed now, or, while something still holds its
    /// stdout, after a grace of a second (what was written until then is still notified).
    private func exited() {
        // Ended by the stop itself (terminateAll): nothing more is notified.
        if server.stopping { return }
        // What the pipe holds (at most its size, and what the leftover adds while it is read,
        // within reason) is still notified.
        graceTimer = process?.endGroupOnExit(loop: loop, drain: { [weak self] in
            for _ in 0..<64 where self?.drain() == true {}
        }, close: { [weak self] in
            guard let self else { return }
            self.graceTimer = nil
            self.closeStdout()
            self.checkEnded()
        })
        checkEnded()
    }

    private func closeStdout() {
        if let w = stdoutWatch { loop.remove(w) }
        stdoutWatch = nil
        process?.closeStdout()
    }

    private func checkEnded() {
        guard !finishing, let process, let status = process.status, process.stdoutFD < 0 else { return }
        finishing = true
        if server.config.eom { server.notifier.enqueue(Array("EOM".utf8), chunk: 3) }
        let ms = Int(((MonotonicClock.seconds() - startTime) * 1000).rounded())
        server.debug("\(server.handler.name) ended: \(status), \(bytesOut) bytes notified, \(ms) ms")
        if !status.succeeded { server.exitError = ToolError(.failure, "\(server.handler.name) ended with \(status)") }
        server.notifier.flush { [unowned self] in self.server.shutdown() }
    }
}
