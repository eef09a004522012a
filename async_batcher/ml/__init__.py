"""Machine-learning integrations: numpy batching helpers (``[numpy]``), Keras (``[keras]``).

Each submodule imports its own optional dependency; importing this package imports none of them.
"""
