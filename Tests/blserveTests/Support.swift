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

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
func isAlive(_ pid: pid_t) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    let state = stat[stat.index(close, offsetBy: 2)]
    return state != "Z" && state != "X"
}
