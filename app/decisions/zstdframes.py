"""Whether a zstd body's frames are all whole, read from their headers alone (RFC 8878 §3.1).

``zstandard``'s stream_reader decodes a truncated frame's prefix without complaint, and a
decompression object returns a frame's whole output at once (32 MiB for a bomb at the cap), so
neither can prove a body whole without decoding it twice or holding it twice. The frame and block
headers can: each block says its size, the last one says it is last, a checksum takes 4 bytes.
Walking them touches a few bytes per 128 KiB block. Corruption inside a block is the decoder's to
find (it raises); this finds what is missing.
"""

from __future__ import annotations

from collections.abc import Iterator

MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE = 0xFFFFFFF0, 0x184D2A50
_DICTIONARY_ID_BYTES = (0, 1, 2, 4)
_CONTENT_SIZE_BYTES = (0, 2, 4, 8)  # by Frame_Content_Size_flag; flag 0 is 1 byte when single-segment
_RESERVED_BLOCK = 3
_RLE_BLOCK = 1


MAX_FRAMES = 1024  # a client compresses a body as one frame; a few more are allowed
STEP_BLOCKS = 4096  # headers walked between two looks at the event loop (~2 ms)


def max_blocks(cap: int) -> int:
    """The most blocks a body under ``cap`` decoded bytes may have: an average of 1 KiB a block
    (an encoder's blocks hold up to 128 KiB; millions of empty ones are a way to burn CPU)."""
    return max(4096, cap // 1024)


def whole(data: bytes, blocks: int | None = None) -> bool:
    """Whether ``data`` is zero or more whole zstd (or skippable) frames and nothing else (an
    empty body is empty, as an empty gzip body is), of at most MAX_FRAMES frames and ``blocks``
    blocks."""
    for verdict in walk(data, blocks):
        if verdict is not None:
            return verdict
    return False


def walk(data: bytes, blocks: int | None = None) -> Iterator[bool | None]:
    """``whole`` a step at a time: None every STEP_BLOCKS blocks (the caller may let other work
    run), then the verdict."""
    at, end = 0, len(data)
    frames = 0
    left = blocks if blocks is not None else max_blocks(len(data) * 1024)
    while at < end:
        frames += 1
        if end - at < 4 or frames > MAX_FRAMES:
            yield False
            return
        magic = int.from_bytes(data[at:at + 4], "little")
        if magic & SKIPPABLE_MASK == SKIPPABLE:
            if end - at < 8:
                yield False
                return
            at += 8 + int.from_bytes(data[at + 4:at + 8], "little")
            if at > end:
                yield False
                return
            continue
        if magic != MAGIC or at + 4 >= end:
            yield False
            return
        descriptor = data[at + 4]
        single_segment = bool(descriptor & 0x20)
        content_size_flag = descriptor >> 6
        at += 5 + (0 if single_segment else 1) + _DICTIONARY_ID_BYTES[descriptor & 0x03]
        at += 1 if content_size_flag == 0 and single_segment else _CONTENT_SIZE_BYTES[content_size_flag]
        while True:
            left -= 1
            if left < 0 or end - at < 3:
                yield False
                return
            if left % STEP_BLOCKS == 0:
                yield None
            header = int.from_bytes(data[at:at + 3], "little")
            last, kind, size = header & 1, (header >> 1) & 3, header >> 3
            if kind == _RESERVED_BLOCK:
                yield False
                return
            at += 3 + (1 if kind == _RLE_BLOCK else size)
            if at > end:
                yield False
                return
            if last:
                break
        at += 4 if descriptor & 0x04 else 0  # the content checksum
        if at > end:
            yield False
            return
    yield True
