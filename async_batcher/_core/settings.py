"""A batcher's live :class:`Settings`: the small values that hold its settings (:mod:`~async_batcher._core.values`:
:class:`Limits`, :class:`Streaming`, :class:`ResultCache`), the dispatch policy, and the rest, validated (public
through :mod:`async_batcher.settings`).

Beside each setting, :class:`Settings` keeps the limit the engine compares against, with "no limit" as a number the
hot path compares without a branch.
"""

from __future__ import annotations

import concurrent.futures
import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from async_batcher import _checks
from async_batcher._core.failures import Isolate, RetryPolicy, SplitOn
from async_batcher._core.hold import ClosedLoopHold
from async_batcher._core.layers import Layer, PreferredSizes, preferred_sizes
from async_batcher._core.policy import UNLIMITED, DispatchPolicy
from async_batcher._core.recovery import Recovery
from async_batcher._core.values import Limits, RefuseLate, ResultCache, Streaming
from async_batcher._core.waits import MAX_QUEUE_TIME, Deadline, LatencyBudget

__all__ = ["Limits", "RefuseLate", "ResultCache", "Streaming"]


# The batcher (its settings) each policy serves: one policy serves one batcher. (A policy that can be neither a
# weak key nor hashed, a user's with __slots__ or __eq__ alone, goes unchecked.)
_owners: weakref.WeakKeyDictionary[DispatchPolicy, weakref.ref[Settings]] = weakref.WeakKeyDictionary()


def _owner(policy: DispatchPolicy) -> weakref.ref[Settings] | None:
    try:
        return _owners.get(policy)
    except TypeError:
        return None


def _set_owner(policy: DispatchPolicy, owner: weakref.ref[Settings] | None) -> None:
    try:
        if owner is None:
            _owners.pop(policy, None)
        else:
            _owners[policy] = owner
    except TypeError:
        pass


#: The dispatch keywords of the constructor: each builds (a layer of) the policy.
DISPATCH_KEYWORDS = ("max_queue_time", "max_latency", "max_hold_time", "preferred_batch_sizes")
#: What the dispatch keywords of a layer read when the policy has no such layer (and build none): off.
LAYER_OFF: dict[str, Any] = {"max_latency": None, "max_hold_time": 0.0, "preferred_batch_sizes": ()}


def layers(policy: DispatchPolicy) -> list[DispatchPolicy]:
    """The policy and those it wraps, outermost first; a ``ValueError`` for layers that wrap one another in a
    circle (an ``inner`` set by hand), which no question would ever get out of."""
    found = [policy]
    while isinstance(found[-1], Layer):
        inner = found[-1].inner
        if any(inner is layer for layer in found):
            raise ValueError(
                f"policy {type(policy).__name__}: its layer {type(found[-1]).__name__} wraps "
                f"{type(inner).__name__}, which wraps it: layers must not wrap one another in a circle"
            )
        found.append(inner)
    return found


def find(policy: DispatchPolicy, kind: type[Any]) -> Any:
    return next((layer for layer in layers(policy) if isinstance(layer, kind)), None)


class Settings:
    """The live settings of one batcher. A setter validates the new value (a bad one raises ``ValueError`` or
    ``TypeError`` naming it, and the old value stays), then calls ``changed`` so that a running batcher applies it
    from its next batch."""

    def __init__(self) -> None:
        self.limits = Limits()
        self.streaming = Streaming()
        self.policy: DispatchPolicy = Deadline()
        self.from_keywords = True  # the policy was built from the dispatch keywords (not given as policy=)
        self.max_queue_time = MAX_QUEUE_TIME  # what max_queue_time says when the policy has no Deadline
        self.wait_when_full = False
        # Refuse at admission an item predicted to miss its deadline: False, True or a RefuseLate, as given.
        self.refuse_late: bool | RefuseLate = False
        self.result_cache: ResultCache | None = None
        self.default_timeout: float | None = None
        self.max_priority_wait = 1.0
        self.executor: concurrent.futures.Executor | None = None
        # What a failed batch leads to (async_batcher.failures); None: off.
        self.retry: RetryPolicy | None = None
        self.on_batch_error: Isolate | None = None
        self.split_on: SplitOn | None = None
        self.streams = ""  # process_batch is an async generator: its class's name (see streams_its_results)
        # The hooks the batcher's class overrides, against which the settings that need one are checked (None: not
        # known, not checked).
        self.hooks: frozenset[str] | None = None
        self.changed: Callable[..., None] = lambda **what: None

    # ------------------------------------------------------------------ what the engine compares against

    @property
    def batch_limit(self) -> int:
        size = self.limits.max_batch_size
        return UNLIMITED if size is None else size

    @property
    def slot_limit(self) -> int:
        slots = self.limits.concurrency
        return UNLIMITED if slots is None else slots

    @property
    def room_limit(self) -> int:
        size = self.limits.max_queue_size
        return UNLIMITED if size is None else size

    @property
    def weight_limit(self) -> float:
        weight = self.limits.max_batch_weight
        return math.inf if weight is None else weight

    @property
    def queue_weight_limit(self) -> float:
        weight = self.limits.max_queue_weight
        return math.inf if weight is None else weight

    @property
    def late(self) -> RefuseLate | None:
        """How ``refuse_late`` predicts (``None``: off)."""
        return RefuseLate.of(self.refuse_late)

    @property
    def stall_limit(self) -> float:
        stall = self.streaming.stall_timeout
        return math.inf if stall is None else stall

    @property
    def recovery(self) -> Recovery | None:
        """The failure settings as the runner applies them, or ``None`` when they are all off."""
        if self.retry is None and self.on_batch_error is None and self.split_on is None:
            return None
        sizes = find(self.policy, PreferredSizes)
        return Recovery(
            isolate=self.on_batch_error,
            retry=self.retry,
            split=self.split_on,
            sizes=() if sizes is None else sizes.sizes,
        )

    # ------------------------------------------------------------------ setting them

    def streams_its_results(self, name: str) -> None:
        """``process_batch`` of the class ``name`` is an async generator: it handles its failures itself, and
        ``retry``, ``on_batch_error`` and ``split_on`` are refused, given to the constructor or set live."""
        self.streams = name
        for key in ("retry", "on_batch_error", "split_on"):
            self._not_streaming(key, getattr(self, key), f"{name}()")

    def _not_streaming(self, key: str, value: object, where: str = "") -> None:
        if value is not None and self.streams:
            raise TypeError(
                f"{where or self.streams}: {key}= is for a process_batch that returns its results; a streaming one "
                "(an async generator) handles its failures itself"
            )

    def set_retry(self, value: object) -> None:
        if value is not None and not isinstance(value, RetryPolicy):
            raise TypeError(f"retry must be an async_batcher.failures.RetryPolicy or None, got {value!r}")
        self._not_streaming("retry", value)
        self.retry = value
        self.changed()

    def set_on_batch_error(self, value: object) -> None:
        if value is not None and not isinstance(value, Isolate):
            raise TypeError(f"on_batch_error must be an async_batcher.failures.Isolate or None, got {value!r}")
        self._not_streaming("on_batch_error", value)
        self.on_batch_error = value
        self.changed()

    def set_split_on(self, value: object) -> None:
        split = SplitOn.of(value)
        self._not_streaming("split_on", split)
        self.split_on = split
        self.changed()

    def set_limits(self, limits: Limits) -> None:
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be an async_batcher.Limits, got {limits!r}")
        _check_sizes(limits, self.policy, limits_changed=True)
        if limits.max_queue_weight is not None:
            self._needs_hook(
                "max_queue_weight",
                limits.max_queue_weight,
                "item_weight",
                "weight",
                "every item would weigh 1 (max_queue_size bounds their number)",
            )
        if limits.max_batch_weight is not None:
            self._needs_hook(
                "max_batch_weight",
                limits.max_batch_weight,
                "item_weight",
                "weight",
                "every item would weigh 1 (max_batch_size bounds their number)",
            )
        old = self.limits
        room = (limits.max_queue_size or UNLIMITED) > (old.max_queue_size or UNLIMITED) or (
            limits.max_queue_weight or math.inf
        ) > (old.max_queue_weight or math.inf)
        self.limits = limits
        self.changed(room=room)

    def set_limit(self, name: str, value: Any) -> None:
        self.set_limits(replace(self.limits, **{name: value}))

    def set_streaming(self, streaming: Streaming) -> None:
        if not isinstance(streaming, Streaming):
            raise TypeError(f"streaming must be an async_batcher.Streaming, got {streaming!r}")
        stall = streaming.stall_timeout != self.streaming.stall_timeout
        self.streaming = streaming
        self.changed(stall=stall)

    def set_policy(self, policy: DispatchPolicy, *, from_keywords: bool = False) -> None:
        if not isinstance(policy, DispatchPolicy):
            raise TypeError(f"policy must be an async_batcher.policies.DispatchPolicy, got {policy!r}")
        _check_sizes(self.limits, policy)
        for layer in layers(policy):
            if type(layer).due is DispatchPolicy.due:
                raise TypeError(f"{type(layer).__name__} does not implement due(): a policy must say when a batch goes")
            owner = _owner(layer)
            if owner is not None and owner() not in (None, self):
                raise ValueError(
                    f"policy {layer!r} already serves another batcher: a policy keeps what it learns of its "
                    "batcher's traffic, give each batcher its own"
                )
        old = self.policy, self.from_keywords
        self.policy, self.from_keywords = policy, from_keywords
        try:
            self.changed()
        except BaseException:  # (its bind() raised, say): the old policy stays
            self.policy, self.from_keywords = old
            raise
        for layer in layers(old[0]):
            _set_owner(layer, None)
        # (self.policy, not policy: a hook of the policy replaced, its replaced() say, may have set another since.)
        for layer in layers(self.policy):
            _set_owner(layer, weakref.ref(self))

    def set_result_cache(self, value: object) -> None:
        if value is not None and not isinstance(value, ResultCache):
            raise TypeError(f"result_cache must be an async_batcher.ResultCache or None, got {value!r}")
        if value is not None:
            self._needs_hook("result_cache", value, "dedup_key", "dedup", "no row is shared, so nothing would be kept")
        self.result_cache = value
        self.changed()

    def _needs_hook(self, name: str, value: object, hook: str, option: str, otherwise: str) -> None:
        """Refuse a setting that does nothing (or something else than it says) unless the batcher's class overrides
        ``hook`` (``option``: the keyword of ``@batch`` that gives it)."""
        if self.hooks is not None and hook not in self.hooks:
            raise ValueError(
                f"{name}={value!r} needs the {hook}() hook, which the batcher does not override: {otherwise}; "
                f"override {hook} (with @batch: {option}=), or leave {name} out"
            )

    def set_timeout(self, value: object) -> None:
        self.default_timeout = None if value is None else _checks.seconds("default_timeout", value)
        self.changed()

    # ------------------------------------------------------------------ the dispatch keywords

    def dispatch_keyword(self, name: str) -> Any:
        """What a dispatch keyword reads now: the parameter of the policy's layer that it builds."""
        policy = self.policy
        if name == "max_queue_time":
            deadline = find(policy, Deadline)
            return self.max_queue_time if deadline is None else deadline.max_queue_time
        if name == "max_latency":
            budget = find(policy, LatencyBudget)
            return LAYER_OFF[name] if budget is None else budget.max_latency
        if name == "max_hold_time":
            hold = find(policy, ClosedLoopHold)
            return LAYER_OFF[name] if hold is None else hold.max_hold_time
        sizes = find(policy, PreferredSizes)
        return LAYER_OFF[name] if sizes is None else sizes.sizes

    def set_dispatch_keyword(self, name: str, value: Any) -> None:
        """A dispatch keyword set on a live batcher: the parameter of its layer of the policy, in place (what the
        policy remembers of each lane is kept); for a policy built from the keywords, the policy built again when a
        layer comes or goes (what a latency budget learned is kept). A policy given as ``policy=`` that has no such
        layer refuses it. A bad value is refused before anything changes."""
        value = _checked_keyword(name, value)
        if name == "preferred_batch_sizes" and value:
            _check_sizes(self.limits, PreferredSizes(value))
        kind, attribute = _LAYERS[name]
        layer = find(self.policy, kind)
        # The layer is to go (a Deadline never goes), for a policy built from the keywords.
        off = self.from_keywords and name != "max_queue_time" and value in (None, 0, ())
        if layer is not None and not off and value is not None:
            setattr(layer, attribute, value)
        elif name == "max_queue_time" and self.from_keywords:
            raise TypeError(
                f"max_queue_time={value!r} does nothing while max_latency={self.dispatch_keyword('max_latency')!r} "
                "is set (the latency budget chooses the wait): set max_latency=None first"
            )
        elif not self.from_keywords:
            raise TypeError(
                f"{name} cannot be set on a batcher whose policy was given as policy={self.policy!r}: set the "
                "parameters of its policy, or give it a new one"
            )
        else:
            values = {key: self.dispatch_keyword(key) for key in DISPATCH_KEYWORDS}
            values[name] = value
            self.set_policy(build_policy(**values, reuse=self.policy), from_keywords=True)
        if name == "max_queue_time":
            self.max_queue_time = value
        self.changed()


#: Each dispatch keyword: the layer of the policy it sets, and that layer's parameter.
_LAYERS: dict[str, tuple[type[DispatchPolicy], str]] = {
    "max_queue_time": (Deadline, "max_queue_time"),
    "max_latency": (LatencyBudget, "max_latency"),
    "max_hold_time": (ClosedLoopHold, "max_hold_time"),
    "preferred_batch_sizes": (PreferredSizes, "sizes"),
}


def _checked_keyword(name: str, value: Any) -> Any:
    """A dispatch keyword's value, validated and normalized (a bad one raises, naming it)."""
    if name == "max_queue_time":
        return _checks.seconds(name, value)
    if name == "max_latency":
        return None if value is None else _checks.seconds(name, value, positive=True)
    if name == "max_hold_time":
        return _checks.seconds(name, value)
    return preferred_sizes(value)


def build_policy(
    *,
    max_queue_time: float,
    max_latency: float | None,
    max_hold_time: float,
    preferred_batch_sizes: Iterable[int],
    reuse: DispatchPolicy | None = None,
) -> DispatchPolicy:
    """The policy the dispatch keywords describe: a :class:`Deadline` (or a :class:`LatencyBudget` with
    ``max_latency``), under :class:`PreferredSizes` with ``preferred_batch_sizes``, under a :class:`ClosedLoopHold`
    with ``max_hold_time``. ``reuse``: the policy they described before, whose layers of the same kinds are kept (and
    with them what a latency budget learned and what each remembers of the lanes), their parameters set."""
    old = layers(reuse) if reuse is not None else []

    def kept(kind: type[Any]) -> Any:
        return next((layer for layer in old if type(layer) is kind), None)

    _checks.seconds("max_queue_time", max_queue_time)
    hold = _checks.seconds("max_hold_time", max_hold_time)
    sizes = preferred_sizes(preferred_batch_sizes)
    policy: DispatchPolicy
    if max_latency is None:
        policy = kept(Deadline) or Deadline(max_queue_time)
        policy.max_queue_time = max_queue_time
    else:
        policy = kept(LatencyBudget) or LatencyBudget(max_latency)
        policy.max_latency = max_latency
    if sizes:
        preferred: PreferredSizes | None = kept(PreferredSizes)
        if preferred is None:
            preferred = PreferredSizes(sizes, policy)
        else:
            preferred.sizes = sizes
            preferred.wrap(policy)
        policy = preferred
    if hold:
        holding: ClosedLoopHold | None = kept(ClosedLoopHold)
        if holding is None:
            holding = ClosedLoopHold(hold, policy)
        else:
            holding.max_hold_time = hold
            holding.wrap(policy)
        policy = holding
    return policy


def _check_sizes(limits: Limits, policy: DispatchPolicy, *, limits_changed: bool = False) -> None:
    sizes = find(policy, PreferredSizes)
    if sizes is None or limits.max_batch_size is None or sizes.sizes[-1] <= limits.max_batch_size:
        return
    if limits_changed:
        raise ValueError(
            f"max_batch_size={limits.max_batch_size!r} is smaller than the preferred batch size {sizes.sizes[-1]}: "
            "lower preferred_batch_sizes first"
        )
    raise ValueError(
        f"preferred_batch_sizes={list(sizes.sizes)!r} has a size above max_batch_size={limits.max_batch_size}"
    )


def executor(value: object) -> concurrent.futures.Executor | None:
    return _checks.executor(value)
