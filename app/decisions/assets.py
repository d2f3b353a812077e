"""TypeSafe's ``assets`` made into SPEC §1's ``images``, for a multipart body (multipart.py).

The SDK's JSON carries ``"assets": {reference: {"type": "image", "part": "asset-0"}}`` and writes
each reference (``<image:...>``, or an alias the caller chose) as, or inside, a string of the
state, a question's instructions or its criteria, where TypeSafe's API puts the image. Arbiter's
backends take images as one list placed before the state, so each image becomes the base64 item
``images[N]`` (in the order of ``assets``, after any images the JSON already had) and each of its
references the marker ``[img-N]`` (Ollama's and llama.cpp's way of naming a prompt's image N).
``assets`` itself is dropped: no backend knows it. What remains is checked and forwarded as JSON.

It runs in three steps, cheapest first, so that the route can refuse a body before its images are
encoded (issue #30): ``plan`` reads the assets (at most MAX_ASSETS references of at most
MAX_REFERENCE_CHARS characters) and what their base64 will weigh; ``Plan.mark`` replaces the
references in one linear pass (an Aho-Corasick automaton, leftmost-longest, never an alternation
of caller-chosen strings, which backtracks over their shared prefixes) and says by how many bytes
the text grew; ``Plan.encode`` makes the images.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ahocorasick_rs

from app.decisions.multipart import Part, invalid
from app.decisions.schema import MAX_MEDIA_ITEMS
from app.errors import ValidationFailed

ASSETS = "assets"
MAX_ASSETS = 64  # references in one request
MAX_REFERENCE_CHARS = 256  # the SDK's references are ~20 characters


def base64_size(size: int) -> int:
    """The length of ``size`` bytes as base64 (padded)."""
    return (size + 2) // 3 * 4


@dataclass(slots=True)
class Plan:
    """What ``assets`` asks for, checked, before anything is encoded."""

    present: list[Any]  # the images the JSON had already
    sources: list[Part | str]  # each new image: its part's bytes, or its own base64
    markers: dict[str, str]  # reference -> marker
    encoded_bytes: int  # what the new images weigh as base64 (their parts': the rest is in the JSON)

    def mark(self, body: dict[str, Any]) -> int:
        """Replace every reference in the state, the instructions and the criteria (values, not
        option names) by its image's marker; the bytes the JSON text grew by (or lost)."""
        if not self.markers:
            return 0
        references = list(self.markers)
        replacements = [self.markers[r] for r in references]
        growth = [len(m.encode()) - len(r.encode()) for r, m in zip(references, replacements, strict=True)]
        automaton = ahocorasick_rs.AhoCorasick(references, matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
        grown = 0

        def swap(text: str) -> str:
            nonlocal grown
            matches = automaton.find_matches_as_indexes(text)
            if not matches:
                return text
            pieces: list[str] = []
            at = 0
            for index, start, end in matches:
                pieces += (text[at:start], replacements[index])
                grown += growth[index]
                at = end
            pieces.append(text[at:])
            return "".join(pieces)

        if "state" in body:
            body["state"] = _strings(body["state"], swap)
        questions = body.get("questions")
        if isinstance(questions, dict):
            for question in questions.values():
                if not isinstance(question, dict):
                    continue
                for key in ("instructions", "criteria"):
                    if key in question:
                        question[key] = _strings(question[key], swap)
        return grown

    def encode(self, body: dict[str, Any]) -> None:
        """Put the images in ``body["images"]`` as base64 (the costly step: last)."""
        added = [s if isinstance(s, str) else base64.b64encode(s).decode("ascii") for s in self.sources]
        self.sources = []  # the parts' bytes are no longer needed here
        body["images"] = [*self.present, *added]


def plan(body: Any, files: dict[str, Part]) -> Plan | None:
    """The assets of ``body`` (taken out of it) checked against ``files``; None when it has none.
    ValidationFailed (400) for an asset or a part that does not fit."""
    if not isinstance(body, dict):
        return None  # schema.validate refuses it
    if ASSETS not in body:
        if files:
            raise _unclaimed(next(iter(files)))
        return None
    assets = body.pop(ASSETS)
    if not isinstance(assets, dict) or not assets:
        raise invalid("must be a non-empty object of assets by reference", "dict_type", (ASSETS,))
    if len(assets) > MAX_ASSETS:
        raise invalid(f"has {len(assets)} assets; at most {MAX_ASSETS} are accepted in one request",
                      "too_long", (ASSETS,))
    present = body.get("images") or []
    if not isinstance(present, list):
        raise invalid("must be a list of base64 strings or data: URLs", "list_type", ("images",))
    if len(present) + len(assets) > MAX_MEDIA_ITEMS:
        raise invalid(f"with its {len(assets)} assets holds {len(present) + len(assets)} images; at most "
                      f"{MAX_MEDIA_ITEMS} are accepted", "too_long", ("images",))
    claimed: set[str] = set()
    markers: dict[str, str] = {}
    sources: list[Part | str] = []
    encoded = 0
    for reference, entry in assets.items():
        source = _image(reference, entry, files, claimed)
        sources.append(source)
        if not isinstance(source, str):
            encoded += base64_size(len(source))
        markers[reference] = f"[img-{len(present) + len(sources) - 1}]"
    for name in files:
        if name not in claimed:
            raise _unclaimed(name)
    return Plan(present, sources, markers, encoded)


def attach(body: Any, files: dict[str, Part]) -> None:
    """All three steps at once, in place (where nothing needs checking between them)."""
    planned = plan(body, files)
    if planned is not None:
        planned.mark(body)
        planned.encode(body)


def _image(reference: str, entry: Any, files: dict[str, Part], claimed: set[str]) -> Part | str:
    """One asset's image: its part's bytes, or its own ``data_base64``."""
    where = (ASSETS, reference)
    if not reference:
        raise invalid("an asset's reference must be a non-empty string", "string_type", where)
    if len(reference) > MAX_REFERENCE_CHARS:
        raise invalid(f"an asset's reference is at most {MAX_REFERENCE_CHARS} characters, not "
                      f"{len(reference)}", "string_too_long", (ASSETS,))
    if not isinstance(entry, dict):
        raise invalid("must be an object such as {\"type\": \"image\", \"part\": \"asset-0\"}",
                      "dict_type", where)
    if entry.get("type", "image") not in ("image", None):
        raise invalid("only image assets are accepted", "literal_error", (*where, "type"))
    part = entry.get("part")
    if part is None:
        data = entry.get("data_base64")
        if isinstance(data, str) and data:
            return data
        raise invalid("needs a 'part' (the multipart part that holds the image) or 'data_base64'",
                      "missing", (*where, "part"))
    if not isinstance(part, str) or part not in files:
        raise invalid(f"names part {part!r}, which the multipart body does not have",
                      "multipart_missing_part", (*where, "part"))
    if part in claimed:
        raise invalid(f"part {part!r} is named by two assets; send it once for each",
                      "multipart_part", (*where, "part"))
    claimed.add(part)
    if not len(files[part]):
        raise invalid(f"part {part!r} is empty", "multipart_part", (*where, "part"))
    return files[part]


def _unclaimed(name: str) -> ValidationFailed:
    return invalid(f"part '{name}' of the multipart body is not named by any entry of 'assets'",
                   "multipart_unknown_part", (ASSETS,))


def _strings(value: Any, swap: Callable[[str], str]) -> Any:
    """``value`` with ``swap`` applied to every string in it (containers changed in place)."""
    if isinstance(value, str):
        return swap(value)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _strings(item, swap)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            value[index] = _strings(item, swap)
    return value
