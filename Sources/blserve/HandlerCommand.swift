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
    /// by the remembered file. When that fails with ENOENT the file may have gone: call
    /// ``searchAgain()`` and start it once more.
    func start(_ children: ChildProcesses, environment: [(String, String)], stdin: Subprocess.Stream,
               stdout: Subprocess.Stream, stderr: Subprocess.Stream) throws(Errno) -> StartingProcess {
        try children.start(argv, executable: path, environment: environment, stdin: stdin, stdout: stdout, stderr: stderr)
    }

    /// Looks the program up again (after a start failed with ENOENT); nil when it is nowhere,
    /// and a start then lets `posix_spawnp` search and say why.
    func searchAgain() {
        path = resolve(argv[0])
    }

    func spawn(_ children: ChildProcesses, environment: [(String, String)], stdin: Subprocess.Stream,
               stdout: Subprocess.Stream, stderr: Subprocess.Stream) throws(Errno) -> Subprocess {
        if let path {
            do {
                return try children.spawn(argv, executable: path, environment: environment,
                                          stdin: stdin, stdout: stdout, stderr: stderr)
            } catch where error == Errno(ENOENT) {
                self.path = nil
            }
        }
        // Not found at start-up, or moved since: search again; when that finds nothing either,
        // posix_spawnp searches once more and reports why exec failed.
        searchAgain()
        return try children.spawn(argv, executable: path, environment: environment,
                                  stdin: stdin, stdout: stdout, stderr: stderr)
    }
}
