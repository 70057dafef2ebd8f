#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Diagnostics (stderr) written from an event loop without ever waiting on the reader.
///
/// A server logging with -v into a pipe nobody reads, or onto a terminal stopped with ^S, must
/// not stop serving: a blocking write to stderr would hold the whole loop. Lines go through a
/// ``QueuedOutput``; a line that does not fit in ``limit`` is dropped and counted, and the
/// count is said before the next line that fits (and when the output finishes). Whole lines
/// only: a line is queued entirely or not at all.
public final class DiagnosticOutput {
    private let output: QueuedOutput
    /// Lines dropped since the last report of them.
    public private(set) var droppedLines = 0
    private let prefix: String

    /// What may wait for the reader: a few hundred lines.
    public static let defaultLimit = 64 << 10

    /// `prefix` starts the note about dropped lines ("blserve: ").
    public init(fd: Int32, loop: EventLoop, prefix: String, limit: Int = DiagnosticOutput.defaultLimit) {
        self.prefix = prefix
        output = QueuedOutput(fd: fd, loop: loop, limit: limit)
        // A stderr that cannot be written ends the diagnostics, as a failed blocking write did.
        output.onFailure = { _ in }
    }

    /// Bytes waiting for the reader.
    public var queuedCount: Int { output.queuedCount }

    /// Queues `text` (one or more whole lines, or a progress line) and writes what stderr takes
    /// now. Returns false when it was dropped, or stderr cannot be written.
    @discardableResult
    public func write(_ text: String) -> Bool {
        guard output.failure == nil else { return false }
        // Lines dropped before are reported first, so the note must fit as well.
        let bytes = Array((droppedNote() + text).utf8)
        guard output.queuedCount + bytes.count <= output.limit else {
            droppedLines += 1
            return false
        }
        droppedLines = 0
        output.write(bytes)
        try? output.flush()
        return output.failure == nil
    }

    /// Writes everything still queued, waiting for the reader: when the tool ends, its last
    /// words matter. Gives up when SIGINT, SIGTERM or SIGHUP is pending (see
    /// ``QueuedOutput/drain(idleTimeout:)``), or when the reader has taken nothing for
    /// `idleTimeout` seconds, if given. Later writes go straight to the descriptor.
    public func finish(idleTimeout: Double? = nil) {
        output.write(Array(droppedNote().utf8))
        droppedLines = 0
        try? output.drain(idleTimeout: idleTimeout)
        output.close()
    }

    /// The line saying how many lines were dropped, or "" when none were.
    private func droppedNote() -> String {
        if droppedLines == 0 { return "" }
        return "\(prefix)\(droppedLines) diagnostic line\(droppedLines == 1 ? "" : "s") dropped: stderr was not being read\n"
    }
}
