import BLBlueZ
import BLCommand

/// blrecv's job: connect, then either read once or stream notifications until an end condition.
struct Receive {
    let target: CentralTarget
    let options: NotificationReceiver.Options
    let readOnce: Bool
    /// Output held for a slow reader (QueuedOutput's limit).
    let buffer: Int

    func run() throws {
        try BlueZClient.session { client, interrupted in
            try target.withPeer(client, interrupted) { peer in try receive(peer, interrupted) }
        }
    }

    private func receive(_ peer: Peer, _ interrupted: InterruptWatch) throws {
        let loop = peer.client.loop
        let characteristic = try peer.characteristic(service: target.service, uuid: target.notifyCharacteristic,
                                                     preferring: readOnce ? ["read"] : ["notify", "indicate"])
        if readOnce {
            let value = try characteristic.read()
            do {
                try FileIO.writeAll(1, value)
            } catch {
                if let failure = ToolError.stdout(error) { throw failure }
            }
            return
        }

        let receiver = NotificationReceiver(characteristic: characteristic, options: options, out: QueuedOutput(fd: 1, loop: loop, limit: buffer))
        var outcome: Result<Void, ToolError>?
        receiver.onFinish = { outcome = $0 }
        try receiver.start()
        receiver.armSilenceTimer()
        // What arrived is written out first (finish flushes; a reader taking nothing for a second
        // is not waited for), then 130 as for the other tools.
        interrupted.onInterrupt = { receiver.finish(.failure(ToolError.quiet(.interrupted))) }
        _ = loop.run(until: { outcome != nil }, timeout: nil)
        receiver.close()
        try (outcome ?? .failure(ToolError.quiet(.interrupted))).get()
    }
}
