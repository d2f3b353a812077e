"""body: Content-Encoding, Content-Length and streamed reading under a cap (SPEC §1)."""

from __future__ import annotations

import asyncio
import gzip
import os
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import zstandard

from app.decisions.body import ClientGone, check_length, content_encoding, read_body
from app.decisions.budget import DecodeBudget
from app.errors import BackendFailed, InvalidRequest, TooLarge, UnsupportedEncoding

MiB = 1024 * 1024
BOMB_SIZE = 200 * MiB
JSON = b'{"model":"nimble","state":{"ticket":"My card was charged twice. \xc5\xbc"},"questions":{}}'


class FakeReceive:
    """An ASGI receive() that hands out ``chunks`` as http.request messages."""

    def __init__(self, chunks: Iterable[bytes], *, disconnect: bool = False) -> None:
        self.messages: list[dict[str, Any]] = []
        chunks = list(chunks)
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1 and not disconnect
            self.messages.append({"type": "http.request", "body": chunk, "more_body": not last})
        if not chunks and not disconnect:
            self.messages.append({"type": "http.request", "body": b"", "more_body": False})
        if disconnect:
            self.messages.append({"type": "http.disconnect"})
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls > len(self.messages):
            return {"type": "http.disconnect"}  # what a server sends once the body is done
        return self.messages[self.calls - 1]


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def read(chunks: Iterable[bytes], encoding: str, cap: int, grow: Any = None, **kwargs: Any) -> bytes:
    return asyncio.run(read_body(FakeReceive(chunks, **kwargs), encoding, cap, grow))


def zstd(data: bytes, **kwargs: Any) -> bytes:
    return zstandard.ZstdCompressor(**kwargs).compress(data)


def refused_as_too_large(read_bomb: Callable[[], object]) -> tuple[float, int]:
    """(seconds, peak bytes allocated) of ``read_bomb()``, which must raise TooLarge."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(TooLarge):
            read_bomb()
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return elapsed, peak


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """200 MB of zeros, gzipped (about 200 KB)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = bytes(MiB)
    parts = [compressor.compress(block) for _ in range(BOMB_SIZE // MiB)]
    parts.append(compressor.flush())
    return b"".join(parts)


@pytest.fixture(scope="module")
def zstd_bomb() -> bytes:
    """200 MB of zeros in one zstd frame that declares its content size."""
    frame = zstd(bytes(BOMB_SIZE), write_content_size=True)
    assert zstandard.get_frame_parameters(frame).content_size == BOMB_SIZE
    return frame


# --- content_encoding ------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "coding"),
    [
        (None, "identity"),
        ("", "identity"),
        ("identity", "identity"),
        ("gzip", "gzip"),
        ("GZip", "gzip"),
        (" gzip ", "gzip"),
        ("x-gzip", "gzip"),
        ("zstd", "zstd"),
        ("ZSTD", "zstd"),
        ("identity, gzip", "gzip"),
        ("gzip, identity", "gzip"),
        ("identity, zstd", "zstd"),
        ("identity, identity", "identity"),
    ],
)
def test_content_encoding_supported(header: str | None, coding: str) -> None:
    assert content_encoding(header) == coding


@pytest.mark.parametrize("header", ["br", "deflate", "compress", "gzip, zstd", "gzip, gzip",
                                    "zstd, gzip", "gzip;q=1", "unknown"])
def test_content_encoding_unsupported(header: str) -> None:
    with pytest.raises(UnsupportedEncoding) as caught:
        content_encoding(header)
    error = caught.value
    assert error.status == 415 and error.error_type == "unsupported_error"
    accepted = {c.strip() for c in error.headers["Accept-Encoding"].split(",")}
    assert {"gzip", "zstd"} <= accepted


# --- check_length ----------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "0", "100", "1024"])
def test_check_length_ok(header: str | None) -> None:
    check_length(header, 1024)


@pytest.mark.parametrize("header", ["1025", "99999999999999999999", str(32 * MiB + 1)])
def test_check_length_over_cap(header: str) -> None:
    with pytest.raises(TooLarge) as caught:
        check_length(header, 1024)
    assert caught.value.status == 413


@pytest.mark.parametrize("header", ["abc", "", "1e3", "12 34", "0x10", "1.5"])
def test_check_length_not_a_number(header: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_length(header, 1024)
    assert caught.value.status == 400


# --- read_body: identity -------------------------------------------------------------


def test_plain_body() -> None:
    assert read([JSON], "identity", 1024) == JSON
    assert read(split(JSON, 7), "identity", 1024) == JSON
    assert read(split(JSON, 1), "identity", 1024) == JSON


def test_empty_body() -> None:
    assert read([], "identity", 1024) == b""
    assert read([], "gzip", 1024) == b""
    assert read([], "zstd", 1024) == b""


def test_message_without_body_key() -> None:
    receive = FakeReceive([])
    receive.messages = [{"type": "http.request", "more_body": True},
                        {"type": "http.request", "body": JSON, "more_body": False}]
    assert asyncio.run(read_body(receive, "identity", 1024)) == JSON


def test_plain_exactly_at_cap_and_one_over() -> None:
    data = b"x" * 1000
    assert read(split(data, 64), "identity", 1000) == data
    with pytest.raises(TooLarge):
        read(split(data + b"x", 64), "identity", 1000)


def test_plain_reading_stops_at_the_cap() -> None:
    receive = FakeReceive([b"x" * 1024] * 1000)
    with pytest.raises(TooLarge):
        asyncio.run(read_body(receive, "identity", 10 * 1024))
    assert receive.calls == 11


# --- read_body: gzip -------------------------------------------------------------------


def test_gzip_body() -> None:
    packed = gzip.compress(JSON)
    assert read([packed], "gzip", 1024) == JSON
    assert read(split(packed, 5), "gzip", 1024) == JSON


def test_gzip_one_byte_chunks() -> None:
    packed = gzip.compress(JSON)
    assert read(split(packed, 1), "gzip", 1024) == JSON


def test_gzip_concatenated_members() -> None:
    parts = [JSON[:10], JSON[10:40], b"", JSON[40:]]
    packed = b"".join(gzip.compress(part) for part in parts)
    assert read([packed], "gzip", 1024) == JSON
    assert read(split(packed, 1), "gzip", 1024) == JSON
    assert read(split(packed, 13), "gzip", 1024) == JSON


def test_gzip_exactly_at_cap_and_one_over() -> None:
    data = os.urandom(3000).hex().encode()  # 6000 bytes, not very compressible
    assert read(split(gzip.compress(data), 100), "gzip", 6000) == data
    assert read(split(gzip.compress(data[:3000]) + gzip.compress(data[3000:]), 1), "gzip", 6000) == data
    with pytest.raises(TooLarge):
        read(split(gzip.compress(data + b"x"), 100), "gzip", 6000)
    with pytest.raises(TooLarge):
        read([gzip.compress(data), gzip.compress(b"x")], "gzip", 6000)


def test_gzip_bomb_stops_at_the_cap_quickly(gzip_bomb: bytes) -> None:
    receive = FakeReceive(split(gzip_bomb, 64 * 1024))
    elapsed, peak = refused_as_too_large(lambda: asyncio.run(read_body(receive, "gzip", MiB)))
    assert elapsed < 2
    assert peak < 8 * MiB
    assert receive.calls <= 2  # ~1 MiB decoded comes from the first 64 KiB chunk


def test_gzip_bomb_with_the_default_cap(gzip_bomb: bytes) -> None:
    started = time.perf_counter()
    with pytest.raises(TooLarge):
        read(split(gzip_bomb, 64 * 1024), "gzip", 32 * MiB)
    assert time.perf_counter() - started < 3


@pytest.mark.parametrize("cut", [-1, -4, -8, 0.5, 12, 5, 1])
def test_gzip_truncated(cut: float) -> None:
    packed = gzip.compress(os.urandom(2000))
    end = int(len(packed) * cut) if isinstance(cut, float) else (cut if cut > 0 else len(packed) + cut)
    with pytest.raises(InvalidRequest):
        read([packed[:end]], "gzip", 1 << 20)
    with pytest.raises(InvalidRequest):
        read(split(packed[:end], 1), "gzip", 1 << 20)


def test_gzip_second_member_truncated() -> None:
    packed = gzip.compress(JSON) + gzip.compress(b" " * 100)[:-3]
    with pytest.raises(InvalidRequest):
        read([packed], "gzip", 1 << 20)


@pytest.mark.parametrize(
    "packed",
    [
        b"this is not gzip at all",
        zlib.compress(JSON),  # a zlib stream, not gzip
        zstd(JSON),
        gzip.compress(JSON)[:10] + bytes([gzip.compress(JSON)[10] ^ 0xFF]) + gzip.compress(JSON)[11:],
        gzip.compress(JSON)[:-8] + b"\x00\x00\x00\x00" + gzip.compress(JSON)[-4:],  # bad CRC
        gzip.compress(JSON) + b"trailing junk",
    ],
)
def test_gzip_corrupt(packed: bytes) -> None:
    with pytest.raises(InvalidRequest):
        read([packed], "gzip", 1 << 20)


def test_gzip_reading_stops_at_the_cap() -> None:
    receive = FakeReceive(split(gzip.compress(os.urandom(200_000)), 1024))
    with pytest.raises(TooLarge):
        asyncio.run(read_body(receive, "gzip", 10_000))
    assert receive.calls < 20


# --- read_body: zstd -------------------------------------------------------------------


def test_zstd_body() -> None:
    packed = zstd(JSON)
    assert read([packed], "zstd", 1024) == JSON
    assert read(split(packed, 1), "zstd", 1024) == JSON


def test_zstd_frame_without_content_size() -> None:
    packed = zstd(JSON, write_content_size=False)
    assert zstandard.get_frame_parameters(packed).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert read(split(packed, 3), "zstd", 1024) == JSON


def test_zstd_multiple_frames() -> None:
    packed = zstd(JSON[:10]) + zstd(JSON[10:50], write_checksum=True) + zstd(JSON[50:])
    assert read([packed], "zstd", 1024) == JSON
    assert read(split(packed, 1), "zstd", 1024) == JSON


def test_zstd_exactly_at_cap_and_one_over() -> None:
    data = os.urandom(3000).hex().encode()
    assert read([zstd(data)], "zstd", 6000) == data
    assert read([zstd(data[:1]), zstd(data[1:])], "zstd", 6000) == data
    with pytest.raises(TooLarge):
        read([zstd(data + b"x")], "zstd", 6000)
    with pytest.raises(TooLarge):
        read([zstd(data), zstd(b"x")], "zstd", 6000)


def test_zstd_compressed_bytes_are_capped_too() -> None:
    receive = FakeReceive([b"\x28\xb5\x2f\xfd" + b"x" * 1024] + [b"x" * 1024] * 1000)
    with pytest.raises(TooLarge):
        asyncio.run(read_body(receive, "zstd", 10 * 1024))
    assert receive.calls <= 11


def test_zstd_bomb_stops_at_the_cap_quickly(zstd_bomb: bytes) -> None:
    elapsed, peak = refused_as_too_large(lambda: read(split(zstd_bomb, 64 * 1024), "zstd", MiB))
    assert elapsed < 2
    assert peak < 8 * MiB


def test_zstd_bomb_with_the_default_cap(zstd_bomb: bytes) -> None:
    started = time.perf_counter()
    with pytest.raises(TooLarge):
        read([zstd_bomb], "zstd", 32 * MiB)
    assert time.perf_counter() - started < 3


def _with_declared_size(frame: bytes, declared: int) -> bytes:
    """The same frame, its Frame_Content_Size field rewritten to ``declared``."""
    descriptor = frame[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    assert fcs_flag in (2, 3), "the test frame must carry a 4- or 8-byte content size"
    start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = 4 if fcs_flag == 2 else 8
    lied = frame[:start] + declared.to_bytes(width, "little") + frame[start + width:]
    assert zstandard.get_frame_parameters(lied).content_size == declared
    return lied


@pytest.mark.parametrize("declared", [10, 1000, 500_000, 2**31])
def test_zstd_frame_lying_about_its_size_is_still_capped(declared: int) -> None:
    real = b'{"pad":"' + b"x" * (2 * MiB) + b'"}'
    frame = zstd(real, write_content_size=True)
    lying = _with_declared_size(frame, declared)
    for cap in (MiB, 64 * 1024):
        with pytest.raises((TooLarge, InvalidRequest)):
            read([lying], "zstd", cap)


def test_zstd_frame_declaring_a_small_size_but_holding_a_bomb(zstd_bomb: bytes) -> None:
    lying = _with_declared_size(zstd_bomb, 100)
    started = time.perf_counter()
    with pytest.raises((TooLarge, InvalidRequest)):
        read([lying], "zstd", MiB)
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize(
    "packed",
    [
        b"this is not zstd at all",
        gzip.compress(JSON),
        b"\x28\xb5\x2f\xfd" + b"\xff" * 64,  # a magic number, then garbage
    ],
)
def test_zstd_corrupt(packed: bytes) -> None:
    with pytest.raises(InvalidRequest):
        read([packed], "zstd", 1 << 20)


def test_zstd_checksum_mismatch() -> None:
    frame = bytearray(zstd(os.urandom(5000).hex().encode(), write_checksum=True))
    frame[len(frame) // 2] ^= 0xFF
    with pytest.raises(InvalidRequest):
        read([bytes(frame)], "zstd", 1 << 20)
    frame = bytearray(zstd(JSON, write_checksum=True))
    frame[-1] ^= 0xFF
    with pytest.raises(InvalidRequest):
        read([bytes(frame)], "zstd", 1 << 20)


@pytest.mark.parametrize("cut", [-1, -4, 0.5, 6, 4])
def test_zstd_truncated(cut: float) -> None:
    packed = zstd(os.urandom(20_000).hex().encode(), write_checksum=True)
    end = int(len(packed) * cut) if isinstance(cut, float) else (cut if cut > 0 else len(packed) + cut)
    with pytest.raises(InvalidRequest):
        read([packed[:end]], "zstd", 1 << 20)


def test_zstd_second_frame_truncated() -> None:
    packed = zstd(b'{"model":"nimble"}') + zstd(b" " * 1000)[:-2]
    with pytest.raises(InvalidRequest):
        read([packed], "zstd", 1 << 20)


# --- client gone -----------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["identity", "gzip", "zstd"])
def test_client_disconnect(encoding: str) -> None:
    packed = {"identity": JSON, "gzip": gzip.compress(JSON), "zstd": zstd(JSON)}[encoding]
    with pytest.raises(ClientGone):
        read(split(packed[:-5], 4), encoding, 1024, disconnect=True)
    with pytest.raises(ClientGone):
        read([], encoding, 1024, disconnect=True)


@pytest.mark.parametrize("header", ["-1", "+5", "1_000", " 5", "٥"])
def test_content_length_must_be_plain_digits(header: str) -> None:
    from app.decisions.body import check_length
    from app.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        check_length(header, 1000)


# --- read_body: big decodes let the event loop run, and reserve what they grow to ---------------

def _ticks_while(reading: Any) -> tuple[Any, int]:
    """What ``reading`` returned, and how often another task ran meanwhile."""
    async def both() -> tuple[Any, int]:
        ticks = 0
        done = False

        async def other() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = ticks
        try:
            result = await reading()
        finally:
            done = True
            await task
        return result, ticks - before

    return asyncio.run(both())


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_big_decode_lets_the_event_loop_run_between_steps(encoding: str) -> None:
    data = bytes(20 * MiB)
    packed = gzip.compress(data) if encoding == "gzip" else zstd(data)
    out, ticks = _ticks_while(lambda: read_body(FakeReceive([packed]), encoding, 32 * MiB))
    assert out == data
    assert ticks >= 10  # a step of at most 1 MiB at a time: /healthz is answered in between


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_what_a_body_grows_to_is_reserved_from_the_budget(encoding: str) -> None:
    data = bytes(5 * MiB)
    packed = gzip.compress(data) if encoding == "gzip" else zstd(data)
    budget = DecodeBudget(64 * MiB)
    grown = budget.reservation(1)
    assert read([packed], encoding, 32 * MiB, grow=grown) == data
    assert grown.held == budget.used == 4 * MiB  # past the first, free MiB
    budget.reservation(2).take(28 * MiB)  # another project: at most half of the budget
    budget.reservation(3).take(30 * MiB)  # and a third: 62 of 64 held
    with pytest.raises(BackendFailed) as refused:
        read([packed], encoding, 32 * MiB, grow=budget.reservation(1))
    assert refused.value.status == 503
    small = read([zstd(JSON) if encoding == "zstd" else gzip.compress(JSON)], encoding, 1024,
                 grow=budget.reservation(1))
    assert small == JSON  # the hot path's bodies take none of it


def test_a_gzip_body_of_many_members_is_refused_without_copying_it_per_member() -> None:
    members = gzip.compress(b"") * 1_000_000  # 20 MB of empty members: one decompressor each
    with pytest.raises(InvalidRequest) as refused:
        read([members], "gzip", 32 * MiB)
    assert "more than 1024 members" in refused.value.message
    assert read([gzip.compress(JSON[:40]) + gzip.compress(JSON[40:])], "gzip", 1024) == JSON  # a few are fine
