#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLBlueZ
import BLCommand

/// A read buffer allocated once and shared by everything that reads a pipe on the loop (the
/// loop runs one handler at a time, and each copies out what it keeps).
final class SharedReadBuffer {
    let bytes: UnsafeMutableRawBufferPointer
    init(size: Int = 64 * 1024) {
        bytes = .allocate(byteCount: size, alignment: FileIO.bufferAlignment)
    }
    deinit { bytes.deallocate() }
}

/// One run of COMMAND for one request: the body goes to its stdin, its stdout is collected (up
/// to `outputLimit` bytes), and `timeout` bounds the whole run.
///
/// It finishes once stdout has ended and the process has been reaped (or, after a kill, once it
/// has been reaped). A failed run (spawn error, non-zero exit, a signal, the timeout, too much
/// output) reports a short reason. On the timeout or an overflow the process group is killed.
final class HandlerRun {
    struct Outcome {
        /// nil when the process could not be started.
        var status: ProcessStatus?
        var output: [UInt8]
        /// Why the run failed, or nil when it succeeded (exit status 0, output within the limit).
        var failure: String?
        var duration: Double
    }

    private let children: ChildProcesses
    private let buffer: SharedReadBuffer
    private let command: HandlerCommand
    private let environment: [(String, String)]
    private var input: [UInt8]
    private var inputOffset = 0
    private let outputLimit: Int
    private let timeout: Double
    private var completion: ((Outcome) -> Void)?

    private var process: Subprocess?
    /// The process while it is being started.
    private var starting: HandlerStart?
    private var stdinWatch: WatchToken?
    private var stdoutWatch: WatchToken?
    private var timer: TimerToken?
    private var graceTimer: TimerToken?
    private var output: [UInt8] = []
    private var failure: String?
    private var started = 0.0
    private var loop: EventLoop { children.loop }

    init(command: HandlerCommand, environment: [(String, String)], input: [UInt8], outputLimit: Int, timeout: Double,
         children: ChildProcesses, buffer: SharedReadBuffer, completion: @escaping (Outcome) -> Void) {
        self.command = command
        self.environment = environment
        self.input = input
        self.outputLimit = outputLimit
        self.timeout = timeout
        self.children = children
        self.buffer = buffer
        self.completion = completion
    }

    /// Starts `command` the way a run needs it: pipes for stdin and stdout, stderr inherited, on
    /// a thread of its own so that the loop goes on meanwhile. A process started ahead for a later
    /// run (--prestart) must be started by this too.
    static func startProcess(_ command: HandlerCommand, _ children: ChildProcesses,
                             environment: [(String, String)]) throws(Errno) -> HandlerStart {
        try command.start(children, environment: environment, stdin: .pipe, stdout: .pipe, stderr: .inherit)
    }

    /// Starts the process, or takes `startedAhead` (from ``startProcess(_:_:environment:)``, not
    /// reaped, nothing read from it; it may still be starting). A failure to start is reported
    /// through the completion, on a later turn.
    func start(with startedAhead: HandlerStart? = nil) {
        started = MonotonicClock.seconds()
        timer = loop.schedule(after: timeout) { [weak self] in self?.timedOut() }
        let process: HandlerStart
        if let startedAhead {
            process = startedAhead
        } else {
            do {
                process = try Self.startProcess(command, children, environment: environment)
            } catch {
                failure = "cannot run \(command.name): \(error)"
                loop.callSoon { [self] in self.finish(status: nil) }
                return
            }
        }
        waitFor(process)
    }

    /// Goes on with the run once `process` has started (at once when it has).
    private func waitFor(_ process: HandlerStart) {
        if let result = process.result {
            if let child = process.process, child.isRunning {
                begin(result)
            } else {
                // Reported on a later turn, as a failure to start always is.
                loop.callSoon { [weak self] in self?.begin(result) }
            }
        } else {
            starting = process
            process.onStarted = { [weak self] result in
                self?.starting = nil
                self?.begin(result)
            }
        }
    }

    /// The process has started (or could not be): the request goes to it.
    private func begin(_ result: Result<Subprocess, Errno>) {
        guard completion != nil else {
            // Cancelled or detached meanwhile: the process is not wanted.
            if case .success(let child) = result { child.discard() }
            return
        }
        let child: Subprocess
        switch result {
        case .success(let started):
            child = started
        case .failure(let error):
            failure = "cannot run \(command.name): \(error)"
            finish(status: nil)
            return
        }
        guard child.isRunning, child.stdinFD >= 0, child.stdoutFD >= 0 else {
            // A process handed over that has already ended (or lost its pipes) cannot take the
            // request; the central gets an error reply rather than a lost request.
            child.discard()
            failure = "\(command.name) ended before its request reached it"
            finish(status: nil)
            return
        }
        process = child
        child.onExit = { [weak self] status in self?.exited(status) }
        if input.isEmpty {
            child.closeStdin()
        } else {
            // The pipe is empty: it takes a request of up to 64 KiB at once, without waiting
            // for the loop to say so. The rest, if any, waits for room.
            feed()
            if child.stdinFD >= 0 {
                stdinWatch = loop.watch(fd: child.stdinFD, events: .writable) { [weak self] _ in self?.feed() }
            }
        }
        stdoutWatch = loop.watch(fd: child.stdoutFD, events: .readable) { [weak self] _ in self?.drain() }
    }

    /// Drops the run without calling the completion and leaves the process to whoever ends
    /// the server's children (`ChildProcesses.terminateAll`: SIGTERM first, then SIGKILL).
    func detach() {
        completion = nil
        starting?.cancel()
        starting = nil
        // In its exit grace, COMMAND is reaped already and terminateAll no longer sees it:
        // end what it left behind now.
        process?.killLeftovers()
        cancelTimers()
        if let stdinWatch { loop.remove(stdinWatch) }
        stdinWatch = nil
        if let stdoutWatch { loop.remove(stdoutWatch) }
        stdoutWatch = nil
    }

    /// Kills the process group and drops the run without calling the completion.
    func cancel() {
        completion = nil
        starting?.cancel()
        starting = nil
        cancelTimers()
        process?.signalGroup(SIGKILL)
        closeStdin()
        closeStdout()
    }

    /// The handler timeout (or the wait after SIGKILL) and the exit grace.
    private func cancelTimers() {
        if let timer { loop.cancel(timer) }
        timer = nil
        if let graceTimer { loop.cancel(graceTimer) }
        graceTimer = nil
    }

    private func feed() {
        guard let child = process, child.stdinFD >= 0 else { return }
        do {
            let n = try input.withUnsafeBytes { raw in
                try Result { () throws(Errno) in
                    try FileIO.write(child.stdinFD, UnsafeRawBufferPointer(rebasing: raw[inputOffset...]))
                }.get()
            }
            inputOffset += n
        } catch let error as Errno where error == .again {
            return
        } catch {
            // EPIPE: COMMAND does not read its input (or no longer); that is its business.
            inputOffset = input.count
        }
        if inputOffset >= input.count {
            closeStdin()
            input = []
        }
    }

    private func drain() {
        guard let child = process, child.stdoutFD >= 0 else { return }
        while true {
            let n: Int
            do {
                n = try FileIO.read(child.stdoutFD, into: buffer.bytes)
            } catch {
                if error == .again { return }
                n = 0
            }
            if n == 0 {
                // COMMAND has exited and what it left in its group has let go of stdout too:
                // end those leftovers with the run (while the pipe is open the group id is safe).
                child.killLeftovers()
                closeStdout()
                checkDone()
                return
            }
            if output.count + n > outputLimit {
                failure = "reply over \(outputLimit) bytes"
                output = []
                child.signalGroup(SIGKILL)
                closeStdout()
                checkDone()
                return
            }
            output.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer.bytes[0..<n]))
            if n < buffer.bytes.count { return }
        }
    }

    private func timedOut() {
        timer = nil
        if let starting {
            // Not started in all that time: it is not wanted any more.
            starting.cancel()
            self.starting = nil
            failure = "timed out after \(formatSeconds(timeout)) s"
            finish(status: nil)
            return
        }
        guard let child = process else { return }
        failure = "timed out after \(formatSeconds(timeout)) s"
        child.signalGroup(SIGKILL)
        closeStdin()
        closeStdout()
        output = []
        // A process stuck in the kernel may take a while to die; do not wait for it forever.
        timer = loop.schedule(after: 5) { [weak self] in self?.finish(status: nil) }
        checkDone()
    }

    private func exited(_ status: ProcessStatus) {
        // Whatever it left in the pipe is still read: drain before deciding.
        if process?.stdoutFD ?? -1 >= 0 { drain() }
        // Anything COMMAND left running in its group ends with the run, so no request leaves
        // processes behind (nor escapes --handler-timeout). The reply is what COMMAND wrote,
        // and what it started in the background may hold stdout only for the exit grace.
        graceTimer = process?.endGroupOnExit(loop: loop, drain: { [weak self] in self?.drain() }, close: { [weak self] in
            self?.closeStdout()
            self?.checkDone()
        })
        checkDone()
    }

    private func checkDone() {
        guard let child = process, let status = child.status, child.stdoutFD < 0 else { return }
        finish(status: status)
    }

    private func finish(status: ProcessStatus?) {
        closeStdin()
        closeStdout()
        cancelTimers()
        guard let completion else { return }
        self.completion = nil
        var reason = failure
        if reason == nil, let status, !status.succeeded { reason = status.description }
        if reason == nil, status == nil { reason = "did not end after SIGKILL" }
        completion(Outcome(status: status, output: reason == nil ? output : [], failure: reason,
                           duration: MonotonicClock.seconds() - started))
    }

    private func closeStdin() {
        if let stdinWatch { loop.remove(stdinWatch) }
        stdinWatch = nil
        process?.closeStdin()
    }

    private func closeStdout() {
        if let stdoutWatch { loop.remove(stdoutWatch) }
        stdoutWatch = nil
        process?.closeStdout()
    }
}
