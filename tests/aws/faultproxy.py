"""An HTTP proxy on 127.0.0.1 between an AWS client and a local server, which injects the service's faults.

DynamoDB, Kinesis and SQS (since botocore 1.31) speak AWS's JSON protocol: a POST whose ``X-Amz-Target`` header
names the operation and whose body is JSON. SNS speaks the query protocol (a form-encoded POST, XML answers),
which :mod:`tests.aws.faultquery` turns into the same kind of body for the rules. The proxy reads each request
and asks its rules, in order, what to do with it:

* nothing (``None``): forward it unchanged and return the server's answer;
* :class:`Reply`: answer an error itself (throttling, 5xx, validation) without forwarding;
* :class:`Withhold`: remove some entries from the request, forward the rest, and report the removed ones as
  the service does when it leaves them out: ``UnprocessedItems`` (``BatchWriteItem``), ``UnprocessedKeys``
  (``BatchGetItem``), ``Failed`` (``SendMessageBatch``, ``PublishBatch``), a record with an ``ErrorCode``
  (``PutRecords``). The withheld entries never reach the server, so a client that drops them loses them for
  real, and a read-back shows it;
* :class:`Disconnect`: close the connection without an answer, before or (``after_forwarding``) after the server
  has applied the request;
* :class:`Hold`: keep the request (before or after forwarding it) until the test releases it: the service slow to
  answer, for a stop to come while the call is under way.

Neither DynamoDB Local nor moto checks request signatures, so the edited requests are accepted. Because the
proxy edits DynamoDB's answers, it recomputes their ``x-amz-crc32`` checksum, which botocore verifies.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.aws import faultquery

__all__ = ["Disconnect", "FaultProxy", "Hold", "Reply", "Rule", "Withhold", "first_calls"]


@dataclass(frozen=True)
class Reply:
    """Answer with this error instead of forwarding."""

    code: str
    status: int = 400
    message: str = "injected by the test proxy"


@dataclass(frozen=True)
class Withhold:
    """Leave out the entries at ``indices`` (positions in the request, flattened over tables).

    For ``SendMessageBatch`` and ``PublishBatch`` they come back as ``Failed`` entries with ``code`` and
    ``sender_fault``; for ``PutRecords`` as records with ``ErrorCode`` ``code``.
    """

    indices: Iterable[int]
    code: str = "InternalError"
    sender_fault: bool = False


@dataclass(frozen=True)
class Disconnect:
    """Close the client's connection without answering; with ``after_forwarding``, once the server has answered
    (it applied the request, and the client never hears so)."""

    after_forwarding: bool = False


class Hold:
    """Keep the request until :meth:`release`: before forwarding it (``forward=False``: the server never sees it
    unless released), or after the server answered (``forward=True``: applied, the answer held back).

    ``reached`` is set once the request is held (after the server's answer, with ``forward``). A proxy releases
    every hold when it closes, so no handler outlives a test.
    """

    def __init__(self, *, forward: bool) -> None:
        self.forward = forward
        self.reached = asyncio.Event()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def wait(self) -> None:
        self.reached.set()
        await self._released.wait()


Fault = Reply | Withhold | Disconnect | Hold
Rule = Callable[[str, dict[str, Any]], Fault | None]
"""(operation name, request body) -> the fault to inject, or None to let the next rule decide."""


def first_calls(operation: str, count: int, fault: Fault | Callable[[dict[str, Any]], Fault | None]) -> Rule:
    """A rule that injects ``fault`` into the first ``count`` calls of ``operation`` and then lets all pass.

    ``fault`` may be a function of the request body (to pick entries by content).
    """
    seen = 0

    def rule(op: str, body: dict[str, Any]) -> Fault | None:
        nonlocal seen
        if op != operation or seen >= count:
            return None
        seen += 1
        return fault(body) if callable(fault) else fault

    return rule


def _entries(operation: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """The entries of a batch request, flattened, as (table or "", entry)."""
    if operation == "BatchWriteItem":
        return [(table, request) for table, requests in body["RequestItems"].items() for request in requests]
    if operation == "BatchGetItem":
        return [(table, key) for table, spec in body["RequestItems"].items() for key in spec["Keys"]]
    if operation in _LISTS:
        return [("", entry) for entry in body[_LISTS[operation]]]
    raise ValueError(f"cannot withhold entries of {operation}")


# The batch operations whose entries are one list of the request: its name.
_LISTS = {"SendMessageBatch": "Entries", "PublishBatch": "PublishBatchRequestEntries", "PutRecords": "Records"}


def _rebuild(operation: str, body: dict[str, Any], entries: list[tuple[str, Any]]) -> dict[str, Any]:
    """``body`` with only ``entries`` (as _entries gives them)."""
    rebuilt = dict(body)
    if operation == "BatchWriteItem":
        items: dict[str, list[Any]] = {}
        for table, request in entries:
            items.setdefault(table, []).append(request)
        rebuilt["RequestItems"] = items
    elif operation == "BatchGetItem":
        keys: dict[str, Any] = {}
        for table, key in entries:
            spec = keys.setdefault(table, {**body["RequestItems"][table], "Keys": []})
            spec["Keys"].append(key)
        rebuilt["RequestItems"] = keys
    else:
        rebuilt[_LISTS[operation]] = [entry for _, entry in entries]
    return rebuilt


def _report_withheld(operation: str, request: dict[str, Any], answer: dict[str, Any], fault: Withhold,
                     withheld: list[tuple[str, Any]], dropped: set[int]) -> None:  # fmt: skip
    """Add the withheld entries to the answer, where the service reports what it left out (``dropped``: their
    positions in the request)."""
    if operation == "PutRecords":
        # The answer's records are the request's, in order: put an error record at each withheld position.
        forwarded = iter(answer.get("Records", []))
        total = len(request["Records"])
        failed = {"ErrorCode": fault.code, "ErrorMessage": "withheld"}
        answer["Records"] = [dict(failed) if i in dropped else next(forwarded) for i in range(total)]
        answer["FailedRecordCount"] = answer.get("FailedRecordCount", 0) + len(dropped)
        return
    if operation == "BatchWriteItem":
        unprocessed = answer.setdefault("UnprocessedItems", {})
        for table, entry in withheld:
            unprocessed.setdefault(table, []).append(entry)
    elif operation == "BatchGetItem":
        unprocessed = answer.setdefault("UnprocessedKeys", {})
        for table, key in withheld:
            spec = unprocessed.setdefault(table, {**request["RequestItems"][table], "Keys": []})
            spec["Keys"].append(key)
    else:
        failed = answer.setdefault("Failed", [])
        for _, entry in withheld:
            failed.append(
                {"Id": entry["Id"], "SenderFault": fault.sender_fault, "Code": fault.code, "Message": "withheld"}
            )


def _empty_answer(operation: str) -> dict[str, Any]:
    if operation == "BatchWriteItem":
        return {"UnprocessedItems": {}}
    if operation == "BatchGetItem":
        return {"Responses": {}, "UnprocessedKeys": {}}
    if operation == "PutRecords":
        return {"FailedRecordCount": 0, "Records": []}
    return {"Successful": [], "Failed": []}


@dataclass
class FaultProxy:
    """The proxy; ``async with FaultProxy(upstream) as proxy:`` then point the client at ``proxy.url``."""

    upstream: str
    rules: list[Rule] = field(default_factory=list)
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Each request that reached the proxy: (operation, body)."""
    forwarded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Each request the proxy sent to the server, as sent: (operation, body)."""

    def __post_init__(self) -> None:
        self._holds: list[Hold] = []
        self._closing = False
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def __aenter__(self) -> FaultProxy:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding",))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing = True
        for hold in self._holds:
            hold.release()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def calls(self, operation: str) -> list[dict[str, Any]]:
        """The bodies of the requests for ``operation`` that reached the proxy."""
        return [body for op, body in self.seen if op == operation]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        query = faultquery.is_query(request.headers.get("Content-Type", ""))
        if query:
            operation, body = faultquery.parse_form(raw)
        else:
            operation = request.headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
            body = json.loads(raw) if raw else {}
        self.seen.append((operation, body))
        fault = None
        for rule in self.rules:
            fault = rule(operation, body)
            if fault is not None:
                break
        if isinstance(fault, Disconnect):
            if fault.after_forwarding:
                self.forwarded.append((operation, body))
                await self._forward(request, raw)
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=500)  # never reaches the client: the connection is gone
        if isinstance(fault, Hold):
            self._holds.append(fault)
            if not fault.forward:
                await fault.wait()
                if self._closing:  # released because the proxy closes: the request never reaches the server
                    return web.Response(status=503)
            self.forwarded.append((operation, body))
            status, headers, answer = await self._forward(request, raw)
            if fault.forward:
                await fault.wait()
            return web.Response(status=status, headers=headers, body=answer)
        if isinstance(fault, Reply):
            return self._error(fault, query=query)
        if isinstance(fault, Withhold):
            return await self._withhold(request, operation, body, fault, query=query)
        self.forwarded.append((operation, body))
        status, headers, answer = await self._forward(request, raw)
        return web.Response(status=status, headers=headers, body=answer)

    async def _withhold(self, request: web.Request, operation: str, body: dict[str, Any],
                        fault: Withhold, *, query: bool) -> web.Response:  # fmt: skip
        entries = _entries(operation, body)
        drop = set(fault.indices)
        kept = [entry for i, entry in enumerate(entries) if i not in drop]
        withheld = [entry for i, entry in enumerate(entries) if i in drop]
        if kept:
            sent = _rebuild(operation, body, kept)
            self.forwarded.append((operation, sent))
            encoded_request = faultquery.form_body(operation, sent) if query else json.dumps(sent).encode()
            status, headers, raw_answer = await self._forward(request, encoded_request)
            if status != 200:
                return web.Response(status=status, headers=headers, body=raw_answer)
            answer = faultquery.parse_answer(raw_answer) if query else json.loads(raw_answer)
        else:
            headers = {"Content-Type": "text/xml" if query else "application/x-amz-json-1.0"}
            answer = _empty_answer(operation)
        _report_withheld(operation, body, answer, fault, withheld, drop)
        encoded = faultquery.render_answer(answer) if query else json.dumps(answer).encode()
        if "x-amz-crc32" in headers:
            headers["x-amz-crc32"] = str(zlib.crc32(encoded) & 0xFFFFFFFF)
        return web.Response(status=200, headers=headers, body=encoded)

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, dict[str, str], bytes]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as response:
            answer = await response.read()
            kept = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS}
            return response.status, kept, answer

    @staticmethod
    def _error(fault: Reply, *, query: bool) -> web.Response:
        if query:
            xml = faultquery.error_xml(fault.code, fault.message, fault.status)
            return web.Response(status=fault.status, headers={"Content-Type": "text/xml"}, body=xml)
        payload = {"__type": f"com.amazonaws.injected#{fault.code}", "message": fault.message}
        encoded = json.dumps(payload).encode()
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "x-amzn-ErrorType": fault.code,
            "x-amz-crc32": str(zlib.crc32(encoded) & 0xFFFFFFFF),
        }
        return web.Response(status=fault.status, headers=headers, body=encoded)


_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding", "date",
     "server"}
)  # fmt: skip
