/* A crash's backtrace where no debugger is installed (the GPU machine has no gdb): preloaded beside the
 * library, on SIGSEGV, SIGBUS or SIGABRT it writes the faulting address, the frames (backtrace(3)) and the
 * mappings of the objects they are in to stderr, then dies of the signal as before. Frames in
 * libvgpu_core.so resolve on the build machine: addr2line -f -C -e target/vgpu/libvgpu_core.so OFFSET.
 * Build: gcc -shared -fPIC -O1 -o segv_trace.so tests/gpu/segv_trace.c */
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_fault(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char line[160];
    int n = snprintf(line, sizeof line, "segv_trace: signal %d at address %p, pid %d\n", sig, si->si_addr, getpid());
    write(2, line, (size_t)n);
    void *frames[64];
    int k = backtrace(frames, 64);
    backtrace_symbols_fd(frames, k, 2);
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd >= 0) {
        char buf[8192], out[8192];
        ssize_t r;
        size_t o = 0;
        while ((r = read(fd, buf, sizeof buf)) > 0) {
            for (ssize_t i = 0; i < r; i++) {
                out[o++] = buf[i];
                if (buf[i] == '\n' || o == sizeof out - 1) {
                    if (strstr(out, "vgpu") || strstr(out, "libcuda") || strstr(out, "soak")) {
                        write(2, "segv_trace: map ", 16);
                        write(2, out, o);
                    }
                    o = 0;
                    memset(out, 0, sizeof out);
                }
            }
        }
        close(fd);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}
