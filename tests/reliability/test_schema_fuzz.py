"""Property-based fuzzing of the public and admin APIs from Arbiter's own OpenAPI schema
(Schemathesis + Hypothesis): no request, however odd, gets a 5xx or an answer that breaks the
schema. Schemathesis's pytest plugin does not run under pytest 9, so the operations are
driven here, one Hypothesis run each."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from tests.support import Stack

EXAMPLES = 15


def test_no_5xx_and_answers_follow_the_schema(stack: Stack) -> None:
    schema = schemathesis.openapi.from_url(f"{stack.gateway.url}/openapi.json")
    failures: list[str] = []
    operations = calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        key = stack.admin_key if operation.path.startswith("/admin") else stack.project_key

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: Any) -> None:
            nonlocal calls
            calls += 1
            response = case.call(headers={"Authorization": f"Bearer {key}"}, timeout=30)
            case.validate_response(response, checks=(not_a_server_error, response_schema_conformance))

        try:
            fuzz()
        except Exception as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:600]}")
    assert operations >= 30 and calls >= operations * 5, (operations, calls)
    assert not failures, "\n\n".join(failures)
