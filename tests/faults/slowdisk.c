/* A slow disk for one process (LD_PRELOAD): every fsync() and fdatasync() first sleeps the number of
 * seconds in the file named by $SLOWDISK_FILE (re-read at most every 20 ms, so a test starts and ends
 * the stall on a running node), then syncs for real. What a saturated or failing disk, or a noisy
 * neighbour on shared storage, does to a node whose Raft thread syncs its journal.
 * Built by tests/faults/test_slow_disk.py with the machine's gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*sync_fn)(int);
static sync_fn real_fsync, real_fdatasync;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double delay_s = 0.0, checked = -1.0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double current_delay(void) {
    double t = now();
    pthread_mutex_lock(&lock);
    if (checked < 0 || t - checked > 0.02) {
        const char *path = getenv("SLOWDISK_FILE");
        FILE *f = path ? fopen(path, "r") : NULL;
        if (f != NULL) {
            double d = 0.0;
            if (fscanf(f, "%lf", &d) == 1) delay_s = d;
            fclose(f);
        }
        checked = t;
    }
    double d = delay_s;
    pthread_mutex_unlock(&lock);
    return d;
}

static void stall(void) {
    double d = current_delay();
    if (d > 0) {
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

__attribute__((constructor)) static void init(void) {
    real_fsync = (sync_fn)dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (sync_fn)dlsym(RTLD_NEXT, "fdatasync");
}

int fsync(int fd) {
    if (real_fsync == NULL) init();
    stall();
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (real_fdatasync == NULL) init();
    stall();
    return real_fdatasync(fd);
}
