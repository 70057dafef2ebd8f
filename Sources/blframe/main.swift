import BLCommand
import BLFrame

let spec = CommandSpec(
    name: "blframe",
    usage: ["[-c CODE] [--exact | --lines] [-]", "-d [--raw | --json] [--images DIR] [--resync] [-]"],
    summary: """
    Encode standard input as frames of the RaspBLE protocol (default), or decode frames from standard
    input (-d). A frame is one code byte (N, T, U or I), seven decimal digits giving the body length,
    then the body.
    """,
    options: [
        OptionSpec("decode", short: "d", help: "decode frames instead of encoding"),
        OptionSpec("code", short: "c", value: "CODE", choices: ["T", "U", "I", "N", "auto"],
                   help: "frame code when encoding: T (default), U, I, N or auto"),
        OptionSpec("exact", short: "e", help: "keep a trailing newline in T and U bodies"),
        OptionSpec("lines", short: "l", help: "encode each input line as its own frame, as it arrives"),
        OptionSpec("raw", short: "r", help: "decode: write T and U bodies exactly, adding no newline"),
        OptionSpec("images", short: "i", value: "DIR",
                   help: "decode: save I frames as files in DIR and print their paths"),
        OptionSpec("json", short: "j", help: "decode: print one JSON object per frame"),
        OptionSpec("resync", short: "s", help: "decode: skip bytes that do not start a valid frame"),
    ],
    operands: 0...1,
    epilog: """
    It reads standard input only; '-' may name it.

    examples:
      echo hello | blframe                        # T0000005hello
      echo http://host/a.png | blframe -c auto    # U0000017http://host/a.png
      blframe -c T --exact < notes.txt | blframe -d --raw
      blrecv DEV | blframe -d --images ./out

    exit status: 0 success, 64 usage error, 65 malformed input or a body over 9999999 bytes,
    73 an image file (or the --images directory) cannot be created, 74 input/output error.
    """
)

Tool.run(spec) { options in
    if let operand = options.operands.first, operand != "-" {
        throw UsageError("reads standard input only: '-' is the one operand it takes, not '\(operand)'")
    }
    if options.has("decode") {
        try options.refuse(["code", "exact", "lines"], "is for encoding; it cannot be used with -d")
        if options.has("json") { try options.refuse(["raw"], "cannot be used with --json: JSON strings carry bodies exactly") }
        var decoder = try Decoder(options: options)
        try decoder.run()
    } else {
        try options.refuse(["raw", "images", "json", "resync"], "is for decoding; use it with -d")
        if options.has("lines") { try options.refuse(["exact"], "cannot be used with --lines: each line is framed without its newline") }
        try Encoder(options: options).run()
    }
}
