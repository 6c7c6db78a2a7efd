/* base/stop.c - the stop flag of base/stop.h. */
#define _POSIX_C_SOURCE 200809L
#include "base/stop.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_signal; /* the first one's number */

static volatile sig_atomic_t g_installed;

static void on_stop_signal(int sig) {
    if (!g_stop)
        g_signal = sig;
    g_stop = 1;
    // One-shot for both signals: SIGINT then SIGTERM kills as surely as SIGTERM twice.
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
}

void tm_stop_install(void) {
    if (g_installed) // once: installing again after a first signal would re-arm the handler
        return;
    g_installed = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART; // a second signal kills, as without a handler
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

bool tm_stop_requested(void) { return g_stop != 0; }

int tm_stop_signal(void) { return g_stop ? (int)g_signal : 0; }
