/* startbench: how long a program takes to start and exit, e.g. /bin/true with or without a preloaded
 * library. Several configurations are measured interleaved (one spawn of each in turn, after a warm-up),
 * so a machine busy with other work slows them all alike. One JSON line per configuration with the
 * median, best and 90th percentile in microseconds.
 *
 *   startbench [-n RUNS] -c NAME=PRELOAD... -- PROGRAM [ARGS...]
 *
 * PRELOAD is the LD_PRELOAD value of that configuration (empty: none). The child's environment is this
 * process's environment without LD_PRELOAD, plus the configuration's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONFIGS 8

extern char **environ;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct config {
    char name[64];
    char **env;
    double *us;
};

/* Spawns PROGRAM once with ENV, waits; returns microseconds or a negative value on failure. */
static double once(char **argv, char **env) {
    pid_t pid;
    uint64_t t0 = now_ns();
    int rc = posix_spawn(&pid, argv[0], NULL, NULL, argv, env);
    if (rc != 0) {
        fprintf(stderr, "startbench: spawn %s: %s\n", argv[0], strerror(rc));
        return -1;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    uint64_t t1 = now_ns();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "startbench: %s exited with status %d\n", argv[0], st);
        return -1;
    }
    return (double)(t1 - t0) / 1e3;
}

int main(int argc, char **argv) {
    long runs = 2000;
    struct config cfg[MAX_CONFIGS];
    int ncfg = 0, argi = 1;
    size_t nenv = 0;
    for (char **e = environ; *e; e++) nenv++;
    for (; argi < argc && strcmp(argv[argi], "--") != 0; argi++) {
        if (!strcmp(argv[argi], "-n") && argi + 1 < argc) {
            runs = strtol(argv[++argi], NULL, 10);
        } else if (!strcmp(argv[argi], "-c") && argi + 1 < argc && strchr(argv[argi + 1], '=') &&
                   ncfg < MAX_CONFIGS) {
            const char *spec = argv[++argi], *eq = strchr(spec, '=');
            struct config *c = &cfg[ncfg++];
            snprintf(c->name, sizeof c->name, "%.*s", (int)(eq - spec), spec);
            c->env = calloc(nenv + 2, sizeof *c->env);
            size_t k = 0;
            for (char **e = environ; *e; e++)
                if (strncmp(*e, "LD_PRELOAD=", 11) != 0) c->env[k++] = *e;
            if (eq[1]) {
                size_t len = strlen(eq + 1) + sizeof "LD_PRELOAD=";
                c->env[k] = malloc(len);
                snprintf(c->env[k], len, "LD_PRELOAD=%s", eq + 1);
            }
        } else {
            fprintf(stderr, "startbench: bad argument '%s'\n", argv[argi]);
            return 2;
        }
    }
    if (argi + 1 >= argc || runs <= 0 || ncfg == 0) {
        fprintf(stderr, "usage: startbench [-n RUNS] -c NAME=PRELOAD... -- PROGRAM [ARGS...]\n");
        return 2;
    }
    char **child_argv = argv + argi + 1;
    long warm = runs / 10 > 10 ? runs / 10 : 10;
    for (int c = 0; c < ncfg; c++) cfg[c].us = calloc((size_t)runs, sizeof(double));
    for (long i = -warm; i < runs; i++) {
        for (int c = 0; c < ncfg; c++) {
            double us = once(child_argv, cfg[c].env);
            if (us < 0) return 1;
            if (i >= 0) cfg[c].us[i] = us;
        }
    }
    /* Paired differences against the first configuration: spawn i of each configuration ran back to back,
     * so the median difference cancels most of what other work on the machine does to both. */
    double *delta = calloc((size_t)runs, sizeof *delta);
    for (int c = ncfg - 1; c >= 0; c--) {
        double *us = cfg[c].us;
        for (long i = 0; i < runs; i++) delta[i] = us[i] - cfg[0].us[i];
        qsort(delta, (size_t)runs, sizeof *delta, cmp_double);
        qsort(us, (size_t)runs, sizeof *us, cmp_double);
        printf("{\"config\":\"%s\",\"bench\":\"start\",\"runs\":%ld,\"us_median\":%.1f,\"us_min\":%.1f,"
               "\"us_p90\":%.1f,\"us_added_median\":%.1f}\n",
               cfg[c].name, runs, us[runs / 2], us[0], us[(runs * 9) / 10], delta[runs / 2]);
    }
    return 0;
}
