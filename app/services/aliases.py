"""Model aliases (SPEC §1): a second public name that stands for an installed model, such as
``jev-latest`` (the default model of TypeSafe's SDK) for ``nimble``. Stored in the database so
every replica shares them; resolved in memory by the registry (app/routing/registry.py).

The rules: an alias cannot have the name of a model (it would shadow it), cannot point at
another alias (one step, never a chain), and must point at a model that exists now (here or
on the mesh). A model that later appears under an alias's name wins over the alias: the alias
is then ``shadowed`` until the model goes or the alias is removed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import audit
from app.db.models import Model, ModelAlias
from app.db.timestamps import iso
from app.errors import Conflict, InvalidRequest, NotFound
from app.tenancy.service import Actor
from app.text import text_problem

MAX_NAME = 200  # as a model's public name
# What an alias is now: serving its target, shadowed by a model of its name (the model wins),
# or pointing at a model that is not installed any more (a request for it gets 404).
ACTIVE, SHADOWED, TARGET_MISSING = "active", "shadowed", "target_missing"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an alias, or None: a model's public-name rules, and a URL path
    segment's (``DELETE /admin/aliases/{alias}``: '.' and '..' are resolved away by clients)."""
    if not name.strip():
        return "must be a non-empty name"
    if len(name) > MAX_NAME:
        return f"must be at most {MAX_NAME} characters"
    if name in (".", ".."):
        return "must not be '.' or '..' (URLs drop such path segments)"
    return text_problem(name)


def model_names(session: Session) -> set[str]:
    """The public names of the models installed here (on any service)."""
    return set(session.scalars(select(Model.public_name).distinct()))


def create_alias(session: Session, actor: Actor, name: str, target: str,
                 known: Callable[[str], bool] = lambda _name: False) -> ModelAlias:
    """Add alias ``name`` for the model ``target``. ``known`` says whether a name is a model this
    node can reach without an installed row (a mesh peer's): the registry's view."""
    for field, value in (("alias", name), ("model", target)):
        problem = name_problem(value)
        if problem is not None:
            raise InvalidRequest(f"{field} {problem}")
    installed = model_names(session)
    if name in installed or known(name):
        raise Conflict(f"'{name}' is the name of a model; an alias cannot shadow a model")
    aliases = {a.name: a.target for a in session.scalars(select(ModelAlias))}
    if name in aliases:
        raise Conflict(f"alias '{name}' already exists (for '{aliases[name]}'); remove it first to change it")
    pointing = sorted(a for a, t in aliases.items() if t == name)
    if pointing:
        raise InvalidRequest(f"'{name}' is the model alias '{pointing[0]}' points at; an alias of that name "
                             "would make a chain of aliases")
    if target == name:
        raise InvalidRequest(f"alias '{name}' cannot point at itself")
    if target in aliases and target not in installed:
        raise InvalidRequest(f"'{target}' is an alias itself (of '{aliases[target]}'); an alias must point "
                             f"at a model: use '{aliases[target]}'")
    if target not in installed and not known(target):
        raise InvalidRequest(f"model '{target}' is not installed; install it first, then add the alias")
    alias = ModelAlias(name=name, target=target)
    session.add(alias)
    session.flush()
    audit.record(session, actor=actor.name, action="alias.create", target=f"alias:{name}",
                 request_id=actor.request_id, details={"model": target})
    return alias


def remove_alias(session: Session, actor: Actor, name: str) -> None:
    alias = session.scalar(select(ModelAlias).where(ModelAlias.name == name))
    if alias is None:
        raise NotFound(f"alias '{name}' does not exist")
    session.delete(alias)
    audit.record(session, actor=actor.name, action="alias.remove", target=f"alias:{name}",
                 request_id=actor.request_id, details={"model": alias.target})


def list_aliases(session: Session) -> list[ModelAlias]:
    return list(session.scalars(select(ModelAlias).order_by(ModelAlias.name)))


def all_targets(session: Session) -> dict[str, str]:
    """Alias -> target, for the registry's reload."""
    return {a.name: a.target for a in session.scalars(select(ModelAlias))}


def status_of(alias: ModelAlias, is_model: Callable[[str], bool]) -> str:
    if is_model(alias.name):
        return SHADOWED
    return ACTIVE if is_model(alias.target) else TARGET_MISSING


def alias_view(alias: ModelAlias, is_model: Callable[[str], bool]) -> dict[str, Any]:
    """An alias as the admin API, the CLI and the UI show it; ``is_model`` says whether a name
    is a model now (installed here, or on the mesh)."""
    return {"alias": alias.name, "model": alias.target, "status": status_of(alias, is_model),
            "created_at": iso(alias.created_at)}
