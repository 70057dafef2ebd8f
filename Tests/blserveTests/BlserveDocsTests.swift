import XCTest
import BLTestSupport

final class BlserveDocsTests: XCTestCase {
    /// Every option of `blserve --help` is in man/blserve.1 and offered by bash, zsh and fish.
    func testManPageAndCompletionsMatchHelp() throws {
        if let problems = try toolDocsProblems("blserve") { XCTFail(problems) }
    }
}
