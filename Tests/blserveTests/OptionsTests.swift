import XCTest
import Glibc
import BLBlueZ
import BLCommand
import BLFrame
@testable import blserve

final class OptionsTests: XCTestCase {
    private func config(_ args: [String]) throws -> ServeConfig {
        try ServeConfig(BlserveCommand.spec.parse(args))
    }

    private func usageError(_ args: [String], file: StaticString = #filePath, line: UInt = #line) -> String {
        do {
            _ = try config(args)
            XCTFail("accepted \(args)", file: file, line: line)
            return ""
        } catch let error as UsageError {
            return error.message
        } catch {
            XCTFail("unexpected \(error)", file: file, line: line)
            return ""
        }
    }

    func testDefaultsAreTheSeed000Server() throws {
        let c = try config(["handler"])
        XCTAssertEqual(c.mode, .frame)
        XCTAssertEqual(c.command, ["handler"])
        XCTAssertEqual(c.serviceUUID, "54f06857-695e-47e4-aea8-c78184ad6c75")
        XCTAssertEqual(c.writeUUID, "30a5f1bb-61dc-45f0-9c52-2218d080fa77")
        XCTAssertEqual(c.notifyUUID, c.writeUUID)
        XCTAssertEqual(c.replyCode, .auto)
        XCTAssertEqual(c.reply, .pull)
        XCTAssertEqual(c.doorbell, .ready, "the seed server's order: the reply queued, then N0000000")
        XCTAssertEqual(c.handlerTimeout, 30)
        XCTAssertEqual(c.maxFrame, 1 << 20)
        XCTAssertTrue(c.allow.isEmpty)
        XCTAssertEqual(c.characteristics.map(\.flags), [["read", "write", "notify"]])
    }

    func testTheCommandKeepsItsOwnOptions() throws {
        XCTAssertEqual(try config(["-v", "tr", "-d", "x"]).command, ["tr", "-d", "x"])
        XCTAssertEqual(try config(["--", "-weird-name", "--help"]).command, ["-weird-name", "--help"])
        XCTAssertTrue(try config(["-v", "--", "cat"]).verbose)
    }

    func testLayoutsAndFlags() throws {
        let nus = try config(["--nus", "--write-without-response", "--mode", "raw", "sh"])
        // Nordic's published UUIDs (not the code's own constants): centrals write to RX, 0002.
        XCTAssertEqual(nus.serviceUUID, "6e400001-b5a3-f393-e0a9-e50e24dcca9e")
        XCTAssertEqual(nus.characteristics.map(\.uuid), ["6e400002-b5a3-f393-e0a9-e50e24dcca9e", "6e400003-b5a3-f393-e0a9-e50e24dcca9e"])
        XCTAssertEqual(nus.characteristics.map(\.flags), [["write", "write-without-response"], ["read", "notify"]])
        let secure = try config(["--secure", "--service", "180D", "--char", "0x2A37", "cat"])
        XCTAssertEqual(secure.serviceUUID, "0000180d-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(secure.writeUUID, "00002a37-0000-1000-8000-00805f9b34fb")
        XCTAssertEqual(secure.characteristics[0].flags,
                       ["read", "encrypt-read", "write", "encrypt-write", "notify", "encrypt-notify"])
    }

    func testValuesAreChecked() throws {
        let c = try config(["--max-frame", "64K", "--handler-timeout", "2.5", "--reply-code", "I", "--reply", "push",
                            "--allow", "aa:bb:cc:dd:ee:ff", "--allow", "11:22:33:44:55:66", "--max-queue", "3", "cat"])
        XCTAssertEqual(c.maxFrame, 65536)
        XCTAssertEqual(c.handlerTimeout, 2.5)
        XCTAssertEqual(c.replyCode, .fixed(.image))
        XCTAssertEqual(c.reply, .push)
        XCTAssertEqual(c.allow, ["AA:BB:CC:DD:EE:FF", "11:22:33:44:55:66"])
        XCTAssertEqual(c.maxQueue, 3)
        XCTAssertEqual(try config(["--max-frame", "9999999", "cat"]).maxFrame, FrameFormat.maxBodySize)
        XCTAssertEqual(try config(["cat"]).maxHeld, 16 << 20)
        XCTAssertEqual(try config(["--max-held", "2G", "cat"]).maxHeld, 2 << 30)
    }

    func testUsageErrors() {
        XCTAssertEqual(usageError([]), "missing COMMAND to run")
        XCTAssertEqual(usageError(["-v", "--", ""]), "missing COMMAND to run")
        XCTAssertTrue(usageError(["--max-frame", "10000000", "cat"]).contains("--max-frame"))
        XCTAssertTrue(usageError(["--max-frame", "1X", "cat"]).contains("--max-frame"))
        XCTAssertTrue(usageError(["--allow", "AA:BB", "cat"]).contains("--allow"))
        XCTAssertTrue(usageError(["--nus", "--char", "1234", "cat"]).contains("--nus"))
        XCTAssertTrue(usageError(["--service", "nope", "cat"]).contains("--service"))
        XCTAssertTrue(usageError(["--mode", "tcp", "cat"]).contains("--mode"))
        XCTAssertTrue(usageError(["--chunk", "0", "cat"]).contains("--chunk"))
        XCTAssertTrue(usageError(["--chunk", "513", "cat"]).contains("--chunk"))
        XCTAssertTrue(usageError(["--handler-timeout", "0", "cat"]).contains("--handler-timeout"))
        XCTAssertTrue(usageError(["--mode", "stream", "--reply", "push", "cat"]).contains("frame mode"))
        XCTAssertTrue(usageError(["--mode", "raw", "--max-frame", "1K", "cat"]).contains("frame mode"))
        XCTAssertTrue(usageError(["--mode", "raw", "--prestart", "cat"]).contains("--prestart"))
        XCTAssertTrue(usageError(["--mode", "stream", "--max-held", "1M", "cat"]).contains("--max-held"))
        XCTAssertTrue(usageError(["--max-held", "0", "cat"]).contains("--max-held"))
        XCTAssertTrue(try config(["--prestart", "cat"]).prestart)
        XCTAssertEqual(try config(["--doorbell", "ready", "cat"]).doorbell, .ready)
        XCTAssertTrue(usageError(["--doorbell", "late", "cat"]).contains("--doorbell"))
        XCTAssertTrue(usageError(["--reply", "push", "--doorbell", "early", "cat"]).contains("--reply pull"))
        XCTAssertTrue(usageError(["--mode", "raw", "--doorbell", "ready", "cat"]).contains("frame mode"))
        XCTAssertTrue(usageError(["--eom", "cat"]).contains("--eom"))
        // Options a mode would not use are refused, not ignored.
        XCTAssertTrue(usageError(["--chunk", "20", "cat"]).contains("--reply push"))
        XCTAssertNoThrow(try config(["--mode", "raw", "--chunk", "20", "cat"]))
        for mode in ["raw", "stream"] {
            XCTAssertTrue(usageError(["--mode", mode, "--eom", "--chunk", "2", "cat"]).contains("EOM whole"), mode)
            XCTAssertNoThrow(try config(["--mode", mode, "--eom", "--chunk", "3", "cat"]), mode)
            XCTAssertNoThrow(try config(["--mode", mode, "--chunk", "1", "cat"]), mode)
        }
        XCTAssertTrue(usageError(["--mode", "stream", "--write-without-response", "cat"]).contains("--write-without-response"))
        XCTAssertNoThrow(try config(["--mode", "raw", "--write-without-response", "cat"]))
        XCTAssertTrue(usageError(["--mode", "stream", "--allow", "AA:BB:CC:DD:EE:FF", "cat"]).contains("--allow"))
        XCTAssertNoThrow(try config(["--mode", "raw", "--allow", "AA:BB:CC:DD:EE:FF", "cat"]))
        XCTAssertTrue(usageError(["--name", "", "cat"]).contains("--name"))
        XCTAssertTrue(usageError(["--service", "180d", "--char", "180d", "cat"]).contains("differ"))
    }

    func testNotificationSize() throws {
        let plain = try config(["cat"])
        XCTAssertEqual(plain.notificationSize(mtu: nil), 20)
        // MTU-5: a BlueZ central cuts each notification to that (multiple-handle notifications).
        XCTAssertEqual(plain.notificationSize(mtu: 23), 18)
        XCTAssertEqual(plain.notificationSize(mtu: 0), 18, "an MTU below ATT's smallest is taken as 23")
        XCTAssertEqual(plain.notificationSize(mtu: 185), 180)
        XCTAssertEqual(plain.notificationSize(mtu: 517), 512)
        let chunked = try config(["--mode", "stream", "--chunk", "20", "cat"])
        XCTAssertEqual(chunked.notificationSize(mtu: 517), 20)
        XCTAssertEqual(chunked.notificationSize(mtu: nil), 20)
        // With no MTU known, a --chunk larger than any link carries is not used.
        XCTAssertEqual(try config(["--mode", "stream", "--chunk", "244", "cat"]).notificationSize(mtu: nil), 20)
        XCTAssertEqual(try config(["--mode", "stream", "--chunk", "10", "cat"]).notificationSize(mtu: nil), 10)
        XCTAssertEqual(try config(["--reply", "push", "--chunk", "100", "cat"]).notificationSize(mtu: 50), 45)
    }

    func testAdvertisedNameFitsTheScanResponse() {
        XCTAssertEqual(LEAdvertisement.shorten("my-raspbverry-pi", toBytes: 29), "my-raspbverry-pi")
        let long = String(repeating: "x", count: 40)
        XCTAssertEqual(LEAdvertisement.shorten(long, toBytes: 29).utf8.count, 29)
        // Never cuts a character in half.
        XCTAssertEqual(LEAdvertisement.shorten(String(repeating: "あ", count: 12), toBytes: 29), String(repeating: "あ", count: 9))
        // The default is this machine's host name up to its first dot, as uname(2) gives it.
        var host = utsname()
        XCTAssertEqual(uname(&host), 0)
        let nodename = withUnsafeBytes(of: host.nodename) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        XCTAssertEqual(LEAdvertisement.defaultLocalName(), String(nodename.split(separator: ".").first ?? "blserve"))
        // The advertisement shortens what it is given, and only what is too long.
        XCTAssertEqual(LEAdvertisement(serviceUUIDs: [], localName: long).localName, String(repeating: "x", count: 29))
        XCTAssertEqual(LEAdvertisement(serviceUUIDs: [], localName: "pi").localName, "pi")
        XCTAssertNil(LEAdvertisement(serviceUUIDs: [], localName: nil).localName)
    }
}
