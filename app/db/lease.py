"""A lease in the database: one replica at a time runs a background job (service syncs)."""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.db.models import Lease, utcnow
from app.db.session import Database
from app.db.timestamps import as_utc

HOLDER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def try_hold(database: Database, name: str, seconds: float, holder: str = HOLDER) -> bool:
    """Take or renew the lease ``name`` for ``seconds``; False while another holder has it."""
    now = utcnow()
    try:
        with database.session() as session:
            lease = session.scalar(select(Lease).where(Lease.name == name).with_for_update())
            if lease is None:
                session.add(Lease(name=name, holder=holder, expires_at=now + dt.timedelta(seconds=seconds)))
                return True
            expires = as_utc(lease.expires_at)
            if lease.holder != holder and expires > now:
                return False
            lease.holder, lease.expires_at = holder, now + dt.timedelta(seconds=seconds)
            return True
    except IntegrityError:  # another replica inserted it first
        return False


def release(database: Database, name: str, holder: str = HOLDER) -> None:
    with database.session() as session:
        lease = session.get(Lease, name)
        if lease is not None and lease.holder == holder:
            session.delete(lease)
