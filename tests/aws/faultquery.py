"""SNS's AWS query protocol for the fault proxy: form-encoded ``PublishBatch`` requests and XML answers.

SNS (unlike DynamoDB, SQS and Kinesis) still speaks the query protocol: a form-encoded POST whose ``Action``
names the operation, and XML answers. These functions turn a ``PublishBatch`` request into the JSON-like body
the proxy's rules read (``{"TopicArn": ..., "PublishBatchRequestEntries": [{"Id": ..., "Message": ...}]}``,
each entry's nested fields as their flat query keys) and back, and read and write its answer and its errors.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any
from xml.etree import ElementTree

__all__ = ["error_xml", "form_body", "is_query", "parse_answer", "parse_form", "render_answer"]

_NS = "http://sns.amazonaws.com/doc/2010-03-31/"
_MEMBER = re.compile(r"^PublishBatchRequestEntries\.member\.(\d+)\.(.+)$")


def is_query(content_type: str) -> bool:
    return content_type.startswith("application/x-www-form-urlencoded")


def parse_form(raw: bytes) -> tuple[str, dict[str, Any]]:
    """(operation, body) of a query request; entries of ``PublishBatch`` become a list of dicts."""
    fields = dict(urllib.parse.parse_qsl(raw.decode(), keep_blank_values=True))
    operation = fields.pop("Action", "")
    fields.pop("Version", None)
    if operation != "PublishBatch":
        return operation, fields
    members: dict[int, dict[str, str]] = {}
    body: dict[str, Any] = {}
    for key, value in fields.items():
        match = _MEMBER.match(key)
        if match:
            members.setdefault(int(match.group(1)), {})[match.group(2)] = value
        else:
            body[key] = value
    body["PublishBatchRequestEntries"] = [members[n] for n in sorted(members)]
    return operation, body


def form_body(operation: str, body: dict[str, Any]) -> bytes:
    """The form encoding of ``body`` (as :func:`parse_form` gives it), entries numbered from 1."""
    fields = {"Action": operation, "Version": "2010-03-31"}
    for key, value in body.items():
        if key == "PublishBatchRequestEntries":
            for n, entry in enumerate(value, start=1):
                fields.update({f"{key}.member.{n}.{field}": text for field, text in entry.items()})
        else:
            fields[key] = value
    return urllib.parse.urlencode(fields).encode()


def parse_answer(raw: bytes) -> dict[str, Any]:
    """``{"Successful": [...], "Failed": [...]}`` from a ``PublishBatch`` XML answer."""
    root = ElementTree.fromstring(raw)
    answer: dict[str, Any] = {"Successful": [], "Failed": []}
    for part in ("Successful", "Failed"):
        for member in root.iterfind(f"{{{_NS}}}PublishBatchResult/{{{_NS}}}{part}/{{{_NS}}}member"):
            answer[part].append({child.tag.removeprefix(f"{{{_NS}}}"): child.text or "" for child in member})
    return answer


def render_answer(answer: dict[str, Any]) -> bytes:
    """The XML answer of ``PublishBatch`` with ``answer``'s entries (``SenderFault`` as true/false)."""
    root = ElementTree.Element("PublishBatchResponse", xmlns=_NS)
    result = ElementTree.SubElement(root, "PublishBatchResult")
    for part in ("Successful", "Failed"):
        container = ElementTree.SubElement(result, part)
        for entry in answer.get(part, ()):
            member = ElementTree.SubElement(container, "member")
            for name, value in entry.items():
                text = str(value).lower() if isinstance(value, bool) else str(value)
                ElementTree.SubElement(member, name).text = text
    metadata = ElementTree.SubElement(root, "ResponseMetadata")
    ElementTree.SubElement(metadata, "RequestId").text = "fault-proxy"
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=False)


def error_xml(code: str, message: str, status: int) -> bytes:
    """A query-protocol error answer."""
    kind = "Sender" if status < 500 else "Receiver"
    return (
        f'<ErrorResponse xmlns="{_NS}"><Error><Type>{kind}</Type><Code>{code}</Code>'
        f"<Message>{message}</Message></Error><RequestId>fault-proxy</RequestId></ErrorResponse>"
    ).encode()
