#!/usr/bin/env python3
"""What a ledger (format version 1, ledger/src/region/format.rs) still holds, read with plain reads (never
mapped, so a file that shrinks under us cannot kill us): one line per file

    ledger PATH total=BYTES spilled=BYTES slots=N live=N charged=N [slot I pid=P alive=0|1 kind=BYTES ...]

total: the commit word's total (bytes 256..264, low 46 bits); spilled: the spill book's (bytes 176..184);
slots: slots with an owner pid recorded; live: slots whose OFD lock someone holds (a live owner); charged:
slots with any usage or spilled bytes (each listed). Exit status 1 when any file holds a charge, a recorded
owner or a live one (after every process has exited: something left behind), 2 when a file is not a ledger.
    ledger.py FILE...
"""
import fcntl
import os
import struct
import sys

MAGIC = b"VGPULDGR"
SLOTS_OFFSET, SLOT_SIZE, SLOT_COUNT = 384, 256, 1024
MAX_TOTAL = (1 << 46) - 1
KINDS = ["context", "module", "data", "array", "async_pool", "vmm", "managed", "graph"]
F_OFD_GETLK = 36


def locked(fd, off, length):
    # struct flock: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid (+ padding)
    req = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, off, length, 0)
    try:
        res = fcntl.fcntl(fd, F_OFD_GETLK, req)
    except OSError:
        return False
    return struct.unpack("hhqqi4x", res)[0] != fcntl.F_UNLCK


def read(path):
    fd = os.open(path, os.O_RDWR)  # F_OFD_GETLK of a write lock needs a descriptor open for writing
    try:
        data = os.pread(fd, SLOTS_OFFSET + SLOT_SIZE * SLOT_COUNT, 0)
        if data[:8] != MAGIC:
            return None
        total = struct.unpack_from("<Q", data, 256)[0] & MAX_TOTAL
        spilled = struct.unpack_from("<Q", data, 176)[0] & MAX_TOTAL
        slots = []
        for i in range(SLOT_COUNT):
            off = SLOTS_OFFSET + SLOT_SIZE * i
            if off + SLOT_SIZE > len(data):
                break
            pid = struct.unpack_from("<I", data, off)[0]
            usage = [struct.unpack_from("<Q", data, off + 64 + 16 * k)[0] for k in range(8)]
            sp = struct.unpack_from("<Q", data, off + 32)[0]
            alive = locked(fd, off, SLOT_SIZE)
            if pid or any(usage) or sp or alive:
                slots.append((i, pid, alive, usage, sp))
        return total, spilled, slots
    finally:
        os.close(fd)


def main(paths):
    status = 0
    for p in paths:
        r = read(p)
        if r is None:
            print(f"ledger {p} not a ledger")
            status = max(status, 2)
            continue
        total, spilled, slots = r
        charged = [s for s in slots if any(s[3]) or s[4]]
        line = (f"ledger {p} total={total} spilled={spilled} slots={sum(1 for s in slots if s[1])} "
                f"live={sum(1 for s in slots if s[2])} charged={len(charged)}")
        for i, pid, alive, usage, sp in slots:
            kinds = " ".join(f"{KINDS[k]}={u}" for k, u in enumerate(usage) if u)
            line += f" [slot {i} pid={pid} alive={int(alive)}{' ' + kinds if kinds else ''}{f' spilled={sp}' if sp else ''}]"
        print(line)
        if total or spilled or slots:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
