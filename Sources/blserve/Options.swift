import BLBlueZ
import BLCommand
import BLFrame

/// The command line of blserve.
enum BlserveCommand {
    static let spec = CommandSpec(
        name: "blserve",
        usage: ["[options] [--] COMMAND [ARG...]"],
        summary: """
        Serve COMMAND as a Bluetooth LE peripheral through bluetoothd: register a GATT service with
        one read/write/notify characteristic and advertise it. In frame mode (the default) every
        frame a central writes runs COMMAND with the body on stdin; its stdout is the reply, which
        only that central can read. COMMAND runs directly, never through a shell.
        """,
        options: [
            OptionSpec("mode", short: "m", value: "MODE", choices: ["frame", "raw", "stream"],
                       help: "frame (a run per request), raw (a run per central) or stream (one run)"),
            AdapterOption.spec,
            OptionSpec("name", short: "n", value: "NAME", help: "advertised name (default: the host name, shortened to fit)"),
            OptionSpec("service", value: "UUID", help: "service UUID; default: the RaspBLE service"),
            OptionSpec("char", value: "UUID", help: "characteristic UUID; default: the RaspBLE characteristic"),
            OptionSpec("nus", help: "Nordic UART layout: write to 6e400002-…, notify from 6e400003-…"),
            OptionSpec("write-without-response", help: "also accept write commands (refusals become silent drops)"),
            OptionSpec("reply-code", short: "c", value: "CODE", choices: ["auto", "raw", "T", "U", "I"],
                       help: "frame mode: code of the reply: auto (default), raw (stdout as is), T, U or I"),
            OptionSpec("reply", short: "r", value: "HOW", choices: ["pull", "push"],
                       help: "frame mode: pull (queue, notify N0000000; default) or push (notify the reply)"),
            OptionSpec("doorbell", value: "WHEN", choices: ["early", "ready"],
                       help: "frame mode, pull: ring N0000000 once the reply is queued (ready, default, as the seed server) or as a request starts (early; reads wait up to 1 s for the reply)"),
            OptionSpec("chunk", value: "N", help: "notify at most N bytes at a time (20 reproduces seed 002)"),
            OptionSpec("eom", help: "stream and raw modes: notify EOM when a run of COMMAND ends"),
            OptionSpec("handler-timeout", short: "t", value: "S", help: "frame mode: kill COMMAND after S seconds (30)"),
            OptionSpec("prestart", help: "frame mode: start COMMAND ahead of each central's next request"),
            OptionSpec("max-frame", value: "BYTES", help: "frame mode: refuse frames announcing more than BYTES (1M; at most 9999999)"),
            OptionSpec("max-queue", value: "N", help: "frame mode: requests and replies a central may have outstanding (16)"),
            OptionSpec("max-held", value: "BYTES", help: "frame mode: a central's next request waits while BYTES of its replies are unsent (16M)"),
            OptionSpec("max-buffered", value: "BYTES", help: "frame mode: for all centrals together, new frames are refused and requests wait while BYTES are held (32M)"),
            OptionSpec("allow", value: "ADDR", help: "only this central may read and write (repeatable)"),
            OptionSpec("secure", help: "require an encrypted (paired) link; agree to Just Works pairing for centrals --allow lets in"),
            OptionSpec("verbose", short: "v", help: "log one line per request, and the registration, to stderr"),
        ],
        operands: 0...Int.max,
        operandsEndOptions: true,
        epilog: """
        environment of COMMAND: BL_CODE and BL_SIZE (frame mode without --prestart: the request's
        code and body size), BL_DEVICE and BL_MTU (not in stream mode: the central's address and
        ATT MTU, 23 until known), BL_ADAPTER (hci0…).

        --prestart: a request then finds COMMAND started and waiting for its stdin, which saves
        the start of a process from its reply time. COMMAND must do nothing before reading its
        request: one that ends before its request comes turns --prestart off (with a warning),
        and one still waiting when its central leaves or blserve stops is killed.

        examples:
          blserve -n my-raspbverry-pi examples/seed000-handler   # drop-in for the seed 000 server
          blserve -n my-pi -- tr a-z A-Z                         # upper-case every text request
          blserve --reply-code raw -- sh -c 'blframe -c T < /etc/motd'
          blserve --mode raw --nus --allow AA:BB:CC:DD:EE:FF --secure -- /bin/sh -i
          blserve --mode stream --chunk 20 --eom -- cat story.txt

        exit status: 0 after SIGINT, SIGTERM or SIGHUP (or, in stream mode, when COMMAND's output
        was sent), 1 stream mode's COMMAND failed, 64 usage, 69 no adapter of that name, no
        bluetoothd or system bus, COMMAND not found, or not registered within 30 s, 71 signals
        cannot be handled, 74 registration refused, 75 bluetoothd or the system bus did not answer
        in time at start, 130 a second signal while stopping.
        """
    )
}

/// Everything blserve was asked to do, checked.
struct ServeConfig: Equatable {
    enum Mode: String { case frame, raw, stream }
    enum ReplyCode: Equatable { case auto, raw, fixed(FrameCode) }
    enum ReplyStyle: String { case pull, push }
    enum Doorbell: String { case early, ready }

    var mode: Mode = .frame
    var command: [String] = []
    var adapter: String?
    var name: String?
    var serviceUUID = KnownUUIDs.raspBLEService
    /// Where centrals write.
    var writeUUID = KnownUUIDs.raspBLECharacteristic
    /// Where notifications and reads come from (the same as writeUUID unless --nus).
    var notifyUUID = KnownUUIDs.raspBLECharacteristic
    var writeWithoutResponse = false
    var replyCode: ReplyCode = .auto
    var reply: ReplyStyle = .pull
    /// Frame mode, pull: when the doorbell of a reply rings.
    var doorbell: Doorbell = .ready
    var chunk: Int?
    var eom = false
    var handlerTimeout = 30.0
    /// Frame mode: keep COMMAND started ahead for each central's next request.
    var prestart = false
    var maxFrame = 1 << 20
    var maxQueue = 16
    /// Frame mode: reply bytes held for one central (queued for its reads or being notified)
    /// from which its next request waits.
    var maxHeld = 16 << 20
    /// Frame mode: bytes held for all centrals together (requests received, replies unsent)
    /// from which new frames are refused, and reply bytes from which requests wait.
    var maxBuffered = 32 << 20
    /// Upper-case addresses; empty = everyone.
    var allow: Set<String> = []
    var secure = false
    var verbose = false

    var nus: Bool { writeUUID != notifyUUID }

    init() {}

    init(_ options: ParsedOptions) throws(UsageError) {
        if let mode = try options.choice("mode") { self.mode = Mode(rawValue: mode)! }
        command = options.operands
        guard let program = command.first, !program.isEmpty else { throw UsageError("missing COMMAND to run") }
        adapter = try AdapterOption.value(options)
        if let name = options.string("name") {
            guard !name.isEmpty else { throw UsageError("--name wants a non-empty name") }
            self.name = name
        }
        let layout = try GattLayout(options)
        serviceUUID = layout.service
        writeUUID = layout.write
        notifyUUID = layout.notify
        if serviceUUID == writeUUID { throw UsageError("--service and --char must differ") }
        writeWithoutResponse = options.has("write-without-response")
        if let code = try options.choice("reply-code", ignoringCase: true) {
            switch code {
            case "auto": replyCode = .auto
            case "raw": replyCode = .raw
            default: replyCode = .fixed(FrameCode(letter: code.first!)!)
            }
        }
        if let style = try options.choice("reply") { reply = ReplyStyle(rawValue: style)! }
        if let when = try options.choice("doorbell") { doorbell = Doorbell(rawValue: when)! }
        chunk = try options.int("chunk", in: 1...512)
        eom = options.has("eom")
        handlerTimeout = try options.seconds("handler-timeout", in: 0.001...86_400) ?? handlerTimeout
        prestart = options.has("prestart")
        maxFrame = try options.byteCount("max-frame", in: 0...FrameFormat.maxBodySize) ?? maxFrame
        maxQueue = try options.int("max-queue", in: 1...1024) ?? maxQueue
        maxHeld = try options.byteCount("max-held", in: 1...(1 << 40)) ?? maxHeld
        maxBuffered = try options.byteCount("max-buffered", in: 1...(1 << 40)) ?? maxBuffered
        for text in options.strings("allow") {
            guard let address = BluetoothAddress.normalize(text) else {
                throw UsageError("--allow wants an address like AA:BB:CC:DD:EE:FF, not '\(text)'")
            }
            allow.insert(address)
        }
        secure = options.has("secure")
        verbose = options.has("verbose")

        // Options that mean nothing in the chosen mode are mistakes, not silently ignored.
        if mode != .frame {
            try options.refuse(["reply-code", "reply", "doorbell", "handler-timeout", "prestart", "max-frame", "max-queue", "max-held", "max-buffered"],
                               "is for frame mode; it cannot be used with --mode \(mode.rawValue)")
        }
        if mode == .frame, eom { throw UsageError("--eom is for stream and raw modes") }
        if eom, let chunk, chunk < 3 {
            // A central matches "EOM" as one notification: cut in pieces it would not be seen.
            throw UsageError("--eom notifies EOM whole: it needs --chunk 3 or more, not \(chunk)")
        }
        if reply == .push, options.has("doorbell") {
            throw UsageError("--doorbell is for --reply pull (a pushed reply falling back to pull rings once it is queued)")
        }
        if mode == .frame, reply == .pull, chunk != nil {
            // Pulled replies go out as read values, whose size the central's MTU sets.
            throw UsageError("--chunk is for notifications: in frame mode it needs --reply push")
        }
        if mode == .stream, writeWithoutResponse {
            throw UsageError("--write-without-response cannot be used with --mode stream: nothing is written to a stream")
        }
        if mode == .stream, !allow.isEmpty {
            // bluetoothd does not say who subscribes (StartNotify has no device), and the stream
            // goes to every subscriber: --allow could not keep anyone out.
            throw UsageError("--allow cannot be used with --mode stream: subscribers are not known by address")
        }
    }

    /// The characteristics to register: (UUID, Flags), the write one first.
    var characteristics: [(uuid: String, flags: [String])] {
        let read = secure ? ["read", "encrypt-read"] : ["read"]
        var write = secure ? ["write", "encrypt-write"] : ["write"]
        if writeWithoutResponse { write.append("write-without-response") }
        let notify = secure ? ["notify", "encrypt-notify"] : ["notify"]
        if nus {
            // The central writes RX and subscribes to (and may read) TX.
            return [(writeUUID, write), (notifyUUID, read + notify)]
        }
        return [(writeUUID, read + write + notify)]
    }

    /// Bytes per notification: what the link allows (MTU-5, bluez-notes §3.7: a BlueZ central
    /// batches notifications and cuts each to MTU-5; at most 512; 18 on the smallest MTU, 23),
    /// further capped by --chunk. With the MTU unknown, 20 (MTU-3 on a link of 23, what the seed
    /// servers sent; a BlueZ central exchanges a larger MTU as it connects), or a smaller --chunk.
    func notificationSize(mtu: Int?) -> Int {
        guard let mtu else { return min(chunk ?? 20, 20) }
        let link = min(max(mtu, 23) - 5, 512)
        return min(chunk ?? link, link)
    }
}
