import XCTest
import BLCommand
@testable import BLDBus

final class DBusSignalTests: BusTestCase {
    private func emit(_ connection: DBusConnection, path: String = "/sig", member: String, _ args: [DBusValue] = []) throws {
        let m = try DBusMessage.signal(path: path, interface: "org.example.Sig", member: member)
        try m.append(args)
        try connection.send(m)
    }

    func testMatchRuleDeliversAndUnsubscribeStops() throws {
        var pings: [String] = []
        var pongs = 0
        let token = try a.subscribe(sender: b.uniqueName, path: "/sig", interface: "org.example.Sig", member: "Ping") { m in
            XCTAssertEqual(m.kind, .signal)
            XCTAssertEqual(m.sender, self.b.uniqueName)
            pings.append(m.arguments.first?.string ?? "?")
        }
        // Another subscription on the same connection only sees its own signals.
        let other = try a.subscribe(sender: b.uniqueName, interface: "org.example.Sig", member: "Pong") { _ in pongs += 1 }

        try emit(b, member: "Ping", [.string("one")])
        try emit(b, member: "Pong")
        try emit(b, path: "/elsewhere", member: "Ping", [.string("wrong path")])
        runUntil("the ping and pong") { pings.count == 1 && pongs == 1 }
        try roundTrip(b)
        try roundTrip(a)
        XCTAssertEqual(pings, ["one"])
        XCTAssertEqual(pongs, 1)

        a.unsubscribe(token)
        try emit(b, member: "Ping", [.string("two")])
        try emit(b, member: "Pong")
        runUntil("the second pong") { pongs == 2 }
        try roundTrip(b)
        try roundTrip(a)
        XCTAssertEqual(pings, ["one"], "no delivery after unsubscribe")
        a.unsubscribe(other)
    }

    func testWellKnownSenderIsResolvedToItsOwner() throws {
        let c = try DBusConnection(address: bus.address, loop: loop)
        XCTAssertEqual(try b.requestName("org.example.B"), .primaryOwner)
        var fromB: [String] = []
        var anySender: [String] = []
        _ = try a.subscribe(sender: "org.example.B", interface: "org.example.Sig", member: "Ping") { m in
            fromB.append(m.arguments.first?.string ?? "?")
        }
        _ = try a.subscribe(interface: "org.example.Sig", member: "Ping") { m in
            anySender.append(m.arguments.first?.string ?? "?")
        }
        try emit(c, member: "Ping", [.string("from c")])
        try emit(b, member: "Ping", [.string("from b")])
        runUntil("both signals") { anySender.count == 2 }
        XCTAssertEqual(anySender, ["from c", "from b"])
        XCTAssertEqual(fromB, ["from b"], "the sender='org.example.B' subscription must not see c's signal")

        // The name moves to c: signals from c now match, b's no longer.
        try b.releaseName("org.example.B")
        XCTAssertEqual(try c.requestName("org.example.B"), .primaryOwner)
        try roundTrip(a)
        try emit(b, member: "Ping", [.string("b again")])
        try emit(c, member: "Ping", [.string("c as owner")])
        runUntil("two more signals") { anySender.count == 4 }
        XCTAssertEqual(fromB, ["from b", "c as owner"])
    }

    func testNameOwnerChanged() throws {
        var events: [(String?, String?)] = []
        _ = try a.subscribeNameOwnerChanged("org.example.Svc") { name, old, new in
            XCTAssertEqual(name, "org.example.Svc")
            events.append((old, new))
        }
        let c = try DBusConnection(address: bus.address, loop: loop)
        XCTAssertEqual(try c.requestName("org.example.Svc"), .primaryOwner)
        runUntil("the name to appear") { events.count == 1 }
        XCTAssertNil(events[0].0)
        XCTAssertEqual(events[0].1, c.uniqueName)
        try c.releaseName("org.example.Svc")
        runUntil("the name to vanish") { events.count == 2 }
        XCTAssertEqual(events[1].0, c.uniqueName)
        XCTAssertNil(events[1].1)
    }

    func testPropertiesChangedAndInterfacesAddedRemovedReachTheOtherSide() throws {
        var level: UInt8 = 50
        let tree = ExportedObjectTree(root: "/app")
        try b.export(tree)

        var changes: [(path: String, iface: String, changed: [String: DBusValue], invalidated: [String])] = []
        var added: [(String, [String: [String: DBusValue]])] = []
        var removed: [(String, [String])] = []
        _ = try a.subscribePropertiesChanged(sender: b.uniqueName, pathNamespace: "/app") { p, i, c, inv in
            changes.append((p, i, c, inv))
        }
        _ = try a.subscribeInterfacesAdded(sender: b.uniqueName, path: "/app") { added.append(($0, $1)) }
        _ = try a.subscribeInterfacesRemoved(sender: b.uniqueName, path: "/app") { removed.append(($0, $1)) }

        let battery = ExportedInterface("org.example.Battery").property("Level") { .byte(level) }
        try tree.add(ExportedObject(path: "/app/bat0", interfaces: [battery]))
        runUntil("InterfacesAdded") { added.count == 1 }
        XCTAssertEqual(added[0].0, "/app/bat0")
        XCTAssertEqual(added[0].1["org.example.Battery"]?["Level"]?.byte, 50)

        level = 40
        try tree.emitPropertiesChanged(path: "/app/bat0", interface: "org.example.Battery", names: ["Level"])
        try tree.emitPropertiesChanged(path: "/app/bat0", interface: "org.example.Battery",
                                       changed: ["Value": .bytes([1, 2])], invalidated: ["RSSI"])
        runUntil("two PropertiesChanged") { changes.count == 2 }
        XCTAssertEqual(changes[0].path, "/app/bat0")
        XCTAssertEqual(changes[0].iface, "org.example.Battery")
        XCTAssertEqual(changes[0].changed["Level"], .byte(40))
        XCTAssertEqual(changes[0].invalidated, [])
        XCTAssertEqual(changes[1].changed["Value"]?.bytes, [1, 2])
        XCTAssertEqual(changes[1].invalidated, ["RSSI"])

        tree.remove(path: "/app/bat0")
        runUntil("InterfacesRemoved") { removed.count == 1 }
        XCTAssertEqual(removed[0].0, "/app/bat0")
        XCTAssertEqual(removed[0].1, ["org.example.Battery"])
    }

    func testPropertiesChangedFilteredByPathAndInterface() throws {
        let tree = ExportedObjectTree(root: "/app")
        try b.export(tree)
        var seen: [String] = []
        _ = try a.subscribePropertiesChanged(sender: b.uniqueName, path: "/app/x", interface: "org.example.A") { p, i, _, _ in
            seen.append("\(p) \(i)")
        }
        try tree.emitPropertiesChanged(path: "/app/y", interface: "org.example.A", changed: [:])
        try tree.emitPropertiesChanged(path: "/app/x", interface: "org.example.B", changed: [:])
        try tree.emitPropertiesChanged(path: "/app/x", interface: "org.example.A", changed: [:])
        runUntil("the matching signal") { !seen.isEmpty }
        try roundTrip(b)
        try roundTrip(a)
        XCTAssertEqual(seen, ["/app/x org.example.A"])
    }

    func testAHandlerMayWaitForACall() throws {
        // Signal handlers run outside libdbus's dispatch, so they may use callAndWait.
        var id: String?
        _ = try a.subscribe(sender: b.uniqueName, interface: "org.example.Sig", member: "Ping") { _ in
            id = try? self.a.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                        interface: "org.freedesktop.DBus", member: "GetId").first?.string
        }
        try emit(b, member: "Ping")
        runUntil("the nested call") { id != nil }
        XCTAssertEqual(id?.count, 32)
    }

    /// The match rules the bus holds for `connection` (org.freedesktop.DBus.Debug.Stats).
    private func rulesAtTheBus(for connection: DBusConnection) throws -> [String] {
        let reply = try b.callAndWait(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                      interface: "org.freedesktop.DBus.Debug.Stats", member: "GetAllMatchRules")
        guard case .dictionary(_, _, let entries)? = reply.first else { XCTFail("unexpected reply \(reply)"); return [] }
        return entries.first { $0.key.string == connection.uniqueName }?.value.stringArray ?? []
    }

    func testAnAddMatchGivenUpIsRemovedAtTheBus() throws {
        let rule = MatchRule(interface: "org.example.Sig", member: "Late")
        // The bus does not answer while stopped; the wait for AddMatch's reply is interrupted.
        XCTAssertEqual(kill(bus.pid, SIGSTOP), 0)
        _ = loop.schedule(after: 0.3) { self.loop.stop() }
        XCTAssertThrowsError(try a.addMatch(rule.ruleString)) {
            XCTAssertEqual(($0 as? DBusError)?.name, DBusError.Name.interrupted)
        }
        loop.clearStop()
        XCTAssertEqual(kill(bus.pid, SIGCONT), 0)
        // The bus now reads AddMatch, then what was sent after it.
        try roundTrip(a)
        let rules = try rulesAtTheBus(for: a)
        XCTAssertFalse(rules.contains(rule.ruleString), "a rule whose AddMatch was given up stayed at the bus: \(rules)")
        // A rule added normally is listed there (the check above can see one).
        try a.addMatch(rule.ruleString)
        XCTAssertTrue(try rulesAtTheBus(for: a).contains(rule.ruleString))
    }

    func testMatchRuleText() {
        let rule = MatchRule(sender: "org.bluez", pathNamespace: "/org/bluez/hci0",
                             interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged", arg0: "it's")
        XCTAssertEqual(rule.ruleString,
                       "type='signal',sender='org.bluez',path_namespace='/org/bluez/hci0',interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',arg0='it'\\''s'")
    }
}
