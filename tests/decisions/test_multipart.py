"""multipart.read_form (app/decisions/multipart.py): parts are views of the body, not copies."""

from __future__ import annotations

from app.decisions.multipart import read_form

BOUNDARY = "b0undary"
CTYPE = f"multipart/form-data; boundary={BOUNDARY}"


def part(name: str, content: bytes) -> bytes:
    return f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + content + b"\r\n"


def test_a_big_part_is_a_view_of_the_body() -> None:
    image = bytes(range(256)) * 40_000  # 10 MB: a copy would double what the request holds
    raw = part("request", b"{}") + part("img", image) + f"--{BOUNDARY}--\r\n".encode()
    form = read_form(raw, CTYPE)
    assert form.request == b"{}"
    view = form.files["img"]
    assert isinstance(view, memoryview) and view.obj is raw
    assert bytes(view) == image


def test_bytes_that_look_like_a_boundary_stay_in_the_part() -> None:
    tricky = b"start\r\n--b0und\r\n--b0undar" + b"\r\n-" * 100 + b"end"
    raw = part("request", b"{}") + part("img", tricky) + f"--{BOUNDARY}--\r\n".encode()
    assert bytes(read_form(raw, CTYPE).files["img"]) == tricky
