"""The registry's read of the database (app/routing/rows.py): every model on every service with
how it answers decisions (its read strategy, its version gate, its cache salting), the aliases,
and each service's reachability. Here, on the admin side that owns those rules, so that the
registry does not import them; ``app/components.py`` hands it this read."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Service
from app.routing.rows import ModelRow, RegistryRows
from app.services import aliases, sync
from app.services import service as services


def registry_rows(session: Session) -> RegistryRows:
    reachable = {name: bool(up) for name, up in session.execute(select(Service.name, Service.reachable))}
    return RegistryRows(_model_rows(session), aliases.all_targets(session), reachable)


def _model_rows(session: Session) -> list[ModelRow]:
    return [
        ModelRow(s.id, s.name, s.type, s.url, s.credential, s.text_limit, s.timeout,
                 m.public_name, m.backend_name, list(m.capabilities), m.timeout,
                 int(m.created_at.timestamp()) if m.created_at else 0, services.read_strategy_of(m, s),
                 sync.gate_of(m, s), sync.salts_prefix_cache(s), m.embedding_temperature)
        for m, s in services.all_models(session)
    ]
