import BLBlueZ
import BLCommand

let spec = CommandSpec(
    name: "blrecv",
    usage: ["[options] DEV"],
    summary: """
    Write the notifications of a GATT characteristic of DEV (an address or an advertised name) to
    standard output as they arrive. A notification that is exactly N0000000 (the RaspBLE "reply is
    ready" doorbell) is followed by reads of the characteristic until one returns an empty value,
    and every value read is written in order.
    """,
    options: CentralTarget.options(nus: "Nordic UART Service: its TX characteristic, 6e400003-…") + [
        OptionSpec("no-pull", help: "do not read after an N0000000 notification"),
        OptionSpec("read", short: "r", help: "read the value once (whole, through offsets), write it and exit"),
        OptionSpec("eom", help: "exit 0 at a notification equal to EOM (not written)"),
        OptionSpec("count", short: "n", value: "N", help: "exit after N replies (frames, when the bytes are frames)"),
        OptionSpec("timeout", short: "t", value: "S", help: "exit after S seconds without a notification (75 if none came)"),
        OptionSpec("buffer", value: "SIZE", help: "output held for a slow reader before reading waits (default 16M)"),
    ],
    operands: 1...1,
    epilog: """
    examples:
      blrecv my-pi | blframe -d --images ./out
      blrecv --nus --eom AA:BB:CC:DD:EE:FF > received.txt
      blrecv --read --service bf9cb85f-620c-4a67-bdd2-1a64213f74ca \\
          --char 5f83e23f-bca1-42b3-b6f2-ea82be46a93d my-ble

    exit status: 0 success (also when the reader of stdout goes away, as with | head, and when
    the device disconnects after data unless --eom waits for EOM), 64 usage, 65 value refused
    by the device as invalid, 69 device or characteristic unavailable, 74 I/O error (with --eom:
    disconnected before EOM; without it: disconnected inside a frame), 75 timeout (also silence
    inside a frame), 77 not permitted (by the device or bluetoothd), 130 interrupted.
    """
)

Tool.run(spec) { options in
    let target = try CentralTarget(options)
    var receive = NotificationReceiver.Options()
    receive.pull = !options.has("no-pull")
    receive.eom = options.has("eom")
    receive.count = try options.int("count", in: 1...Int.max)
    receive.silence = try options.seconds("timeout", in: 0.001...86_400)
    if options.has("read") {
        try options.refuse(["count", "timeout", "eom", "no-pull", "buffer"], "is for notifications; it cannot be used with --read")
    }
    let buffer = try options.byteCount("buffer", in: 4096...(1 << 30)) ?? QueuedOutput.defaultLimit
    try Tool.requireWritableStdout()
    try Receive(target: target, options: receive, readOnce: options.has("read"), buffer: buffer).run()
}
