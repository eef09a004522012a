"""What the SQS, SNS and Kinesis batchers share: each item goes to a target (a queue, a topic, a stream), its own
or the batcher's default; a call carries one target's entries, up to a count and a size; ``batch_key`` is the
target, so a batch holds one target's items (and ``process_batch`` still splits a batch that mixes them)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from async_batcher.aws._chunking import chunk_groups
from async_batcher.aws._delivery import Outcomes, Splitter, splitter
from async_batcher.aws.base import AwsBatcher

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class Entry:
    """One item on its way: its position in the batch, its target, its API entry and its size."""

    index: int
    target: str
    entry: dict[str, Any]
    size: int


class TargetedBatcher(AwsBatcher[T, R]):
    """An :class:`AwsBatcher` whose items name their target in the attribute ``target_attribute`` (or take the
    batcher's ``default_target``). Subclasses give the API's name, limits and splitter, and make the calls."""

    operation: ClassVar[str]
    target_attribute: ClassVar[str]
    max_entries: ClassVar[int]
    bisect_codes: ClassVar[frozenset[str]]
    """The error codes of a call refused for one bad entry: bisect it to find the entry."""

    def __init__(self, *, default_target: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if default_target is not None and (not isinstance(default_target, str) or not default_target):
            raise ValueError(f"{self.target_attribute} must be a non-empty str or None, got {default_target!r}")
        self.default_target = default_target
        self._split: Splitter[Entry] = splitter(bisect_codes=self.bisect_codes)

    def target_of(self, item: T) -> str | None:
        target: str | None = getattr(item, self.target_attribute) or self.default_target
        return target

    def batch_key(self, item: T) -> Hashable:
        """Items for different targets never share a batch."""
        return self.target_of(item)

    def max_call_bytes(self) -> int:
        """The most bytes of entries in one call."""
        raise NotImplementedError

    def entry_of(self, item: T) -> tuple[dict[str, Any], int]:
        """The API entry of ``item`` (without an ``Id``) and the size the service counts for it."""
        raise NotImplementedError

    def in_order(self, target: str) -> bool:
        """Whether the calls for ``target`` go one after the other (a FIFO queue or topic)."""
        return target.endswith(".fifo")

    async def call(self, entries: list[Entry], outcomes: Outcomes[R]) -> list[Entry]:
        """One API call for ``entries`` (one target's): record the outcomes the service gave, return the
        entries to send again."""
        raise NotImplementedError

    async def process_batch(self, batch: list[T]) -> list[R | Exception]:
        outcomes: Outcomes[R] = self._outcomes(len(batch), self.operation)
        with self._tracking(batch, outcomes):
            entries: list[Entry] = []
            for index, item in enumerate(batch):
                target = self.target_of(item)
                if target is None:
                    error = ValueError(f"the item names no {self.target_attribute} and the batcher has none")
                    outcomes.fail(index, error)
                    continue
                entries.append(Entry(index, target, *self.entry_of(item)))

            async def send(call: list[Entry]) -> list[Entry]:
                return await self.call(call, outcomes)

            def fail(entry: Entry, error: Exception) -> None:
                outcomes.fail(entry.index, error)

            delivery = self._delivery(
                self.operation, send, fail, self._split, outcomes, indices_of=lambda entry: (entry.index,)
            )
            calls = chunk_groups(
                entries,
                key_of=lambda entry: entry.target,
                max_count=self.max_entries,
                max_bytes=self.max_call_bytes(),
                size_of=lambda entry: entry.size,
            )
            in_order = any(self.in_order(call[0].target) for call in calls)
            await self._run_calls(delivery, calls, outcomes, in_order=in_order)
            return outcomes.results()
