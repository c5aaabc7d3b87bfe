/* The closefds and pipes ops of client.c: an application that closes every descriptor from 3 up and opens
 * its own pipes onto the freed numbers. Not here: anything CUDA (client.c). */
#ifndef APPFDS_H
#define APPFDS_H
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The application's own pipes, opened onto the descriptor numbers it freed. */
#define NPIPES 16
static int app_pipes[NPIPES][2];
static int napp_pipes;

/* Closes every descriptor from 3 up, as a daemon's cleanup does, sparing only the fake driver's own files
 * (under FAKE_CUDA_STATE_DIR: a program that closed its real driver's descriptors would lose CUDA itself),
 * then opens NPIPES pipes, which take the lowest free numbers. Returns how many were closed. */
static int close_fds(int *spared) {
    const char *keep = getenv("FAKE_CUDA_STATE_DIR");
    if (!keep || !*keep) keep = "/tmp/fake-cuda";
    int closed = 0, max = (int)sysconf(_SC_OPEN_MAX);
    if (max <= 0 || max > 1 << 20) max = 1 << 20;
    *spared = 0;
    for (int fd = 3; fd < max; fd++) {
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n < 0) continue; /* not open */
        target[n] = 0;
        if (!strncmp(target, keep, strlen(keep))) { (*spared)++; continue; }
        if (close(fd) == 0) closed++;
    }
    /* non-blocking: a read end that is no longer our pipe must fail, not hang */
    for (napp_pipes = 0; napp_pipes < NPIPES && pipe2(app_pipes[napp_pipes], O_NONBLOCK) == 0; napp_pipes++) {}
    return closed;
}

/* A byte through each of the application's pipes; returns how many failed (EBADF: closed under us). */
static int check_pipes(int *first_errno) {
    int bad = 0;
    *first_errno = 0;
    for (int i = 0; i < napp_pipes; i++) {
        char b = (char)i, got = 0;
        errno = 0;
        struct stat r, w;
        /* a number that now holds something else (the library's files) must not be written to */
        if (fstat(app_pipes[i][0], &r) != 0 || fstat(app_pipes[i][1], &w) != 0 || !S_ISFIFO(r.st_mode) ||
            !S_ISFIFO(w.st_mode) || r.st_ino != w.st_ino) {
            if (!*first_errno) *first_errno = errno ? errno : EBADF;
            bad++;
            continue;
        }
        if (write(app_pipes[i][1], &b, 1) != 1 || read(app_pipes[i][0], &got, 1) != 1 || got != b) {
            if (!*first_errno) *first_errno = errno;
            bad++;
        }
    }
    return bad;
}

#endif
