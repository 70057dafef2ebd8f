import XCTest
@testable import BLCommand

final class OptionsTests: XCTestCase {
    let spec = CommandSpec(
        name: "tool", usage: ["[options] DEV"], summary: "A test tool.",
        options: [
            OptionSpec("decode", short: "d", help: "decode"),
            OptionSpec("verbose", short: "v", help: "more output"),
            OptionSpec("code", short: "c", value: "CODE", help: "code"),
            OptionSpec("timeout", value: "S", help: "seconds"),
            OptionSpec("allow", value: "ADDR", help: "repeatable"),
        ],
        operands: 0...2)

    func testLongOptionForms() throws {
        let parsed = try spec.parse(["--code", "T", "--timeout=2.5", "--decode"])
        XCTAssertEqual(parsed.string("code"), "T")
        XCTAssertEqual(try parsed.seconds("timeout"), 2.5)
        XCTAssertTrue(parsed.has("decode"))
        XCTAssertFalse(parsed.has("verbose"))
        XCTAssertEqual(try spec.parse(["--code="]).string("code"), "", "an empty inline value is a value")
    }

    func testShortOptionForms() throws {
        XCTAssertEqual(try spec.parse(["-c", "U"]).string("code"), "U")
        XCTAssertEqual(try spec.parse(["-cU"]).string("code"), "U")
        let bundled = try spec.parse(["-dvvcI"])
        XCTAssertTrue(bundled.has("decode"))
        XCTAssertEqual(bundled.count("verbose"), 2)
        XCTAssertEqual(bundled.string("code"), "I")
    }

    func testDoubleDashEndsOptionsAndDashIsAnOperand() throws {
        let parsed = try spec.parse(["-d", "--", "-v", "-"])
        XCTAssertEqual(parsed.operands, ["-v", "-"])
        XCTAssertFalse(parsed.has("verbose"))
        XCTAssertEqual(try spec.parse(["-", "-d"]).operands, ["-"])
    }

    /// A value left out before the next option is a usage error, not that option taken as the
    /// value; attached, or not one of the tool's options, a value starting with '-' is taken.
    func testAnOptionIsNotTakenAsAValue() throws {
        for args in [["--code", "--decode"], ["--code", "--timeout=3"], ["-c", "-d"], ["--code", "--"], ["--timeout", "-v"]] {
            XCTAssertThrowsError(try spec.parse(args), "\(args)") { error in
                XCTAssertTrue("\(error)".contains("needs a value"), "\(args): \(error)")
            }
        }
        XCTAssertEqual(try spec.parse(["--code=--decode"]).string("code"), "--decode")
        XCTAssertEqual(try spec.parse(["-c--decode"]).string("code"), "--decode")
        XCTAssertEqual(try spec.parse(["--timeout", "-70"]).string("timeout"), "-70")
        XCTAssertEqual(try spec.parse(["--code", "-x"]).string("code"), "-x")
        XCTAssertEqual(try spec.parse(["--code", "--other"]).string("code"), "--other")
    }

    /// A negative number is a value even where it is also an option (blscan's `-1`):
    /// `--rssi-min -1` means -1 dBm.
    func testANegativeNumberIsAValueEvenWhenItIsAnOption() throws {
        let digits = CommandSpec(name: "scan", usage: [""], summary: "",
                                 options: [OptionSpec("first", short: "1", help: "first"),
                                           OptionSpec("rssi-min", value: "DBM", help: "dBm")])
        XCTAssertEqual(try digits.parse(["--rssi-min", "-1"]).string("rssi-min"), "-1")
        XCTAssertFalse(try digits.parse(["--rssi-min", "-1"]).has("first"))
        XCTAssertEqual(try digits.parse(["--rssi-min", "-1.5"]).string("rssi-min"), "-1.5")
        XCTAssertTrue(try digits.parse(["-1", "--rssi-min=-3"]).has("first"))
        XCTAssertThrowsError(try digits.parse(["--rssi-min", "--first"]))
    }

    func testOperandsMayBeMixedWithOptions() throws {
        let parsed = try spec.parse(["AA:BB", "-d", "second"])
        XCTAssertEqual(parsed.operands, ["AA:BB", "second"])
        XCTAssertTrue(parsed.has("decode"))
    }

    func testOperandsCanEndOptionParsing() throws {
        let serve = CommandSpec(name: "serve", usage: ["-- CMD"], summary: "",
                                options: [OptionSpec("verbose", short: "v", help: "")],
                                operands: 1...Int.max, operandsEndOptions: true)
        let parsed = try serve.parse(["-v", "cat", "-v", "--x"])
        XCTAssertEqual(parsed.operands, ["cat", "-v", "--x"])
        XCTAssertEqual(parsed.count("verbose"), 1)
    }

    func testHelpAndVersionAreFoundOnALineThatDoesNotParse() {
        XCTAssertTrue(spec.helpOrVersionAsked(in: ["-vh"]).help, "-h in a bundle of flags")
        XCTAssertTrue(spec.helpOrVersionAsked(in: ["-dvh", "a", "b", "c"]).help)
        XCTAssertFalse(spec.helpOrVersionAsked(in: ["-ch"]).help, "h is the value of -c")
        XCTAssertFalse(spec.helpOrVersionAsked(in: ["-vch", "x", "y", "z"]).help)
        XCTAssertFalse(spec.helpOrVersionAsked(in: ["--", "-h"]).help, "an operand after --")
        XCTAssertFalse(spec.helpOrVersionAsked(in: ["-x", "--", "--version"]).version)
        XCTAssertTrue(spec.helpOrVersionAsked(in: ["--bogus", "--version"]).version)
        XCTAssertTrue(spec.helpOrVersionAsked(in: ["--code", "-h"]).help, "refused as a value, so asked for")

        let serve = CommandSpec(name: "serve", usage: ["-- CMD"], summary: "",
                                options: [OptionSpec("verbose", short: "v", help: ""),
                                          OptionSpec("mode", short: "m", value: "MODE", help: "")],
                                operands: 1...Int.max, operandsEndOptions: true)
        XCTAssertTrue(serve.helpOrVersionAsked(in: ["-m", "raw", "-vh", "cat"]).help, "a value is not COMMAND")
        XCTAssertTrue(serve.helpOrVersionAsked(in: ["--mode", "raw", "--help"]).help)
        XCTAssertFalse(serve.helpOrVersionAsked(in: ["-vm", "raw", "cat", "-h"]).help, "-h is COMMAND's")
        XCTAssertFalse(serve.helpOrVersionAsked(in: ["cat", "--version"]).version)
    }

    func testRepeatedValuesKeepOrder() throws {
        let parsed = try spec.parse(["--allow", "A", "--allow=B"])
        XCTAssertEqual(parsed.strings("allow"), ["A", "B"])
        XCTAssertEqual(parsed.string("allow"), "B")
    }

    func testUsageErrors() {
        func message(_ arguments: [String]) -> String? {
            do {
                _ = try spec.parse(arguments)
                return nil
            } catch {
                return error.message
            }
        }
        XCTAssertEqual(message(["--nope"]), "unknown option '--nope'")
        XCTAssertEqual(message(["--decod"]), "unknown option '--decod' (did you mean '--decode'?)")
        XCTAssertEqual(message(["--timeot", "1"]), "unknown option '--timeot' (did you mean '--timeout'?)")
        XCTAssertEqual(message(["-x"]), "unknown option '-x'")
        XCTAssertEqual(message(["--code"]), "option '--code' needs a value (CODE)")
        XCTAssertEqual(message(["-dc"]), "option '-c' needs a value (CODE)")
        XCTAssertEqual(message(["--decode=yes"]), "option '--decode' takes no value")
        XCTAssertEqual(message(["a", "b", "c"]), "unexpected operand 'c'")
        XCTAssertNil(message(["a", "b"]))
    }

    func testRefuseNamesTheFirstConflictingOptionGiven() throws {
        let parsed = try spec.parse(["-v", "--timeout", "3", "-c", "T"])
        XCTAssertNoThrow(try parsed.refuse(["decode", "allow"], "is for decoding"))
        XCTAssertThrowsError(try parsed.refuse(["decode", "code", "timeout"], "cannot be used with --read")) { error in
            XCTAssertEqual((error as? UsageError)?.message, "--code cannot be used with --read")
        }
    }

    func testTypedValues() throws {
        let parsed = try spec.parse(["--timeout", "abc", "--code", "12"])
        XCTAssertThrowsError(try parsed.seconds("timeout"))
        XCTAssertEqual(try parsed.int("code", in: 1...20), 12)
        XCTAssertThrowsError(try parsed.int("code", in: 1...10))
        XCTAssertThrowsError(try spec.parse(["--timeout", "-1"]).seconds("timeout"))
        XCTAssertThrowsError(try spec.parse(["--timeout", "nan"]).seconds("timeout"))
        for odd in ["0x1p3", "1e3", "inf", "+", ".", ""] {
            XCTAssertThrowsError(try spec.parse(["--timeout=" + odd]).seconds("timeout"), odd)
        }
        for (text, value) in [("2.5", 2.5), ("10", 10.0), (".5", 0.5), ("3.", 3.0)] {
            XCTAssertEqual(try spec.parse(["--timeout", text]).seconds("timeout"), value, text)
        }
        // choice() takes its words from the OptionSpec.
        let modes = CommandSpec(name: "t", usage: [], summary: "",
                                options: [OptionSpec("mode", value: "M", choices: ["pull", "push"], help: "m")])
        XCTAssertEqual(try modes.parse(["--mode", "push"]).choice("mode"), "push")
        XCTAssertNil(try modes.parse([]).choice("mode"))
        XCTAssertThrowsError(try modes.parse(["--mode=Push"]).choice("mode")) { error in
            XCTAssertEqual((error as? UsageError)?.message, "--mode wants one of pull, push, not 'Push'")
        }
        XCTAssertEqual(try modes.parse(["--mode=Push"]).choice("mode", ignoringCase: true), "push")
        XCTAssertThrowsError(try modes.parse(["--mode=pus"]).choice("mode", ignoringCase: true))
    }

    func testByteCounts() {
        XCTAssertEqual(parseByteCount("4096"), 4096)
        XCTAssertEqual(parseByteCount("64K"), 65536)
        XCTAssertEqual(parseByteCount("1m"), 1 << 20)
        XCTAssertEqual(parseByteCount("2G"), 2 << 30)
        XCTAssertNil(parseByteCount("K"))
        XCTAssertNil(parseByteCount("-1"))
        XCTAssertNil(parseByteCount("1.5M"))
        XCTAssertNil(parseByteCount("99999999999999999999"))
    }

    func testHelpListsEveryOption() {
        let help = spec.helpText
        XCTAssertTrue(help.hasPrefix("usage: tool [options] DEV\n"))
        for option in spec.options {
            XCTAssertTrue(help.contains("--\(option.long)"), option.long)
        }
        XCTAssertTrue(help.contains("-c, --code CODE"))
        XCTAssertTrue(help.contains("    --timeout S"))
    }

    func testAnOpenEndedIntegerRangeIsSaidInWords() {
        let parsed = try! spec.parse(["--timeout", "0"])
        XCTAssertThrowsError(try parsed.int("timeout", in: 1...Int.max)) { error in
            XCTAssertEqual((error as? UsageError)?.message, "--timeout wants a positive integer, not '0'")
        }
        XCTAssertThrowsError(try parsed.int("timeout", in: 5...Int.max)) { error in
            XCTAssertEqual((error as? UsageError)?.message, "--timeout wants an integer of at least 5, not '0'")
        }
        XCTAssertThrowsError(try parsed.int("timeout", in: 1...9)) { error in
            XCTAssertEqual((error as? UsageError)?.message, "--timeout wants an integer from 1 to 9, not '0'")
        }
    }

    func testLongOptionHelpIsWrappedUnderItsColumn() {
        let words = (1...40).map { "word\($0)" }.joined(separator: " ")
        let wordy = CommandSpec(name: "t", usage: [], summary: "", options: [OptionSpec("wordy", help: words)])
        let lines = wordy.helpText.split(separator: "\n", omittingEmptySubsequences: false)
        let first = lines.firstIndex { $0.hasPrefix("      --wordy") }!
        let block = lines[first...].prefix { $0.hasPrefix("      --wordy") || $0.hasPrefix("               ") }
        XCTAssertGreaterThan(block.count, 2)
        XCTAssertTrue(block.allSatisfy { $0.count <= 100 }, "\(block)")
        // Every word once, in order, and the continuation lines start where the help starts.
        let column = block.first!.range(of: "word1")!.lowerBound.utf16Offset(in: block.first!)
        XCTAssertTrue(block.dropFirst().allSatisfy { $0.prefix(column).allSatisfy { $0 == " " } && $0.dropFirst(column).first != " " })
        XCTAssertEqual(block.map { $0.dropFirst(column) }.joined(separator: " "), words)
    }
}
