"""A floor under a body's text (SPEC §1: the body without its media fields, as compact JSON),
counted on its bytes before anything is decoded into Python objects.

A body of 30 MiB of ``{}`` takes seconds and most of a gigabyte to decode, only to be refused
for its text. Its floor takes tens of milliseconds and no objects: every input byte counted maps
to its own byte of the compact re-encoding, so ``floor <= text`` for every body the full check
accepts, and a body whose floor is over its model's limit is refused (413) undecoded.

Counted bytes, per 256 KiB chunk (so a worker thread lets the event loop in between chunks):

- ``hexless``: every byte but whitespace, ``\\``, ``-`` (``-0`` re-encodes as ``0``), ``u`` and
  hex digits (the five a ``\\uXXXX`` escape loses). Structure (``{}[],:"``) always counts, so
  padding a body can never lower the count of its structure.
- ``escaped``: every byte but whitespace, ``\\`` and ``-``, less 4 per ``\\u`` (an escape's six
  bytes re-encode as at least one). It counts text made of hex digits that ``hexless`` drops.

The floor is the larger of the two, less each media member's bytes (its value, key, colon and
comma). A body whose first member is its model, in plain text, is counted at once while no media
key (nor a ``\\u`` escape, which could spell one) turns up (``leading``, ``plain_floor``); any
other is probed first: msgspec finds the model and the media members without building the rest
(``msgspec.Raw``), but holds the GIL while it skips, ~2 ns a byte of ``{}``. A media value that
is not a list of strings is not subtracted (such a body is a 400 anyway).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from app.decisions.schema import MAX_MEDIA_ITEMS, MEDIA_FIELDS
from app.errors import ValidationFailed, problem

CHUNK = 1 << 18  # 256 KiB: ~0.3 ms of translate each, then the GIL may pass to the loop
_SPACE = b" \t\r\n"
_NOT_COUNTED = _SPACE + b"\\-"
_NOT_COUNTED_HEXLESS = _NOT_COUNTED + b"u0123456789abcdefABCDEF"


class _Members(msgspec.Struct):
    """The top-level members the floor needs; every other one is skipped, never decoded."""

    model: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    images: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    audio: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    videos: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_members = msgspec.json.Decoder(_Members)
_media_list = msgspec.json.Decoder(list[str] | None)
_model = msgspec.json.Decoder(str)
# A body that names its model first, in plain text, as clients write it ({"model": "nimble", ...}).
_LEADING_MODEL = re.compile(rb'[ \t\r\n]*\{[ \t\r\n]*"model"[ \t\r\n]*:[ \t\r\n]*"([^"\\\x00-\x1f]{1,256})"')
# What could start a media member: its key, or a \u escape (which could spell one).
_MEDIA_SIGNS = (*(b'"' + field.encode() + b'"' for field in MEDIA_FIELDS), b"\\u")


@dataclass(frozen=True, slots=True)
class Probe:
    """What is known of a body before it is decoded."""

    model: str | None  # None: missing, or not a non-empty string (a 400 once decoded)
    model_missing: bool
    media_bytes: int  # the media members' bytes (value, key, colon, comma): not text
    size: int  # the body's bytes

    def can_exceed(self, limit: int) -> bool:
        """Whether a floor could be over ``limit``: never when the bytes outside media fit in it
        (a body of big images and a short state is not counted at all)."""
        return self.size - self.media_bytes > limit

    def model_problem(self) -> ValidationFailed:
        """The 400 a body without a usable model gets (SPEC §1: ``model`` is a non-empty string)."""
        if self.model_missing:
            return ValidationFailed([problem(("model",), "field required", "missing")])
        return ValidationFailed([problem(("model",), "must be a non-empty string", "string_type")])


def probe(raw: bytes) -> Probe:
    """The body's model and media; ValidationFailed (400) when it is not a JSON object. msgspec
    skips the rest without building it (and lets other threads run meanwhile)."""
    try:
        members = _members.decode(raw)
    except msgspec.ValidationError as exc:
        raise ValidationFailed([problem((), "the body must be a JSON object", "model_attributes_type")]) from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValidationFailed([problem((), f"the body is not valid JSON: {exc}", "json_invalid")]) from exc
    media = 0
    for field in MEDIA_FIELDS:
        value = getattr(members, field)
        if isinstance(value, msgspec.Raw) and _is_media_list(value):
            media += len(value) + len(field) + 4  # its value, its key (quoted), ':' and ','
    return Probe(_model_name(members.model), members.model is msgspec.UNSET, media, len(raw))


def leading(raw: bytes) -> Probe | None:
    """The probe of a body whose first member is its model, in plain text: one anchored match,
    no parse (msgspec holds the GIL while it skips millions of tiny values). None otherwise."""
    match = _LEADING_MODEL.match(raw)
    if match is None:
        return None
    try:
        name = match.group(1).decode()
    except UnicodeDecodeError:
        return None
    return Probe(name, False, 0, len(raw))


def plain_floor(raw: bytes, over: int) -> int | None:
    """The text floor of a body with no media member, counted until it is past ``over``; None
    once a media key (or a ``\\u`` escape) turns up in what was counted: then only ``probe``
    can say which bytes are media."""
    return _count(raw, over, plain=True)


def text_floor(raw: bytes, probe: Probe, over: int | None = None) -> int:
    """At most the text the full check measures (0 at least). Counting stops once the floor is
    past ``over``: that is all a refusal needs, and 30 MiB of ``{}`` is past 64 KiB in one chunk."""
    return max(compact_floor(raw, None if over is None else over + probe.media_bytes) - probe.media_bytes, 0)


def compact_floor(raw: bytes, over: int | None = None) -> int:
    """At most the length of ``raw`` re-encoded as compact JSON (whenever it parses); counting
    stops once past ``over`` (every prefix's count is a floor too)."""
    counted = _count(raw, over, plain=False)
    return 0 if counted is None else counted


def _count(raw: bytes, over: int | None, plain: bool) -> int | None:
    hexless = escaped = 0
    view = memoryview(raw)
    for start in range(0, len(raw), CHUNK):
        if plain and _media_sign(raw, start):
            return None
        chunk = bytes(view[start:start + CHUNK])
        hexless += len(chunk.translate(None, _NOT_COUNTED_HEXLESS))
        # A "\\u" counts where its backslash is: the next chunk's first byte is looked at too.
        starts = chunk.count(b"\\u") + (chunk.endswith(b"\\") and raw[start + CHUNK:start + CHUNK + 1] == b"u")
        escaped += len(chunk.translate(None, _NOT_COUNTED)) - 4 * starts
        if over is not None and max(hexless, escaped) > over:
            break
    return max(hexless, escaped)


def _media_sign(raw: bytes, start: int) -> bool:
    """A media key or ``\\u`` starting in this chunk (one that runs into the next one included)."""
    return any(raw.find(sign, start, start + CHUNK + len(sign) - 1) != -1 for sign in _MEDIA_SIGNS)


def _is_media_list(value: msgspec.Raw) -> bool:
    # More commas than MAX_MEDIA_ITEMS items can hold (a data: URL has one of its own) is no media
    # list: counted as text, not decoded into millions of strings first.
    if bytes(value).count(b",") > 2 * MAX_MEDIA_ITEMS:
        return False
    try:
        _media_list.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
    return True


def _model_name(value: msgspec.Raw | msgspec.UnsetType) -> str | None:
    if not isinstance(value, msgspec.Raw):
        return None
    try:
        name = _model.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return name or None
