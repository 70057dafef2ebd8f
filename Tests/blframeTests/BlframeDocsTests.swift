import XCTest
import BLTestSupport

final class BlframeDocsTests: XCTestCase {
    /// Every option of `blframe --help` is in man/blframe.1 and offered by bash, zsh and fish.
    func testManPageAndCompletionsMatchHelp() throws {
        if let problems = try toolDocsProblems("blframe") { XCTFail(problems) }
    }
}
