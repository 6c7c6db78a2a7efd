/* placeholder: replaced by the module */
typedef int tm_placeholder_job_spec;
