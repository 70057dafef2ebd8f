import XCTest
import BLTestSupport

final class BlserveDocsTests: XCTestCase {
    /// Every option of `blserve --help` is in man/blserve.1 and offered by bash, zsh and fish.
    func testManPageAndCompletionsMatchHelp() throws {
        if let problems = try toolDocsProblems("blserve") { XCTFail(problems) }
    }

    /// blserve reads no options after COMMAND: what follows is COMMAND's, so no shell offers
    /// blserve's options there (bash and fish offer files, zsh COMMAND's own completion), while
    /// each still offers them before COMMAND.
    func testCompletionsOfferNoOptionsAfterTheCommand() throws {
        let root = packageRoot.path
        let bash = """
            source '\(root)/completions/blserve.bash'
            offer() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _blserve; printf '%s\\n' "${COMPREPLY[@]}"; }
            echo PART; offer blserve -v --
            echo PART; offer blserve -n pi tr --
            echo PART; offer blserve -- tr --
            echo PART; offer blserve -n pi tr Packa
            """
        let fish = """
            source '\(root)/completions/blserve.fish'
            echo PART; complete -C 'blserve -v --'
            echo PART; complete -C 'blserve -n pi tr --'
            echo PART; complete -C 'blserve -- tr --'
            echo PART; complete -C 'blserve -n pi tr Packa'
            """
        var outputs: [(String, [String])] = []
        for (shell, script) in [("bash", bash), ("fish", fish)] {
            let process = try Spawned("/usr/bin/env", [shell, "-c", script], cwd: root, stdin: .inherit, stderr: .stdout)
            let text = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
            XCTAssertEqual(process.wait(), 0, "\(shell): \(text)")
            outputs.append((shell, text.components(separatedBy: "PART\n").dropFirst().map { $0 }))
        }
        // zsh (Tests/docs/zsh-complete: a shell on a pseudo-terminal, TAB pressed). zsh offers
        // nothing for "blserve -- tr --", with `--` the first word; "-v --" shows the same case.
        let process = try Spawned("/usr/bin/timeout", ["120", root + "/Tests/docs/zsh-complete",
                                  "blserve -v --", "blserve -n pi tr --", "blserve -v -- tr --", "blserve -t 5 tr --"],
                                  cwd: root, stdin: .inherit, stderr: .stdout)
        let text = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
        XCTAssertEqual(process.wait(), 0, "zsh: \(text)")
        outputs.append(("zsh", text.components(separatedBy: "\n== ").map { $0 }))

        for (shell, parts) in outputs {
            guard parts.count == 4 else {
                XCTFail("\(shell): \(parts.count) answers: \(parts)")
                continue
            }
            XCTAssertTrue(parts[0].contains("--mode"), "\(shell) offers no options before COMMAND: \(parts[0])")
            for after in parts[1...3] {
                XCTAssertFalse(after.contains("--mode") || after.contains("--reply-code"),
                               "\(shell) offers blserve's options after COMMAND: \(after)")
            }
            if shell == "zsh" {
                // COMMAND's own completion: tr's options.
                for after in parts[1...3] {
                    XCTAssertTrue(after.contains("--delete"), "zsh does not complete tr's options after it: \(after)")
                }
            } else {
                XCTAssertTrue(parts[3].contains("Package.swift"), "\(shell) does not offer files after COMMAND: \(parts[3])")
            }
        }
    }
}
