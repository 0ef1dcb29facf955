"""schemathesis hooks for tests/it/api_fuzz.rs (loaded with SCHEMATHESIS_HOOKS=kv_fuzz_hooks).

`negative_data_rejection_on_the_wire`: schemathesis' `negative_data_rejection` (a request that
breaks the schema must get a 4xx), except for requests whose only schema-breaking part is the
query string. Query values go on the wire as text, so schemathesis' "negative" `5` for a string
parameter is the string "5", and its "negative" "false" for a boolean one is `false`: valid
requests the server rightly accepts. Bodies and path parameters are checked as usual (the API
declares no header or cookie parameters: schemathesis marks its security header "negative"
there, and a bad token is 401 anyway). Run with `--checks all --exclude-checks
negative_data_rejection`.
"""

import schemathesis
from schemathesis.specs.openapi.checks import negative_data_rejection


@schemathesis.check
def negative_data_rejection_on_the_wire(ctx, response, case):
    meta = case.meta
    if meta is not None:
        # `meta.path_parameters` is "negative" also for an operation without path parameters.
        body = meta.body is not None and meta.body.is_negative
        path = (
            meta.path_parameters is not None
            and meta.path_parameters.is_negative
            and bool(case.path_parameters)
        )
        if not (body or path):
            return None
    return negative_data_rejection(ctx, response, case)
