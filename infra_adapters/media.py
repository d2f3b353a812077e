"""Media items: what one is (``media_kind``), and base64 strings turned into data: URLs for
backends that want URLs.

``media_kind`` is here, below every forwarding path, because what it judges is how a backend's
URL parser would read an item (a URL it would fetch is a server-side request forgery), the same
for a decision's media fields and a chat message's parts: decisions and chat both ask it, and
neither imports the other.
"""

from __future__ import annotations

import base64
import binascii

# The members of a System One body that carry media (SPEC §1), as a backend receives them;
# app/decisions/schema.py maps each to the capability it needs.
MEDIA_FIELDS = ("images", "audio", "videos")
# C0 controls and space: URL parsers (WHATWG's, Python's urlsplit) skip them before a scheme.
_URL_LEADING = "".join(map(chr, range(0x21)))

_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF8", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),
    (b"WAVE", 8, "audio/wav"),
    (b"ID3", 0, "audio/mpeg"),
    (b"\xff\xfb", 0, "audio/mpeg"),
    (b"\xff\xf3", 0, "audio/mpeg"),
    (b"\xff\xf2", 0, "audio/mpeg"),
    (b"OggS", 0, "audio/ogg"),
    (b"fLaC", 0, "audio/flac"),
    (b"ftyp", 4, "video/mp4"),
    (b"\x1aE\xdf\xa3", 0, "video/webm"),
)


def media_kind(item: str) -> str:
    """What a media item is: ``"data"`` (a data: URL), ``"base64"``, ``"remote"`` (an http(s)://
    URL: refused unless a setting allows it) or ``"other"`` (any other scheme: always refused).

    An allowlist, as a backend's URL parser would read the item: leading controls and spaces
    are skipped (``" http://169.254.169.254/"`` is a URL), and base64 has no ``:``, so anything
    else with one (``file:``, ``ftp:``, ``http:host`` without slashes, a scheme split by a tab) is
    some other scheme."""
    head = item.lstrip(_URL_LEADING)
    scheme = head[:8].lower()
    if scheme.startswith("data:"):
        return "data"
    if scheme.startswith(("http://", "https://")):
        return "remote"
    return "other" if ":" in head else "base64"


def sniff(b64: str) -> str:
    """The media type of a base64 payload, from its first bytes."""
    try:
        head = base64.b64decode(b64[:24] + "=" * (-len(b64[:24]) % 4), validate=False)
    except (binascii.Error, ValueError):
        return "application/octet-stream"
    for signature, offset, media_type in _SIGNATURES:
        if head[offset: offset + len(signature)] == signature:
            return media_type
    return "application/octet-stream"


def as_data_url(item: str) -> str:
    if item.startswith(("data:", "http://", "https://")):
        return item
    return f"data:{sniff(item)};base64,{item}"


def as_base64(item: str) -> str:
    """The payload of a ``data:...;base64,`` URL; anything else unchanged."""
    if item.startswith("data:"):
        head, sep, payload = item.partition(",")
        if sep and head.endswith(";base64"):
            return payload
    return item
