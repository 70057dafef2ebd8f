import BLBlueZ
import BLCommand

/// blscan's job: one discovery session, one line per matching device the first time it is
/// seen. A device first reported without a name is held back up to `nameWait` seconds so its
/// name (which arrives in the scan response) can be printed with it.
struct Scan {
    var adapterName: String?
    var service: String?
    var name: String?
    var rssiMin: Int?
    var timeout: Double = 10
    var json = false
    var first = false
    let nameWait = 1.0

    func run() throws {
        try BlueZClient.session(scan)
    }

    private func scan(_ client: BlueZClient, _ interrupted: InterruptWatch) throws {
        let loop = client.loop
        let adapter = try client.adapter(named: adapterName)
        // --service is checked here only (see Discovery.Filter).
        let discovery = Discovery(client: client, adapter: adapter, filter: Discovery.Filter(rssi: rssiMin))
        // Queued: a reader that stops reading does not stop the scan (nor D-Bus with it), and one
        // that has gone (`blscan | head -1`) ends it at once, not at the next device.
        let out = QueuedOutput(fd: 1, loop: loop)
        defer { out.close() }
        var printed: Set<String> = []
        /// Devices held back for a name, in the order they were first heard.
        var waiting: [(path: String, timer: TimerToken)] = []
        var found = 0
        var failure: ToolError?
        var done = false
        /// The reader went away (EPIPE): a clean end, as for blrecv, not a failed search.
        var readerGone = false
        /// Standard output takes nothing more (its reader went away, or it failed).
        var outputEnded = false

        func outputFailed(_ error: Errno) {
            if failure == nil {
                failure = ToolError.stdout(error)
                readerGone = failure == nil
            }
            outputEnded = true
            done = true
        }
        out.onFailure = outputFailed

        func emit(_ device: DeviceInfo) {
            guard !done, !printed.contains(device.path) else { return }
            printed.insert(device.path)
            if let i = waiting.firstIndex(where: { $0.path == device.path }) { loop.cancel(waiting.remove(at: i).timer) }
            found += 1
            out.write(Array((line(for: device) + "\n").utf8))
            do {
                try out.flush()
            } catch {
                outputFailed(error)
            }
            if first { done = true }
        }

        discovery.onGone = { reason in
            if failure == nil { failure = ToolError(.unavailable, reason) }
            done = true
        }
        discovery.onSighting = { device in
            guard !done, !printed.contains(device.path), self.matches(device) else { return }
            if device.name != nil || self.name != nil {
                emit(device)
            } else if !waiting.contains(where: { $0.path == device.path }) {
                let path = device.path
                let timer = loop.schedule(after: nameWait) {
                    waiting.removeAll { $0.path == path }
                    if let latest = discovery.devices[path], self.matches(latest) { emit(latest) }
                }
                waiting.append((path, timer))
            }
        }
        let deadline = MonotonicClock.seconds() + timeout
        try discovery.start(busyLimit: timeout)
        defer {
            loop.clearStop()
            discovery.stop()
            client.bus.flush()
        }
        // A device connected to this adapter is in range, but it may advertise no more, and
        // bluetoothd reports no sighting of it then: it is listed at once. Not a headset or a
        // keyboard connected over BR/EDR, though: this lists LE devices.
        for device in discovery.devices.values.sorted(by: { $0.path < $1.path })
        where device.connected && !device.knownOverBREDR && matches(device) {
            emit(device)
        }
        interrupted.onInterrupt = { done = true }
        _ = loop.run(until: { done }, timeout: max(0, deadline - MonotonicClock.seconds()))
        // However the search ended (time up, a signal, bluetoothd or the adapter gone), devices
        // that matched and were still waiting for a name are printed, first heard first; not
        // once --first has printed its device, nor to an output that takes nothing more.
        if !outputEnded && !(first && found > 0) {
            done = false
            for (path, _) in waiting {
                if let device = discovery.devices[path], matches(device) { emit(device) }
            }
            done = true
        }
        // The radio stops scanning now, not once a slow reader has taken the output.
        discovery.stop()
        client.bus.flush()
        // What was found is written out, also when a signal or a failure ended the search
        // (after a signal a reader that takes nothing for a second is not waited for).
        if !readerGone {
            do {
                try out.drainAtEnd(interrupted: interrupted.received != nil, dropping: "bytes listing devices found")
            } catch {
                // After a signal the exit is 130 whatever became of the output.
                if interrupted.received == nil { outputFailed(error) }
            }
        }
        if let failure { throw failure }
        if interrupted.received != nil { throw ToolError.quiet(.interrupted) }
        if first && found == 0 && !readerGone {
            throw ToolError(.unavailable, "no matching device found within \(formatSeconds(timeout)) s")
        }
    }

    /// The filters bluetoothd cannot be trusted with (it merges every client's filter).
    func matches(_ device: DeviceInfo) -> Bool {
        if let service, !device.uuids.contains(where: { $0.lowercased() == service }) { return false }
        if let name, device.name != name && device.alias != name { return false }
        if let rssiMin {
            guard let rssi = device.rssi, rssi >= rssiMin else { return false }
        }
        return true
    }

    func line(for device: DeviceInfo) -> String {
        if json {
            var object = JSONObject()
            object.add("address", device.address)
            object.add("address_type", device.addressType)
            if let rssi = device.rssi { object.add("rssi", rssi) } else { object.add("rssi", raw: "null") }
            if let name = device.name { object.add("name", name) } else { object.add("name", raw: "null") }
            object.add("uuids", device.uuids)
            return object.json
        }
        let rssi = device.rssi.map(String.init) ?? "-"
        // Tabs separate the fields, so a name never splits a line or a field (tabs and line
        // breaks become spaces), and its other control characters do not reach a terminal.
        let name = Tool.printable(String((device.name ?? "-").map { $0 == "\t" || $0 == "\n" || $0 == "\r" || $0 == "\r\n" ? " " : $0 }))
        let uuids = device.uuids.isEmpty ? "-" : device.uuids.joined(separator: ",")
        return "\(device.address)\t\(device.addressType)\t\(rssi)\t\(name)\t\(uuids)"
    }
}
