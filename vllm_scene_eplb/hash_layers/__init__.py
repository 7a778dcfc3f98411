"""DeepSeek-V4's hash layers, counted from tokens without a server: ``hash_routing`` (the
``tid2eid`` tables and the exact prediction), ``hash_counts`` (the prediction as a counts file) and
``token_input`` (the tokens an operator has, from files)."""
