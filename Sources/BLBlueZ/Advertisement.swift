#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import BLCommand
import BLDBus

/// A connectable, discoverable LE advertisement for `LEAdvertisingManager1.RegisterAdvertisement`
/// (bluez-notes §4): an `org.bluez.LEAdvertisement1` object whose properties bluetoothd reads with
/// `Properties.GetAll`.
///
/// The 31-byte legacy budget: Flags (3) + one 128-bit service UUID (18) = 21 bytes of advertising
/// data; bluetoothd puts `LocalName` in the scan response, where up to 29 bytes of name fit.
/// ``localNameLimit`` keeps the name within that.
///
/// Not `Sendable`.
public final class LEAdvertisement {
    public let path: String
    public let serviceUUIDs: [String]
    public let localName: String?
    public let tree: ExportedObjectTree
    /// Called when bluetoothd releases the advertisement (it removed it by itself).
    public var onRelease: (() -> Void)?
    /// Decides whether a call may be answered at all (e.g. only calls from bluetoothd's unique
    /// name): a refused one (`Release`, or reading the properties) gets NotPermitted and is not
    /// acted on. Default: every call.
    public var acceptCall: (IncomingCall) -> Bool = { _ in true }

    /// The longest name, in UTF-8 bytes, that fits the scan response (31 - 2 bytes of AD header).
    public static let localNameLimit = 29

    public init(path: String = "/org/blpipe/advertisement0", serviceUUIDs: [String], localName: String?) {
        self.path = path
        self.serviceUUIDs = serviceUUIDs
        self.localName = localName.map { Self.shorten($0, toBytes: Self.localNameLimit) }
        tree = ExportedObjectTree(root: path)
        tree.providesObjectManager = false
        let interface = ExportedInterface(BlueZ.advertisementInterface)
            .property("Type") { .string("peripheral") }
            .property("ServiceUUIDs") { [serviceUUIDs] in .stringArray(serviceUUIDs) }
            .property("Discoverable") { .bool(true) }
            .method("Release", inSignature: "", outSignature: "") { [weak self] call in
                call.reply([])
                self?.onRelease?()
            }
        if let name = self.localName {
            interface.property("LocalName") { .string(name) }
        }
        try? tree.add(ExportedObject(path: path, interfaces: [interface]), announce: false)
        tree.admitOnly { [weak self] call in self?.acceptCall(call) }
    }

    /// `text` cut to at most `limit` UTF-8 bytes, at a character boundary.
    public static func shorten(_ text: String, toBytes limit: Int) -> String {
        if text.utf8.count <= limit { return text }
        var out = ""
        var used = 0
        for ch in text {
            let n = String(ch).utf8.count
            if used + n > limit { break }
            out.append(ch)
            used += n
        }
        return out
    }

    /// This machine's host name up to its first dot ("pi" for "pi.local"), or "blserve".
    public static func defaultLocalName() -> String {
        var buffer = [UInt8](repeating: 0, count: 256)
        let rc = buffer.withUnsafeMutableBufferPointer { b in
            b.withMemoryRebound(to: CChar.self) { gethostname($0.baseAddress!, 255) }
        }
        guard rc == 0 else { return "blserve" }
        let text = String(decoding: buffer.prefix { $0 != 0 }, as: UTF8.self)
        let name = text.split(separator: ".").first.map(String.init) ?? ""
        return name.isEmpty ? "blserve" : name
    }
}
