"""Warnings on an answer: a reading that clearly failed is still answered, but says so (issue 20).

A warning sits in the question's own diagnostics entry, ``diagnostics.<question>.warnings``, a
list of ``{"code", "message"}``: beside the figure it is about, and never a key of its own in
``diagnostics`` (whose keys are the request's question ids; a question may be named
``warnings``). ``code`` is short, stable and machine-readable; ``message`` is for people and may
change. Codes:

- ``low_label_mass``: label reading, where the model put less of its probability on the labels
  than ``ARBITER_LABEL_MASS_WARNING``; its first token was mostly something else, so the
  probabilities share out what little it gave the labels.
- ``truncated``: the embeddings strategy, where the query (the instructions and the state) or an
  option's text was longer than the model's window (e5: 512 tokens) and was cut to it before
  embedding: what lay past the window was not compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LOW_LABEL_MASS = "low_label_mass"
TRUNCATED = "truncated"
# The codes Arbiter writes: the only ones counted in arbiter_decision_warnings_total, so that a
# backend's answer cannot add series.
CODES = frozenset({LOW_LABEL_MASS, TRUNCATED})


def low_label_mass(label_mass: float, threshold: float) -> dict[str, str] | None:
    """The warning for a read whose ``label_mass`` is under ``threshold``, else None."""
    if label_mass >= threshold:
        return None
    return {"code": LOW_LABEL_MASS,
            "message": f"the model put {label_mass:.2f} of its probability on the labels, under the "
                       f"{threshold:g} of ARBITER_LABEL_MASS_WARNING: it mostly wanted to answer something "
                       "else, so this answer may be meaningless"}


def truncated(query: bool, passages: int) -> dict[str, str] | None:
    """The warning for a question whose query was cut (``query``) or ``passages`` of whose option
    texts were, to the model's window before embedding; None when nothing was cut."""
    if not query and not passages:
        return None
    texts = f"{passages} option text{'s' if passages > 1 else ''}"
    if query:
        what = f"the state (with the instructions) and {texts} were" if passages else \
            "the state (with the instructions) was"
    else:
        what = f"{texts} {'were' if passages > 1 else 'was'}"
    return {"code": TRUNCATED,
            "message": f"{what} longer than the model's window and cut to it before embedding: what lay past "
                       "the window was not compared"}


def codes_of(answer: Mapping[str, Any]) -> tuple[str, ...]:
    """The codes of Arbiter's warnings in an answer, one per warning, in question order."""
    diagnostics = answer.get("diagnostics")
    if not isinstance(diagnostics, dict):
        return ()
    found: list[str] = []
    for entry in diagnostics.values():
        listed = entry.get("warnings") if isinstance(entry, dict) else None
        if isinstance(listed, list):
            found.extend(w["code"] for w in listed if isinstance(w, dict) and w.get("code") in CODES)
    return tuple(found)
