"""The error bodies real vLLM 0.33 answers, as the emulator's tests assert them."""

from __future__ import annotations

import httpx


def refused(resp: httpx.Response, message: str, param: str | None = None, status: int = 400,
            err_type: str = "BadRequestError") -> None:
    """vLLM's `create_error_response` body."""
    assert resp.status_code == status, resp.text
    assert resp.json() == {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def invalid(resp: httpx.Response, param: str, *errors: str) -> None:
    """vLLM's `validation_exception_handler` body for pydantic's errors."""
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "\n".join(f"  {e}" for e in errors)
    refused(resp, message, param, err_type="Bad Request")
