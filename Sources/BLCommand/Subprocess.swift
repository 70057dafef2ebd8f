#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// How a child process ended.
public enum ProcessStatus: Equatable, Sendable, CustomStringConvertible {
    /// It called exit with this status.
    case exited(Int32)
    /// A signal ended it.
    case signaled(Int32)

    /// True for `exited(0)`.
    public var succeeded: Bool { self == .exited(0) }

    /// Decodes a `waitpid` status word (`WIFEXITED`/`WEXITSTATUS`, `WIFSIGNALED`/`WTERMSIG`; the
    /// macros are not visible to Swift, so the bit layout of Linux's `<bits/waitstatus.h>` is used).
    public init(waitStatus status: Int32) {
        let signal = status & 0x7F
        if signal == 0 {
            self = .exited((status >> 8) & 0xFF)
        } else {
            self = .signaled(signal)
        }
    }

    /// "exit status 3", "killed by signal 9 (SIGKILL)".
    public var description: String {
        switch self {
        case .exited(let code): return "exit status \(code)"
        case .signaled(let signal): return "killed by signal \(signal)" + (Self.signalName(signal).map { " (\($0))" } ?? "")
        }
    }

    /// The conventional name of a common signal ("SIGTERM"), or nil.
    public static func signalName(_ signal: Int32) -> String? {
        switch signal {
        case SIGHUP: return "SIGHUP"
        case SIGINT: return "SIGINT"
        case SIGQUIT: return "SIGQUIT"
        case SIGILL: return "SIGILL"
        case SIGTRAP: return "SIGTRAP"
        case SIGABRT: return "SIGABRT"
        case SIGBUS: return "SIGBUS"
        case SIGFPE: return "SIGFPE"
        case SIGKILL: return "SIGKILL"
        case SIGUSR1: return "SIGUSR1"
        case SIGSEGV: return "SIGSEGV"
        case SIGUSR2: return "SIGUSR2"
        case SIGPIPE: return "SIGPIPE"
        case SIGALRM: return "SIGALRM"
        case SIGTERM: return "SIGTERM"
        case SIGXCPU: return "SIGXCPU"
        case SIGXFSZ: return "SIGXFSZ"
        default: return nil
        }
    }
}

/// The child processes started on one ``EventLoop``: spawns them and reaps them.
///
/// Reaping follows SIGCHLD through the loop's `signalfd` (``EventLoop/onSignal(_:_:)``): on each
/// SIGCHLD every tracked child is checked with `waitpid(pid, WNOHANG)`, never `waitpid(-1)`, so
/// children started elsewhere in the process are left alone. A SIGCHLD can be consumed by another
/// thread that does not block it (a test runner's threads, for one); a backstop timer therefore
/// checks the tracked children every ``backstopInterval`` seconds while any is running.
///
/// ``spawn(_:executable:environment:stdin:stdout:stderr:)`` returns once the child has started
/// its program; ``start(_:executable:environment:stdin:stdout:stderr:)`` returns at once and
/// starts it on a thread of its own, for a loop that must not stop while a program is loaded.
///
/// Create it before the first spawn; it blocks SIGCHLD in the calling thread for its lifetime.
/// Not `Sendable`: use it on the loop's thread.
public final class ChildProcesses {
    public let loop: EventLoop
    private var signalToken: SignalToken?
    private var backstop: TimerToken?
    private var children: [Subprocess] = []
    /// Children being started on other threads, by tag, and the pipe those threads report on.
    private var starting: [UInt64: StartingProcess] = [:]
    private var nextTag: UInt64 = 1
    private var resultPipe: (read: Int32, write: Int32)?
    private var resultWatch: WatchToken?

    /// How often tracked children are checked without a SIGCHLD (seconds).
    public static let backstopInterval = 0.25

    /// Also ignores SIGPIPE for the process (``Signals/ignoreSIGPIPE()``): writing to a child's
    /// stdin after it exited must fail with EPIPE, not kill this process. Children get SIGPIPE
    /// back at its default.
    ///
    /// - Throws: the `Errno` of `pthread_sigmask`/`signalfd` if SIGCHLD cannot be handled.
    public init(loop: EventLoop) throws(Errno) {
        self.loop = loop
        Signals.ignoreSIGPIPE()
        // Started with SIGCHLD ignored, the kernel would reap children itself and their exit
        // statuses would be lost (waitpid: ECHILD).
        if Signals.ignoredAtStart(SIGCHLD) { _ = signal(SIGCHLD, SIG_DFL) }
        signalToken = try loop.onSignal(SIGCHLD) { [weak self] _ in self?.reap() }
    }

    deinit {
        // Threads still starting children use their plans: wait for them (milliseconds, as a
        // rule). One that has not reported after `deinitWait` seconds keeps its plan and the
        // pipe, both left allocated for it: better a leak than a thread writing to freed memory
        // or to a descriptor number that means something else by then.
        let deadline = MonotonicClock.seconds() + Self.deinitWait
        while !starting.isEmpty, let resultPipe, MonotonicClock.seconds() < deadline {
            var pfd = pollfd(fd: resultPipe.read, events: Int16(POLLIN), revents: 0)
            _ = poll(&pfd, 1, 100)
            for child in collectStarted() {
                // Nobody is left to wait for it.
                child.signalGroup(SIGKILL)
                var status: Int32 = 0
                _ = waitpid(child.pid, &status, 0)
            }
        }
        let abandoned = !starting.isEmpty
        for process in starting.values {
            if let plan = process.plan { _ = Unmanaged.passRetained(plan) }
        }
        if let signalToken { loop.removeSignalHandler(signalToken) }
        if let backstop { loop.cancel(backstop) }
        if let resultWatch { loop.remove(resultWatch) }
        if let resultPipe, !abandoned {
            FileIO.close(resultPipe.read)
            FileIO.close(resultPipe.write)
        }
    }

    /// How long `deinit` waits for children still being started.
    static let deinitWait = 5.0

    /// Starts children on threads (``start(_:executable:environment:stdin:stdout:stderr:)``);
    /// false starts them in place, as when no thread can be created (for tests).
    var startsOnThreads = true

    /// For tests: the spawning threads' reports reach the loop this many seconds late, as those
    /// of a slow start would.
    var reportDelay = 0.0

    /// Children started and not yet reaped.
    public var running: [Subprocess] { children }

    /// No child is running, and none is being started on another thread (such a child is not
    /// in ``running`` until its thread has reported).
    public var isIdle: Bool { children.isEmpty && starting.isEmpty }

    /// Starts `argv[0]` (looked up in `PATH` when it has no slash) with `argv` as its arguments,
    /// directly: no shell is involved, so no argument is ever interpreted.
    ///
    /// The child gets its own process group (its pid), the signal mask and dispositions the
    /// process had before any loop blocked signals (``Signals/prepareSpawnAttributes(_:)``), the
    /// current environment with `environment` added (a key given there replaces the inherited
    /// one), and the working directory of this process. No descriptor but 0, 1 and 2 is passed
    /// on: the child closes all others before it execs, also those this process inherited
    /// without close-on-exec (where the C library cannot, they are all made close-on-exec).
    ///
    /// - Parameters:
    ///   - stdin, stdout, stderr: ``Subprocess/Stream/pipe`` gives this process a non-blocking,
    ///     close-on-exec end (``Subprocess/stdinFD``…), ``Subprocess/Stream/null`` connects
    ///     `/dev/null`, ``Subprocess/Stream/inherit`` passes this process's descriptor.
    ///   - executable: the file to run, already looked up (``Subprocess/findExecutable(_:)``);
    ///     `argv[0]` is still what the program sees as its name. nil searches `PATH` for
    ///     `argv[0]` at every call, which costs a failed `exec` per directory before the right one.
    /// - Throws: the `Errno` of `pipe` or `posix_spawn(p)`; glibc reports a failed `exec` (ENOENT,
    ///   EACCES…) from `posix_spawn(p)` itself.
    ///
    /// The corresponding C function is `posix_spawnp(3)` (`posix_spawn(3)` with `executable`)
    /// with `POSIX_SPAWN_SETPGROUP`.
    public func spawn(
        _ argv: [String], executable: String? = nil, environment: [(String, String)] = [],
        stdin: Subprocess.Stream = .pipe, stdout: Subprocess.Stream = .pipe, stderr: Subprocess.Stream = .inherit
    ) throws(Errno) -> Subprocess {
        let plan = try SpawnPlan(argv, executable: executable, environment: environment, streams: [stdin, stdout, stderr])
        return try adopt(plan, error: plan.spawnHere())
    }

    /// Starts a child as ``spawn(_:executable:environment:stdin:stdout:stderr:)`` does, but on a
    /// thread of its own, and returns at once: glibc's `posix_spawn` keeps the thread that calls it
    /// waiting until the child has loaded its program, which is most of the cost of starting one
    /// (and much more than that on an emulated CPU). The result comes to the loop:
    /// ``StartingProcess/onStarted`` is called with the tracked ``Subprocess`` or the error
    /// `spawn` would have thrown. When no thread can be created, the child is started here.
    ///
    /// Every descriptor the process creates must be close-on-exec from the start (`O_CLOEXEC`,
    /// `SOCK_CLOEXEC`, ``FileIO/pipe()``): a child started meanwhile would inherit it otherwise.
    ///
    /// - Throws: the `Errno` of `pipe`, or of preparing the attributes.
    public func start(
        _ argv: [String], executable: String? = nil, environment: [(String, String)] = [],
        stdin: Subprocess.Stream = .pipe, stdout: Subprocess.Stream = .pipe, stderr: Subprocess.Stream = .inherit
    ) throws(Errno) -> StartingProcess {
        let plan = try SpawnPlan(argv, executable: executable, environment: environment, streams: [stdin, stdout, stderr])
        let process = StartingProcess(plan: plan)
        let tag = nextTag
        nextTag &+= 1
        var rc = ENOMEM
        if startsOnThreads, let fd = try? resultWriteEnd() {
            rc = plan.spawnOnThread(resultFD: fd, tag: tag)
        }
        if rc == 0 {
            starting[tag] = process
        } else {
            // No thread: started here. It is adopted (tracked, so reaped) only on the turn that
            // tells the caller, as a thread's report is: never reaped before onStarted has run.
            let error = plan.spawnHere()
            loop.callSoon { [weak self] in
                guard let self else {
                    if error == 0 { _ = kill(-plan.pid, SIGKILL) }
                    return
                }
                process.resolve(Result { () throws(Errno) in try self.adopt(plan, error: error) })
                self.reap()
            }
        }
        return process
    }

    /// The write end of the pipe the spawning threads report on, made (and its read end watched)
    /// on first use. The write end blocks: a thread waits rather than lose its report.
    private func resultWriteEnd() throws(Errno) -> Int32 {
        if let resultPipe { return resultPipe.write }
        let (read, write) = try FileIO.pipe()
        do {
            try FileIO.setNonBlocking(read)
        } catch {
            FileIO.close(read)
            FileIO.close(write)
            throw error
        }
        resultPipe = (read, write)
        resultWatch = loop.watch(fd: read, events: .readable) { [weak self] _ in
            guard let self else { return }
            if self.reportDelay > 0, let watch = self.resultWatch {
                self.loop.setEvents(watch, [])
                _ = self.loop.schedule(after: self.reportDelay) { [weak self] in
                    guard let self, let watch = self.resultWatch else { return }
                    self.loop.setEvents(watch, .readable)
                    self.collectStarted()
                    self.reap()
                }
                return
            }
            self.collectStarted()
            // A child that ended before it was adopted had its SIGCHLD read already.
            self.reap()
        }
        return write
    }

    /// Reads the reports of the spawning threads that are in and resolves their processes.
    /// Returns the children adopted (cancelled ones already killed).
    @discardableResult
    private func collectStarted() -> [Subprocess] {
        guard let resultPipe else { return [] }
        var adopted: [Subprocess] = []
        var record = cl_spawn_result()
        let size = MemoryLayout<cl_spawn_result>.size
        // Each report is written whole (shorter than PIPE_BUF), so reads of its size stay aligned.
        while read(resultPipe.read, &record, size) == size {
            guard let process = starting.removeValue(forKey: record.tag), let plan = process.plan else { continue }
            let result = Result { () throws(Errno) in try adopt(plan, error: record.error, pid: record.pid) }
            if case .success(let child) = result { adopted.append(child) }
            process.resolve(result)
        }
        return adopted
    }

    /// Closes the child's ends of the pipes and, when the spawn succeeded, tracks the child.
    private func adopt(_ plan: SpawnPlan, error: Int32, pid: pid_t? = nil) throws(Errno) -> Subprocess {
        plan.closeChildEnds()
        if error != 0 {
            plan.closeParentEnds()
            throw Errno(error)
        }
        let ends = plan.takeParentEnds()
        let child = Subprocess(pid: pid ?? plan.pid, stdinFD: ends[0], stdoutFD: ends[1], stderrFD: ends[2])
        children.append(child)
        if backstop == nil {
            backstop = loop.schedule(after: Self.backstopInterval, repeating: Self.backstopInterval) { [weak self] in
                self?.reap()
            }
        }
        return child
    }

    /// `environ` with `additions` applied, as malloc'd C strings plus a terminating nil. Keys are
    /// compared as bytes (blserve builds this for every request; String comparison of each
    /// inherited entry cost more than the rest of the spawn).
    static func environmentBlock(adding additions: [(String, String)]) -> [UnsafeMutablePointer<CChar>?] {
        let keys = additions.map { Array($0.0.utf8) }
        var block: [UnsafeMutablePointer<CChar>?] = []
        var index = 0
        while let entry = environ[index] {
            index += 1
            let keyLength = strcspn(entry, "=")
            let replaced = keys.contains { key in
                key.count == keyLength && key.withUnsafeBytes { keyLength == 0 || memcmp($0.baseAddress!, entry, keyLength) == 0 }
            }
            if !replaced { block.append(strdup(entry)) }
        }
        for (key, value) in additions { block.append(strdup(key + "=" + value)) }
        block.append(nil)
        return block
    }

    /// Checks every tracked child and reports those that ended. Called on SIGCHLD and by the
    /// backstop timer; safe to call at any time.
    public func reap() {
        var i = 0
        while i < children.count {
            let child = children[i]
            var status: Int32 = 0
            let rc = waitpid(child.pid, &status, WNOHANG)
            if rc == child.pid {
                children.remove(at: i)
                child.ended(ProcessStatus(waitStatus: status))
                continue
            }
            if rc < 0 && errno == ECHILD {
                // Reaped by someone else (a waitpid(-1) elsewhere): the status is lost.
                children.remove(at: i)
                child.ended(.exited(255))
                continue
            }
            i += 1
        }
        if children.isEmpty, let backstop {
            loop.cancel(backstop)
            self.backstop = nil
        }
    }

    /// Sends `signal` to the process group of every running child, waits up to `grace` seconds
    /// (the loop keeps running) for the groups to end, then sends SIGKILL to the groups left and
    /// reaps. A group outlives its child when something the child started stays in it (and
    /// ignores `signal`): it gets the SIGKILL too. Children still being started are cancelled
    /// (killed as soon as they are). Returns when all are reaped or after `grace` + 2 s.
    public func terminateAll(signal: Int32 = SIGTERM, grace: Double = 2) {
        for process in starting.values { process.cancel() }
        if children.isEmpty && starting.isEmpty { return }
        // The children's group ids: Linux keeps such an id from being reused while a member of
        // the group lives, and hands out ids in turn, so within these seconds it names only the
        // group (or nothing).
        let groups = children.map(\.pid)
        for child in children { child.signalGroup(signal) }
        let groupsLeft = { groups.contains { kill(-$0, 0) == 0 } }
        let reaped = { [unowned self] in self.children.isEmpty && self.starting.isEmpty }
        // Nothing wakes the loop when a member that is not our child ends: look every 20 ms.
        let tick = loop.schedule(after: 0.02, repeating: 0.02) {}
        defer { loop.cancel(tick) }
        if loop.run(until: { reaped() && !groupsLeft() }, timeout: grace) { return }
        for child in children { child.signalGroup(SIGKILL) }
        for group in groups { _ = kill(-group, SIGKILL) }
        _ = loop.run(until: reaped, timeout: 2)
    }

    /// Sends SIGKILL to the process group of every running child at once, without reaping them
    /// (for a process about to exit). Children still being started are killed as soon as they
    /// are, for up to `startTimeout` seconds.
    public func killAll(startTimeout: Double = 1) {
        for process in starting.values { process.cancel() }
        for child in children { child.signalGroup(SIGKILL) }
        if !starting.isEmpty { _ = loop.run(until: { [unowned self] in self.starting.isEmpty }, timeout: startTimeout) }
    }
}

/// Everything `posix_spawn` needs for one child, in memory of its own that stays put until the
/// child has been started (on this thread or another), and the pipes made for it.
final class SpawnPlan {
    private let path: UnsafeMutablePointer<CChar>
    private let searchPath: Bool
    private let actions: UnsafeMutablePointer<posix_spawn_file_actions_t>
    private let attributes: UnsafeMutablePointer<posix_spawnattr_t>
    private let cArgs: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>
    private let argCount: Int
    private let cEnv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>
    private let envCount: Int
    private var parentEnds: [Int32] = [-1, -1, -1]
    private var childEnds: [Int32] = []
    private(set) var pid: pid_t = 0

    init(_ argv: [String], executable: String?, environment: [(String, String)], streams: [Subprocess.Stream]) throws(Errno) {
        precondition(!argv.isEmpty, "spawn needs a program")
        path = strdup(executable ?? argv[0])
        searchPath = executable == nil
        actions = .allocate(capacity: 1)
        posix_spawn_file_actions_init(actions)
        attributes = .allocate(capacity: 1)
        posix_spawnattr_init(attributes)
        argCount = argv.count + 1
        cArgs = .allocate(capacity: argCount)
        for (i, arg) in argv.enumerated() { (cArgs + i).initialize(to: strdup(arg)) }
        (cArgs + argv.count).initialize(to: nil)
        let env = ChildProcesses.environmentBlock(adding: environment)
        envCount = env.count
        cEnv = .allocate(capacity: envCount)
        cEnv.initialize(from: env, count: envCount)

        for target in 0..<3 {
            switch streams[target] {
            case .inherit:
                break
            case .null:
                posix_spawn_file_actions_addopen(actions, Int32(target), "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            case .pipe:
                // Close-on-exec from the start: another thread may be starting a child meanwhile.
                let (readEnd, writeEnd) = try FileIO.pipe()
                let (childEnd, parentEnd) = target == 0 ? (readEnd, writeEnd) : (writeEnd, readEnd)
                childEnds.append(childEnd)
                parentEnds[target] = parentEnd
                try FileIO.setNonBlocking(parentEnd)
                // dup2 onto 0/1/2 clears close-on-exec for the child's copy only.
                posix_spawn_file_actions_adddup2(actions, childEnd, Int32(target))
            }
        }
        // Nothing but 0, 1 and 2 reaches the child, also no descriptor this process inherited
        // without close-on-exec (a service manager's, a shell's): a handler that parses what a
        // remote central sent gets no way to the bus or anything else blserve holds. Where the
        // C library cannot close them in the child (ENOSYS), every descriptor above 2 of this
        // process is made close-on-exec instead (all it opens itself already is).
        var closing = cl_spawn_close_from(actions, 3)
        if closing == ENOSYS { closing = cl_cloexec_from(3, true) == 0 ? 0 : errno }
        if closing != 0 { throw Errno(closing) }

        var rc = posix_spawnattr_setpgroup(attributes, 0)
        if rc == 0 {
            do {
                try Signals.prepareSpawnAttributes(&attributes.pointee)
            } catch {
                rc = error.rawValue
            }
        }
        if rc == 0 {
            var flags: Int16 = 0
            rc = posix_spawnattr_getflags(attributes, &flags)
            if rc == 0 { rc = posix_spawnattr_setflags(attributes, flags | Int16(POSIX_SPAWN_SETPGROUP)) }
        }
        if rc != 0 { throw Errno(rc) }
    }

    deinit {
        closeChildEnds()
        closeParentEnds()
        posix_spawn_file_actions_destroy(actions)
        actions.deallocate()
        posix_spawnattr_destroy(attributes)
        attributes.deallocate()
        for i in 0..<argCount { free(cArgs[i]) }
        cArgs.deallocate()
        for i in 0..<envCount { free(cEnv[i]) }
        cEnv.deallocate()
        free(path)
    }

    /// Starts the child on this thread; returns 0 or posix_spawn's error.
    func spawnHere() -> Int32 {
        searchPath
            ? posix_spawnp(&pid, path, actions, attributes, cArgs, cEnv)
            : posix_spawn(&pid, path, actions, attributes, cArgs, cEnv)
    }

    /// Starts the child on a new thread, which reports on `resultFD`; returns 0 or the error of
    /// creating the thread. The plan must live until the report has been read.
    func spawnOnThread(resultFD: Int32, tag: UInt64) -> Int32 {
        cl_spawn_on_thread(path, searchPath ? 1 : 0, actions, attributes, cArgs, cEnv, resultFD, tag)
    }

    func closeChildEnds() {
        for fd in childEnds { FileIO.close(fd) }
        childEnds.removeAll()
    }

    func closeParentEnds() {
        for fd in parentEnds where fd >= 0 { FileIO.close(fd) }
        parentEnds = [-1, -1, -1]
    }

    /// The parent's ends (-1 where there is no pipe), now the caller's to close.
    func takeParentEnds() -> [Int32] {
        defer { parentEnds = [-1, -1, -1] }
        return parentEnds
    }
}

/// A child being started on a thread of its own (``ChildProcesses/start(_:executable:environment:stdin:stdout:stderr:)``).
public final class StartingProcess {
    /// The started child (tracked by its ``ChildProcesses``, as a spawned one) or the error, once
    /// known.
    public private(set) var result: Result<Subprocess, Errno>?
    /// Called once on the loop with ``result`` when it becomes known, unless cancelled before.
    /// Replacing it hands the process over to someone else.
    public var onStarted: ((Result<Subprocess, Errno>) -> Void)?
    /// Set by ``cancel()``.
    public private(set) var isCancelled = false
    /// Held until the spawning thread has reported.
    private(set) var plan: SpawnPlan?

    init(plan: SpawnPlan) {
        self.plan = plan
    }

    /// The child once started, or nil.
    public var process: Subprocess? {
        if case .success(let child)? = result { return child }
        return nil
    }

    /// Ends the child without a word to anyone: its process group gets SIGKILL and its pipes are
    /// closed, now if it has started, otherwise as soon as it has. ``onStarted`` is not called.
    /// It is still reaped by its ``ChildProcesses``.
    public func cancel() {
        if isCancelled { return }
        isCancelled = true
        onStarted = nil
        process?.discard()
    }

    func resolve(_ result: Result<Subprocess, Errno>) {
        plan = nil
        self.result = result
        if isCancelled {
            process?.discard()
            return
        }
        let callback = onStarted
        onStarted = nil
        callback?(result)
    }
}

/// One child process started by ``ChildProcesses/spawn(_:executable:environment:stdin:stdout:stderr:)``.
///
/// The descriptors are the parent's ends of the pipes (non-blocking, close-on-exec), or -1.
/// Watch them on the loop yourself; close them with ``closeStdin()``/``closeStdout()``/
/// ``closeStderr()`` (remove your watches first). Whatever is still open is closed in `deinit`.
public final class Subprocess {
    public enum Stream: Sendable { case pipe, null, inherit }

    public let pid: pid_t
    /// The write end of the child's standard input, or -1.
    public private(set) var stdinFD: Int32
    /// The read end of the child's standard output, or -1.
    public private(set) var stdoutFD: Int32
    /// The read end of the child's standard error, or -1.
    public private(set) var stderrFD: Int32
    /// How it ended, once reaped.
    public private(set) var status: ProcessStatus?
    /// Called once on the loop when the child has been reaped.
    public var onExit: ((ProcessStatus) -> Void)?

    init(pid: pid_t, stdinFD: Int32, stdoutFD: Int32, stderrFD: Int32) {
        self.pid = pid
        self.stdinFD = stdinFD
        self.stdoutFD = stdoutFD
        self.stderrFD = stderrFD
    }

    deinit {
        closeStdin()
        closeStdout()
        closeStderr()
    }

    /// True until the child has been reaped.
    public var isRunning: Bool { status == nil }

    public func closeStdin() {
        if stdinFD >= 0 { FileIO.close(stdinFD) }
        stdinFD = -1
    }

    public func closeStdout() {
        if stdoutFD >= 0 { FileIO.close(stdoutFD) }
        stdoutFD = -1
    }

    public func closeStderr() {
        if stderrFD >= 0 { FileIO.close(stderrFD) }
        stderrFD = -1
    }

    /// Sends `signal` to the child only.
    ///
    /// The corresponding C function is `kill(2)`.
    public func signal(_ signal: Int32) {
        if status == nil { _ = kill(pid, signal) }
    }

    /// Sends `signal` to the child's whole process group (the child and whatever it started
    /// that stayed in its group). Once the child has been reaped this is done only while its
    /// standard output pipe is still open: then something of the group may still hold it, and
    /// the group id cannot have been reused while a member lives; otherwise it does nothing.
    ///
    /// The corresponding C function is `kill(2)` with `-pgid`.
    public func signalGroup(_ signal: Int32) {
        if status != nil && stdoutFD < 0 { return }
        _ = kill(-pid, signal)
    }

    /// Gives the child up: ``onExit`` is dropped, its process group gets SIGKILL (see
    /// ``signalGroup(_:)``) and its pipes are closed. Its ``ChildProcesses`` still reaps it.
    public func discard() {
        onExit = nil
        signalGroup(SIGKILL)
        closeStdin()
        closeStdout()
        closeStderr()
    }

    /// Once the child has been reaped: sends SIGKILL to what it left running in its process
    /// group (while its standard output is open, see ``signalGroup(_:)``). Before, nothing: the
    /// child itself is ended by whoever waits for it.
    public func killLeftovers() {
        if status != nil { signalGroup(SIGKILL) }
    }

    /// Sends SIGKILL to what is left of the child's process group. Only for `onExit`, which
    /// runs right after the child was reaped: Linux hands out process ids in turn, so its id
    /// cannot have been reused as another group's yet.
    ///
    /// The corresponding C function is `kill(2)` with `-pgid`.
    public func killGroupJustReaped() {
        _ = kill(-pid, SIGKILL)
    }

    /// How long a child's standard output may stay open after the child was reaped.
    public static let exitGrace = 1.0

    /// For ``onExit``: a run ends with its child. What the child left running in its process
    /// group is killed now when its standard output is closed. While something it started
    /// still holds the output (`cmd &` in a shell), the run's output goes on for ``exitGrace``
    /// seconds; then `drain` takes what the pipe holds and, if it is still open, the group gets
    /// SIGKILL and `close` must close the output (``closeStdout()``, and the caller's watch) and
    /// end the run. Returns the timer of that grace, for the caller to cancel should the run end
    /// otherwise first.
    public func endGroupOnExit(loop: EventLoop, drain: @escaping () -> Void, close: @escaping () -> Void) -> TimerToken? {
        guard stdoutFD >= 0 else {
            killGroupJustReaped()
            return nil
        }
        return loop.schedule(after: Self.exitGrace) { [weak self] in
            guard let self, self.stdoutFD >= 0 else { return }
            drain()
            guard self.stdoutFD >= 0 else { return }  // it ended meanwhile
            // The pipe is still open: the group id cannot have been reused.
            self.signalGroup(SIGKILL)
            close()
        }
    }

    func ended(_ status: ProcessStatus) {
        self.status = status
        let callback = onExit
        onExit = nil
        callback?(status)
    }
}

extension Subprocess {
    /// Looks `program` up the way `posix_spawnp` will: a name with a slash is taken as it is,
    /// otherwise each directory of `PATH` (default "/usr/local/bin:/usr/bin:/bin") is tried.
    /// Returns the path of an executable regular file, or nil.
    public static func findExecutable(_ program: String) -> String? {
        candidates(for: program).first { path in
            var st = stat()
            guard stat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return false }
            return access(path, X_OK) == 0
        }
    }

    /// Why ``findExecutable(_:)`` found nothing for `program`, as a shell would say it:
    /// "command not found" (or "no such file" for a path), or "permission denied" / "is a
    /// directory" for a file that is there.
    public static func whyNotFound(_ program: String) -> String {
        let named = program.contains("/")
        for path in candidates(for: program) {
            var st = stat()
            guard stat(path, &st) == 0 else { continue }
            if (st.st_mode & S_IFMT) == S_IFDIR {
                if named { return "is a directory" }
                continue
            }
            return "permission denied"
        }
        return named ? "no such file" : "command not found"
    }

    /// The files `program` may be: itself when it has a slash, else that name in each
    /// directory of `PATH` in order (an empty entry is the current directory).
    private static func candidates(for program: String) -> [String] {
        if program.isEmpty { return [] }
        if program.contains("/") { return [program] }
        let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/local/bin:/usr/bin:/bin"
        return path.split(separator: ":", omittingEmptySubsequences: false).map { dir in
            (dir.isEmpty ? "." : String(dir)) + "/" + program
        }
    }
}
