"""Media items: what one is, sniffing base64 heads, data: URLs and back."""

from __future__ import annotations

import base64

import pytest

from infra_adapters.media import as_base64, as_data_url, media_kind, sniff

HEADS = {
    "image/png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "image/jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00",
    "image/gif": b"GIF89a\x01\x00\x01\x00",
    "image/webp": b"RIFF\x24\x00\x00\x00WEBPVP8 ",
    "audio/wav": b"RIFF\x24\x08\x00\x00WAVEfmt ",
    "audio/mpeg": b"ID3\x04\x00\x00\x00\x00\x00\x00",
    "audio/ogg": b"OggS\x00\x02\x00\x00\x00\x00",
    "audio/flac": b"fLaC\x00\x00\x00\x22",
    "video/mp4": b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00",
    "video/webm": b"\x1aE\xdf\xa3\x9fB\x86\x81\x01",
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(("item", "kind"), [
    ("iVBORw0KGgo=", "base64"),
    ("data:image/png;base64,iVBORw0KGgo=", "data"),
    ("DATA:image/png;base64,iVBORw0KGgo=", "data"),
    ("https://example.com/a.png", "remote"),
    # As a backend's URL parser reads it: leading controls and spaces skipped, any case.
    (" http://169.254.169.254/", "remote"),
    ("\x00\t" * 20 + "HTTPS://169.254.169.254/", "remote"),
    # Any other scheme, or a colon base64 never has: refused whatever the setting.
    ("file:///etc/passwd", "other"),
    ("ftp://x/y.wav", "other"),
    ("http:example.com", "other"),
    ("ht\ttp://example.com", "other"),
])
def test_media_kind(item: str, kind: str) -> None:
    assert media_kind(item) == kind


@pytest.mark.parametrize(("media_type", "head"), sorted(HEADS.items()))
def test_sniff(media_type: str, head: bytes) -> None:
    assert sniff(b64(head + bytes(range(256)) * 4)) == media_type
    assert sniff(b64(head)) == media_type  # a payload no longer than its signature area


@pytest.mark.parametrize(
    ("head", "media_type"),
    [
        (b"\xff\xfb\x90\x64\x00", "audio/mpeg"),  # an MPEG frame without ID3
        (b"GIF87a\x01\x00", "image/gif"),
        (b"\x00\x00\x00\x20ftypisom", "video/mp4"),
    ],
)
def test_sniff_variants(head: bytes, media_type: str) -> None:
    assert sniff(b64(head + bytes(64))) == media_type


@pytest.mark.parametrize(
    "payload",
    ["", "AAAA", b64(b"just some text, not media"), b64(b"RIFF\x00\x00\x00\x00AVI LIST"),
     "!!!not base64!!!", "a", "ab="],
)
def test_sniff_unknown(payload: str) -> None:
    assert sniff(payload) == "application/octet-stream"


def test_sniff_reads_only_the_head() -> None:
    payload = b64(HEADS["image/png"]) + "!" * 100  # junk after the head is never decoded
    assert sniff(payload) == "image/png"


@pytest.mark.parametrize(("media_type", "head"), sorted(HEADS.items()))
def test_as_data_url(media_type: str, head: bytes) -> None:
    payload = b64(head + bytes(40))
    url = as_data_url(payload)
    assert url == f"data:{media_type};base64,{payload}"
    assert as_base64(url) == payload


def test_as_data_url_of_unknown_bytes() -> None:
    payload = b64(b"plain bytes here")
    assert as_data_url(payload) == f"data:application/octet-stream;base64,{payload}"


@pytest.mark.parametrize(
    "item",
    ["data:image/png;base64,iVBORw0KGgo=", "data:,hello", "http://example.com/a.png",
     "https://example.com/a.png"],
)
def test_as_data_url_leaves_urls_alone(item: str) -> None:
    assert as_data_url(item) == item


@pytest.mark.parametrize(
    ("item", "payload"),
    [
        ("data:image/png;base64,iVBORw0KGgo=", "iVBORw0KGgo="),
        ("data:audio/wav;base64,UklGRg==", "UklGRg=="),
        ("data:;base64,AAAA", "AAAA"),
        ("data:image/png;base64,", ""),
        ("iVBORw0KGgo=", "iVBORw0KGgo="),
        ("data:text/plain,hello", "data:text/plain,hello"),  # not base64: unchanged
        ("data:image/png;base64", "data:image/png;base64"),  # no comma: unchanged
        ("https://example.com/a.png", "https://example.com/a.png"),
    ],
)
def test_as_base64(item: str, payload: str) -> None:
    assert as_base64(item) == payload
