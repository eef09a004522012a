"""The core of async-batcher (private): the layers, bottom up, each module one concern.

- State: :mod:`.lane` (a queued item, the lane of one key), :mod:`.queue`, :mod:`.sinks` (how results reach the
  callers), :mod:`.deadlines` (the callers' timeouts), :mod:`.forming` (a batch taken from the queue), :mod:`.room`
  (the line for room in a full queue), :mod:`.state`.
- Policy: :mod:`.policy` (the interface), :mod:`.waits` (a deadline, a latency budget), :mod:`.layers` (preferred
  sizes), :mod:`.hold` (the closed-loop hold).
- Execution: :mod:`.batch`, :mod:`.ending`, :mod:`.execution` (a batch's paths), :mod:`.streaming`.
- The engine of a run: :mod:`.dispatch` (when batches go), :mod:`.engine` (what comes in and leaves).
- Lifecycle: :mod:`.stopping`, :mod:`.lifecycle`; then :mod:`.admission` (the long paths in), :mod:`.values`,
  :mod:`.settings` and :mod:`.options` (the settings as values, live, and as keywords), :mod:`.current` and
  :mod:`.hooks`.

A module imports only those above it in this list, or (for types) below; where a lower layer must wake a higher one,
it calls a callback it was given (the runner's ``on_end``, the engine's ``on_drained``).
"""
