"""The first admin key from ARBITER_BOOTSTRAP_ADMIN_KEY (SPEC §3), with replicas that start at once."""

from __future__ import annotations

import threading
import time

from sqlalchemy import func, select

from app.components import Components
from app.db.models import ApiKey
from app.db.session import Database
from app.settings import Settings
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher

VALUE = "arb_admin_" + "B" * 43


def admin_keys(db: Database) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(ApiKey.name).where(ApiKey.kind == "admin")))


def test_the_bootstrap_key_is_registered_once(db: Database) -> None:
    replica = Components(Settings(database_url=db.url, bootstrap_admin_key=VALUE))
    replica.prepare_database()
    replica.prepare_database()  # a restart: an admin key exists, nothing to do
    assert admin_keys(db) == ["bootstrap"]
    with db.session() as session:
        assert tenancy.key_registered(session, KeyHasher(), VALUE)
        principal = tenancy.load_principal(session, KeyHasher().digest(VALUE))
        assert principal is not None and principal.role == "owner"  # the first key may do everything
        assert session.scalar(select(ApiKey.role).where(ApiKey.name == "bootstrap")) == "owner"
    replica.database.dispose()


def test_replicas_starting_at_once_both_start(db: Database) -> None:
    """Both find no admin key and insert the same digest: the one that loses the unique index
    must not fail to start, the key being there."""
    replica = Components(Settings(database_url=db.url, bootstrap_admin_key=VALUE))
    failures: list[BaseException] = []

    def start() -> None:
        try:
            replica.prepare_database()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    with db.session() as session:  # the other replica: its key inserted, not yet committed
        assert tenancy.ensure_bootstrap_admin_key(session, KeyHasher(), VALUE)
        starting = threading.Thread(target=start)
        starting.start()
        time.sleep(0.5)  # it finds no admin key, and its insert waits for this transaction
    starting.join(40)
    assert not starting.is_alive() and failures == []
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(ApiKey)) == 1
    replica.database.dispose()
