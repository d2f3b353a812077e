"""Web UI sessions kept in the database, so that every replica sees a session end.

A session is a row keyed by the SHA-256 of its cookie (the table never holds a cookie that
works). It ends at its maximum age, after ``idle`` without a request, at sign-out, and when its
admin key is revoked, expires or is rotated: a rotated key keeps working for its grace period
as an API credential, but its sessions end at once. Every check is one primary-key lookup;
``last_seen_at`` is written at most once per ``touch_every`` seconds, so a busy page does not
write on every request.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from app.db.models import ApiKey, UiSessionRow, utcnow
from app.db.timestamps import as_utc

TOUCH_EVERY = 60.0  # seconds: at most one write of last_seen_at per session per minute


@dataclass(frozen=True, slots=True)
class Ended:
    """Why a session no longer counts, in words for the sign-in page."""

    reason: str


SIGNED_OUT = Ended("Your session ended: you signed out.")
IDLE = Ended("Your session ended after a while without use; sign in again.")
EXPIRED = Ended("Your session has expired; sign in again.")
KEY_GONE = Ended("Your session ended: the admin key was revoked, rotated or has expired.")
UNKNOWN = Ended("Your session ended; sign in again.")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def start(session: Session, key_id: int, token: str, expires: dt.datetime) -> None:
    """Record a new session; sessions past their maximum age are cleared out on the way."""
    now = utcnow()
    session.execute(delete(UiSessionRow).where(UiSessionRow.expires_at < now))
    session.add(UiSessionRow(digest=digest(token), key_id=key_id, created_at=now, last_seen_at=now,
                             expires_at=expires))


def check(session: Session, token: str, key_id: int, idle: dt.timedelta,
          now: dt.datetime | None = None) -> Ended | None:
    """None when the session of ``token`` is live (and its last use recorded), else why not."""
    now = now or utcnow()
    row = session.get(UiSessionRow, digest(token))
    if row is None or row.key_id != key_id:
        return UNKNOWN
    if row.ended_at is not None:
        return SIGNED_OUT
    if as_utc(row.expires_at) <= now:
        return EXPIRED
    last_seen = as_utc(row.last_seen_at)
    if last_seen + idle <= now:
        return IDLE
    key = session.get(ApiKey, row.key_id)
    if key is None or key.replaced_by_id is not None:
        return KEY_GONE
    # Written well within the idle timeout, so a session in use never idles out between writes.
    if (now - last_seen).total_seconds() >= min(TOUCH_EVERY, idle.total_seconds() / 4):
        session.execute(update(UiSessionRow).where(UiSessionRow.digest == row.digest,
                                                   UiSessionRow.last_seen_at < now)
                        .values(last_seen_at=now).execution_options(synchronize_session=False))
    return None


def end(session: Session, token: str) -> bool:
    """Sign-out: the session of ``token`` ends for every replica. Whether one was live."""
    ended = session.execute(update(UiSessionRow).where(UiSessionRow.digest == digest(token),
                                                       UiSessionRow.ended_at.is_(None))
                            .values(ended_at=utcnow()).execution_options(synchronize_session=False))
    return bool(ended.rowcount)  # type: ignore[attr-defined]  # a CursorResult
