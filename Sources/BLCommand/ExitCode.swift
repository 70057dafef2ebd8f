/// Process exit statuses from BSD `sysexits(3)`, the contract every tool follows.
public enum ExitCode: Int32, Sendable, CustomStringConvertible {
    case ok = 0
    /// Generic failure that fits nothing below.
    case failure = 1
    /// EX_USAGE: bad options or arguments.
    case usage = 64
    /// EX_DATAERR: malformed input data (a bad frame, an oversized body).
    case dataError = 65
    /// EX_UNAVAILABLE: a service, adapter or device is not there.
    case unavailable = 69
    /// EX_SOFTWARE: an internal error.
    case software = 70
    /// EX_OSERR: an operating-system error (fork, pipe, out of descriptors).
    case osError = 71
    /// EX_CANTCREAT: an output file cannot be created.
    case cantCreate = 73
    /// EX_IOERR: an input/output error.
    case ioError = 74
    /// EX_TEMPFAIL: a timeout or another condition worth retrying.
    case tempFail = 75
    /// EX_NOPERM: insufficient permission.
    case noPermission = 77
    /// Ended by SIGINT, SIGTERM or SIGHUP (the shell's 128 + SIGINT).
    case interrupted = 130

    public var description: String { String(rawValue) }
}

/// An error that ends the tool: one line for stderr and the exit status that goes with it.
public struct ToolError: Error, Sendable, CustomStringConvertible {
    public var code: ExitCode
    public var message: String
    public init(_ code: ExitCode, _ message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { message }

    /// Ends the tool with `code` and no message, e.g. 0 when the reader of stdout went away.
    public static func quiet(_ code: ExitCode) -> ToolError { ToolError(code, "") }

    /// What a failed write to stdout ends a tool with: nil for EPIPE (its reader went away, as
    /// in `cat | head`: a clean end), a quiet 130 for EINTR (``QueuedOutput/drain()`` gave up on
    /// a pending SIGINT, SIGTERM or SIGHUP), otherwise 74 with "stdout: …".
    public static func stdout(_ error: Errno) -> ToolError? {
        switch error {
        case .pipe: return nil
        case .interrupted: return .quiet(.interrupted)
        default: return ToolError(.ioError, "stdout: \(error)")
        }
    }
}
