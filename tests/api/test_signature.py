"""The signature ``help(AsyncBatcher)`` and ``inspect.signature`` show: every keyword with its default, the one the
batcher really takes (not ``**options``)."""

from __future__ import annotations

import inspect
from typing import Any

from async_batcher import AsyncBatcher, BatcherOptions


class Doubler(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [x * 2 for x in batch]


class WithItsOwn(Doubler):
    def __init__(self, model: str, **options: Any) -> None:
        super().__init__(**options)
        self.model = model


DEPRECATED = {"batch_size", "sleep_time", "buffering_time"}


def test_the_signature_lists_every_keyword_with_the_default_a_batcher_takes() -> None:
    signature = inspect.signature(AsyncBatcher)
    assert list(signature.parameters) == [key for key in BatcherOptions.__annotations__ if key not in DEPRECATED]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.parameters.values())
    assert inspect.signature(Doubler) == signature  # (a subclass without an __init__ of its own shows it too)
    b = Doubler()
    for name, parameter in signature.parameters.items():
        if name == "name":
            assert parameter.default is None and b.name == "Doubler"  # (None: the class's name)
        elif name == "policy":
            assert repr(parameter.default) == repr(b.policy) == "Deadline(max_queue_time=0.01, turns=4, regather=True)"
        else:
            assert getattr(b, name) == parameter.default, name
    assert str(signature.parameters["max_queue_time"]) == "max_queue_time: 'float' = 0.01"
    assert "limits: 'Limits' = Limits(" in str(signature) and "**" not in str(signature)


def test_a_subclass_with_an_init_of_its_own_shows_its_own() -> None:
    assert list(inspect.signature(WithItsOwn).parameters) == ["model", "options"]
