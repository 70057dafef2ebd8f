#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The version every tool reports.
public let blpipeVersion = "0.1.0"

/// Diagnostics and the exit contract shared by the tools: messages go to stderr prefixed with the
/// tool's name, data goes to stdout, and every failure ends with a sysexits status.
public enum Tool {
    /// The name used as a prefix on stderr. Set once by `run`.
    nonisolated(unsafe) public private(set) static var name = "blpipe"

    /// How much `note` says: 0 nothing, 1 with -v.
    nonisolated(unsafe) public static var verbosity = 0

    /// A progress note for -v: "name: message" on stderr when verbose.
    public static func note(_ message: @autoclosure () -> String) {
        if verbosity > 0 { warn(message()) }
    }

    /// Writes "name: message" and a newline to stderr. Never fails, and never waits on the
    /// reader once ``queueDiagnostics(on:)`` was called.
    public static func warn(_ message: String) {
        // A progress line being redrawn ends first, so the message gets a line of its own.
        // Control characters (a device's name can hold any) neither break the line nor reach
        // the terminal.
        writeStderr((lineOpen ? "\n" : "") + "\(name): \(printable(message))\n")
    }

    /// `text` with every control character (C0, DEL, C1) shown as "?", as `ls` shows them on a
    /// terminal: safe to print, and on one line.
    public static func printable(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars { out.append(isControl(scalar) ? "?" : scalar) }
        return String(out)
    }

    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
    }

    /// Writes `text` to stderr as it is (a progress line), through the loop's queue when there
    /// is one. Returns false when it was dropped because stderr is not being read.
    @discardableResult
    public static func writeStderr(_ text: String) -> Bool {
        let written: Bool
        if let diagnostics {
            written = diagnostics.write(text)
        } else {
            written = (try? FileIO.writeAll(2, text)) != nil
        }
        if written, let last = text.utf8.last { lineOpen = last != UInt8(ascii: "\n") }
        return written
    }

    /// The last text written to stderr did not end its line (a progress line).
    nonisolated(unsafe) private static var lineOpen = false

    /// True while diagnostics wait for stderr's reader: a progress update then is not worth
    /// queueing.
    public static var stderrIsBehind: Bool { (diagnostics?.queuedCount ?? 0) > 0 }

    nonisolated(unsafe) private static var diagnostics: DiagnosticOutput?

    /// From now on diagnostics are written from `loop` without waiting on stderr's reader (a
    /// pipe nobody reads, a terminal stopped with ^S): see ``DiagnosticOutput``. What is still
    /// queued is written, waiting, when the tool exits through `Tool`.
    public static func queueDiagnostics(on loop: EventLoop) {
        finishDiagnostics()
        diagnostics = DiagnosticOutput(fd: 2, loop: loop, prefix: "\(name): ")
    }

    /// Writes what diagnostics still wait (see ``DiagnosticOutput/finish(idleTimeout:)``); later
    /// ones are written directly again. After a signal (``InterruptWatch``) a reader that takes
    /// nothing is waited for ``QueuedOutput/drainAfterInterrupt`` seconds at most, as stdout's
    /// is: a terminal stopped with ^S must not keep Ctrl-C from ending the tool. A signal that
    /// comes meanwhile ends the process at once with 130, as a second signal does elsewhere
    /// (were the queue's loop released first, the signal would be unblocked and kill it).
    public static func finishDiagnostics() {
        guard let queue = diagnostics else { return }
        diagnostics = nil
        withExtendedLifetime(queue) {
            queue.finish(idleTimeout: InterruptWatch.signalled ? QueuedOutput.drainAfterInterrupt : nil)
            if QueuedOutput.terminationPending() { Glibc.exit(ExitCode.interrupted.rawValue) }
        }
    }

    /// Keeps descriptors 0, 1 and 2 taken when the tool was started with one of them closed
    /// (`blrecv DEV >&-`): otherwise the next descriptor opened (the D-Bus socket) would get the
    /// number and data meant for stdout would go into it. A closed one gets /dev/null opened the
    /// wrong way round (stdin write-only, stdout and stderr read-only), so using it still fails
    /// with EBADF, as it would have.
    public static func reserveStandardDescriptors() {
        for fd: Int32 in 0...2 where fcntl(fd, F_GETFD) < 0 {
            let null = open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY)
            if null >= 0 && null != fd {
                dup2(null, fd)
                close(null)
            }
        }
    }

    /// Fails with 74 when standard output cannot be written at all (closed, or open read-only),
    /// for a tool to call before it starts its work (a scan, a connection) rather than after.
    public static func requireWritableStdout() throws(ToolError) {
        if let problem = FileIO.unwritable(1), let failure = ToolError.stdout(problem) { throw failure }
    }

    /// Writes a diagnostic line and exits with `code`.
    public static func exit(_ code: ExitCode, _ message: String) -> Never {
        warn(message)
        finishDiagnostics()
        Glibc.exit(code.rawValue)
    }

    /// Ignores SIGPIPE (``Signals/ignoreSIGPIPE()``; children get it back at its default),
    /// parses the command line with `spec`, handles `--help` and `--version`, runs `body` and
    /// turns thrown errors into one stderr line and an exit status:
    /// `UsageError` → 64 with a hint to `--help`, `ToolError` → its code, anything else → 70.
    public static func run(_ spec: CommandSpec, arguments: [String]? = nil,
                           _ body: (ParsedOptions) throws -> Void) -> Never {
        name = spec.name
        Signals.recordInheritedDispositions()
        // A reader that went away (`| head`) makes a write fail with EPIPE, which every tool
        // takes as a clean end (--help and --version too), instead of killing the process.
        Signals.ignoreSIGPIPE()
        reserveStandardDescriptors()
        let arguments = arguments ?? commandLineArguments()
        let options: ParsedOptions
        do {
            options = try spec.parse(arguments)
        } catch {
            // --help and --version win over other mistakes on the same line (before a `--`,
            // or for a tool whose first operand ends its options, before that: after them
            // they are operands).
            let asked = spec.helpOrVersionAsked(in: arguments)
            if asked.help { printHelp(spec) }
            if asked.version { printVersion(spec) }
            exit(.usage, "\(error.message); try '\(spec.name) --help'")
        }
        if options.has("help") { printHelp(spec) }
        if options.has("version") { printVersion(spec) }
        do {
            try body(options)
        } catch let error as UsageError {
            exit(.usage, "\(error.message); try '\(spec.name) --help'")
        } catch let error as ToolError {
            if error.message.isEmpty {
                finishDiagnostics()
                Glibc.exit(error.code.rawValue)
            }
            exit(error.code, error.message)
        } catch {
            exit(.software, "\(error)")
        }
        finishDiagnostics()
        Glibc.exit(0)
    }

    /// The process's arguments after its name. Swift's `CommandLine.arguments` repairs bytes that
    /// are not UTF-8 (each becomes U+FFFD), which would make a file name given on the command line
    /// another one, or alter an argument passed on to COMMAND: such an argument is refused (64).
    static func commandLineArguments() -> [String] {
        var arguments: [String] = []
        var i = 1
        while i < Int(CommandLine.argc), let raw = CommandLine.unsafeArgv[i] {
            guard let text = String(validatingCString: raw) else {
                exit(.usage, "argument \(i) is not valid UTF-8 (\(escapingInvalidUTF8(raw))): only text and UTF-8 names "
                     + "can be passed; try '\(name) --help'")
            }
            arguments.append(text)
            i += 1
        }
        return arguments
    }

    /// `raw` for a one-line message: each byte that is not part of valid UTF-8, each control
    /// character and the backslash written as \xHH, in one pass.
    static func escapingInvalidUTF8(_ raw: UnsafePointer<CChar>) -> String {
        let bytes = UnsafeRawBufferPointer(start: raw, count: strlen(raw))
        func escape(_ byte: UInt8) -> String { "\\x" + hexDigits(byte) }
        var text = ""
        var parser = Unicode.UTF8.ForwardParser()
        var iterator = bytes.makeIterator()
        var position = 0
        while true {
            switch parser.parseScalar(from: &iterator) {
            case .valid(let encoded):
                let scalar = Unicode.UTF8.decode(encoded)
                if scalar.value < 0x20 || scalar.value == 0x7F || scalar == "\\" {
                    text += escape(UInt8(scalar.value))
                } else {
                    text.unicodeScalars.append(scalar)
                }
                position += encoded.count
            case .error(let length):
                for byte in bytes[position..<position + length] { text += escape(byte) }
                position += length
            case .emptyInput:
                return text
            }
        }
    }

    static func printHelp(_ spec: CommandSpec) -> Never {
        writeStdoutOrExit(spec.helpText)
        Glibc.exit(0)
    }

    static func printVersion(_ spec: CommandSpec) -> Never {
        writeStdoutOrExit("\(spec.name) \(blpipeVersion)\n")
        Glibc.exit(0)
    }

    private static func writeStdoutOrExit(_ text: String) {
        do {
            try FileIO.writeAll(1, text)
        } catch {
            if let failure = ToolError.stdout(error) { exit(failure.code, failure.message) }
        }
    }
}

extension CommandSpec {
    /// The text `--help` prints.
    public var helpText: String {
        var text = ""
        for (i, line) in usage.enumerated() {
            text += (i == 0 ? "usage: " : "       ") + name + (line.isEmpty ? "" : " " + line) + "\n"
        }
        text += "\n" + summary + "\n\noptions:\n"
        let labels = options.map { option -> String in
            var label = option.short.map { "-\($0), " } ?? "    "
            label += "--" + option.long
            if let value = option.value { label += " " + value }
            return label
        }
        let width = min(labels.map(\.count).max() ?? 0, 30)
        let indent = String(repeating: " ", count: width + 4)
        for (option, label) in zip(options, labels) {
            let help = wrapped(option.help, indent: indent)
            if label.count > width {
                text += "  " + label + "\n" + indent + help + "\n"
            } else {
                text += "  " + label + String(repeating: " ", count: width - label.count + 2) + help + "\n"
            }
        }
        if !epilog.isEmpty { text += "\n" + epilog + (epilog.hasSuffix("\n") ? "" : "\n") }
        return text
    }
}

/// `text` cut at spaces into lines of at most `columns` characters after `indent` (a longer word
/// gets a line of its own), the lines after the first indented.
func wrapped(_ text: String, indent: String, columns: Int = 100) -> String {
    let room = max(columns - indent.count, 20)
    var lines: [String] = []
    var line = ""
    for word in text.split(separator: " ", omittingEmptySubsequences: false) {
        if !line.isEmpty && line.count + 1 + word.count > room {
            lines.append(line)
            line = String(word)
        } else {
            line += (line.isEmpty ? "" : " ") + word
        }
    }
    lines.append(line)
    return lines.joined(separator: "\n" + indent)
}

/// "10" or "2.5".
public func formatSeconds(_ seconds: Double) -> String {
    seconds == seconds.rounded() && seconds < 1e9 ? String(Int(seconds)) : String(seconds)
}
