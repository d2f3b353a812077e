"""Whether a zstd body's frames are all whole, read from their headers alone (RFC 8878 §3.1).

``zstandard``'s stream_reader decodes a truncated frame's prefix without complaint, and a
decompression object returns a frame's whole output at once (32 MiB for a bomb at the cap), so
neither can prove a body whole without decoding it twice or holding it twice. The frame and block
headers can: each block says its size, the last one says it is last, a checksum takes 4 bytes.
Walking them touches a few bytes per 128 KiB block. Corruption inside a block is the decoder's to
find (it raises); this finds what is missing.
"""

from __future__ import annotations

MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE = 0xFFFFFFF0, 0x184D2A50
_DICTIONARY_ID_BYTES = (0, 1, 2, 4)
_CONTENT_SIZE_BYTES = (0, 2, 4, 8)  # by Frame_Content_Size_flag; flag 0 is 1 byte when single-segment
_RESERVED_BLOCK = 3
_RLE_BLOCK = 1


def whole(data: bytes) -> bool:
    """Whether ``data`` is zero or more whole zstd (or skippable) frames and nothing else (an
    empty body is empty, as an empty gzip body is)."""
    at, end = 0, len(data)
    while at < end:
        if end - at < 4:
            return False
        magic = int.from_bytes(data[at:at + 4], "little")
        if magic & SKIPPABLE_MASK == SKIPPABLE:
            if end - at < 8:
                return False
            at += 8 + int.from_bytes(data[at + 4:at + 8], "little")
            if at > end:
                return False
            continue
        if magic != MAGIC:
            return False
        next_at = _frame_end(data, at + 4)
        if next_at is None:
            return False
        at = next_at
    return True


def _frame_end(data: bytes, at: int) -> int | None:
    """Where the frame whose header descriptor is at ``at`` ends, or None when it is cut short."""
    end = len(data)
    if at >= end:
        return None
    descriptor = data[at]
    single_segment = bool(descriptor & 0x20)
    content_size_flag = descriptor >> 6
    at += 1 + (0 if single_segment else 1) + _DICTIONARY_ID_BYTES[descriptor & 0x03]
    at += 1 if content_size_flag == 0 and single_segment else _CONTENT_SIZE_BYTES[content_size_flag]
    while True:
        if end - at < 3:
            return None
        header = int.from_bytes(data[at:at + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == _RESERVED_BLOCK:
            return None
        at += 3 + (1 if kind == _RLE_BLOCK else size)
        if at > end:
            return None
        if last:
            break
    at += 4 if descriptor & 0x04 else 0  # the content checksum
    return at if at <= end else None
