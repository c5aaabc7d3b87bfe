"""The Helm suites' checks: one line each (`  ok   WHAT` or `  FAIL WHAT` with up to 20 lines of detail),
counted, and the closing line `NAME: N passed, N failed` with exit status 1 on any failure."""

import sys

PASSED = FAILED = 0


def check(what, ok, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print(f"  ok   {what}")
    else:
        FAILED += 1
        print(f"  FAIL {what}")
        for line in str(detail).splitlines()[:20]:
            print(f"       | {line}")


def done(name):
    print(f"{name}: {PASSED} passed, {FAILED} failed")
    sys.exit(1 if FAILED else 0)
