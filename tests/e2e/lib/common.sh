# Shared helpers for the end-to-end suites (tests/e2e/*.test.sh). Source it first:
#   . "$(dirname "$0")/lib/common.sh"
#   t_init oci-runc            # work dir in $WORK, cleanup on exit, counters
#   check "what" cmd args...   # passes when the command succeeds
#   check_not "what" cmd ...   # passes when it fails
#   check_match "what" REGEX "$text"
#   t_done                     # prints "N passed, N failed" and exits non-zero on failure
# Cleanup: `on_exit "cmd"` registers commands run (in reverse order) when the suite exits, however it exits.
# Paths: $REPO (repository root), $T (target dir), $HOOK, $SHIM, $LIBVGPU, $FAKE_DIR, $CLIENTS_DIR.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
# Cargo's target folder: $CARGO_TARGET_DIR when set (as `make` exports it), else target/.
T=$(realpath -m "${CARGO_TARGET_DIR:-$REPO/target}")
HOOK=$T/release/vgpu-hook
SHIM=$T/release/vgpu-container-runtime
LIBVGPU=$T/vgpu/libvgpu.so
FAKE_DIR=$T/fake
CLIENTS_DIR=$T/clients
PASSED=0
FAILED=0
_ON_EXIT=()

on_exit() { _ON_EXIT+=("$1"); }

_run_on_exit() {
    local i
    for ((i = ${#_ON_EXIT[@]} - 1; i >= 0; i--)); do eval "${_ON_EXIT[i]}" >/dev/null 2>&1 || true; done
}

# t_init NAME: creates $WORK (removed at exit unless KEEP_WORK=1) and installs the exit trap.
t_init() {
    SUITE=$1
    if [ "$(id -u)" != 0 ]; then echo "$SUITE: needs root (real container runtimes)"; exit 1; fi
    WORK=$(mktemp -d "/tmp/vgpu-e2e-$SUITE.XXXXXX")
    chmod 755 "$WORK"
    [ "${KEEP_WORK:-0}" = 1 ] || on_exit "rm -rf '$WORK'"
    trap _run_on_exit EXIT
    trap 'exit 130' INT TERM
}

# t_require FILE...: every build product the suite needs, or exit with a pointer to `make build`.
t_require() {
    local f
    for f in "$@"; do
        if [ ! -e "$f" ]; then echo "$SUITE: missing $f (run 'make build' first)"; echo "0 passed, 1 failed"; exit 1; fi
    done
}

pass() { PASSED=$((PASSED + 1)); echo "  ok   $1"; }
fail() { FAILED=$((FAILED + 1)); echo "  FAIL $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/       | /' | head -20; return 0; }

check() {
    local what=$1; shift
    local out
    if out=$("$@" 2>&1); then pass "$what"; else fail "$what" "$out"; fi
}

check_not() {
    local what=$1; shift
    local out
    if out=$("$@" 2>&1); then fail "$what (unexpectedly succeeded)" "$out"; else pass "$what"; fi
}

# check_match WHAT REGEX TEXT (extended regex, grep -E)
check_match() {
    if printf '%s\n' "$3" | grep -Eq -- "$2"; then pass "$1"; else fail "$1 (wanted /$2/)" "$3"; fi
}

check_eq() {
    if [ "$2" = "$3" ]; then pass "$1"; else fail "$1 (wanted '$3', got '$2')"; fi
}

# field KEY TEXT: value of the last "KEY=value" in TEXT (client output lines are "op=x key=value ...").
field() { printf '%s\n' "$2" | grep -o "\b$1=[^ ]*" | tail -1 | cut -d= -f2-; }

# wait_for SECONDS CMD...: polls every 0.1 s until CMD succeeds.
wait_for() {
    local deadline=$(( $(date +%s) + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -ge "$deadline" ] && return 1
        sleep 0.1
    done
}

t_done() {
    echo "$SUITE: $PASSED passed, $FAILED failed"
    [ "$FAILED" = 0 ]
    exit $?
}
