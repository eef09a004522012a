"""What a batcher does when a batch fails, as values (public through :mod:`async_batcher.failures`).

- :class:`Retry`: an element of ``process_batch``'s results: this item failed for a transient reason (throttled,
  unprocessed, a timeout), try it again. The shape of AWS Lambda's ``ReportBatchItemFailures`` and DynamoDB's
  ``UnprocessedItems``.
- :class:`RetryPolicy` (``retry=``): how items that failed transiently are tried again: attempts, backoff, a budget.
- :class:`Isolate` (``on_batch_error=``): a batch whose ``process_batch`` raises is called again on halves, down to
  the items at fault, whose callers alone get the error.
- :class:`SplitOn` (``split_on=``): a batch that runs out of memory is split, and the batcher learns the batch size
  that fits (:func:`out_of_memory` recognises the frameworks' errors).

Each is off by default. An error is classified once, in this order: a capacity error (``split_on``) is split, a
transient one (``RetryPolicy.retry_on``) retried, any other ``Exception`` isolated; bisecting a throttle or an
out-of-memory error would fail healthy items.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from async_batcher import _checks
from async_batcher.exceptions import TransientError

__all__ = [
    "ErrorMatcher",
    "Isolate",
    "Retry",
    "RetryBudget",
    "RetryPolicy",
    "SplitOn",
    "matches",
    "out_of_memory",
]


@dataclass(frozen=True, slots=True)
class Retry:
    """An element of ``process_batch``'s results: this item failed for a transient reason; try it again.

    With a :class:`~async_batcher.failures.RetryPolicy` (``retry=``) the item goes back to the head of its lane after
    its backoff and joins the next batch; without one, or once it may not be tried again (its attempts, the retry
    budget, its deadline), its caller gets ``error`` (a :class:`~async_batcher.TransientError` saying why, when
    ``error`` is ``None``).

    Args:
        error: What its caller gets if it is not tried again: the transient error (a throttle, ``UnprocessedItems``).
        after: The least seconds to wait before trying again (a ``Retry-After``); the backoff when longer.
    """

    error: Exception | None = None
    after: float | None = None

    def __post_init__(self) -> None:
        if self.error is not None and not isinstance(self.error, Exception):
            raise TypeError(f"Retry(error=...) must be an Exception instance or None, got {self.error!r}")
        if self.after is not None:
            object.__setattr__(self, "after", _checks.seconds("Retry(after=...)", self.after))

    def outcome(self, why: str = "no retry policy (retry=) is set") -> Exception:
        """What its caller gets when it is not tried again."""
        if self.error is not None:
            return self.error
        return TransientError(f"process_batch asked to try this item again (Retry); not tried: {why}")


#: What classifies an error: an exception class (the error is an instance of it), or a function of the error that
#: returns whether it matches.
ErrorMatcher: TypeAlias = type[BaseException] | Callable[[BaseException], bool]


def _matchers(name: str, given: Iterable[Any]) -> tuple[ErrorMatcher, ...]:
    if isinstance(given, type) or (callable(given) and not isinstance(given, Iterable)):
        given = (given,)
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise TypeError(f"{name} must be exception classes or functions of an error, got {given!r}")
    found = tuple(given)
    for matcher in found:
        if isinstance(matcher, type):
            if not issubclass(matcher, BaseException):
                raise TypeError(f"{name}: {matcher!r} is not an exception class")
        elif not callable(matcher):
            raise TypeError(f"{name}: {matcher!r} is neither an exception class nor a function of an error")
    return found


def _natural(name: str, value: object) -> int:
    """An integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def matches(error: BaseException, matchers: Iterable[ErrorMatcher]) -> bool:
    """Whether ``error`` is one of ``matchers``: an instance of a class among them, or one of their functions says
    so. A function that raises counts as "no"."""
    for matcher in matchers:
        if isinstance(matcher, type):
            if isinstance(error, matcher):
                return True
            continue
        try:
            if matcher(error):
                return True
        except Exception:
            continue
    return False


# The frameworks' out-of-memory errors, by class name and the top-level package it comes from: recognised without
# importing the framework.
_OOM_CLASSES = frozenset(
    {
        ("torch", "OutOfMemoryError"),
        ("tensorflow", "ResourceExhaustedError"),
        ("keras", "ResourceExhaustedError"),
        ("jaxlib", "XlaRuntimeError"),
        ("jax", "XlaRuntimeError"),
        ("cupy", "OutOfMemoryError"),
        ("cupy_backends", "CUDARuntimeError"),
    }
)
# Messages of a RuntimeError (or a framework's error above) that say the device ran out of memory.
_OOM_MESSAGES = (
    "out of memory",
    "resource_exhausted",
    "resource exhausted",
    "oom when allocating",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
    "failed to allocate",
)


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says that memory ran out: ``MemoryError``; PyTorch's ``torch.OutOfMemoryError`` (CUDA, and
    the ``RuntimeError`` of older versions and other devices: "CUDA out of memory", "MPS backend out of memory");
    TensorFlow's ``ResourceExhaustedError`` ("OOM when allocating tensor"); JAX's ``RESOURCE_EXHAUSTED``; CuPy's. Its
    ``__cause__`` and ``__context__`` are looked at too (a library that wraps the error). Imports no framework."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, MemoryError):
            return True
        for kind in type(error).__mro__:
            package = kind.__module__.partition(".")[0]
            if (package, kind.__name__) in _OOM_CLASSES:
                if kind.__name__ != "XlaRuntimeError" and kind.__name__ != "CUDARuntimeError":
                    return True
                break
        if isinstance(error, RuntimeError | OSError) or type(error).__name__ in ("XlaRuntimeError", "CUDARuntimeError"):
            message = str(error).lower()
            if any(words in message for words in _OOM_MESSAGES):
                return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
        seen += 1
    return False


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """How many retries a batcher makes, beyond which items that failed transiently fail at once: it stops a retry
    storm when the service is down or the queue is full (Finagle's and Envoy's retry budgets, gRPC's retry
    throttling).

    Each item answered (not asked to retry) earns ``ratio`` of a retry, and ``floor`` retries a second are earned
    whatever comes; each item tried again spends one. What is earned is kept about ``window`` seconds (it decays
    exponentially), so a long healthy spell does not pay for an outage.

    Args:
        ratio: Retries earned per item answered: at most that share of the traffic is retries.
        floor: Retries a second allowed however little succeeds (a quiet batcher still retries).
        window: Seconds over which what was earned is kept.
    """

    ratio: float = 0.2
    floor: float = 10.0
    window: float = 10.0

    def __post_init__(self) -> None:
        for name in ("ratio", "floor"):
            value = getattr(self, name)
            if not _checks.is_real(value) or not _checks.is_finite(value) or value < 0:
                raise ValueError(f"RetryBudget({name}=...) must be a finite number >= 0, got {value!r}")
        object.__setattr__(self, "window", _checks.seconds("RetryBudget(window=...)", self.window, positive=True))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How items that failed for a transient reason are tried again (``retry=``): those that ``process_batch``
    answered with :class:`Retry`, and every item of a call that raised an error of ``retry_on``.

    Only those items are tried again, never the items answered: they go back to the head of their lane once their
    backoff has passed and join its next batch. How tries count against ``attempts``: an item's first try always
    counts; a later one counts only when its call made no progress (answered none of its items), so a call that
    answered some of its items (DynamoDB's ``UnprocessedItems``) does not use up the attempts of the others, and
    ``max_tries`` bounds every try, progress or not. An item is never tried past its deadline (its caller's
    ``timeout``): one whose backoff would end after it fails at once with its error. Kafka's ``retries`` bounded by
    ``delivery.timeout.ms`` is the model.

    Args:
        attempts: The most tries of an item that count, the first included (``1``: never tried again, whatever its
            call answered); a try after the first counts only when its call answered none of its items.
        backoff: Seconds, the bound of the first wait; it grows ``multiplier`` times with each attempt, up to ``cap``.
        multiplier: How the bound grows from one attempt to the next.
        cap: The most seconds of one wait.
        jitter: ``True``: each wait is uniform in ``[0, bound)`` ("full jitter", so that callers throttled together
            do not come back together); ``False``: the bound itself; a function returning a number in ``[0, 1)``:
            that share of the bound (tests pass a constant).
        retry_on: Errors raised by ``process_batch`` that are transient (exception classes, or functions of the
            error): every item of the call is tried again.
        max_tries: The most tries of an item in all, progress or not (``None``: ``4 * attempts``).
        budget: The :class:`RetryBudget`, or ``None`` for none.
    """

    attempts: int = 3
    backoff: float = 0.05
    multiplier: float = 2.0
    cap: float = 5.0
    jitter: bool | Callable[[], float] = field(default=True, compare=False)
    retry_on: tuple[ErrorMatcher, ...] = ()
    max_tries: int | None = None
    budget: RetryBudget | None = RetryBudget()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "attempts", _checks.count("RetryPolicy(attempts=...)", self.attempts, unlimited=False))
        set_(self, "backoff", _checks.seconds("RetryPolicy(backoff=...)", self.backoff))
        set_(self, "cap", _checks.seconds("RetryPolicy(cap=...)", self.cap))
        if not _checks.is_real(self.multiplier) or not _checks.is_finite(self.multiplier) or self.multiplier < 1:
            raise ValueError(f"RetryPolicy(multiplier=...) must be a finite number >= 1, got {self.multiplier!r}")
        if not isinstance(self.jitter, bool) and not callable(self.jitter):
            raise TypeError(f"RetryPolicy(jitter=...) must be True, False or a function, got {self.jitter!r}")
        set_(self, "retry_on", _matchers("RetryPolicy(retry_on=...)", self.retry_on))
        if self.max_tries is not None:
            set_(self, "max_tries", _checks.count("RetryPolicy(max_tries=...)", self.max_tries, unlimited=False))
        if self.budget is not None and not isinstance(self.budget, RetryBudget):
            raise TypeError(f"RetryPolicy(budget=...) must be a RetryBudget or None, got {self.budget!r}")

    @property
    def tries_limit(self) -> int:
        """The most tries of an item in all."""
        return self.max_tries if self.max_tries is not None else 4 * self.attempts

    def bound(self, attempt: int) -> float:
        """The bound of the wait after ``attempt`` tries without progress (1 for the first)."""
        return min(self.cap, self.backoff * self.multiplier ** min(max(attempt, 1) - 1, 64))

    def draw(self) -> float:
        """The share of the bound that the next wait is (see ``jitter``)."""
        if self.jitter is True:
            return random.random()
        if self.jitter is False:
            return 1.0
        share = self.jitter()
        if not _checks.is_real(share) or not 0 <= share <= 1:
            raise ValueError(f"RetryPolicy(jitter=...) returned {share!r}; it must return a number in [0, 1]")
        return float(share)


@dataclass(frozen=True, slots=True)
class Isolate:
    """Find the items at fault when ``process_batch`` raises (``on_batch_error=``): the batch is called again on
    halves, recursively, until the failing items are alone; only their callers get the error (the one their own call
    raised, with its traceback), every other item its result. AWS Lambda's ``BisectBatchOnFunctionError``.

    The halves run one after the other in the batch's own slot, before new arrivals; they are halves whatever
    ``preferred_batch_sizes`` says (a cut at a preferred size far from the half would make the search linear). A
    half whose other half succeeded is split without being called whole (it holds the fault), so one bad item in a
    batch of ``n`` costs at most ``2 * log2(n)`` extra calls. Errors of ``split_on`` or of ``RetryPolicy.retry_on``
    are never bisected (bisecting a throttle fails healthy items), nor is an error of a batch that did not reach
    ``process_batch``.

    Args:
        max_extra_calls: The most calls of ``process_batch`` that one batch may cost beyond its first; when they run
            out, the parts not yet tried fail with the error of the call that covered them. ``None``:
            ``4 * ceil(log2(n))`` for a batch of ``n`` (two bad items found).
        retry_first: Calls of the whole batch again before bisecting it (a flaky error that is not classified as
            transient); each counts in ``max_extra_calls``.
        on_poison: Called as ``on_poison(item, error)`` for each item that failed alone, before its caller gets the
            error: a dead-letter queue. A plain function, called on the event loop in a copy of the item's caller
            context; what it raises is reported to the loop's exception handler.
    """

    max_extra_calls: int | None = None
    retry_first: int = 0
    on_poison: Callable[[Any, BaseException], object] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_extra_calls is not None:
            object.__setattr__(self, "max_extra_calls", _natural("Isolate(max_extra_calls=...)", self.max_extra_calls))
        object.__setattr__(self, "retry_first", _natural("Isolate(retry_first=...)", self.retry_first))
        if self.on_poison is not None and not callable(self.on_poison):
            raise TypeError(f"Isolate(on_poison=...) must be a function of (item, error), got {self.on_poison!r}")

    def budget(self, size: int) -> int:
        """The extra calls a batch of ``size`` items may cost."""
        if self.max_extra_calls is not None:
            return self.max_extra_calls
        return 4 * math.ceil(math.log2(size)) if size > 1 else 0


class SplitOn:
    """Split a batch that runs out of memory and learn the batch size that fits (``split_on=``).

    A call that raises one of ``errors`` (:func:`out_of_memory` when none is given) is split into parts of half its
    size (of its weight, with ``item_weight``), called one after the other in its slot; the batcher lowers the
    ceiling of that batch key's batches to that size (multiplicative decrease), and raises it by ``grow_by`` after
    each ``grow_after`` calls in a row that succeed at the ceiling (additive increase), so that a transient spike
    does not shrink it for good; at the size that failed first the ceiling is lifted. A single item that still fails
    fails alone, with the error. The ceilings are in ``stats.ceilings``, the splits in ``stats.splits``. A key's
    ceiling outlives its idle lane: it is kept for :attr:`keys_kept` keys at most, the key idle longest forgotten
    first.

    Args:
        errors: Exception classes, or functions of an error, that mean "too big": ``SplitOn(torch.OutOfMemoryError,
            MemoryError)``; none: :func:`out_of_memory`.
        grow_after: Calls in a row that succeed at the ceiling before it is raised.
        grow_by: How much it is raised each time (items, or weight); ``None``: a sixteenth of the size that failed
            first (at least 1).
    """

    __slots__ = ("errors", "grow_after", "grow_by")

    #: With ``item_weight``, a call that succeeds at this share of the weight ceiling or more counts as "at the
    #: ceiling" (toward ``grow_after``): items of every weight rarely fill it exactly. (Without, a call counts at the
    #: ceiling's size only.)
    full_share: ClassVar[float] = 0.75
    #: The keys whose ceilings are kept once their idle lanes are let go (a ceiling is a safety fact, not scheduling
    #: history): past this many, the key idle longest is forgotten first.
    keys_kept: ClassVar[int] = 1024

    def __init__(self, *errors: ErrorMatcher, grow_after: int = 8, grow_by: float | None = None) -> None:
        self.errors = _matchers("SplitOn(...)", errors) if errors else (out_of_memory,)
        self.grow_after = _checks.count("SplitOn(grow_after=...)", grow_after, unlimited=False)
        if grow_by is not None and (not _checks.is_real(grow_by) or not _checks.is_finite(grow_by) or grow_by <= 0):
            raise ValueError(f"SplitOn(grow_by=...) must be None or a finite number > 0, got {grow_by!r}")
        self.grow_by = grow_by

    @classmethod
    def of(cls, value: object) -> SplitOn | None:
        """What ``split_on=`` takes: a :class:`SplitOn`, an exception class, a function of an error, or a tuple of
        them; ``None`` for none."""
        if value is None or isinstance(value, SplitOn):
            return value
        if isinstance(value, type) or (callable(value) and not isinstance(value, Iterable)):
            return cls(value)
        if isinstance(value, tuple | list):
            return cls(*_matchers("split_on", value))
        raise TypeError(f"split_on must be a SplitOn, exception classes or functions of an error, got {value!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SplitOn):
            return NotImplemented
        return (self.errors, self.grow_after, self.grow_by) == (other.errors, other.grow_after, other.grow_by)

    def __hash__(self) -> int:
        return hash((self.errors, self.grow_after, self.grow_by))

    def __repr__(self) -> str:
        names = ", ".join(getattr(matcher, "__name__", repr(matcher)) for matcher in self.errors)
        return f"SplitOn({names}, grow_after={self.grow_after}, grow_by={self.grow_by!r})"
