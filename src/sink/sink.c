/* placeholder: replaced by the module */
typedef int tm_placeholder_sink;
