"""Reading the streaming example's server-sent events, for the tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["Stream", "read_stream"]


@dataclass
class Stream:
    """What one POST /generate answered: its status, its tokens, and how it ended (``end``, ``error``, or None)."""

    status: int
    tokens: list[int] = field(default_factory=list)
    ended: str | None = None
    end_data: Any = None


async def read_stream(
    client: httpx.AsyncClient,
    prompt: str,
    max_tokens: int,
    *,
    leave_after: int | None = None,
    key: str | None = "token",
) -> Stream:
    """POST /generate and read its events; ``leave_after``: close the connection after that many tokens.

    A token event's data is ``{key: token}`` (the example's), or the token itself with ``key=None``.
    """
    async with client.stream("POST", "/generate", json={"prompt": prompt, "max_tokens": max_tokens}) as response:
        stream = Stream(response.status_code)
        if response.status_code != 200:
            await response.aread()
            return stream
        assert response.headers["content-type"].startswith("text/event-stream")
        event = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                if event is None:
                    stream.tokens.append(data if key is None else data[key])
                else:
                    stream.ended, stream.end_data = event, data
                event = None
                if leave_after is not None and len(stream.tokens) == leave_after:
                    break  # the response is closed unread: httpx drops the connection
        return stream
