import BLBlueZ
import BLCommand

let spec = CommandSpec(
    name: "blscan",
    usage: ["[options]"],
    summary: """
    Scan for Bluetooth LE devices and print one line per device as it is found: address, address
    type, RSSI, name and advertised service UUIDs, separated by tabs.
    """,
    options: [
        AdapterOption.spec,
        OptionSpec("service", short: "s", value: "UUID", help: "only devices advertising this service (16- or 128-bit UUID)"),
        OptionSpec("name", value: "NAME", help: "only devices with this name (or alias in bluetoothd)"),
        OptionSpec("rssi-min", value: "DBM", help: "only devices heard at least this strongly, e.g. -70"),
        OptionSpec("timeout", short: "t", value: "S", help: "scan for S seconds (10)"),
        OptionSpec("json", short: "j", help: "print one JSON object per line"),
        OptionSpec("first", short: "1", help: "print the first match and exit (69 if none in time)"),
    ],
    epilog: """
    examples:
      blscan --service 54f06857-695e-47e4-aea8-c78184ad6c75 --first
      blscan --rssi-min -70 --json --timeout 30

    exit status: 0 success, 64 usage, 69 no adapter (or, with --first, no match in time),
    74 output error, 75 bluetoothd or the system bus did not answer in time, 77 not permitted,
    130 interrupted.
    """
)

Tool.run(spec) { options in
    var scan = Scan()
    scan.adapterName = try AdapterOption.value(options)
    if let text = options.string("service") {
        guard let uuid = BluetoothUUID.normalize(text) else {
            throw UsageError("--service wants a 16-bit (180d) or 128-bit UUID, not '\(text)'")
        }
        scan.service = uuid
    }
    if let name = options.string("name") {
        guard !name.isEmpty else { throw UsageError("--name wants a non-empty name") }
        scan.name = name
    }
    if let text = options.string("rssi-min") {
        guard let dbm = Int(text), (-127...20).contains(dbm) else {
            throw UsageError("--rssi-min wants dBm from -127 to 20, not '\(text)'")
        }
        scan.rssiMin = dbm
    }
    scan.timeout = try options.seconds("timeout", in: 0...86_400) ?? 10
    scan.json = options.has("json")
    scan.first = options.has("first")
    try Tool.requireWritableStdout()
    try scan.run()
}
