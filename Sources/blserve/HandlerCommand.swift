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

    /// Starts it on a thread of its own (``ChildProcesses/start(_:executable:environment:stdin:stdout:stderr:)``)
    /// by the remembered file. When that fails with ENOENT the file may have gone:
    /// ``startAgain(after:retried:_:)`` searches again and starts it once more.
    func start(_ children: ChildProcesses, environment: [(String, String)], stdin: Subprocess.Stream,
               stdout: Subprocess.Stream, stderr: Subprocess.Stream) throws(Errno) -> StartingProcess {
        try children.start(argv, executable: path, environment: environment, stdin: stdin, stdout: stdout, stderr: stderr)
    }

    /// Looks the program up again (after a start failed with ENOENT); nil when it is nowhere,
    /// and a start then lets `posix_spawnp` search and say why.
    private func searchAgain() {
        path = resolve(argv[0])
    }

    /// After a start failed with `error`: ENOENT may mean the remembered file has gone, so `PATH`
    /// is searched again and `start` called once more; its start is returned. Nil when the failure
    /// stands: another error, a second ENOENT (`retried` is set here), or `start` itself failing.
    func startAgain(after error: Errno, retried: inout Bool,
                    _ start: () throws(Errno) -> StartingProcess) -> StartingProcess? {
        guard error == Errno(ENOENT), !retried else { return nil }
        retried = true
        searchAgain()
        return try? start()
    }
}
