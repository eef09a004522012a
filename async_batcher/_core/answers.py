"""A dispatch policy's answers, checked as the dispatcher takes them (private; the policy layer): an answer that is not
what its method must return is refused with an error that names the policy, the method and the value, not taken for
an internal error of the dispatcher; an exception raised inside a policy's method is reported with that method's
name (:func:`fault`).
"""

from __future__ import annotations

import numbers
from typing import Any

from async_batcher._checks import is_real
from async_batcher._core.policy import DispatchPolicy, Reason

__all__: list[str] = []


def due(policy: DispatchPolicy, at: Any) -> float:
    """What :meth:`DispatchPolicy.due` said: a time on the loop's clock, or ``inf``."""
    if at.__class__ is not float and not is_real(at):
        raise wrong(policy, "due", at, "a time on the loop's clock, or inf")
    if at != at:  # NaN: neither due nor not, it would leave the lane waiting, silently
        raise wrong(policy, "due", at, "a time, or inf", ValueError)
    taken: float = at  # (as it is: an int, a numpy float, compared as they are)
    return taken


def reason(policy: DispatchPolicy, said: Any) -> Reason:
    """What :meth:`DispatchPolicy.reason` said, as a :class:`Reason` (its value is taken: ``"deadline"`` is
    ``Reason.DEADLINE``)."""
    if said.__class__ is Reason:
        found: Reason = said
        return found
    try:
        return Reason(said)
    except (TypeError, ValueError):
        # Taken as it is, it would reach the statistics as the batch ends, and fail there.
        raise TypeError(f"{type(policy).__name__}.reason() returned {said!r}: it must be a Reason") from None


def size(policy: DispatchPolicy, said: Any) -> int:
    """What :meth:`DispatchPolicy.size` said: a whole number of items, one or more."""
    found: int = said  # (as it is: a numpy integer is a count too)
    if said.__class__ is not int and (isinstance(said, bool) or not isinstance(said, numbers.Integral)):
        raise wrong(policy, "size", said, "a whole number of items, one or more")
    if not found >= 1:  # a batch that takes nothing would be formed again and again, forever
        raise wrong(policy, "size", said, "a batch takes one item or more", ValueError)
    return found


def fault(exc: BaseException) -> str:
    """What went wrong, for an exception raised while dispatching: a policy's wrong answer, an exception raised in
    a policy's method (named), or an internal error of the dispatcher."""
    return getattr(exc, _POLICY_ANSWER, None) or _raised_in_policy(exc) or "internal error while dispatching batches"


# The attribute that marks an answer of a dispatch policy refused (:func:`_wrong_answer`): what its callers are told.
_POLICY_ANSWER = "_async_batcher_policy_answer"


def wrong(
    policy: DispatchPolicy, method: str, value: object, wanted: str, kind: type[Exception] = TypeError
) -> Exception:
    """The error of a dispatch policy's answer that is not what its method must return: it names the policy, the
    method and the value (not an internal error of the dispatcher)."""
    name = f"{type(policy).__name__}.{method}()"
    exc = kind(f"{name} returned {value!r}: {wanted}")
    setattr(exc, _POLICY_ANSWER, f"{name} gave a wrong answer")
    return exc


def _raised_in_policy(exc: BaseException) -> str | None:
    """``"<Policy>.<method>() raised"`` when ``exc`` was raised inside a method of a dispatch policy (the outermost:
    the one the dispatcher called), else ``None``."""
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, DispatchPolicy):
            return f"{type(owner).__name__}.{tb.tb_frame.f_code.co_name}() raised"
        tb = tb.tb_next
    return None
