"""The backend's answer comes back as it came but for ``model`` (SPEC §1): byte for byte where the
pair can be found in it, else re-encoded with every number's own text. Its token counts are read
as the ledger can hold them."""

from __future__ import annotations

import pytest

from app.routing.answers import rewrite_model, token_count

BACKEND, PUBLIC = "nimble:latest", "nimble"


@pytest.mark.parametrize("body, expected", [
    # Ollama: model leads.
    (b'{"model":"nimble:latest","answers":{"n":1.50}}', b'{"model":"nimble","answers":{"n":1.50}}'),
    # vLLM: id leads; numbers past 64 bits, floats' text and whitespace are the backend's.
    (b'{"id":"x","object":"systemone","model":"nimble:latest","n":1.50,"big":123456789012345678901234}',
     b'{"id":"x","object":"systemone","model":"nimble","n":1.50,"big":123456789012345678901234}'),
    (b'{ "answers" : {}, "model" : "nimble:latest" , "n": 1e2 }\n',
     b'{ "answers" : {}, "model" : "nimble" , "n": 1e2 }\n'),
    # A string that mentions the pair is not the pair (its quotes are escaped).
    (b'{"note":"\\"model\\":\\"nimble:latest\\"","model":"nimble:latest"}',
     b'{"note":"\\"model\\":\\"nimble:latest\\"","model":"nimble"}'),
])
def test_the_pair_is_spliced_and_nothing_else_changes(body: bytes, expected: bytes) -> None:
    assert rewrite_model(body, BACKEND, PUBLIC) == expected


def test_a_nested_pair_alone_is_left_alone_and_numbers_keep_their_text() -> None:
    """The top-level name written with an escape, the same pair nested: only the top level changes."""
    body = b'{"model":"nimble\\u003alatest","inner":{"model":"nimble:latest"},"n":1.50,"big":123456789012345678901234}'
    assert rewrite_model(body, BACKEND, PUBLIC) == (
        b'{"model":"nimble","inner":{"model":"nimble:latest"},"n":1.50,"big":123456789012345678901234}')


def test_the_pair_twice_is_re_encoded_with_exact_numbers() -> None:
    body = b'{"id":"x","inner":{"model":"nimble:latest"},"model":"nimble:latest","n":0.10}'
    assert rewrite_model(body, BACKEND, PUBLIC) == (
        b'{"id":"x","inner":{"model":"nimble:latest"},"model":"nimble","n":0.10}')


def test_an_answer_already_in_public_terms_is_untouched() -> None:
    body = b'{ "model": "same", "n": 1.50 }'
    assert rewrite_model(body, "same", "same") is body


def test_not_json_is_untouched() -> None:
    assert rewrite_model(b"not json", BACKEND, PUBLIC) == b"not json"


def test_token_counts_past_the_bigint_range_are_unknown() -> None:
    assert token_count(2**63 - 1) == 2**63 - 1
    assert (token_count(2**63) is None and token_count(-1) is None and token_count(True) is None
            and token_count(1.0) is None)
