#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CLinux

/// A file written under a hidden temporary name and given its real name only when complete, so
/// nothing partial ever looks finished. The final name is never overwritten: `commit` moves the
/// file into place in a way that fails on an existing name, and tries the next candidate name.
///
/// While a partial file exists, a signal sent to end the process (SIGINT, SIGTERM, SIGHUP, SIGQUIT
/// and the others in `SignalCleanup.signals`, unless it was ignored when the process started)
/// removes it first. SIGKILL, a real-time signal or a crash can leave one behind, under its
/// hidden name.
public final class PartialFile {
    public let directory: String
    public let temporaryPath: String
    private var fd: Int32
    public private(set) var bytesWritten = 0
    /// The first bytes written (for recognising a file type at commit time).
    public private(set) var head: [UInt8] = []
    private let headLimit: Int

    /// Creates `directory/.<prefix>-<pid>-<n>.part`, the first n whose name is free (one left by
    /// a killed process that had the same pid is passed over, never reused).
    public init(directory: String, prefix: String, keepHead headLimit: Int = 16) throws(ToolError) {
        self.directory = directory
        self.headLimit = headLimit
        let base = PartialFile.prefix(of: directory)
        // A signal between creating the file and arming the cleanup would leave it behind: the
        // cleanup's signals wait until both are done.
        let mask = SignalCleanup.blockSignals()
        defer { SignalCleanup.restoreSignals(mask) }
        var attempts = 0
        while true {
            PartialFile.counter += 1
            let path = "\(base)/.\(prefix)-\(getpid())-\(PartialFile.counter).part"
            fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
            if fd >= 0 {
                temporaryPath = path
                break
            }
            attempts += 1
            // The message names the directory: the hidden name means nothing to the user.
            if errno != EEXIST || attempts == 1000 { throw ToolError(.cantCreate, "creating a file in \(directory): \(Errno.current)") }
        }
        PartialFile.cleanup.arm(temporaryPath)
    }

    deinit {
        // Also after finish() without a commit: the partial file must not stay behind.
        if !temporaryGone { discard() }
    }

    public func write(_ bytes: UnsafeRawBufferPointer) throws(ToolError) {
        if head.count < headLimit {
            head.append(contentsOf: bytes.prefix(headLimit - head.count))
        }
        do {
            try FileIO.writeAll(fd, bytes)
        } catch {
            throw ToolError(.ioError, "writing a file in \(directory): \(error)")
        }
        bytesWritten += bytes.count
    }

    /// Writes the data to the disk and closes the file (``commit(first:name:skip:)`` does it
    /// first when not done: separately, a caller can name the file under a lock held only as
    /// long as the naming takes). On failure the partial file is removed.
    public func finish() throws(ToolError) {
        guard fd >= 0 else { return }
        // EINVAL: a file that cannot be synced (a pipe or device, not a partial file here).
        let synced = fsync(fd) == 0 || errno == EINVAL
        let syncError = Errno.current
        let closed = Glibc.close(fd)
        fd = -1
        if !synced || closed != 0 {
            let error = synced ? Errno.current : syncError
            unlinkTemporary()
            throw ToolError(.ioError, "writing a file in \(directory): \(error)")
        }
    }

    /// Closes the file and gives it the first name `name(n)` (n = first, first+1, …, passing
    /// over each n for which `skip(n)` is true) that does not exist yet. Returns the final path
    /// and n.
    /// The data reach the disk before the name is given, so that after a power cut a file under
    /// its final name is whole.
    public func commit(first: Int, name: (Int) -> String, skip: (Int) -> Bool = { _ in false }) throws(ToolError) -> (path: String, number: Int) {
        try finish()
        let base = PartialFile.prefix(of: directory)
        var number = first
        while true {
            while skip(number) { number += 1 }
            let path = "\(base)/\(name(number))"
            switch place(at: path) {
            case nil:
                unlinkTemporary()
                return (path, number)
            case let error? where error.rawValue == EEXIST:
                number += 1
            case let error?:
                unlinkTemporary()
                throw ToolError(.cantCreate, "\(path): \(error)")
            }
        }
    }

    /// What goes before "/name" for a file in `directory` ("" for the root, not "/").
    private static func prefix(of directory: String) -> String { directory == "/" ? "" : directory }

    /// False once the file system refused a rename that does not replace (NFS, some FUSE file
    /// systems): hard links do the same there. Tests set it to take that way.
    nonisolated(unsafe) static var renameNoReplaceWorks = true

    /// Gives the temporary file the name `path` unless that exists (EEXIST). A rename that does
    /// not replace works on most file systems, also those without hard links (vfat and exfat on
    /// a USB stick); where it does not, a hard link is made and the temporary name then removed.
    private func place(at path: String) -> Errno? {
        if PartialFile.renameNoReplaceWorks {
            if cl_rename_noreplace(temporaryPath, path) == 0 { return nil }
            let error = Errno.current
            guard error.rawValue == EINVAL || error.rawValue == ENOSYS || error.rawValue == EOPNOTSUPP else { return error }
            PartialFile.renameNoReplaceWorks = false
        }
        return link(temporaryPath, path) == 0 ? nil : Errno.current
    }

    /// Closes and removes the partial file.
    public func discard() {
        if fd >= 0 {
            _ = Glibc.close(fd)
            fd = -1
        }
        unlinkTemporary()
    }

    /// True once the temporary name is gone (given its final name, or removed).
    private var temporaryGone = false

    private func unlinkTemporary() {
        temporaryGone = true
        unlink(temporaryPath)
        PartialFile.cleanup.disarm()
    }

    nonisolated(unsafe) private static var counter = 0
    nonisolated(unsafe) private static let cleanup = SignalCleanup()

    /// Creates `path` and any missing parents, like `mkdir -p`.
    public static func makeDirectories(_ path: String) throws(ToolError) {
        var st = stat()
        if stat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFDIR else { throw ToolError(.cantCreate, "\(path): not a directory") }
            return
        }
        var prefix = path.hasPrefix("/") ? "/" : ""
        for component in path.split(separator: "/") {
            prefix += component
            if mkdir(prefix, 0o777) != 0 {
                let error = Errno.current
                guard error.rawValue == EEXIST else { throw ToolError(.cantCreate, "\(prefix): \(error)") }
                // There already: fine if it is a directory (or a link to one).
                if stat(prefix, &st) != 0 {
                    let reason = Errno.current
                    throw ToolError(.cantCreate, "\(prefix): " + (reason.rawValue == ENOENT ? "a symbolic link to nothing" : "\(reason)"))
                }
                guard (st.st_mode & S_IFMT) == S_IFDIR else { throw ToolError(.cantCreate, "\(prefix): not a directory") }
            }
            prefix += "/"
        }
    }
}

/// Removes one registered path when a signal in `signals` arrives, then lets the signal take its
/// default course. A signal the process was started with ignored (`nohup`, a shell's background
/// job) stays ignored. The path lives in a buffer allocated once, so the handler only calls
/// async-signal-safe functions.
private final class SignalCleanup {
    /// The signals whose default action ends the process and that another process or the kernel
    /// (a file size limit: SIGXFSZ) may send while a file is written.
    static let signals = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,
                          SIGXCPU, SIGXFSZ, SIGPWR, SIGIO, SIGSTKFLT]
    static let capacity = 4096
    /// NUL-terminated path, or an empty string when disarmed. Read by the signal handler.
    nonisolated(unsafe) static let path: UnsafeMutablePointer<CChar> = {
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: capacity)
        buffer[0] = 0
        return buffer
    }()
    private var installed = false

    func arm(_ target: String) {
        let buffer = SignalCleanup.path
        if !installed {
            installed = true
            for signo in Signals.notIgnoredAtStart(SignalCleanup.signals) {
                signal(signo) { signo in
                    if SignalCleanup.path[0] != 0 { unlink(SignalCleanup.path) }
                    signal(signo, SIG_DFL)
                    raise(signo)
                }
            }
        }
        let utf8 = Array(target.utf8)
        guard utf8.count < SignalCleanup.capacity else { return }
        buffer[0] = 0
        for (i, byte) in utf8.enumerated().dropFirst() { buffer[i] = CChar(bitPattern: byte) }
        buffer[utf8.count] = 0
        buffer[0] = CChar(bitPattern: utf8[0])  // written last: the path becomes valid at once
    }

    func disarm() {
        SignalCleanup.path[0] = 0
    }

    /// Blocks `signals` in the calling thread; returns the mask to restore.
    static func blockSignals() -> sigset_t {
        var block = sigset_t()
        sigemptyset(&block)
        for signo in signals { sigaddset(&block, signo) }
        var old = sigset_t()
        _ = pthread_sigmask(SIG_BLOCK, &block, &old)
        return old
    }

    /// Restores a mask ``blockSignals()`` returned; a signal that came meanwhile is handled now.
    static func restoreSignals(_ mask: sigset_t) {
        var mask = mask
        _ = pthread_sigmask(SIG_SETMASK, &mask, nil)
    }
}
