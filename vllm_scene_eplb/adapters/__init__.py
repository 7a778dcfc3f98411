"""Engine adapters: the only code that touches inference-engine internals, each behind a version check."""
