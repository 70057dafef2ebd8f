#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux
import Synchronization

/// One signal as read from the loop's `signalfd` (a subset of `struct signalfd_siginfo`).
public struct SignalInfo: Equatable, Sendable {
    /// The signal number, e.g. `SIGINT`.
    public var signal: Int32
    /// `si_code`: `SI_USER` for kill(2), `SI_TKILL` for raise(3), `CLD_EXITED`… for SIGCHLD.
    public var code: Int32
    /// The sending process (for SIGCHLD: the child; several children can be coalesced into one).
    public var senderPID: Int32
    /// The real user ID of the sender.
    public var senderUID: UInt32
    /// For SIGCHLD: the exit status or signal.
    public var status: Int32

    public init(signal: Int32, code: Int32 = 0, senderPID: Int32 = 0, senderUID: UInt32 = 0, status: Int32 = 0) {
        self.signal = signal
        self.code = code
        self.senderPID = senderPID
        self.senderUID = senderUID
        self.status = status
    }
}

/// Process-wide signal state shared by event loops and by the code that spawns child processes.
///
/// ``EventLoop/onSignal(_:_:)`` **blocks** the signals it handles (`pthread_sigmask`) and reads them
/// from a `signalfd`. Two consequences:
/// * Handle signals from the loop thread **before starting other threads**: a signal sent with
///   kill(2) goes to any thread that does not block it. (The tools run one thread, the loop's;
///   the only others are ``ChildProcesses/start(_:executable:environment:stdin:stdout:stderr:)``'s,
///   which block every signal.)
/// * A blocked mask and ignored dispositions are **inherited across `exec`**. Code that starts
///   child processes must give them the original mask and default dispositions, with
///   ``prepareSpawnAttributes(_:)`` for `posix_spawn`, or with ``originalMask`` after a hand-written
///   `fork()`.
/// * A signal the process **started with ignored** (`nohup`'s SIGHUP; SIGINT and SIGQUIT in a
///   shell's background job) stays ignored, as Unix programs leave it: the tools do not watch it
///   (a blocked signal is queued even while ignored: ``notIgnoredAtStart(_:)``), and files being
///   written do not handle it. Children keep only the terminal's SIGINT and SIGQUIT ignored
///   (``keptIgnoredInChildren``): blserve sends its commands SIGHUP and SIGTERM itself, and
///   SIGPIPE and SIGCHLD ignored would change how any program works. ``ignoredAtStart(_:)``
///   tells; ``Tool/run(_:arguments:_:)`` takes the record before anything changes a disposition.
public enum Signals {
    /// Process-wide, hence behind a mutex (signal masks are per thread, dispositions per process).
    private struct State: Sendable {
        var originalMask: sigset_t?
        var blockCounts: [Int32: Int] = [:]
        var ignoredSIGPIPE = false
        /// Signals 1-31 whose disposition was SIG_IGN at the first look (nil: not taken yet).
        var ignoredAtStart: Set<Int32>?
    }

    private static let state = Mutex(State())

    /// Takes the record of the signals ignored at start, once; what the process ignores or
    /// blocks later does not count. Called by everything here that changes signal state.
    public static func recordInheritedDispositions() {
        state.withLock { s in record(&s) }
    }

    private static func record(_ s: inout State) {
        if s.ignoredAtStart != nil { return }
        var ignored = Set<Int32>()
        for signo in Int32(1)..<32 where signo != SIGKILL && signo != SIGSTOP && cl_signal_ignored(signo) {
            ignored.insert(signo)
        }
        s.ignoredAtStart = ignored
    }

    /// Whether `signal` was ignored when the process started (see the type's notes).
    public static func ignoredAtStart(_ signal: Int32) -> Bool {
        state.withLock { s in
            record(&s)
            return s.ignoredAtStart!.contains(signal)
        }
    }

    /// The signals that end a tool cleanly (exit 130): SIGINT, SIGTERM and SIGHUP.
    public static let interruptSignals: [Int32] = [SIGINT, SIGTERM, SIGHUP]

    /// Those of `signals` the process did not start with ignored: the ones to watch.
    public static func notIgnoredAtStart(_ signals: [Int32]) -> [Int32] {
        signals.filter { !ignoredAtStart($0) }
    }

    /// Signals a child keeps ignored when the process started with them ignored: those a
    /// terminal sends to a whole job (every other one of ``resetInChildren`` is reset).
    public static let keptIgnoredInChildren: [Int32] = [SIGINT, SIGQUIT]

    /// Signals reset to their default disposition in children by ``prepareSpawnAttributes(_:)``
    /// (except those of ``keptIgnoredInChildren`` the process started with ignored).
    public static let resetInChildren: [Int32] = [
        SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH,
    ]

    /// The signal mask the process had before any event loop blocked a signal (the current mask of
    /// the calling thread if none did). Give it to child processes.
    public static var originalMask: sigset_t {
        state.withLock { s in s.originalMask ?? LoopSyscalls.currentSigmask() }
    }

    /// Ignores SIGPIPE for the whole process, so that writing to a closed pipe or socket fails with
    /// `EPIPE` (reported by ``FileIO/write(_:_:)`` as ``Errno/pipe``) instead of killing the process.
    /// Children spawned with ``prepareSpawnAttributes(_:)`` get SIGPIPE back at its default.
    ///
    /// The corresponding C function is `signal(3)` with `SIG_IGN`.
    public static func ignoreSIGPIPE() {
        state.withLock { s in
            if s.ignoredSIGPIPE { return }
            record(&s)
            _ = signal(SIGPIPE, SIG_IGN)
            s.ignoredSIGPIPE = true
        }
    }

    /// Configures `posix_spawn` attributes so the child starts with the process's original signal
    /// mask (`POSIX_SPAWN_SETSIGMASK`) and the default disposition for ``resetInChildren``
    /// (`POSIX_SPAWN_SETSIGDEF`), undoing what the event loop and ``ignoreSIGPIPE()`` did.
    /// `attributes` must have been initialised with `posix_spawnattr_init`; other flags are kept.
    public static func prepareSpawnAttributes(_ attributes: inout posix_spawnattr_t) throws(Errno) {
        var mask = originalMask
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for s in resetInChildren where !(keptIgnoredInChildren.contains(s) && ignoredAtStart(s)) {
            sigaddset(&defaults, s)
        }
        var flags: Int16 = 0
        var rc = posix_spawnattr_getflags(&attributes, &flags)
        if rc == 0 { rc = posix_spawnattr_setsigmask(&attributes, &mask) }
        if rc == 0 { rc = posix_spawnattr_setsigdefault(&attributes, &defaults) }
        if rc == 0 {
            rc = posix_spawnattr_setflags(&attributes, flags | Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        }
        if rc != 0 { throw Errno(rc) }
    }

    /// Blocks `signal` in the calling thread, counting users so that two loops can share it.
    static func block(_ signal: Int32) throws(Errno) {
        let result: Errno? = state.withLock { s in
            record(&s)
            if s.originalMask == nil { s.originalMask = LoopSyscalls.currentSigmask() }
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, signal)
            var old = sigset_t()
            do throws(Errno) {
                try LoopSyscalls.sigmask(SIG_BLOCK, &set, old: &old)
            } catch {
                return error
            }
            s.blockCounts[signal, default: 0] += 1
            return nil
        }
        if let result { throw result }
    }

    /// Undoes one ``block(_:)``; the last one unblocks the signal unless it was blocked originally.
    /// A pending instance is then delivered with its normal disposition.
    static func unblock(_ signal: Int32) {
        state.withLock { s in
            guard let count = s.blockCounts[signal], count > 0 else { return }
            if count > 1 {
                s.blockCounts[signal] = count - 1
                return
            }
            s.blockCounts[signal] = nil
            if var original = s.originalMask, sigismember(&original, signal) == 1 { return }
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, signal)
            var old = sigset_t()
            try? LoopSyscalls.sigmask(SIG_UNBLOCK, &set, old: &old)
        }
    }
}
