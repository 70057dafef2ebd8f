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
        // zsh completes only in an interactive shell: one on a pseudo-terminal, as
        // Tests/docs/check-tool-docs does, each line typed and TAB pressed.
        let zsh = """
            zmodload zsh/zpty
            offer() {
                zpty z 'zsh -f -i'
                zpty -w z "LISTMAX=10000; COLUMNS=250; fpath=('\(root)/completions' \\$fpath); autoload -U compinit; compinit -u -D; print READY"
                local out="" line
                zpty -r z out '*READY*'
                zpty -w -n z "$1"$'\\t'
                sleep 2
                out=""
                while zpty -r -t z line; do out+=$line; done
                zpty -d z
                print -r -- ${out//$'\\r'/}
            }
            echo BEFORE; offer 'blserve -v --'
            echo AFTER; offer 'blserve -n pi tr --'
            echo AFTER; offer 'blserve -- tr --'
            """
        for (shell, script) in [("bash", bash), ("fish", fish), ("zsh", zsh)] {
            let process = try Spawned("/usr/bin/env", shell == "zsh" ? ["zsh", "-f", "-c", script] : [shell, "-c", script],
                                      stdin: .inherit, stderr: .stdout)
            let text = String(decoding: Spawned.readAll(process.stdout), as: UTF8.self)
            XCTAssertEqual(process.wait(), 0, "\(shell): \(text)")
            let parts = text.components(separatedBy: "AFTER\n")
            XCTAssertEqual(parts.count, 3, "\(shell): \(text)")
            XCTAssertTrue(parts[0].contains("--mode"), "\(shell) offers no options before COMMAND: \(text)")
            for after in parts.dropFirst() {
                XCTAssertFalse(after.contains("--mode") || after.contains("--reply-code"),
                               "\(shell) offers blserve's options after COMMAND: \(after)")
            }
            if shell == "zsh" {
                // What comes after COMMAND is completed as COMMAND's own arguments.
                XCTAssertTrue(parts[1].contains("--delete"), "zsh does not complete tr's options after it: \(parts[1])")
            }
        }
    }
}
