import BLBlueZ
import BLCommand

let spec = CommandSpec(
    name: "blsend",
    usage: ["[options] DEV"],
    summary: """
    Write standard input to a GATT characteristic of DEV (an address or an advertised name), as
    it arrives, in pieces that fit the link. Exit 0 only when all of it was written and, for
    write requests, acknowledged.
    """,
    options: CentralTarget.options(nus: "Nordic UART Service: write to 6e400002-…, with --reply notifications from 6e400003-…") + [
        OptionSpec("write", short: "w", value: "TYPE", choices: ["request", "command"],
                   help: "request (acknowledged) or command; default request when allowed"),
        OptionSpec("eom", help: "after standard input ends, write EOM as its own write"),
        OptionSpec("reply", short: "r", help: "subscribe first and copy the replies to stdout, as blrecv does"),
        OptionSpec("count", short: "n", value: "N", help: "with --reply: exit after N replies"),
        OptionSpec("timeout", short: "t", value: "S", help: "with --reply: exit after S seconds without a reply (10)"),
        OptionSpec("progress", short: "p", help: "show bytes and rate on stderr (default on a terminal)"),
    ],
    operands: 1...1,
    epilog: """
    examples:
      echo hi | blframe -c T | blsend my-pi
      echo hi | blframe -c T | blsend --reply --count 1 my-pi | blframe -d
      cat | blframe --lines | blsend AA:BB:CC:DD:EE:FF
      blsend --nus --write command --eom AA:BB:CC:DD:EE:FF < firmware.bin

    exit status: 0 success, 64 usage, 65 value refused by the device as invalid, 69 device or
    characteristic unavailable, 74 I/O error (the message says how many bytes were confirmed),
    75 timeout, 77 not permitted (by the device or bluetoothd), 130 interrupted.
    """
)

Tool.run(spec) { options in
    let target = try CentralTarget(options)
    var send = Send.Options()
    send.writeType = try options.choice("write").map { RemoteCharacteristic.WriteType(rawValue: $0)! }
    send.eom = options.has("eom")
    // Replies written to the terminal the progress line is drawn on would be drawn over.
    send.progress = options.has("progress")
        || (FileIO.isTerminal(2) && !(options.has("reply") && FileIO.isTerminal(1)))
    if options.has("reply") {
        var receive = NotificationReceiver.Options()
        receive.count = try options.int("count", in: 1...Int.max)
        receive.silence = try options.seconds("timeout", in: 0.001...86_400) ?? 10
        send.reply = receive
        try Tool.requireWritableStdout()
    } else if options.has("count") || options.has("timeout") {
        throw UsageError("--count and --timeout apply to replies; add --reply")
    }
    // Said before a scan or a connection, in the words of a failure after them.
    if let problem = FileIO.unreadable(0) { throw ToolError(.ioError, "stdin: \(problem) (0 bytes confirmed)") }
    try Send(target: target, options: send).run()
}
