"""The core of async-batcher (private): the layers, bottom up, each module one concern.

- State: :mod:`.state` (a run's state, "no limit"), :mod:`.lane` (a queued item, the lane of one key),
  :mod:`.queue`, :mod:`.sinks` (how results reach the callers), :mod:`.deadlines` (the callers' timeouts),
  :mod:`.forming` (a batch taken from the queue), :mod:`.room` (the line for room in a full queue), :mod:`.ceiling`.
- Policy: :mod:`.policy` (the interface), :mod:`.answers` (its answers checked), :mod:`.waits` (a deadline, a latency
  budget), :mod:`.layers` (preferred sizes), :mod:`.hold` (the closed-loop hold).
- Execution: :mod:`.batch`, :mod:`.outcomes` (how a batch's callers get their outcome), :mod:`.ending`,
  :mod:`.recovery` (a failed call), :mod:`.execution` (a batch's paths), :mod:`.streaming`, :mod:`.feedback`.
- Dispatch: :mod:`.dispatcher` (the slots, the pump, the timer, the turns, the flush; when a lane's batch goes and
  why, decided once per lane).
- The engine of a run: :mod:`.engine`, which composes the queue, the room, the deadlines, the dispatcher, the runner
  and the feedback (what comes in and leaves).
- Lifecycle: :mod:`.stopping`, :mod:`.lifecycle`; then :mod:`.intake` (a run's long paths in), :mod:`.admission`
  (which run items go to), :mod:`.values`, :mod:`.settings` and :mod:`.options` (the settings as values, live, and as
  keywords), :mod:`.current` and :mod:`.hooks`.

A module imports only those above it in this list, or (for types) below; where a lower layer must wake a higher one,
it calls a callback it was given (the runner's ``on_end``, the dispatcher's ``on_idle`` and ``on_fault``, the
feedback's ``requeue``, the engine's ``on_drained``).
"""
