import Foundation
import Glibc
import XCTest
import BLCommand

extension XCTestCase {
    /// A scratch directory, removed with everything in it when the test ends.
    func scratchDirectory() throws -> String {
        var template = Array("/tmp/blserve-test-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw Errno.current }
        let path = String(cString: dir)
        addTeardownBlock { try? FileManager.default.removeItem(atPath: path) }
        return path
    }
}

/// A shell command that writes its shell's pid to `path` in one step (a reader never sees a
/// half-written file); ``readPID(_:)`` reads it.
func writingPID(to path: String) -> String {
    "echo $$ >\(path).tmp && mv \(path).tmp \(path)"
}

/// The pid written to `path` by ``writingPID(to:)``; nil while there is none.
func readPID(_ path: String) -> pid_t? {
    (try? String(contentsOfFile: path, encoding: .utf8)).flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
}

/// ``readPID(_:)`` once the file is there, waiting up to `seconds` without running any event
/// loop (for a test whose loop has stopped); nil if it never came.
func waitForPID(_ path: String, seconds: Double) -> pid_t? {
    for _ in 0..<Int(seconds * 100) {
        if let pid = readPID(path) { return pid }
        usleep(10_000)
    }
    return readPID(path)
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
func isAlive(_ pid: pid_t) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    let state = stat[stat.index(close, offsetBy: 2)]
    return state != "Z" && state != "X"
}
