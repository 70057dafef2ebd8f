#!/usr/bin/python3
"""bluez_example.py SCRIPT ADAPTER [ARGS...]: runs one of BlueZ's own example programs
(bluez-test-scripts: example-gatt-server, example-advertisement) unmodified, except that
its find_adapter() answers ADAPTER instead of "the first adapter bluetoothd lists", so the
bench decides which virtual controller plays the peripheral."""
import runpy
import sys

script, adapter = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]
module = runpy.run_path(script, run_name="bluez_example")
main = module["main"]
main.__globals__["find_adapter"] = lambda bus: "/org/bluez/" + adapter
main()
