"""bleak_send.py ADAPTER ADDRESS SERVICE CHAR FILE request|command [CHUNK]

A reference central written with bleak (PyPI), for the benchmarks: writes FILE to the
characteristic in CHUNK-byte pieces (default 510), with or without response, one after the
other as bleak's API allows, and prints "bytes seconds cpu-seconds" for the transfer alone
(connection and service discovery excluded; the CPU time is this process's, all threads). Run with the bleak venv's python (scripts/bench/setup-bleak)."""
import asyncio
import sys
import time

from bleak import BleakClient, BleakScanner
from bleak.exc import BleakError


async def main():
    adapter, address, service, char, path, kind = sys.argv[1:7]
    chunk = int(sys.argv[7]) if len(sys.argv) > 7 else 510
    data = open(path, "rb").read()
    # Like blsend, retry the transient connection failures of BlueZ (the other client's
    # disconnect just before, a cache revalidation dropping the link).
    for attempt in range(4):
        device = await BleakScanner.find_device_by_address(address, timeout=20, bluez={"adapter": adapter})
        if device is None:
            sys.exit("bleak_send: %s not found" % address)
        try:
            async with BleakClient(device, timeout=30, bluez={"adapter": adapter}) as client:
                target = client.services.get_service(service).get_characteristic(char)
                start, start_cpu = time.monotonic(), time.process_time()
                for i in range(0, len(data), chunk):
                    await client.write_gatt_char(target, data[i:i + chunk], response=(kind == "request"))
                if kind == "command":
                    # Commands are only queued; a read behind them means they went out. As
                    # blsend does: a CCC descriptor of the service, which the peripheral's
                    # bluetoothd answers itself (reading the characteristic would also wait
                    # for the peripheral's program to take the writes: not the client's time).
                    ccc = [d for c in client.services.get_service(service).characteristics
                           for d in c.descriptors if d.uuid.startswith("00002902")]
                    if ccc:
                        await client.read_gatt_descriptor(ccc[0])
                    else:
                        await client.read_gatt_char(target)
                took, cpu = time.monotonic() - start, time.process_time() - start_cpu
                break
        except BleakError as exc:
            if attempt == 3:
                raise
            print("bleak_send: retrying after", exc, file=sys.stderr)
            await asyncio.sleep(1)
    print(len(data), "%.3f" % took, "%.3f" % cpu)


asyncio.run(main())
