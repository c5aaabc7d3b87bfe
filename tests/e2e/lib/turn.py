#!/usr/bin/env python3
"""Plays the time-quanta arbiter on one ledger, for tests of the library's turn gate alone: writes the
turn area's words with pwrite, in the order vgpu_ledger::region::write_turn does (heartbeat, epoch, then
the one mode byte), and reads the library's counters. Offsets: ledger/src/region/turn.rs (the area starts
at byte 320 of a ledger).

  turn.py set LEDGER MODE EPOCH    mode unmanaged|free|hold|wait|yield, heartbeat now
  turn.py beat LEDGER SECONDS      a heartbeat every 20 ms for SECONDS (a live arbiter)
  turn.py get LEDGER WORD          mode|epoch|waiting|launches|drained|waited_ns|heartbeat
"""
import os
import struct
import sys
import time

AREA = 320
WORDS = {"epoch": 8, "waiting": 16, "launches": 24, "drained": 32, "waited_ns": 40, "heartbeat": 48}
MODES = ["unmanaged", "free", "hold", "wait", "yield"]


def main(argv):
    if len(argv) < 3 or len(argv) != {"set": 4, "beat": 3, "get": 3}.get(argv[0]):
        sys.exit(__doc__)
    op, path = argv[0], argv[1]
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    beat = lambda: os.pwrite(fd, struct.pack("<Q", time.monotonic_ns()), AREA + WORDS["heartbeat"])
    if op == "set":
        beat()
        os.pwrite(fd, struct.pack("<Q", int(argv[3])), AREA + WORDS["epoch"])
        os.pwrite(fd, bytes([MODES.index(argv[2])]), AREA)
    elif op == "beat":
        end = time.monotonic() + float(argv[2])
        while time.monotonic() < end:
            beat()
            time.sleep(0.02)
    elif argv[2] == "mode":
        b = os.pread(fd, 1, AREA)[0]
        print(MODES[b] if b < len(MODES) else "unknown")
    else:
        print(struct.unpack("<Q", os.pread(fd, 8, AREA + WORDS[argv[2]]))[0])


if __name__ == "__main__":
    main(sys.argv[1:])
