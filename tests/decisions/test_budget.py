"""The decode budget (app/decisions/budget.py): what bodies grow to, bounded for the process."""

from __future__ import annotations

import pytest

from app.decisions.budget import DecodeBudget
from app.errors import BackendFailed


def test_requests_share_the_budget_and_give_it_back() -> None:
    budget = DecodeBudget(100)
    first, second = budget.reservation(), budget.reservation()
    first.take(60)
    second.take(40)
    with pytest.raises(BackendFailed) as refused:
        second.take(1)
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
    assert budget.used == 100 and budget.refused == 1
    first.release()
    second.take(50)
    assert budget.used == 90
    second.release()
    second.release()  # twice changes nothing
    assert budget.used == 0


def test_a_request_alone_is_never_refused_for_its_size() -> None:
    budget = DecodeBudget(10)
    alone = budget.reservation()
    alone.take(8)
    alone.take(50)  # over the budget, but nobody else holds any of it
    assert budget.used == 58
    with pytest.raises(BackendFailed):
        budget.reservation().take(1)
    alone.release()
    assert budget.used == 0
