/* runner/guided/formats.c - the JSON Schema string formats of OpenAI's strict mode (date-time,
 * time, date, duration, email, hostname, ipv4, ipv6, uuid) as regular expressions over the
 * string's characters (guided_int.h). Each is a subset of what the format allows, written one
 * way, so that every answer validates whatever the validator's mode: dates check the days of
 * each month and leap years; times always carry a zone (Z or +hh:mm) and no leap second; emails
 * and host names use letters, digits and a few symbols in bounded labels; ipv6 is the full
 * eight-group form; uuids are lower-case hex. */
#include <string.h>

#include "runner/guided/guided_int.h"

#define DATE                                                                                       \
    "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)" \
    "|02-(?:0[1-9]|1\\d|2[0-8]))|(?:\\d{2}(?:0[48]|[2468][048]|[13579][26])|"                      \
    "(?:[02468][048]|[13579][26])00)-02-29)"
#define TIME                                                                                       \
    "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define DUR_T "T(?:\\d{1,9}H(?:\\d{1,9}M)?(?:\\d{1,9}S)?|\\d{1,9}M(?:\\d{1,9}S)?|\\d{1,9}S)"
#define LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?"
#define OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
#define HEX4 "[0-9a-f]"

static const struct {
    const char *name, *re;
} FORMATS[] = {
    {"date-time", DATE "T" TIME},
    {"date", DATE},
    {"time", TIME},
    {"duration", "P(?:\\d{1,9}W|(?:\\d{1,9}Y(?:\\d{1,9}M)?(?:\\d{1,9}D)?|\\d{1,9}M(?:\\d{1,9}D)?|"
                 "\\d{1,9}D)(?:" DUR_T ")?|" DUR_T ")"},
    {"email",
     "[A-Za-z0-9_+-]{1,32}(?:\\.[A-Za-z0-9_+-]{1,32}){0,2}@" LABEL "(?:\\." LABEL "){1,3}"},
    {"hostname", LABEL "(?:\\." LABEL "){0,3}"},
    {"ipv4", "(?:" OCTET "\\.){3}" OCTET},
    {"ipv6", HEX4 "{1,4}(?::" HEX4 "{1,4}){7}"},
    {"uuid", HEX4 "{8}-" HEX4 "{4}-" HEX4 "{4}-" HEX4 "{4}-" HEX4 "{12}"},
};

const char *rx_format_regex(const char *name) {
    for (size_t i = 0; i < sizeof(FORMATS) / sizeof(FORMATS[0]); i++)
        if (strcmp(FORMATS[i].name, name) == 0)
            return FORMATS[i].re;
    return NULL;
}
