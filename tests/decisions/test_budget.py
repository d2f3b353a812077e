"""The decode budget (app/decisions/budget.py): what bodies grow to, bounded for the process."""

from __future__ import annotations

import pytest

from app.decisions.budget import DecodeBudget
from app.errors import BackendFailed


def test_requests_share_the_budget_and_give_it_back() -> None:
    budget = DecodeBudget(100)
    first, second = budget.reservation(1), budget.reservation(2)  # two projects
    first.take(60)
    second.take(40)
    with pytest.raises(BackendFailed) as refused:
        second.take(1)
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
    assert budget.used == 100 and budget.refused == 1
    first.release()
    second.take(10)  # alone now: past its project's half too
    assert budget.used == 50
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


def test_no_project_holds_more_than_half_while_others_hold_any() -> None:
    budget = DecodeBudget(100)
    greedy, other = budget.reservation(1), budget.reservation(2)
    first = budget.reservation(1)
    first.take(30)
    greedy.take(20)  # project 1: 50 of 100
    with pytest.raises(BackendFailed) as refused:
        greedy.take(1)
    assert "for one project" in refused.value.message
    other.take(50)  # another project still finds its half
    first.give_back(30)
    assert budget.held_by(1) == 20 and budget.used == 70 and first.held == 0
