"""RetryPolicy: exponential bounds, full jitter, validation; which errors are retryable (botocore's set, at least)."""

from __future__ import annotations

from typing import Any

import botocore.loaders
import botocore.session
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.retries import standard

from async_batcher.aws.retry import RETRYABLE_ERROR_CODES, RETRYABLE_STATUS_CODES, RetryPolicy, is_retryable_error


def client_error(code: str, status: int = 400, operation: str = "BatchWriteItem") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "test"}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


def test_bounds_double_then_cap() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    assert [policy.backoff_bound(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_huge_retry_numbers_stay_capped() -> None:
    assert RetryPolicy(base_delay=0.1, max_delay=3.0).backoff_bound(10_000) == 3.0


@pytest.mark.parametrize("draw", [0.0, 0.25, 0.999])
def test_full_jitter_scales_the_bound(draw: float) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=10.0, jitter=lambda: draw)
    assert policy.backoff(3) == pytest.approx(draw * 2.0)


def test_default_jitter_stays_within_bound() -> None:
    policy = RetryPolicy(base_delay=0.01, max_delay=0.04)
    waits = [policy.backoff(n) for n in range(1, 6) for _ in range(50)]
    assert all(0 <= w < 0.04 for w in waits)
    assert len(set(waits)) > 1  # random, not a constant


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be >= 1, got 0"),
        ({"max_attempts": 2.5}, "max_attempts must be an int, got 2.5"),
        ({"base_delay": -1}, "base_delay must be >= 0, got -1"),
        ({"max_delay": float("nan")}, "max_delay must be >= 0, got nan"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_retry_numbers_start_at_one() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        RetryPolicy().backoff(0)


@pytest.mark.parametrize(
    "code",
    ["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded", "InternalServerError"],
)
def test_throttling_codes_are_retryable(code: str) -> None:
    assert is_retryable_error(client_error(code))


def test_any_5xx_is_retryable() -> None:
    assert is_retryable_error(client_error("SomethingNew", status=503))


@pytest.mark.parametrize("code", ["ValidationException", "ResourceNotFoundException", "AccessDeniedException"])
def test_client_faults_are_not_retryable(code: str) -> None:
    assert not is_retryable_error(client_error(code))


def test_transport_errors_are_left_to_botocore() -> None:
    assert not is_retryable_error(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert not is_retryable_error(ValueError("x"))


def _botocore_retry_json() -> dict[str, Any]:
    loaded: dict[str, Any] = botocore.loaders.Loader().load_data("_retry")
    return loaded


def _codes_and_statuses(policies: dict[str, Any], definitions: dict[str, Any]) -> tuple[set[str], set[int]]:
    """The error codes and HTTP statuses of ``_retry.json`` policies (following their ``$ref``)."""
    codes: set[str] = set()
    statuses: set[int] = set()
    for policy in policies.values():
        policy = definitions[policy["$ref"]] if "$ref" in policy else policy
        response = policy["applies_when"].get("response", {})
        if "service_error_code" in response:
            codes.add(response["service_error_code"])
        elif "http_status_code" in response:
            statuses.add(response["http_status_code"])
    return codes, statuses


SERVICES = ("dynamodb", "sqs", "sns", "kinesis")


def test_every_code_botocore_retries_is_retried_here() -> None:
    # Fails when botocore gains a code (or a status) that RETRYABLE_ERROR_CODES lacks: add it there.
    data = _botocore_retry_json()
    codes, statuses = _codes_and_statuses(data["retry"]["__default__"]["policies"], data["definitions"])
    for service in SERVICES:
        extra = data["retry"].get(service, {}).get("__default__", {}).get("policies", {})
        service_codes, service_statuses = _codes_and_statuses(extra, data["definitions"])
        codes |= service_codes
        statuses |= service_statuses - {409}  # DynamoDB's write conflict: its code is in the set
    codes |= set(standard.ThrottledRetryableChecker._THROTTLED_ERROR_CODES)
    codes |= set(standard.TransientRetryableChecker._TRANSIENT_ERROR_CODES)
    statuses |= set(standard.TransientRetryableChecker._TRANSIENT_STATUS_CODES)
    session = botocore.session.get_session()
    for service in SERVICES:
        model = session.get_service_model(service)
        for name in model.shape_names:
            shape = model.shape_for(name)
            if shape.metadata.get("retryable") is not None:
                codes.add(shape.metadata.get("error", {}).get("code", name))
    assert codes - RETRYABLE_ERROR_CODES == set()
    assert statuses - RETRYABLE_STATUS_CODES == set()
    assert len(codes) >= 15  # botocore's lists were read, not found empty
    for code in codes:
        assert is_retryable_error(client_error(code)), code
    for status in statuses:
        assert is_retryable_error(client_error("Unknown", status=status)), status


def test_the_codes_the_issue_found_missing_are_retried() -> None:
    for code in ("ThrottledException", "SlowDown", "LimitExceededException", "BandwidthLimitExceeded",
                 "TransactionInProgressException"):  # fmt: skip
        assert is_retryable_error(client_error(code)), code


def test_429_is_retryable_whatever_the_code() -> None:
    assert is_retryable_error(client_error("Throttled", status=429))
    assert is_retryable_error(client_error("SomethingElse", status=429))
    assert not is_retryable_error(client_error("SomethingElse", status=403))
