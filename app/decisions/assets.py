"""TypeSafe's ``assets`` made into SPEC §1's ``images``, for a multipart body (multipart.py).

The SDK's JSON carries ``"assets": {reference: {"type": "image", "part": "asset-0"}}`` and writes
each reference (``<image:...>``, or an alias the caller chose) as, or inside, a string of the
state, a question's instructions or its criteria, where TypeSafe's API puts the image. Arbiter's
backends take images as one list placed before the state, so each image becomes the base64 item
``images[N]`` (in the order of ``assets``, after any images the JSON already had) and each of its
references the marker ``[img-N]`` (Ollama's and llama.cpp's way of naming a prompt's image N).
``assets`` itself is dropped: no backend knows it. What remains is checked and forwarded as JSON.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

from app.decisions.multipart import invalid
from app.errors import ValidationFailed

ASSETS = "assets"


def attach(body: Any, files: dict[str, bytearray]) -> None:
    """Move the images of ``files`` into ``body["images"]`` as its ``assets`` say, in place;
    ValidationFailed (400) for an asset or a part that does not fit."""
    if not isinstance(body, dict):
        return  # schema.validate refuses it
    if ASSETS not in body:
        if files:
            raise _unclaimed(next(iter(files)))
        return
    assets = body.pop(ASSETS)
    if not isinstance(assets, dict) or not assets:
        raise invalid("must be a non-empty object of assets by reference", "dict_type", (ASSETS,))
    present = body.get("images") or []
    if not isinstance(present, list):
        raise invalid("must be a list of base64 strings or data: URLs", "list_type", ("images",))
    claimed: set[str] = set()
    markers: dict[str, str] = {}
    added: list[str] = []
    for reference, entry in assets.items():
        added.append(_image(reference, entry, files, claimed))
        markers[reference] = f"[img-{len(present) + len(added) - 1}]"
    for name in files:
        if name not in claimed:
            raise _unclaimed(name)
    body["images"] = [*present, *added]
    _replace_references(body, markers)


def _image(reference: str, entry: Any, files: dict[str, bytearray], claimed: set[str]) -> str:
    """The base64 of one asset: its part's bytes, or its own ``data_base64``."""
    where = (ASSETS, reference)
    if not reference:
        raise invalid("an asset's reference must be a non-empty string", "string_type", where)
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
    if not files[part]:
        raise invalid(f"part {part!r} is empty", "multipart_part", (*where, "part"))
    return base64.b64encode(files[part]).decode("ascii")


def _unclaimed(name: str) -> ValidationFailed:
    return invalid(f"part '{name}' of the multipart body is not named by any entry of 'assets'",
                   "multipart_unknown_part", (ASSETS,))


def _replace_references(body: dict[str, Any], markers: dict[str, str]) -> None:
    """Each reference, as or inside a string of the state, the questions' instructions and their
    criteria (values, not option names), becomes its image's marker."""
    # Longest first: a reference that another one contains is not cut out of it.
    pattern = re.compile("|".join(re.escape(r) for r in sorted(markers, key=len, reverse=True)))

    def swap(text: str) -> str:
        return pattern.sub(lambda match: markers[match[0]], text)

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
