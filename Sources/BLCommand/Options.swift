/// Command-line option parsing shared by every tool: a table of options in, parsed values out.
///
/// Accepted forms: `--name value`, `--name=value`, `-x value`, `-xvalue`, bundled short flags
/// (`-dv`), `--` to end options, and `-` as an ordinary operand (standard input). Options and
/// operands may be mixed unless the tool asks for operands to stop option parsing (as `blserve`
/// does for its command).
public struct OptionSpec: Sendable {
    /// Long name without dashes, e.g. "code". Also the key for reading the value back.
    public var long: String
    /// Optional one-letter short name.
    public var short: Character?
    /// Placeholder for the value in help (e.g. "CODE"); nil for a flag.
    public var value: String?
    /// One-line help text.
    public var help: String
    /// The words the value must be one of (read back with ``ParsedOptions/choice(_:)``); empty
    /// for a free value.
    public var choices: [String]

    public init(_ long: String, short: Character? = nil, value: String? = nil, choices: [String] = [],
                help: String) {
        self.long = long
        self.short = short
        self.value = value
        self.help = help
        self.choices = choices
    }

    public var takesValue: Bool { value != nil }
}

/// Everything a tool says about itself: the option table plus the text for `--help`.
public struct CommandSpec: Sendable {
    public var name: String
    /// Usage lines without the tool name, e.g. "[-c CODE] [--lines]".
    public var usage: [String]
    /// One paragraph saying what the tool does.
    public var summary: String
    public var options: [OptionSpec]
    /// The range of operand counts accepted.
    public var operands: ClosedRange<Int>
    /// When true, the first operand ends option parsing (everything after it is an operand), as
    /// for a command line to run.
    public var operandsEndOptions: Bool
    /// Extra help paragraphs (examples).
    public var epilog: String

    public init(name: String, usage: [String], summary: String, options: [OptionSpec],
                operands: ClosedRange<Int> = 0...0, operandsEndOptions: Bool = false, epilog: String = "") {
        self.name = name
        self.usage = usage
        self.summary = summary
        // --help and --version are common to every tool.
        self.options = options + [
            OptionSpec("help", short: "h", help: "show this help and exit"),
            OptionSpec("version", help: "show the version and exit"),
        ]
        self.operands = operands
        self.operandsEndOptions = operandsEndOptions
        self.epilog = epilog
    }

    public func option(long: String) -> OptionSpec? { options.first { $0.long == long } }
    public func option(short: Character) -> OptionSpec? { options.first { $0.short == short } }

    /// Whether a command line that did not parse still asks for `--help` (also as `-h`, alone or
    /// in a bundle of flags such as `-vh`) or `--version`: those win over other mistakes on the
    /// same line. Only words before a `--` count, and for a tool whose first operand ends its
    /// options, only those before that operand. The value of an option that takes one is skipped
    /// (`--images -h` still asks for help, as the parser refuses an option as a value); in a
    /// bundle, the letters after one that takes a value are that value.
    public func helpOrVersionAsked(in arguments: [String]) -> (help: Bool, version: Bool) {
        var help = false, version = false
        var valueNext = false
        for word in arguments {
            if valueNext && !word.hasPrefix("-") { valueNext = false; continue }
            valueNext = false
            if word == "--" || (operandsEndOptions && !word.hasPrefix("-")) { break }
            if word == "--help" { help = true }
            if word == "--version" { version = true }
            if word.hasPrefix("--") {
                if let spec = option(long: String(word.dropFirst(2))), spec.takesValue { valueNext = true }
                continue
            }
            guard word.hasPrefix("-") else { continue }
            var letters = word.dropFirst()
            while let letter = letters.first {
                letters = letters.dropFirst()
                if letter == "h" { help = true }
                guard let spec = option(short: letter) else { break }
                if spec.takesValue {
                    valueNext = letters.isEmpty
                    break
                }
            }
        }
        return (help, version)
    }
}

/// A usage error: bad options or operands. Exit status 64.
public struct UsageError: Error, Equatable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The result of parsing: option values by long name, in command-line order, and the operands.
public struct ParsedOptions: Sendable {
    public private(set) var values: [String: [String]] = [:]
    /// Flags and options in the order given, for tools where order matters.
    public private(set) var order: [String] = []
    public var operands: [String] = []
    /// The spec's fixed sets of values, by long name.
    var choicesByName: [String: [String]] = [:]

    mutating func add(_ long: String, _ value: String) {
        values[long, default: []].append(value)
        order.append(long)
    }

    /// True when the flag or option was given at least once.
    public func has(_ long: String) -> Bool { values[long] != nil }
    /// How many times it was given (`-vv` counts 2).
    public func count(_ long: String) -> Int { values[long]?.count ?? 0 }
    /// The last value given, or nil.
    public func string(_ long: String) -> String? { values[long]?.last }
    /// Every value given, in order.
    public func strings(_ long: String) -> [String] { values[long] ?? [] }

    /// Refuses options that make no sense together with what else was chosen: throws
    /// "--NAME REASON" for the first of `names` that was given.
    ///
    ///     if mode != .frame { try options.refuse(["reply"], "is for frame mode") }
    public func refuse(_ names: [String], _ reason: String) throws(UsageError) {
        if let name = names.first(where: has) { throw UsageError("--\(name) \(reason)") }
    }

    /// An integer value within `range`, or nil when the option is absent.
    public func int(_ long: String, in range: ClosedRange<Int>) throws(UsageError) -> Int? {
        guard let text = string(long) else { return nil }
        guard let value = Int(text), range.contains(value) else {
            let wanted = range.upperBound < Int.max ? "an integer from \(range.lowerBound) to \(range.upperBound)"
                : range.lowerBound == 1 ? "a positive integer" : "an integer of at least \(range.lowerBound)"
            throw UsageError("--\(long) wants \(wanted), not '\(text)'")
        }
        return value
    }

    /// A byte count within `range`: digits with an optional K, M or G suffix (powers of 1024).
    public func byteCount(_ long: String, in range: ClosedRange<Int>) throws(UsageError) -> Int? {
        guard let text = string(long) else { return nil }
        guard let value = parseByteCount(text), range.contains(value) else {
            throw UsageError("--\(long) wants a byte count from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
        }
        return value
    }

    /// A duration in seconds (decimals allowed) within `range`, or nil when absent.
    public func seconds(_ long: String, in range: ClosedRange<Double> = 0...86_400) throws(UsageError) -> Double? {
        guard let text = string(long) else { return nil }
        // Plain decimals only: Double would also take "1e3", "0x1p3" and "inf".
        let plain = text.utf8.contains { $0 >= 0x30 && $0 <= 0x39 }
            && text.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E || $0 == 0x2D || $0 == 0x2B }
        guard plain, let value = Double(text), value.isFinite, range.contains(value) else {
            throw UsageError("--\(long) wants seconds from \(formatNumber(range.lowerBound)) to \(formatNumber(range.upperBound)), not '\(text)'")
        }
        return value
    }

    /// One of the option's ``OptionSpec/choices``, or nil when absent. With `ignoringCase`
    /// (frame codes: `-c t` as `-c T`, as blframe takes them) the choice is returned as the
    /// OptionSpec spells it.
    public func choice(_ long: String, ignoringCase: Bool = false) throws(UsageError) -> String? {
        guard let text = string(long) else { return nil }
        let choices = choicesByName[long] ?? []
        precondition(!choices.isEmpty, "--\(long) has no choices in its OptionSpec")
        let chosen = ignoringCase ? choices.first { $0.lowercased() == text.lowercased() } : choices.first { $0 == text }
        guard let chosen else {
            throw UsageError("--\(long) wants one of \(choices.joined(separator: ", ")), not '\(text)'")
        }
        return chosen
    }
}

/// Parses "4096", "64K", "1M", "2G" (powers of 1024). Nil when malformed or too large.
public func parseByteCount(_ text: String) -> Int? {
    var digits = Substring(text)
    var unit = 1
    switch digits.last {
    case "k", "K": unit = 1 << 10
    case "m", "M": unit = 1 << 20
    case "g", "G": unit = 1 << 30
    default: break
    }
    if unit != 1 { digits = digits.dropLast() }
    guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(digits) else { return nil }
    let (product, overflow) = n.multipliedReportingOverflow(by: unit)
    return overflow ? nil : product
}

func formatNumber(_ value: Double) -> String {
    value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
}

extension CommandSpec {
    /// Parses `arguments` (without the program name).
    public func parse(_ arguments: [String]) throws(UsageError) -> ParsedOptions {
        var result = ParsedOptions()
        for option in options where !option.choices.isEmpty { result.choicesByName[option.long] = option.choices }
        var index = 0
        var optionsEnded = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if optionsEnded || argument == "-" || !argument.hasPrefix("-") {
                result.operands.append(argument)
                if operandsEndOptions { optionsEnded = true }
                continue
            }
            if argument == "--" {
                optionsEnded = true
                continue
            }
            if argument.hasPrefix("--") {
                let body = argument.dropFirst(2)
                let name: Substring
                var inlineValue: String?
                if let eq = body.firstIndex(of: "=") {
                    name = body[..<eq]
                    inlineValue = String(body[body.index(after: eq)...])
                } else {
                    name = body
                }
                guard let spec = option(long: String(name)) else {
                    throw UsageError("unknown option '--\(name)'" + suggestion(for: String(name)))
                }
                if spec.takesValue {
                    if let inlineValue {
                        result.add(spec.long, inlineValue)
                    } else if index < arguments.count {
                        try refuseOptionAsValue(arguments[index], for: "--\(spec.long)", spec)
                        result.add(spec.long, arguments[index])
                        index += 1
                    } else {
                        throw UsageError("option '--\(spec.long)' needs a value (\(spec.value!))")
                    }
                } else {
                    if inlineValue != nil { throw UsageError("option '--\(spec.long)' takes no value") }
                    result.add(spec.long, "")
                }
                continue
            }
            // One or more short options: -x, -xVALUE, -x VALUE, -abc.
            var letters = argument.dropFirst()
            while let letter = letters.first {
                letters = letters.dropFirst()
                guard let spec = option(short: letter) else {
                    throw UsageError("unknown option '-\(letter)'")
                }
                if spec.takesValue {
                    if !letters.isEmpty {
                        result.add(spec.long, String(letters))
                    } else if index < arguments.count {
                        try refuseOptionAsValue(arguments[index], for: "-\(letter)", spec)
                        result.add(spec.long, arguments[index])
                        index += 1
                    } else {
                        throw UsageError("option '-\(letter)' needs a value (\(spec.value!))")
                    }
                    break
                }
                result.add(spec.long, "")
            }
        }
        if !operands.contains(result.operands.count) {
            if result.operands.count < operands.lowerBound {
                throw UsageError(operands.lowerBound == 1 && operands.upperBound == 1
                    ? "missing operand" : "too few operands")
            }
            throw UsageError("unexpected operand '\(result.operands[operands.upperBound])'")
        }
        return result
    }

    /// A value given as the next argument that is one of this tool's options (or `--`) means
    /// the value was left out (`--images --json`): taking it would quietly do something else.
    /// Attached (`--images=--json`, `-i--json`) it is taken as it is. A negative number is a
    /// value even where it is also an option (`blscan --rssi-min -1`, where `-1` is `--first`).
    private func refuseOptionAsValue(_ next: String, for given: String, _ spec: OptionSpec) throws(UsageError) {
        let isOption: Bool
        let digits = next.utf8.dropFirst()
        if next.utf8.first == UInt8(ascii: "-"), let first = digits.first, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first),
           digits.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || $0 == UInt8(ascii: ".") }) {
            isOption = false
        } else if next == "--" {
            isOption = true
        } else if next.hasPrefix("--") {
            isOption = option(long: String(next.dropFirst(2).prefix { $0 != "=" })) != nil
        } else {
            isOption = next.count == 2 && next.hasPrefix("-") && option(short: next.last!) != nil
        }
        if isOption {
            throw UsageError("option '\(given)' needs a value (\(spec.value!)), not the option '\(next)'"
                             + " (write \(given.hasPrefix("--") ? given + "=" : given)\(next) for a value that looks like one)")
        }
    }

    /// " (did you mean '--lines'?)" when a known option is close to `name`.
    func suggestion(for name: String) -> String {
        let candidates = options.map(\.long)
        var best: (name: String, distance: Int)?
        // Short names tolerate one typo, longer ones two.
        let tolerance = name.count <= 4 ? 1 : 2
        for candidate in candidates {
            let distance = candidate.hasPrefix(name) && !name.isEmpty ? 1 : editDistance(name, candidate)
            if distance <= tolerance, best == nil || distance < best!.distance { best = (candidate, distance) }
        }
        return best.map { " (did you mean '--\($0.name)'?)" } ?? ""
    }
}

/// Levenshtein distance over Unicode scalars; option names are short.
func editDistance(_ a: String, _ b: String) -> Int {
    let a = Array(a.unicodeScalars), b = Array(b.unicodeScalars)
    if a.isEmpty { return b.count }
    if b.isEmpty { return a.count }
    var previous = Array(0...b.count)
    var current = [Int](repeating: 0, count: b.count + 1)
    for i in 1...a.count {
        current[0] = i
        for j in 1...b.count {
            let cost = a[i - 1] == b[j - 1] ? 0 : 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
        }
        swap(&previous, &current)
    }
    return previous[b.count]
}
