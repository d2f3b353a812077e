"""The lean HTTP/1.1 client of the decision path (infra_adapters/h1.py), against raw servers on
loopback that answer with exactly the bytes a test gives them: every way an answer can be framed,
and every way it can go wrong."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from infra_adapters.base import BackendBroken, BackendTimeout, BackendUnreachable, ReplyTooLarge
from infra_adapters.h1 import H1Pool

HEADERS = (("Content-Type", "application/json"), ("User-Agent", "arbiter"))
Answer = Callable[[bytes], bytes | None]  # the request's bytes -> what to send back (None: nothing)


def ok(body: bytes, *extra: str) -> bytes:
    head = "\r\n".join(["HTTP/1.1 200 OK", "Content-Type: application/json",
                        f"Content-Length: {len(body)}", *extra])
    return head.encode() + b"\r\n\r\n" + body


async def serve(answer: Answer, work: Callable[[H1Pool, list[bytes], list[int]], Awaitable[Any]],
                *, close_after: bool = False, close_after_empty: bool = False, limit: int = 8,
                delay: float = 0.0) -> Any:
    """Run ``work(pool, requests, connections)`` against a server that answers every request
    with ``answer(request)``; ``requests`` collects what it received, ``connections`` counts.
    ``close_after_empty``: an empty answer closes the connection (a request read, never answered)."""
    requests: list[bytes] = []
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                requests.append(request)
                reply = answer(request)
                await asyncio.sleep(delay)
                if reply is None:
                    await asyncio.sleep(30)
                    return
                if close_after_empty and not reply:
                    break
                writer.write(reply)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = H1Pool(f"http://127.0.0.1:{port}/base", connect_timeout=2.0, limit=limit)
    try:
        return await work(pool, requests, connections)
    finally:
        pool.close()
        server.close()


async def post(pool: H1Pool, body: bytes = b'{"q":1}', *, timeout: float = 2.0, limit: int = 1 << 20,
               headers: dict[str, str] | None = None) -> Any:
    return await pool.post("/v1/systemone", pool.head("/v1/systemone", HEADERS), headers or {}, body,
                           timeout, limit)


def test_a_post_carries_the_head_the_headers_and_the_body_and_reuses_the_connection() -> None:
    async def work(pool: H1Pool, requests: list[bytes], connections: list[int]) -> None:
        first = await post(pool, headers={"X-Request-Id": "abc"})
        second = await post(pool, b'{"q":2}')
        assert (first.status, first.content_type, first.body) == (200, "application/json", b'{"a":1}')
        assert second.body == b'{"a":1}'
        assert connections[0] == 1 and pool.busy == 0 and pool.open_connections == 1
        head, _, body = requests[0].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /base/v1/systemone HTTP/1.1"
        assert b"Host: 127.0.0.1:" + str(pool._port).encode() in lines
        assert {b"Content-Type: application/json", b"User-Agent: arbiter", b"X-Request-Id: abc",
                b"Content-Length: 7"} <= set(lines)
        assert body == b'{"q":1}' and requests[1].endswith(b'{"q":2}')

    asyncio.run(serve(lambda _r: ok(b'{"a":1}'), work))


@pytest.mark.parametrize("raw", [
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n"),
    ok(gzip.compress(b'{"a":1}'), "Content-Encoding: gzip"),
    b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b'{"a":1}'),
], ids=["chunked", "gzip", "after 100 Continue"])
def test_every_framing_of_an_answer_gives_its_body(raw: bytes) -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        reply = await post(pool)
        assert (reply.status, reply.body) == (200, b'{"a":1}')

    asyncio.run(serve(lambda _r: raw, work))


def test_an_answer_delimited_by_the_end_of_the_connection_is_whole() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"a\":1}"

    async def work(pool: H1Pool, _requests: list[bytes], connections: list[int]) -> None:
        assert (await post(pool)).body == b'{"a":1}'
        assert (await post(pool)).body == b'{"a":1}'
        assert connections[0] == 2  # not reused after Connection: close

    asyncio.run(serve(lambda _r: raw, work, close_after=True))


def test_a_backend_error_passes_through_with_its_status_and_type() -> None:
    raw = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nnot found"

    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        reply = await post(pool)
        assert (reply.status, reply.content_type, reply.body) == (404, "text/plain", b"not found")

    asyncio.run(serve(lambda _r: raw, work))


@pytest.mark.parametrize("raw", [
    ok(b"x" * 2000),  # declared
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"x" * 2000 + b"\r\n0\r\n\r\n",  # counted
], ids=["declared", "counted"])
def test_an_answer_over_the_cap_is_refused_and_its_connection_dropped(raw: bytes) -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(ReplyTooLarge):
            await post(pool, limit=1000)
        assert pool.busy == 0
        await asyncio.sleep(0.05)
        assert pool.open_connections == 0

    asyncio.run(serve(lambda _r: raw, work))


@pytest.mark.parametrize("raw", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\":",  # then the connection ends
], ids=["malformed", "cut short"])
def test_a_broken_answer_is_backend_broken(raw: bytes) -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(BackendBroken):
            await post(pool)
        assert pool.busy == 0

    asyncio.run(serve(lambda _r: raw, work, close_after=True))


def test_no_answer_in_time_is_a_timeout_and_frees_the_slot() -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(BackendTimeout):
            await post(pool, timeout=0.2)
        assert pool.busy == 0

    asyncio.run(serve(lambda _r: None, work))


def test_nobody_listening_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused

        async def work() -> None:
            pool = H1Pool(f"http://127.0.0.1:{port}", connect_timeout=1.0, limit=4)
            with pytest.raises(BackendUnreachable):
                await post(pool)
            assert pool.busy == 0

        asyncio.run(work())


def test_requests_past_the_limit_wait_for_a_free_connection() -> None:
    async def work(pool: H1Pool, requests: list[bytes], connections: list[int]) -> None:
        replies = await asyncio.gather(*(post(pool) for _ in range(10)))
        assert [r.status for r in replies] == [200] * 10
        assert connections[0] <= 2 and pool.busy == 0

    asyncio.run(serve(lambda _r: ok(b'{"a":1}'), work, limit=2))


def test_a_cancelled_request_gives_its_slot_back_and_its_connection_up() -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        task = asyncio.ensure_future(post(pool))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.busy == 0
        await asyncio.sleep(0.05)
        assert pool.open_connections == 0

    asyncio.run(serve(lambda _r: None, work))


def test_a_header_value_with_a_line_break_is_refused() -> None:
    async def work(pool: H1Pool, requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(ValueError):
            await post(pool, headers={"X-Request-Id": "a\r\nX-Evil: 1"})
        assert pool.busy == 0 and not requests

    asyncio.run(serve(lambda _r: ok(b"{}"), work))


def test_a_request_that_ends_after_the_pool_closed_closes_its_connection() -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        task = asyncio.ensure_future(post(pool))
        await asyncio.sleep(0.05)
        pool.close()  # as a backend's aclose() does while a request is in flight
        assert (await task).status == 200
        await asyncio.sleep(0.05)
        assert pool.busy == 0 and pool.open_connections == 0

    asyncio.run(serve(lambda _r: ok(b"{}"), work, delay=0.2))


# -- what a reused connection must not carry over, and answers that break the rules ------------


def test_a_reused_connection_closed_without_an_answer_is_broken_not_the_last_answer_again() -> None:
    """The first answer (a 204 without Content-Length) leaves no state behind: when the server then
    closes the kept connection without answering, the second POST fails; it is not the old 204."""
    answers = iter([b"HTTP/1.1 204 No Content\r\n\r\n"])

    async def work(pool: H1Pool, requests: list[bytes], _connections: list[int]) -> None:
        assert (await post(pool)).status == 204
        with pytest.raises(BackendBroken):
            await post(pool)
        assert len(requests) == 2 and pool.busy == 0

    asyncio.run(serve(lambda _r: next(answers, b""), work, close_after_empty=True))


def test_an_interim_answer_then_the_end_of_the_connection_is_broken() -> None:
    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(BackendBroken):
            await post(pool)
        assert pool.busy == 0

    asyncio.run(serve(lambda _r: b"HTTP/1.1 100 Continue\r\n\r\n", work, close_after=True))


def test_bytes_after_an_answer_never_reach_the_next_request() -> None:
    """An unrequested (partial) answer right behind the real one: the connection is dropped, so the
    next request, maybe another tenant's, gets its own answer on a fresh connection."""
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nIN"
    answers = iter([ok(b'{"a":1}') + stray, ok(b'{"b":2}')])

    async def work(pool: H1Pool, _requests: list[bytes], connections: list[int]) -> None:
        assert (await post(pool)).body == b'{"a":1}'
        assert (await post(pool)).body == b'{"b":2}'
        assert connections[0] == 2

    asyncio.run(serve(lambda _r: next(answers), work))


def test_a_header_flood_is_cut_off_early() -> None:
    """Headers count against no cap of their own otherwise; a backend sending megabytes of one
    header value is stopped after the first 64 KiB or so, not read to the end."""

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request's head; its small body stays unread
        writer.write(b"HTTP/1.1 200 OK\r\nX-Flood: ")
        try:
            for _ in range(4096):  # 64 MiB in 16 KiB pieces, unless the client hangs up first
                writer.write(b"a" * 16384)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()

    async def work() -> None:
        server = await asyncio.start_server(flood, "127.0.0.1", 0)
        pool = H1Pool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connect_timeout=2.0, limit=2)
        try:
            with pytest.raises(BackendBroken, match="headers"):
                await post(pool, timeout=20.0)
            assert pool.busy == 0
        finally:
            pool.close()
            server.close()

    asyncio.run(work())


def test_trailers_do_not_change_the_answers_headers() -> None:
    raw = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"7\r\n{\"a\":1}\r\n0\r\nContent-Type: text/evil\r\nContent-Encoding: gzip\r\n\r\n")

    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        reply = await post(pool)
        assert (reply.status, reply.content_type, reply.body) == (200, "application/json", b'{"a":1}')

    asyncio.run(serve(lambda _r: raw, work))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_cut_off_compressed_answer_is_broken(encoding: str) -> None:
    import zlib

    data = b'{"answers":' + b'"x",' * 200 + b'"end"}'
    packed = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    cut = packed[: len(packed) // 2]
    raw = ok(cut, f"Content-Encoding: {encoding}")

    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(BackendBroken, match="cannot decode"):
            await post(pool)
        assert pool.busy == 0

    asyncio.run(serve(lambda _r: raw, work))


def test_switching_protocols_is_broken() -> None:
    raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

    async def work(pool: H1Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(BackendBroken):
            await post(pool)
        assert pool.busy == 0

    asyncio.run(serve(lambda _r: raw, work))


def test_a_slot_handed_over_as_the_wait_times_out_is_passed_on() -> None:
    """Python 3.12+ may raise TimeoutError from wait_for although the slot was handed to the waiter
    in the same turn; the slot must then go to the next waiter (or back), never be lost."""

    async def work() -> None:
        pool = H1Pool("http://127.0.0.1:9", connect_timeout=1.0, limit=1)
        pool.busy = 1  # the one slot is taken: the next request waits
        loop = asyncio.get_running_loop()
        original = asyncio.wait_for

        async def hand_over_then_time_out(future: Any, timeout: float) -> Any:
            pool._release(None)  # the taken slot is freed and goes to the waiter ...
            assert future.done()
            raise TimeoutError  # ... and the wait gives up all the same (3.12's race)

        asyncio.wait_for = hand_over_then_time_out  # type: ignore[assignment]
        try:
            with pytest.raises(BackendTimeout):
                await pool._acquire("u", 0.05, loop.time() + 0.05)
        finally:
            asyncio.wait_for = original
        assert pool.busy == 0 and not pool._waiters  # nobody holds a slot, and none is lost

    asyncio.run(work())
