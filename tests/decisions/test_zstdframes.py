"""Whole zstd frames, told from their headers (app/decisions/zstdframes.py)."""

from __future__ import annotations

import os

import pytest
import zstandard

from app.decisions.zstdframes import max_blocks, whole


def _streamed(data: bytes) -> bytes:
    compressor = zstandard.ZstdCompressor().compressobj()
    return compressor.compress(data) + compressor.flush()


def _compressed(data: bytes, **options: object) -> bytes:
    return zstandard.ZstdCompressor(**options).compress(data)  # type: ignore[arg-type]


SKIPPABLE = (0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
# Each body as its frames: a cut between two of them leaves whole frames.
FRAMES = {
    "zeros": [_compressed(bytes(10_000_000))],
    "random, checksummed": [_compressed(os.urandom(300_000), write_checksum=True)],
    "no content size": [_compressed(b"hello", write_content_size=False)],
    "empty": [_compressed(b"")],
    "streamed": [_streamed(b"abc" * 100_000)],
    "two frames": [_compressed(b"x" * 1000), _compressed(b"y")],
    "skippable, then a frame": [SKIPPABLE, _compressed(b"z")],
}


@pytest.mark.parametrize("name", FRAMES)
def test_whole_frames_are_whole_and_every_cut_is_not(name: str) -> None:
    data = b"".join(FRAMES[name])
    assert whole(data)
    boundaries = {sum(len(f) for f in FRAMES[name][:i]) for i in range(len(FRAMES[name]) + 1)}
    for cut in {*range(1, min(len(data), 400)), *range(max(len(data) - 400, 1), len(data))} - boundaries:
        assert not whole(data[:cut]), cut


def test_an_empty_body_is_whole_and_garbage_is_not() -> None:
    assert whole(b"")
    assert not whole(b"this is not zstd")
    assert not whole(b"\x28\xb5\x2f\xfd\xff")
    assert not whole(FRAMES["zeros"][0] + b"\x00")  # trailing bytes that are no frame


def test_bodies_built_to_burn_cpu_are_refused_by_their_headers() -> None:
    skippable = ((0x184D2A50).to_bytes(4, "little") + bytes(4)) * 100_000  # 800 KB of empty frames
    assert not whole(skippable)
    empty_blocks = ((0xFD2FB528).to_bytes(4, "little") + bytes([0x20]) + b"\x00"
                    + bytes(3) * 1_000_000 + (1).to_bytes(3, "little"))  # a million empty raw blocks
    assert not whole(empty_blocks, max_blocks(32 * 1024 * 1024))
    assert whole(_compressed(bytes(32 * 1024 * 1024)), max_blocks(32 * 1024 * 1024))  # 256 RLE blocks
