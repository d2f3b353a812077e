"""Property-based fuzzing of the public and admin APIs from Arbiter's own OpenAPI schema
(Schemathesis + Hypothesis): no request, however odd, gets a 5xx or an answer that breaks the
schema. Schemathesis's pytest plugin does not run under pytest 9, so the operations are
driven here, one Hypothesis run each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from tests.support import Stack

EXAMPLES = 15


def fuzzer(operation: Any, key: str, count: list[int]) -> Callable[[], None]:
    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def fuzz(case: Any) -> None:
        count[0] += 1
        response = case.call(headers={"Authorization": f"Bearer {key}"}, timeout=30)
        case.validate_response(response, checks=(not_a_server_error, response_schema_conformance))

    return fuzz  # type: ignore[no-any-return]


def test_no_5xx_and_answers_follow_the_schema(stack: Stack) -> None:
    schema = schemathesis.openapi.from_url(f"{stack.gateway.url}/openapi.json",
                                           headers={"Authorization": f"Bearer {stack.admin_key}"})
    failures: list[str] = []
    operations = 0
    calls = [0]
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        key = stack.admin_key if operation.path.startswith("/admin") else stack.project_key
        try:
            fuzzer(operation, key, calls)()
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)
    assert operations >= 30 and calls[0] >= operations * 5, (operations, calls[0])
