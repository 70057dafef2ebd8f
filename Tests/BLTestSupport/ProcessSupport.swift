#if canImport(Glibc)
import Glibc
#endif
import BLCommand
import Foundation


/// The directory holding the built products (the test bundle sits beside the tools).
public let productsDirectory: URL = {
    let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    var dir = exe.deletingLastPathComponent()
    // The XCTest runner may live inside a .xctest directory.
    while dir.path != "/" && !FileManager.default.fileExists(atPath: dir.appendingPathComponent("blframe").path) {
        dir = dir.deletingLastPathComponent()
    }
    return dir
}()

public struct RunResult {
    public var status: Int32
    public var stdout: Data
    public var stderr: String
    public var stdoutText: String { String(decoding: stdout, as: UTF8.self) }
}

/// Runs a built tool with `input` on stdin and returns what it printed and its exit status.
public func runTool(_ tool: String, _ arguments: [String], input: Data = Data(), cwd: URL? = nil,
                    environment: [String: String] = [:]) throws -> RunResult {
    try runProgram(productsDirectory.appendingPathComponent(tool).path, arguments, input: input, cwd: cwd, environment: environment)
}

/// Runs the program at `path` (a shell, say, that runs a tool in a set-up of its own) with
/// `input` on stdin and returns what it printed and its exit status.
public func runProgram(_ path: String, _ arguments: [String], input: Data = Data(), cwd: URL? = nil,
                       environment: [String: String] = [:]) throws -> RunResult {
    let process = try Spawned(path, arguments,
                              environment: environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { $1 },
                              cwd: cwd?.path)
    // Feed stdin and drain both outputs concurrently so no pipe fills up.
    let group = DispatchGroup()
    nonisolated(unsafe) var out = Data(), err = Data()
    DispatchQueue.global().async(group: group) { out = Spawned.readAll(process.stdout) }
    DispatchQueue.global().async(group: group) { err = Spawned.readAll(process.stderr) }
    DispatchQueue.global().async(group: group) { process.feed(input) }
    group.wait()
    return RunResult(status: process.wait(), stdout: out, stderr: String(decoding: err, as: UTF8.self))
}

public func data(_ text: String) -> Data { Data(text.utf8) }

/// Ignores SIGPIPE in the test process, through ``Signals`` so that its record of the signals
/// ignored at start (which children keep ignored) is taken first: a direct signal(3) call made
/// before it would count as inherited.
public func ignoreSIGPIPE() { Signals.ignoreSIGPIPE() }

public func randomData(_ count: Int, _ rng: inout SeededGenerator) -> Data { Data(rng.bytes(count)) }

public let pngHeader = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
public let jpegHeader = Data([0xFF, 0xD8, 0xFF, 0xE0])

/// The package's root directory (where Package.swift is).
public let packageRoot: URL = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// Runs Tests/docs/check-tool-docs for `tool`: its man page and bash, zsh and fish completions
/// must agree with its --help. Also, `--help` and `--version` into a pipe whose reader has gone
/// (`tool --help | true`) must end with 0, not be killed by SIGPIPE. Returns what is wrong, nil
/// when nothing is.
public func toolDocsProblems(_ tool: String) throws -> String? {
    let process = try Spawned(packageRoot.appendingPathComponent("Tests/docs/check-tool-docs").path,
                              [productsDirectory.path, tool], stdin: .inherit, stderr: .stdout)
    let text = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
    var problems = process.wait() == 0 ? [] : [text]
    for option in ["--help", "--version"] {
        let (readEnd, writeEnd) = try Spawned.pipe()
        close(readEnd)
        defer { close(writeEnd) }
        let (status, said) = try runTool(tool, [option], stdout: writeEnd)
        if status != 0 { problems.append("\(tool) \(option) | true: exit \(status) \(said.debugDescription)") }
    }
    return problems.isEmpty ? nil : problems.joined(separator: "\n")
}

/// Runs `tool` with each of `argumentLists`: each must be a usage error, exit 64 with nothing on
/// stdout and one line on stderr starting "TOOL: ". Returns what differs, nil when nothing does.
public func usageErrorProblems(_ tool: String, _ argumentLists: [[String]]) throws -> String? {
    var problems: [String] = []
    for arguments in argumentLists {
        let result = try runTool(tool, arguments)
        let lines = result.stderr.filter { $0 == "\n" }.count
        if result.status != 64 || !result.stdout.isEmpty || !result.stderr.hasPrefix("\(tool): ") || lines != 1 {
            problems.append("\(arguments): exit \(result.status), \(result.stdout.count) bytes out, stderr \(result.stderr.debugDescription)")
        }
    }
    return problems.isEmpty ? nil : problems.joined(separator: "\n")
}

/// Runs `tool` with a system bus address nothing listens on: it must end with 69, saying that it
/// cannot connect to the system bus. Returns what differs, nil when nothing does.
public func noBusProblems(_ tool: String, _ arguments: [String]) throws -> String? {
    let result = try runTool(tool, arguments, environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
    if result.status == 69 && result.stderr.hasPrefix("\(tool): cannot connect to the system bus") { return nil }
    return "exit \(result.status), stderr \(result.stderr.debugDescription)"
}

/// Runs `tool` against a system bus that takes the connection and never answers (a hung
/// dbus-daemon), then sends SIGTERM while it waits: it must end at once with `status` (130 for
/// a central tool, 0 for blserve) and nothing on stderr. With `full`, the bus's queue of
/// connections is full, and the signal comes while libdbus's connect() waits (its default
/// action then: 143). Returns what differs, nil when nothing does.
public func silentBusProblems(_ tool: String, _ arguments: [String], status expected: Int32, full: Bool = false) throws -> String? {
    let silent = try SilentBus(full: full)
    let child = try Spawned(productsDirectory.appendingPathComponent(tool).path, arguments,
                            environment: ProcessInfo.processInfo.environment.merging(["DBUS_SYSTEM_BUS_ADDRESS": silent.address]) { $1 })
    usleep(500_000)
    if child.hasEnded { return "ended before the signal: exit \(child.wait()), stderr \(String(decoding: Spawned.readAll(child.stderr), as: UTF8.self).debugDescription)" }
    child.terminate()
    let deadline = MonotonicClock.seconds() + 5
    while !child.hasEnded && MonotonicClock.seconds() < deadline { usleep(20_000) }
    guard child.hasEnded else {
        kill(child.pid, SIGKILL)
        child.wait()
        return "still running 5 s after SIGTERM"
    }
    let said = String(decoding: Spawned.readAll(child.stderr), as: UTF8.self)
    let status = child.wait()
    if status == expected && said.isEmpty { return nil }
    return "exit \(status), stderr \(said.debugDescription)"
}

/// Runs `tool` with a standard output it cannot write (open read-only, as a closed one is) and
/// no system bus: it must end with 74 about stdout before it tries the bus (which would be 69).
/// Returns what differs, nil when nothing does.
public func unwritableStdoutProblems(_ tool: String, _ arguments: [String]) throws -> String? {
    let readOnly = open("/dev/null", O_RDONLY | O_CLOEXEC)
    guard readOnly >= 0 else { return "cannot open /dev/null" }
    defer { close(readOnly) }
    let (status, said) = try runTool(tool, arguments, stdout: readOnly,
                                     environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
    if status == 74 && said.hasPrefix("\(tool): stdout: ") && said.filter({ $0 == "\n" }).count == 1 { return nil }
    return "exit \(status), stderr \(said.debugDescription)"
}

/// Runs `tool` with `fd` as its standard output (and `environment` added to the test's): its
/// exit status and what it wrote on stderr.
private func runTool(_ tool: String, _ arguments: [String], stdout fd: Int32,
                     environment: [String: String] = [:]) throws -> (status: Int32, stderr: String) {
    let child = try Spawned(productsDirectory.appendingPathComponent(tool).path, arguments,
                            environment: ProcessInfo.processInfo.environment.merging(environment) { $1 },
                            stdin: .inherit, stdout: .fd(fd))
    let said = String(decoding: Spawned.readAll(child.stderr), as: UTF8.self)
    return (child.wait(), said)
}
