/* runner/text/chat_int.h - declarations shared by the chat renderers of runner/text (chat.c,
 * chat_dsv41.c); not part of the module's API. */
#ifndef TM_RUNNER_TEXT_CHAT_INT_H
#define TM_RUNNER_TEXT_CHAT_INT_H

#include <stdint.h>

#include "base/err.h"
#include "base/record.h"

/* TM_E_INVAL naming the message for a role other than system/user/assistant/tool or NULL
 * content. */
tm_rc tm_chat_check_messages(const tm_message *msgs, uint32_t n, tm_err *err);

#endif /* TM_RUNNER_TEXT_CHAT_INT_H */
