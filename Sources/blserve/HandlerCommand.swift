import BLCommand

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// COMMAND, looked up in `PATH` once and then started by its path, as a shell remembers the
/// commands it has found: searching `PATH` again for every request costs a failed `exec` per
/// directory before the right one (about 20 ms on the VM bench, where each is a 9p round trip).
/// When the remembered file is gone (ENOENT), `PATH` is searched again once.
final class HandlerCommand {
    let argv: [String]
    private let resolve: (String) -> String?
    private var path: String?

    /// `resolve` finds the file for a name (``Subprocess/findExecutable(_:)``; tests replace it).
    init(_ argv: [String], resolve: @escaping (String) -> String? = Subprocess.findExecutable) {
        precondition(!argv.isEmpty, "a command needs a program")
        self.argv = argv
        self.resolve = resolve
        path = resolve(argv[0])
    }

    var name: String { argv[0] }

    /// The file that runs now, if it was found.
    var resolvedPath: String? { path }

    /// Starts it on a thread of its own by the remembered file; when that fails with ENOENT the
    /// file may have gone, and the returned ``HandlerStart`` searches `PATH` again and starts it
    /// once more.
    ///
    /// - Throws: the `Errno` of creating the pipes or the spawn attributes (nothing was started).
    func start(_ children: ChildProcesses, environment: [(String, String)], stdin: Subprocess.Stream,
               stdout: Subprocess.Stream, stderr: Subprocess.Stream) throws(Errno) -> HandlerStart {
        try HandlerStart(self, children, environment: environment, streams: (stdin, stdout, stderr))
    }

    /// One start by the remembered file.
    fileprivate func startOnce(_ children: ChildProcesses, environment: [(String, String)],
                               streams: (Subprocess.Stream, Subprocess.Stream, Subprocess.Stream)) throws(Errno) -> StartingProcess {
        try children.start(argv, executable: path, environment: environment,
                           stdin: streams.0, stdout: streams.1, stderr: streams.2)
    }

    /// Looks the program up again (after a start failed with ENOENT); nil when it is nowhere,
    /// and a start then lets `posix_spawnp` search and say why.
    fileprivate func searchAgain() {
        path = resolve(argv[0])
    }
}

/// COMMAND being started (``HandlerCommand/start(_:environment:stdin:stdout:stderr:)``), like a
/// ``StartingProcess`` but with the second try after ENOENT included: ``onStarted`` hears once,
/// with the process or with why it could not be started.
final class HandlerStart {
    private let command: HandlerCommand
    private let children: ChildProcesses
    private let environment: [(String, String)]
    private let streams: (Subprocess.Stream, Subprocess.Stream, Subprocess.Stream)
    /// The start under way, the second one after a search of PATH.
    private var current: StartingProcess
    private var searchedAgain = false

    /// The started child (tracked by its ``ChildProcesses``) or why it could not be started,
    /// once known.
    private(set) var result: Result<Subprocess, Errno>?
    /// Called once on the loop with ``result`` when it becomes known, unless cancelled before.
    /// Replacing it hands the process over to someone else.
    var onStarted: ((Result<Subprocess, Errno>) -> Void)?

    fileprivate init(_ command: HandlerCommand, _ children: ChildProcesses, environment: [(String, String)],
                     streams: (Subprocess.Stream, Subprocess.Stream, Subprocess.Stream)) throws(Errno) {
        self.command = command
        self.children = children
        self.environment = environment
        self.streams = streams
        current = try command.startOnce(children, environment: environment, streams: streams)
        watch(current)
    }

    /// The child once started, or nil.
    var process: Subprocess? {
        if case .success(let child)? = result { return child }
        return nil
    }

    /// Ends the child without a word to anyone (``StartingProcess/cancel()``); ``onStarted`` is
    /// not called.
    func cancel() {
        onStarted = nil
        current.cancel()
    }

    private func watch(_ starting: StartingProcess) {
        starting.onStarted = { [weak self] outcome in
            guard let self else {
                // Its owner let it go meanwhile: nobody wants the process.
                if case .success(let child) = outcome { child.discard() }
                return
            }
            self.started(outcome)
        }
    }

    private func started(_ outcome: Result<Subprocess, Errno>) {
        if case .failure(let error) = outcome, error == Errno(ENOENT), !searchedAgain {
            searchedAgain = true
            command.searchAgain()
            do {
                current = try command.startOnce(children, environment: environment, streams: streams)
                watch(current)
            } catch {
                finish(.failure(error))
            }
            return
        }
        finish(outcome)
    }

    private func finish(_ outcome: Result<Subprocess, Errno>) {
        result = outcome
        let tell = onStarted
        onStarted = nil
        tell?(outcome)
    }
}
