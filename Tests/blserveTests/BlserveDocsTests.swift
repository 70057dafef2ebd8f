import XCTest
import BLTestSupport

final class BlserveDocsTests: XCTestCase {
    /// Every option of `blserve --help` is in man/blserve.1 and offered by bash, zsh and fish.
    func testManPageAndCompletionsMatchHelp() throws {
        if let problems = try toolDocsProblems("blserve") { XCTFail(problems) }
    }

    /// blserve reads no options after COMMAND: what follows is COMMAND's, so no shell offers
    /// blserve's options there, while it still offers them before COMMAND.
    func testCompletionsOfferNoOptionsAfterTheCommand() throws {
        let root = packageRoot.path
        let bash = """
            source '\(root)/completions/blserve.bash'
            offer() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _blserve; printf '%s\\n' "${COMPREPLY[@]}"; }
            echo BEFORE; offer blserve -v --
            echo AFTER; offer blserve -n pi tr --
            echo AFTER; offer blserve -- tr --
            """
        let fish = """
            source '\(root)/completions/blserve.fish'
            echo BEFORE; complete -C 'blserve -v --'
            echo AFTER; complete -C 'blserve -n pi tr --'
            echo AFTER; complete -C 'blserve -- tr --'
            """
        for (shell, script) in [("bash", bash), ("fish", fish)] {
            let process = try Spawned("/usr/bin/env", [shell, "-c", script], stdin: .inherit, stderr: .stdout)
            let text = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
            XCTAssertEqual(process.wait(), 0, "\(shell): \(text)")
            let parts = text.components(separatedBy: "AFTER\n")
            XCTAssertEqual(parts.count, 3, "\(shell): \(text)")
            XCTAssertTrue(parts[0].contains("--mode"), "\(shell) offers no options before COMMAND: \(text)")
            for after in parts.dropFirst() {
                XCTAssertFalse(after.contains("--mode") || after.contains("--reply-code"),
                               "\(shell) offers blserve's options after COMMAND: \(after)")
            }
        }
    }
}
