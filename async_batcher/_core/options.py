"""The keyword arguments of :class:`~async_batcher.AsyncBatcher` and ``@batch``, defined once
(:class:`BatcherOptions`), how they become :class:`~async_batcher._core.settings.Settings`, and the batcher's
attributes that read and set them live (:class:`SettingsView`) (private).

The grouped settings are ``limits=`` (:class:`~async_batcher.Limits`), ``policy=`` (a
:class:`~async_batcher.policies.DispatchPolicy`) and ``streaming=`` (:class:`~async_batcher.Streaming`); the single
keywords of earlier versions (``max_batch_size=``, ``max_queue_time=``, ...) are still accepted, each the field of a
group (or a layer of the policy) it stands for. A keyword and its group together are refused.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, overload

from async_batcher import _checks
from async_batcher._core.failures import ErrorMatcher, Isolate, RetryPolicy, SplitOn
from async_batcher._core.policy import DispatchPolicy
from async_batcher._core.settings import (
    DISPATCH_KEYWORDS,
    LAYER_OFF,
    Limits,
    RefuseLate,
    ResultCache,
    Settings,
    Streaming,
    build_policy,
    find,
)
from async_batcher._core.waits import MAX_QUEUE_TIME, LatencyBudget
from async_batcher.adaptive import AdaptiveWaitState

if TYPE_CHECKING:
    from async_batcher._core.lifecycle import Lifecycle

__all__ = ["BatcherOptions", "SettingsView"]

V = TypeVar("V")


class BatcherOptions(TypedDict, total=False):
    """The keyword arguments of :class:`~async_batcher.AsyncBatcher` (and of ``@batch``), all optional. Their
    defaults are in the signature of :class:`~async_batcher.AsyncBatcher` (``help(AsyncBatcher)``,
    ``inspect.signature(AsyncBatcher)``), taken from where each is made: the values' own (:class:`Limits`,
    :class:`Streaming`), the policy's (:class:`~async_batcher.policies.Deadline`), the settings'."""

    #: How much it takes at once: per batch, in flight, waiting (``None``: no limit). Default ``Limits()``.
    limits: Limits
    #: When a batch goes: a :class:`~async_batcher.policies.DispatchPolicy`. Default ``Deadline()``.
    policy: DispatchPolicy
    #: How a streaming ``process_batch`` waits for its consumers. Default ``Streaming()``.
    streaming: Streaming
    #: Where a plain ``def process_batch`` runs; the loop's default executor if ``None``.
    executor: Executor | None
    #: On a full queue, wait for room instead of raising :class:`~async_batcher.QueueFullException`.
    wait_when_full: bool
    #: Refuse at admission an item predicted to be answered after its deadline (its ``timeout``, ``default_timeout``
    #: or ``max_latency``), with :class:`~async_batcher.LateRefusalError`; a call with none of them is a
    #: ``ValueError``. ``True``, or a :class:`~async_batcher.RefuseLate` that says how it predicts. Default False.
    refuse_late: bool | RefuseLate
    #: Keep the results of deduplicated items (the ``dedup_key`` hook, which it needs) for a while:
    #: :class:`~async_batcher.ResultCache`. Default ``None``: nothing is kept once a row resolves.
    result_cache: ResultCache | None
    #: Seconds every item may take at most (waiting for room included) when its call gives no ``timeout=``.
    default_timeout: float | None
    #: The most seconds an item is passed over for items of a better priority.
    max_priority_wait: float
    #: A name for logs, statistics and metrics; the class name by default.
    name: str | None
    #: Items that fail for a transient reason (a :class:`~async_batcher.failures.Retry` result, or an error of its
    #: ``retry_on``) are tried again: a :class:`~async_batcher.failures.RetryPolicy`. Default ``None``: they fail.
    retry: RetryPolicy | None
    #: A batch whose ``process_batch`` raises is bisected to find the items at fault:
    #: :class:`~async_batcher.failures.Isolate`. Default ``None``: every caller gets the error.
    on_batch_error: Isolate | None
    #: A batch that runs out of memory is split, and the batch size that fits is learned:
    #: :class:`~async_batcher.failures.SplitOn`, or the errors that mean it. Default ``None``.
    split_on: SplitOn | ErrorMatcher | tuple[ErrorMatcher, ...] | None
    # -- The single keywords of earlier versions, each a field of a group above (or a layer of the policy): give
    # -- the field or its group, not both.
    #: ``Limits.max_batch_size``, given alone: the most items in one batch (``None``: no limit).
    max_batch_size: int | None
    #: ``Limits.max_batch_weight``, given alone: the most total ``item_weight`` in one batch (``None``: no limit).
    max_batch_weight: float | None
    #: ``Limits.concurrency``, given alone: the most batches processed at once (``None``: no limit).
    concurrency: int | None
    #: ``Limits.max_queue_size``, given alone: the most items waiting for a batch (``None``: no limit).
    max_queue_size: int | None
    #: ``Limits.max_queue_weight``, given alone: the most total ``item_weight`` admitted and not yet answered, held
    #: until each call resolves (``None``: no limit); it needs the ``item_weight`` hook.
    max_queue_weight: float | None
    #: The policy's wait, a :class:`~async_batcher.policies.Deadline`: the most seconds the oldest item waits for
    #: its batch to fill once a slot is free.
    max_queue_time: float
    #: The policy's wait, a :class:`~async_batcher.policies.LatencyBudget` (the adaptive wait) instead of the
    #: ``Deadline``: each item's latency budget, arrival to result, in seconds. Default ``None``: the ``Deadline``.
    max_latency: float | None
    #: A :class:`~async_batcher.policies.ClosedLoopHold` over the policy: the most seconds a freed slot waits for
    #: the callers its batch answered (0: no hold).
    max_hold_time: float
    #: :class:`~async_batcher.policies.PreferredSizes` over the wait: the batch sizes the model runs best at.
    #: Default none: any size.
    preferred_batch_sizes: Iterable[int]
    #: ``Streaming.buffer``, given alone: the most parts a stream buffers for its consumer.
    stream_buffer: int
    #: ``Streaming.stall_timeout``, given alone: the most seconds a step waits for a consumer whose buffer is full.
    stream_stall_timeout: float | None
    # -- async-batcher 0.2.2's, deprecated.
    #: Deprecated (async-batcher 0.2.2): ``max_batch_size``, with a ``DeprecationWarning``.
    batch_size: int | None
    #: Deprecated (async-batcher 0.2.2): ignored, with a ``DeprecationWarning``.
    sleep_time: float | None
    #: Deprecated (async-batcher 0.2.2): ignored, with a ``DeprecationWarning``.
    buffering_time: float | None


OPTIONS = frozenset(BatcherOptions.__annotations__)
_LIMITS = ("max_batch_size", "max_batch_weight", "concurrency", "max_queue_size", "max_queue_weight")
_STREAMING = {"stream_buffer": "buffer", "stream_stall_timeout": "stall_timeout"}


#: async-batcher 0.2.2's keywords, deprecated: accepted (with a warning), not shown in the signature.
DEPRECATED = ("batch_size", "sleep_time", "buffering_time")


def signature() -> inspect.Signature:
    """The signature of ``AsyncBatcher.__init__`` as ``help()`` and ``inspect.signature`` show it: every keyword of
    :class:`BatcherOptions` but the deprecated ones, keyword-only, each with its default as it is made (a fresh
    :class:`Settings`: the values' own, the policy's, the settings')."""
    settings = Settings()
    limits, streaming = settings.limits, settings.streaming
    defaults: dict[str, Any] = {
        "limits": limits,
        "policy": settings.policy,
        "streaming": streaming,
        "executor": settings.executor,
        "wait_when_full": settings.wait_when_full,
        "refuse_late": settings.refuse_late,
        "result_cache": settings.result_cache,
        "default_timeout": settings.default_timeout,
        "max_priority_wait": settings.max_priority_wait,
        "name": None,  # (the class's name)
        "retry": settings.retry,
        "on_batch_error": settings.on_batch_error,
        "split_on": settings.split_on,
        **{key: getattr(limits, key) for key in _LIMITS},
        "max_queue_time": settings.max_queue_time,
        **LAYER_OFF,
        **{key: getattr(streaming, field) for key, field in _STREAMING.items()},
    }
    keyword = inspect.Parameter.KEYWORD_ONLY
    annotations = BatcherOptions.__annotations__
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [
        inspect.Parameter(key, keyword, default=defaults[key], annotation=_named(annotations[key]))
        for key in annotations
        if key not in DEPRECATED
    ]
    return inspect.Signature(parameters, return_annotation=None)


def _named(annotation: Any) -> Any:
    """An annotation of :class:`BatcherOptions` as written (the ``TypedDict`` keeps a ``ForwardRef`` of it)."""
    return getattr(annotation, "__forward_arg__", annotation)


def settings_from(
    options: dict[str, Any], where: str, hooks: frozenset[str] | None = None
) -> tuple[Settings, str | None]:
    """The settings ``options`` describe, validated, and the name given; ``where`` names the call in errors,
    ``hooks`` are those the batcher's class overrides (what some settings need)."""
    unknown = [key for key in options if key not in OPTIONS]
    if unknown:
        raise _checks.unexpected_keywords(unknown, sorted(OPTIONS), where)
    options = dict(options)
    _deprecated(options)
    settings = Settings()
    settings.hooks = hooks
    for group, fields in (("limits", _LIMITS), ("streaming", tuple(_STREAMING)), ("policy", DISPATCH_KEYWORDS)):
        if group in options and options[group] is None:  # (a configuration's "not set": the default, as if absent)
            del options[group]
        both = [key for key in fields if key in options]
        if group in options and both:
            raise TypeError(f"{where}: pass {group}= or {', '.join(f'{key}=' for key in both)}, not both")
    settings.executor = _checks.executor(options.get("executor", settings.executor))
    settings.wait_when_full = _checks.flag("wait_when_full", options.get("wait_when_full", settings.wait_when_full))
    settings.refuse_late = _refuse_late(options.get("refuse_late", settings.refuse_late))
    settings.set_result_cache(options.get("result_cache", settings.result_cache))
    limits = options.get("limits")
    if limits is None:
        limits = Limits(**{key: options[key] for key in _LIMITS if key in options})
    streaming = options.get("streaming")
    if streaming is None:
        streaming = Streaming(**{_STREAMING[key]: options[key] for key in _STREAMING if key in options})
    policy = options.get("policy")
    if policy is None:
        if "max_queue_time" in options and options.get("max_latency") is not None:
            raise TypeError(
                f"{where}: pass max_queue_time= or max_latency=, not both: with max_latency the latency budget "
                "chooses the wait, and max_queue_time would be ignored"
            )
        settings.max_queue_time = _checks.seconds("max_queue_time", options.get("max_queue_time", MAX_QUEUE_TIME))
        policy = build_policy(
            max_queue_time=settings.max_queue_time, **{key: options.get(key, off) for key, off in LAYER_OFF.items()}
        )
    settings.set_limits(limits)
    settings.set_streaming(streaming)
    settings.set_policy(policy, from_keywords="policy" not in options)
    wait = options.get("max_priority_wait", settings.max_priority_wait)
    settings.max_priority_wait = _checks.seconds("max_priority_wait", wait)
    settings.set_timeout(options.get("default_timeout", settings.default_timeout))
    settings.set_retry(options.get("retry", settings.retry))
    settings.set_on_batch_error(options.get("on_batch_error", settings.on_batch_error))
    settings.set_split_on(options.get("split_on", settings.split_on))
    return settings, options.get("name")


def _refuse_late(value: object) -> bool | RefuseLate:
    """``refuse_late=`` as given (checked): ``True``, ``False`` or a :class:`RefuseLate`."""
    RefuseLate.of(value)
    return value  # type: ignore[return-value]


def _deprecated(options: dict[str, Any]) -> None:
    """async-batcher 0.2.2's keywords: ``batch_size`` is ``max_batch_size``; the others do nothing. Each warns."""
    batch_size = options.pop("batch_size", None)
    if batch_size is not None:
        if options.get("max_batch_size") not in (None, -1):
            raise TypeError("pass max_batch_size or its deprecated synonym batch_size, not both")
        warnings.warn("batch_size is deprecated: use max_batch_size", DeprecationWarning, stacklevel=4)
        options["max_batch_size"] = batch_size
    for deprecated in ("sleep_time", "buffering_time"):
        if options.pop(deprecated, None) is not None:
            warnings.warn(
                f"{deprecated!r} has no effect and is ignored: the batcher sleeps until there is work",
                DeprecationWarning,
                stacklevel=4,
            )


class _Setting(Generic[V]):
    """An attribute of the batcher that reads and sets one setting live (from the next batch)."""

    def __init__(self, get: Callable[[Settings], V], put: Callable[[Settings, V], None], doc: str) -> None:
        self._get, self._put = get, put
        self.__doc__ = doc

    @overload
    def __get__(self, owner: None, cls: type[Any]) -> _Setting[V]: ...

    @overload
    def __get__(self, owner: SettingsView, cls: type[Any]) -> V: ...

    def __get__(self, owner: SettingsView | None, cls: type[Any]) -> V | _Setting[V]:
        return self if owner is None else self._get(owner._settings)

    def __set__(self, owner: SettingsView, value: V) -> None:
        self._put(owner._settings, value)


def _limit(name: str, doc: str) -> _Setting[Any]:
    return _Setting(lambda s: getattr(s.limits, name), lambda s, v: s.set_limit(name, v), doc)


def _stream(name: str, doc: str) -> _Setting[Any]:
    field = _STREAMING[name]
    return _Setting(
        lambda s: getattr(s.streaming, field), lambda s, v: s.set_streaming(replace(s.streaming, **{field: v})), doc
    )


def _dispatch(name: str, doc: str) -> _Setting[Any]:
    return _Setting(lambda s: s.dispatch_keyword(name), lambda s, v: s.set_dispatch_keyword(name, v), doc)


def _plain(name: str, check: Callable[[Any], Any], doc: str) -> _Setting[Any]:
    def put(s: Settings, value: Any) -> None:
        setattr(s, name, check(value))
        s.changed()

    return _Setting(lambda s: getattr(s, name), put, doc)


class SettingsView:
    """The batcher's settings as attributes: read them, or set them on a live batcher (from its next batch). A bad
    value raises ``ValueError`` or ``TypeError`` naming it, and the old value stays."""

    _settings: Settings
    _life: Lifecycle

    limits: _Setting[Limits] = _Setting(
        lambda s: s.limits, Settings.set_limits, "How much it takes at once (:class:`~async_batcher.Limits`)."
    )
    policy: _Setting[DispatchPolicy] = _Setting(
        lambda s: s.policy, Settings.set_policy, "When a batch goes (:mod:`async_batcher.policies`)."
    )
    streaming: _Setting[Streaming] = _Setting(
        lambda s: s.streaming, Settings.set_streaming, "How a stream waits for its consumers."
    )
    max_batch_size: _Setting[int | None] = _limit("max_batch_size", "The most items in one batch; ``None``: no limit.")
    max_batch_weight: _Setting[float | None] = _limit(
        "max_batch_weight", "The most total ``item_weight`` in one batch; ``None``: no limit."
    )
    concurrency: _Setting[int | None] = _limit("concurrency", "The most batches processed at once; ``None``: no limit.")
    max_queue_size: _Setting[int | None] = _limit(
        "max_queue_size", "The most items waiting (batches in flight not counted); ``None``: no limit."
    )
    max_queue_weight: _Setting[float | None] = _limit(
        "max_queue_weight", "The most total ``item_weight`` admitted and not yet answered; ``None``: no limit."
    )
    max_queue_time: _Setting[float] = _dispatch(
        "max_queue_time", "The most seconds the oldest waiting item waits for its batch to fill, once a slot is free."
    )
    max_latency: _Setting[float | None] = _dispatch(
        "max_latency", "The latency budget of the adaptive wait (:class:`~async_batcher.policies.LatencyBudget`)."
    )
    max_hold_time: _Setting[float] = _dispatch(
        "max_hold_time", "The most seconds a free slot waits for the callers its batch answered; ``0``: never."
    )
    preferred_batch_sizes: _Setting[tuple[int, ...]] = _dispatch(
        "preferred_batch_sizes", "The batch sizes the model runs best at, smallest first; empty: any size."
    )
    stream_buffer: _Setting[int] = _stream("stream_buffer", "The most parts a stream buffers for its consumer.")
    stream_stall_timeout: _Setting[float | None] = _stream(
        "stream_stall_timeout", "Seconds a step waits for a consumer with a full buffer; ``None``: as long as it takes."
    )
    executor: _Setting[Executor | None] = _plain(
        "executor", _checks.executor, "Where a plain ``def process_batch`` runs; the loop's default if ``None``."
    )
    wait_when_full: _Setting[bool] = _plain(
        "wait_when_full", lambda v: _checks.flag("wait_when_full", v), "On a full queue, wait for room (else raise)."
    )
    refuse_late: _Setting[bool | RefuseLate] = _plain(
        "refuse_late",
        _refuse_late,
        "Refuse at admission an item predicted to miss its deadline (:class:`~async_batcher.LateRefusalError`).",
    )
    result_cache: _Setting[ResultCache | None] = _Setting(
        lambda s: s.result_cache, Settings.set_result_cache, "The cache of deduplicated items' results; ``None``: none."
    )
    max_priority_wait: _Setting[float] = _plain(
        "max_priority_wait",
        lambda v: _checks.seconds("max_priority_wait", v),
        "The most seconds an item is passed over for items of a better priority.",
    )
    retry: _Setting[RetryPolicy | None] = _Setting(
        lambda s: s.retry, Settings.set_retry, "How items that fail transiently are tried again; ``None``: never."
    )
    on_batch_error: _Setting[Isolate | None] = _Setting(
        lambda s: s.on_batch_error,
        Settings.set_on_batch_error,
        "How a batch whose ``process_batch`` raises finds its bad items; ``None``: every caller gets the error.",
    )
    split_on: _Setting[SplitOn | None] = _Setting(
        lambda s: s.split_on, Settings.set_split_on, "Which errors split a batch (out of memory); ``None``: none."
    )
    default_timeout: _Setting[float | None] = _Setting(
        lambda s: s.default_timeout,
        Settings.set_timeout,
        "Seconds an item may take at most when its call gives no ``timeout=``; ``None``: no limit.",
    )

    @property
    def adaptive_state(self) -> AdaptiveWaitState | None:
        """What the latency budget believes now (cost model, arrival rate, target size), or ``None`` without one."""
        budget: LatencyBudget | None = find(self._settings.policy, LatencyBudget)
        if budget is None:
            return None
        return budget.adaptive.state(self._settings.slot_limit)
