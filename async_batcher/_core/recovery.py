"""What a batch does when a call of ``process_batch`` fails, or answers items with ``Retry`` (private; the execution
layer, beside :mod:`~async_batcher._core.ending`).

A batcher with ``on_batch_error=``, ``retry=`` or ``split_on=`` gives its runner a :class:`Recovery`, to which
:meth:`Ending.end <async_batcher._core.ending.Ending.end>` hands the end of every call (:meth:`Recovery.settle`):

- the items answered are answered. Those answered with :class:`~async_batcher.failures.Retry`, and every item of a
  call that raised an error of ``retry_on``, go back to the engine, which queues them again at the head of their lane
  once their backoff has passed (``retry_later`` of the runner's
  :class:`~async_batcher._core.feedback.Feedback`), unless they may not be tried again (their attempts, the retry
  budget, their deadline): then their callers get the error;
- a call that ran out of memory (``split_on``) is split into parts that fit the lane's ceiling, which the engine
  lowers (``lowered``); a call that raised another error is bisected (``on_batch_error``).

The parts of a batch run one after the other in its own slot, before it frees it: they go before new arrivals. They
run in the same :class:`~async_batcher._core.batch.Batch`, whose items, sinks and contexts are the part's while it
runs (what ``process_batch``, ``current_batch()``, a trace and a forced stop see). What is left of a batch is its
:class:`Tree`. Each item of it ends once: answered by a call, failed (its own error, its part's, ``TimeoutError``
past its deadline), handed to the engine for another try, or dropped when its caller has left.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from async_batcher._checks import plural
from async_batcher._core.failures import Isolate, Retry, RetryPolicy, SplitOn, matches
from async_batcher._core.lane import WeightedEntry
from async_batcher._core.parts import Part, Tree
from async_batcher._core.policy import Reason
from async_batcher._core.sinks import as_results, deadline_of, deliver, fail_sinks
from async_batcher.stats import TIMED_OUT

if TYPE_CHECKING:
    import asyncio

    from async_batcher._core.batch import Batch
    from async_batcher._core.feedback import Feedback
    from async_batcher._core.outcomes import Outcomes

__all__: list[str] = []

logger = logging.getLogger("async_batcher")


def _done(sink: Any) -> bool:
    return bool(sink[0].future.done()) if sink.__class__ is tuple else bool(sink.done())


class Recovery:
    """A batcher's failure settings as its runner applies them (see the module's docstring)."""

    __slots__ = ("feedback", "isolate", "loop", "outcomes", "retry", "sizes", "split")

    def __init__(
        self,
        *,
        isolate: Isolate | None,
        retry: RetryPolicy | None,
        split: SplitOn | None,
        sizes: tuple[int, ...] = (),
    ) -> None:
        self.isolate = isolate
        self.retry = retry
        self.split = split
        self.sizes = sizes  # preferred_batch_sizes: the size of a split's parts (a bisection cuts halves)
        # A runner's, once bound (:meth:`bound`): how its callers get their outcomes, what the engine is told, the loop.
        self.outcomes: Outcomes
        self.feedback: Feedback
        self.loop: asyncio.AbstractEventLoop

    def bound(self, outcomes: Outcomes, feedback: Feedback, loop: asyncio.AbstractEventLoop) -> Recovery:
        """These settings as a runner applies them: its outcomes, its feedback, its loop."""
        recovery = Recovery(isolate=self.isolate, retry=self.retry, split=self.split, sizes=self.sizes)
        recovery.outcomes, recovery.feedback, recovery.loop = outcomes, feedback, loop
        return recovery

    # ------------------------------------------------------------------ the end of a call

    def settle(self, batch: Batch, results: Any, error: BaseException | None, *, ran: bool) -> bool:
        """A call of ``batch`` (of a part of it) has ended: answer, fail, or hand on each of its items. True if the
        batch goes on (its next part is installed: the runner calls it, in its slot); False: it is over, and frees
        its slot."""
        if not ran:  # not called: its callers had all left, or its executor refused it
            if error is None:
                self._add(batch, self.outcomes.answer(batch, results))
            else:
                self._fail(batch, error)
        elif error is None:
            self._answered(batch, results)
        else:
            self._failed(batch, error)
        return self._next(batch)

    def _add(self, batch: Batch, answered: int) -> None:
        if batch.tree is not None:
            batch.tree.answered += answered
        else:
            batch.answered += answered

    def _fail(self, batch: Batch, error: BaseException) -> None:
        self._add(batch, self.outcomes.fail(batch, error, cut_off=False))

    def _answered(self, batch: Batch, results: Any) -> None:
        recorder = self.outcomes.recorder
        try:
            checked = as_results(results, batch.size)
        except Exception as exc:  # the wrong number of results, or not a sequence: every caller of the call gets why
            logger.warning("%s: %s", self.outcomes.name, exc)
            recorder.processed(batch.size)
            self._add(batch, fail_sinks(batch.sinks, exc, recorder))
            return
        tree = batch.tree
        size = batch.size
        if self.split is not None:
            weight = _weight_of(batch)
            if tree is None:  # (a batch's own call; the parts of a split say what fits now: settled at its end)
                self.feedback.held(batch.lane, size, weight)
            else:
                tree.ok_size, tree.ok_weight = max(tree.ok_size, size), max(tree.ok_weight, weight)
        if tree is not None and tree.part.sibling is not None:
            tree.part.sibling.presumed = True  # this half of a failed part succeeded: the other holds the fault
        if Retry not in set(map(type, checked)):
            recorder.processed(size)
            if self.retry is not None and self.retry.budget is not None:
                self.feedback.retries_earned(size)
            self._add(batch, deliver(batch.sinks, checked, recorder, futures_only=batch.futures_only))
            return
        tree = self._tree(batch)
        index = tree.part.index
        kept = [k for k, result in enumerate(checked) if result.__class__ is not Retry]
        if kept:
            recorder.processed(len(kept))
            if self.retry is not None and self.retry.budget is not None:
                self.feedback.retries_earned(len(kept))
            sinks = [tree.sinks[index[k]] for k in kept]
            tree.answered += deliver(sinks, [checked[k] for k in kept], recorder, futures_only=tree.futures_only)
        again = [k for k, result in enumerate(checked) if result.__class__ is Retry]
        self._again(batch, [index[k] for k in again], [checked[k] for k in again], progress=bool(kept))

    def _failed(self, batch: Batch, error: BaseException) -> None:
        size = batch.size
        if not isinstance(error, Exception):  # cancelled, interrupted: every item left fails with it
            self.fold(batch)
            self.outcomes.recorder.processed(batch.size)
            self._fail(batch, error)
            return
        split, retry, isolate = self.split, self.retry, self.isolate
        if split is not None and matches(error, split.errors):
            if size > 1:
                self.outcomes.recorder.count("splits")
                tree = self._tree(batch)
                weighted = tree.weights is not None
                ceiling = self.feedback.lowered(batch.lane, size, tree.weight(tree.part.index))
                parts = self._pieces(tree, tree.part.index, ceiling, weighted=weighted)
                tree.pending.extendleft(reversed([Part(piece, error) for piece in parts]))
                logger.info(
                    "%s: a call of %s ran out of memory (%s): split into %s; ceiling now %g%s",
                    self.outcomes.name,
                    plural(size, "item"),
                    type(error).__name__,
                    plural(len(parts), "part"),
                    ceiling,
                    " (weight)" if weighted else "",
                )
                return
        elif retry is not None and matches(error, retry.retry_on):
            tree = self._tree(batch)
            self._again(batch, list(tree.part.index), [error] * size, progress=False)
            return
        elif isolate is not None:
            tree = self._tree(batch)
            part = tree.part
            if size > 1:
                if part.whole and tree.first_left > 0:  # the whole batch again first
                    tree.first_left -= 1
                    tree.pending.appendleft(Part(part.index, error, isolating=True, whole=True))
                    return
                left, right = self._halves(part.index)
                first, second = Part(left, error, isolating=True), Part(right, error, isolating=True)
                first.sibling = second
                tree.pending.extendleft((second, first))
                logger.debug(
                    "%s: process_batch raised %s on %s: bisecting",
                    self.outcomes.name,
                    type(error).__name__,
                    plural(size, "item"),
                )
                return
            self._poison(batch, error)
        self.outcomes.recorder.processed(size)
        self._fail(batch, error)

    def _poison(self, batch: Batch, error: BaseException) -> None:
        """An item failed alone: it is at fault. Its caller gets the error after ``on_poison`` has seen it."""
        self.outcomes.recorder.count("isolated")
        isolate = self.isolate
        hook = None if isolate is None else isolate.on_poison
        if hook is None:
            return
        tree = batch.tree
        if tree is not None:
            i = tree.part.index[0]
            item, context = tree.items[i], tree.contexts[i]
        else:
            item = batch.kept[0] if batch.kept else batch.items[0]
            context = batch.contexts[0]
        try:
            context.copy().run(hook, item, error)
        except Exception as exc:
            self.loop.call_exception_handler(
                {
                    "message": f"{self.outcomes.name}: on_poison() failed; the item's caller gets its error",
                    "exception": exc,
                }
            )

    # ------------------------------------------------------------------ tried again

    def _again(self, batch: Batch, index: list[int], outcomes: list[Any], *, progress: bool) -> None:
        """The items at ``index`` of the tree failed transiently (``outcomes``: a :class:`Retry` each, or the error
        raised): back to the engine for another try, or failed now if they may not be tried again."""
        tree = batch.tree
        assert tree is not None
        recorder = self.outcomes.recorder
        policy = self.retry
        errors = [outcome.error if outcome.__class__ is Retry else outcome for outcome in outcomes]
        if policy is None:
            self._give_up(tree, index, errors, "no retry policy (retry=) is set")
            return
        now = self.loop.time()
        try:
            share = policy.draw()
        except Exception as exc:
            self.loop.call_exception_handler(
                {"message": f"{self.outcomes.name}: RetryPolicy.jitter failed", "exception": exc}
            )
            share = 1.0
        error_of = dict(zip(index, errors, strict=True))
        going: list[tuple[int, float, int, int]] = []  # (place, delay, attempts, tries)
        for i, outcome, error in zip(index, outcomes, errors, strict=True):
            if _done(tree.sinks[i]):
                continue  # its caller has left: nothing to try again for
            # Its first try counts whatever its call did; a later one only if its call answered no one.
            attempts = tree.attempts[i] + (0 if progress and tree.tries[i] else 1)
            tries = tree.tries[i] + 1
            if attempts >= policy.attempts or tries >= policy.tries_limit:
                self._give_up(tree, [i], [error], f"tried {plural(tries, 'time')}")
                continue
            delay = share * policy.bound(attempts)
            if outcome.__class__ is Retry and outcome.after is not None:
                delay = max(delay, outcome.after)
            if now + delay >= deadline_of(tree.sinks[i], tree.deadlines[i]):
                self._give_up(tree, [i], [error], "its deadline comes before its next try")
                continue
            going.append((i, delay, attempts, tries))
        if going and policy.budget is not None:
            allowed = self.feedback.retries_allowed(len(going))
            if allowed < len(going):
                late = going[allowed:]
                going = going[:allowed]
                recorder.count("retries_refused", len(late))
                places = [g[0] for g in late]
                self._give_up(tree, places, [error_of[i] for i in places], "the retry budget is spent")
        groups: dict[float, list[WeightedEntry]] = {}
        for i, delay, attempts, tries in going:
            groups.setdefault(delay, []).append(self._entry(batch, tree, i, attempts, tries))
        for delay, entries in groups.items():
            recorder.count("retried", len(entries))
            self.feedback.retry_later(batch.lane.key, entries, delay)

    def _entry(self, batch: Batch, tree: Tree, i: int, attempts: int, tries: int) -> WeightedEntry:
        sink = tree.sinks[i]
        bulk, index = (sink[0], sink[1]) if sink.__class__ is tuple else (sink, 0)
        weight = 1.0 if tree.weights is None else tree.weights[i]
        # Its arrival is its batch's oldest: it is due as soon as it is back, and joins the lane's next batch.
        return WeightedEntry(
            tree.items[i],
            bulk,
            batch.oldest,
            batch.lane,
            tree.contexts[i],
            weight=weight,
            index=index,
            deadline=tree.deadlines[i],
            attempts=attempts,
            tries=tries,
        )

    def _give_up(self, tree: Tree, index: list[int], errors: list[Any], why: str) -> None:
        """Items that failed transiently and are not tried again: each caller gets its error."""
        self.outcomes.recorder.processed(len(index))
        for i, error in zip(index, errors, strict=True):
            if error is None:
                error = Retry().outcome(why)
            tree.answered += fail_sinks([tree.sinks[i]], error, self.outcomes.recorder)

    # ------------------------------------------------------------------ the parts

    def _tree(self, batch: Batch) -> Tree:
        tree: Tree | None = batch.tree
        if tree is None:
            tree = batch.tree = Tree(self, batch)
            tree.answered = batch.answered
        return tree

    def _next(self, batch: Batch) -> bool:
        """Call the next part of the batch, if any is left: True. Else the batch is over: False."""
        tree = batch.tree
        if tree is None:
            return False
        now = self.loop.time()
        while tree.pending:
            part = tree.pending.popleft()
            live = []
            for i in part.index:
                sink = tree.sinks[i]
                if _done(sink):
                    continue  # its caller left (or its process_many call failed): it is not sent
                if tree.deadlines[i] <= now:
                    tree.answered += _expire(self.outcomes, sink)
                    continue
                live.append(i)
            if not live:
                continue
            part.index = live
            if part.presumed and len(live) > 1:  # split without a call: its other half succeeded
                left, right = self._halves(live)
                first, second = Part(left, part.error, isolating=True), Part(right, part.error, isolating=True)
                first.sibling = second
                tree.pending.extendleft((second, first))
                continue
            if self.split is not None and len(live) > 1:
                weighted = tree.weights is not None
                ceiling = batch.lane.weight_ceiling if weighted else batch.lane.ceiling
                if (tree.weight(live) if weighted else len(live)) > ceiling:  # lowered since it was cut: cut it again
                    pieces = self._pieces(tree, live, ceiling, weighted=weighted)
                    tree.pending.extendleft(reversed([Part(piece, part.error) for piece in pieces]))
                    continue
            if part.isolating:
                if tree.extra_left <= 0:  # the isolation's calls are spent: its items get the error that covers them
                    assert part.error is not None
                    self.outcomes.recorder.processed(len(live))
                    tree.answered += fail_sinks([tree.sinks[i] for i in live], part.error, self.outcomes.recorder)
                    continue
                tree.extra_left -= 1
            self._install(batch, tree, part)
            self.outcomes.recorder.count("extra_calls")
            self.feedback.calling(batch)
            return True
        if self.split is not None and tree.ok_size:
            self.feedback.settled(batch.lane, tree.ok_size, tree.ok_weight)
        batch.answered = tree.answered
        batch.tree = None
        batch.size = len(tree.items)
        # Its time is not a batch's of its size: the dispatch policy must not learn from it.
        batch.entered = False
        return False

    def _install(self, batch: Batch, tree: Tree, part: Part) -> None:
        """Make ``part`` the batch's: what its call of ``process_batch`` is given, and what answers its callers."""
        index = part.index
        tree.part = part
        batch.items = [tree.items[i] for i in index]
        batch.kept = None
        batch.sinks = [tree.sinks[i] for i in index]
        batch.contexts = [tree.contexts[i] for i in index]
        batch.weights = None if tree.weights is None else [tree.weights[i] for i in index]
        batch.deadlines = [tree.deadlines[i] for i in index]
        batch.attempts = [tree.attempts[i] for i in index]
        batch.tries = [tree.tries[i] for i in index]
        batch.arrivals = None if tree.arrivals is None else [tree.arrivals[i] for i in index]
        batch.size = len(index)
        batch.futures_only = tree.futures_only
        batch.entered = False
        batch.reason = Reason.SPLIT
        batch.called = self.loop.time()

    def fold(self, batch: Batch) -> None:
        """Make every item left (the part called, and those not called yet) the batch's, to fail them at once."""
        tree = batch.tree
        if tree is None or not tree.pending:
            return
        index = list(tree.part.index)
        for part in tree.pending:
            index.extend(part.index)
        tree.pending.clear()
        batch.sinks = [tree.sinks[i] for i in index]
        batch.contexts = [tree.contexts[i] for i in index]
        batch.size = len(index)
        tree.part = Part(index)

    @staticmethod
    def _halves(index: list[int]) -> tuple[list[int], list[int]]:
        """Cut ``index`` in two halves. Never at a preferred batch size: one far from the half (1 of 32) makes the
        search linear, and the bound of ``2 * log2(n)`` extra calls for one bad item holds only for halves."""
        cut = len(index) // 2
        return index[:cut], index[cut:]

    def _pieces(self, tree: Tree, index: list[int], ceiling: float, *, weighted: bool) -> list[list[int]]:
        """Cut ``index`` into parts that fit ``ceiling`` (items, or weight): at least two, none empty."""
        if not weighted:
            size = max(1, int(ceiling))
            fits = [s for s in self.sizes if s <= size]
            if fits:
                size = fits[-1]
            size = min(size, max(1, len(index) // 2))
            return [index[k : k + size] for k in range(0, len(index), size)]
        weights = tree.weights
        assert weights is not None
        pieces: list[list[int]] = [[]]
        total = 0.0
        for i in index:
            if pieces[-1] and total + weights[i] > ceiling:
                pieces.append([])
                total = 0.0
            pieces[-1].append(i)
            total += weights[i]
        if len(pieces) == 1:  # (the ceiling was above the call's weight: halves)
            return list(self._halves(index))
        return pieces


def _weight_of(batch: Batch) -> float:
    return float(batch.size) if batch.weights is None else sum(batch.weights)


def _expire(outcomes: Outcomes, sink: Any) -> int:
    """An item whose deadline passed before its part's call: it is never sent; its caller gets ``TimeoutError`` (a
    ``process_many`` call's: the whole call). Returns the calls that resolved."""
    recorder = outcomes.recorder
    if sink.__class__ is tuple:
        bulk = sink[0]
        if bulk.future.done():
            return 0
        recorder.resolved(len(bulk.items), TIMED_OUT)
        bulk.future.set_exception(TimeoutError(f"{outcomes.name}: no results within the timeout"))
        return 1
    if sink.done():
        return 0
    recorder.resolved(1, TIMED_OUT)
    sink.set_exception(TimeoutError(f"{outcomes.name}: no result within the timeout"))
    return 1
