"""Talking to a running server (stdlib only): the recorder routes (``record``) and the audit of
what the server loaded (``server_audit``, what ``scene-eplb audit`` runs)."""
