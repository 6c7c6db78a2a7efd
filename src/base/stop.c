/* base/stop.c - the stop flag of base/stop.h. */
#define _POSIX_C_SOURCE 200809L
#include "base/stop.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t g_stop;

static void on_stop_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

void tm_stop_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART; // a second signal kills, as without a handler
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

bool tm_stop_requested(void) { return g_stop != 0; }
