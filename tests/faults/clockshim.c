/* A wall-clock fault for one process (LD_PRELOAD): CLOCK_REALTIME, gettimeofday() and time() read
 * real + OFFSET + (RATE - 1) * (real - since), with "OFFSET_SECONDS RATE" read from the file named by
 * $CLOCKSHIM_FILE (re-read at most every 20 ms, so a test steps or slews a running node's clock by
 * rewriting it; `since` is when the current line was first read). CLOCK_MONOTONIC is left alone, as NTP
 * leaves it.
 *
 * Why not Debian's libfaketime: with FAKETIME_DONT_FAKE_MONOTONIC=1 (wall clock only, what an NTP step
 * does) its clock_nanosleep wrapper makes Python 3.11's time.sleep() fail with EINVAL, and faking
 * CLOCK_MONOTONIC instead would move every timeout, which no real clock step does.
 * Built by tests/faults/test_clock.py with the machine's gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
static clock_gettime_fn real_clock_gettime;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double offset_s = 0.0, rate = 1.0, since = 0.0, checked = -1.0;

static double seconds(const struct timespec *ts) { return (double)ts->tv_sec + ts->tv_nsec / 1e9; }

static void reload(double real_mono, double real_wall) {
    const char *path = getenv("CLOCKSHIM_FILE");
    if (path == NULL) return;
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    double off = 0.0, r = 1.0;
    int n = fscanf(f, "%lf %lf", &off, &r);
    fclose(f);
    if (n < 1) return;
    if (n < 2) r = 1.0;
    if (off != offset_s || r != rate) {  /* a new line: step to real + OFFSET, then drift at RATE */
        offset_s = off;
        rate = r;
        since = real_wall;
    }
    checked = real_mono;
}

static double fake_wall(void) {
    struct timespec mono, wall;
    real_clock_gettime(CLOCK_MONOTONIC, &mono);
    real_clock_gettime(CLOCK_REALTIME, &wall);
    double m = seconds(&mono), w = seconds(&wall);
    pthread_mutex_lock(&lock);
    if (checked < 0 || m - checked > 0.02) reload(m, w);
    if (since == 0.0) since = w;
    double fake = w + offset_s + (rate - 1.0) * (w - since);
    pthread_mutex_unlock(&lock);
    return fake;
}

__attribute__((constructor)) static void init(void) {
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (real_clock_gettime == NULL) init();
    if (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE) return real_clock_gettime(id, ts);
    double fake = fake_wall();
    ts->tv_sec = (time_t)fake;
    ts->tv_nsec = (long)((fake - (double)ts->tv_sec) * 1e9);
    return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    if (real_clock_gettime == NULL) init();
    double fake = fake_wall();
    tv->tv_sec = (time_t)fake;
    tv->tv_usec = (suseconds_t)((fake - (double)tv->tv_sec) * 1e6);
    return 0;
}

time_t time(time_t *out) {
    if (real_clock_gettime == NULL) init();
    time_t t = (time_t)fake_wall();
    if (out != NULL) *out = t;
    return t;
}
