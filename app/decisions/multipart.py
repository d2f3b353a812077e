"""``multipart/form-data`` request bodies (RFC 7578), as TypeSafe's SDK sends images: the JSON of
the request in a part named ``request``, each image in a part of its own that the JSON names
(assets.py turns them into the request's ``images``).

Read by python-multipart's streaming parser (FastAPI's own), never a hand-written one, over the
body that body.py has read and decoded under the cap. Every fault is a 400 that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from python_multipart.exceptions import FormParserError, MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.errors import ValidationFailed, problem

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FORM_TYPE = b"multipart/form-data"
REQUEST_PART = "request"  # the SDK's name for the part that holds the JSON
MAX_PARTS = 1024  # a bound on the parser's work: each part is a callback round in Python


def is_multipart(content_type: str | None) -> bool:
    """Whether a body is multipart: its Content-Type's first bytes only (the JSON hot path)."""
    return content_type is not None and content_type[:10].lower() == "multipart/"


@dataclass(slots=True)
class Form:
    """The parts of a multipart body: the JSON of the request, and every other part by name. A
    part is a view of the body's own bytes where it can be (never a copy of a 24 MiB image)."""

    request: bytes
    files: dict[str, Part]


Part = bytes | memoryview


def read_form(raw: bytes, content_type: str) -> Form:
    """The parts of ``raw``, or ValidationFailed (400) naming the bad part or the fault."""
    reader = _Reader(raw)
    try:
        parser = MultipartParser(_boundary(content_type), reader.callbacks())
        parser.write(raw)
    except (MultipartParseError, FormParserError) as exc:
        raise invalid(f"the multipart body is malformed: {exc}", "multipart_malformed") from exc
    if not reader.ended:
        raise invalid("the multipart body ends before its closing boundary", "multipart_malformed")
    parts = reader.parts
    if REQUEST_PART not in parts:
        raise invalid(f"the multipart body has no part named '{REQUEST_PART}' (the JSON of the "
                      "request)", "multipart_missing_part")
    request = bytes(parts.pop(REQUEST_PART))
    return Form(request, parts)


def _boundary(content_type: str) -> bytes:
    kind, options = parse_options_header(content_type)
    if kind != FORM_TYPE:
        raise invalid(f"Content-Type {kind.decode('latin-1')} is not accepted; send "
                      "application/json or multipart/form-data", "multipart_type")
    boundary = options.get(b"boundary")
    if not boundary:
        raise invalid("the multipart/form-data Content-Type has no boundary", "multipart_malformed")
    return boundary


@dataclass(slots=True)
class _Reader:
    """The parser's callbacks: each part's headers and bytes, kept by the part's name. A part's
    bytes are kept as ranges of the body while the parser hands them out of it, and copied only
    where it hands out its own buffer (bytes it held back while they looked like a boundary)."""

    raw: bytes
    parts: dict[str, Part] = field(default_factory=dict)
    ended: bool = False
    _header: bytearray = field(default_factory=bytearray)
    _value: bytearray = field(default_factory=bytearray)
    _disposition: bytes | None = None
    _name: str = ""
    _pieces: list[tuple[int, int] | bytes] = field(default_factory=list)

    def callbacks(self) -> MultipartCallbacks:
        return {"on_part_begin": self._begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end, "on_end": self._end}

    def _begin(self) -> None:
        if len(self.parts) >= MAX_PARTS:
            raise invalid(f"the multipart body has more than {MAX_PARTS} parts", "multipart_parts")
        self._disposition = None
        self._pieces = []

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        if self._header.lower() == b"content-disposition":
            self._disposition = bytes(self._value)
        self._header.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        kind, options = parse_options_header(self._disposition)
        name = options.get(b"name")
        if kind != b"form-data" or name is None:
            raise invalid(f"part {len(self.parts) + 1} of the multipart body has no "
                          "'Content-Disposition: form-data; name=...'", "multipart_part")
        self._name = name.decode("utf-8", "replace")
        if self._name in self.parts:
            raise invalid(f"the multipart body has two parts named '{self._name}'", "multipart_part")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        pieces = self._pieces
        if data is not self.raw:
            pieces.append(data[start:end])
        elif pieces and isinstance(pieces[-1], tuple) and pieces[-1][1] == start:
            pieces[-1] = (pieces[-1][0], end)  # the parser's callbacks split one run of the body
        else:
            pieces.append((start, end))

    def _part_end(self) -> None:
        pieces = self._pieces
        if len(pieces) == 1 and isinstance(pieces[0], tuple):
            self.parts[self._name] = memoryview(self.raw)[pieces[0][0]:pieces[0][1]]
        else:
            self.parts[self._name] = b"".join(
                p if isinstance(p, bytes) else memoryview(self.raw)[p[0]:p[1]] for p in pieces)

    def _end(self) -> None:
        self.ended = True


def invalid(message: str, kind: str, loc: tuple[str, ...] = ()) -> ValidationFailed:
    return ValidationFailed([problem(loc, message, kind)])
