"""Talking to a running server (stdlib only): the recorder routes (``record``) and the audit of
what the server loaded (``audit``)."""
