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
