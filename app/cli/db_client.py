"""The local mode's client: each command straight on the database (ARBITER_DATABASE_URL), with
the domain functions the admin API calls and the views it answers, audited as ``cli``. Without
the serving stack: no registry, router or mesh here, so a service's ``backed_off`` is always
empty and an alias's status knows only the models installed here (not a mesh peer's).

A change reaches running servers through Redis at once when ARBITER_REDIS_URL is set (the change
bus, app/changes.py); without it, at their key cache's expiry or registry refresh."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session

from app.changes import CHANNEL
from app.cli.client import View
from app.db.migrate import NotMigrated
from app.db.session import Database
from app.prepare import key_hasher, prepare_database
from app.services import aliases, sync
from app.services import service as services
from app.settings import Settings
from app.tenancy import organizations
from app.tenancy import service as tenancy
from app.tenancy.service import CLI
from infra_adapters.admin import AdminClient

T = TypeVar("T")


class DatabaseClient:
    def __init__(self) -> None:
        self.settings = Settings()
        self.actor = CLI
        self.database = Database(self.settings.database_url)
        self.hasher = key_hasher(self.settings)
        try:
            prepare_database(self.settings, self.database, self.hasher)
        except NotMigrated as exc:
            self.database.dispose()
            raise SystemExit(f"arbiter: {exc}") from exc
        except BaseException:  # a database that is away: no pool left behind
            self.database.dispose()
            raise

    def close(self) -> None:
        self.database.dispose()

    # -- organizations ------------------------------------------------------------------------

    def list_organizations(self) -> list[View]:
        return self._run(organizations.list_organizations)

    def get_organization(self, name: str) -> View:
        return self._run(lambda s: organizations.show_organization(s, name))

    def create_organization(self, name: str) -> View:
        def work(s: Session) -> View:
            org = tenancy.create_organization(s, name, self.actor)
            return {"id": org.id, "name": org.name}
        return self._run(work)

    def rename_organization(self, name: str, new_name: str) -> View:
        return self._run(lambda s: organizations.rename_organization(s, name, new_name, self.actor))

    # -- projects and keys --------------------------------------------------------------------

    def list_projects(self) -> list[View]:
        return self._run(lambda s: [tenancy.project_view(p) for p in tenancy.list_projects(s)])

    def get_project(self, name: str) -> View:
        return self._run(lambda s: tenancy.project_view(tenancy.get_project(s, name)))

    def create_project(self, name: str, models: str | list[str], organization: str | None) -> View:
        return self._run(lambda s: tenancy.project_view(tenancy.create_project(
            s, name, self.actor, models=models, organization=organization)))

    def update_project(self, name: str, changes: dict[str, Any]) -> View:
        limits: dict[str, int | None] = {f: changes[f] for f in ("requests_per_minute", "tokens_per_minute")
                                         if f in changes}
        view = self._run(lambda s: tenancy.project_view(tenancy.update_project(
            s, name, self.actor, models=changes.get("models"), archived=changes.get("archived"),
            set_models="models" in changes, limits=limits)))
        self._changed("keys")
        return view

    def list_project_keys(self, project: str) -> list[View]:
        return self._run(lambda s: [tenancy.key_view(k, project) for k in tenancy.list_keys(s, project=project)])

    def create_project_key(self, project: str, name: str, expires_at: str | None) -> View:
        def work(s: Session) -> View:
            key, value = tenancy.create_key(s, self.hasher, self.actor, kind="project", project=project, name=name,
                                            expires_at=dt.datetime.fromisoformat(expires_at) if expires_at else None)
            return {**tenancy.key_view(key, project), "key": value}
        return self._run(work)

    def list_admin_keys(self) -> list[View]:
        return self._run(lambda s: [tenancy.admin_key_view(s, k) for k in tenancy.list_keys(s, kind="admin")])

    def create_admin_key(self, name: str, role: str, projects: list[str], expires_at: str | None) -> View:
        def work(s: Session) -> View:
            key, value = tenancy.create_key(s, self.hasher, self.actor, kind="admin", name=name, role=role,
                                            projects=projects,
                                            expires_at=dt.datetime.fromisoformat(expires_at) if expires_at else None)
            return {**tenancy.admin_key_view(s, key), "key": value}
        return self._run(work)

    def get_key(self, key_id: int) -> View:
        return self._run(lambda s: tenancy.any_key_view(s, tenancy.get_key(s, key_id)))

    def revoke_key(self, key_id: int) -> View:
        def work(s: Session) -> View:
            key = tenancy.revoke_key(s, key_id, self.actor)
            return tenancy.key_view(key, tenancy.key_project_name(s, key))
        view = self._run(work)
        self._changed("keys")
        return view

    def rotate_key(self, key_id: int, grace_seconds: int) -> View:
        def work(s: Session) -> View:
            key, value = tenancy.rotate_key(s, self.hasher, key_id, self.actor, grace_seconds=grace_seconds)
            return {**tenancy.key_view(key, tenancy.key_project_name(s, key)), "key": value}
        view = self._run(work)
        self._changed("keys")
        return view

    # -- services, models, aliases ------------------------------------------------------------

    def list_services(self) -> list[View]:
        return self._run(lambda s: [{**services.service_view(x), "backed_off": []} for x in services.list_services(s)])

    def get_service(self, name: str) -> View:
        return self._run(lambda s: {**services.service_view(services.get_service(s, name)), "backed_off": []})

    def add_service(self, fields: dict[str, Any], confirm: bool) -> View:
        """``confirm`` is the mesh's: there is no mesh here to warn."""
        def answer(s: Session, service: Any) -> View:
            models = [services.model_view(m, service) for m in services.service_models(s, service)]
            return {**services.service_view(service), "models": models, "backed_off": []}
        view = self._with_backends(lambda admin: services.add_service(
            self.database.in_session, self.settings, admin, self.actor, type=fields["type"], url=fields.get("url"),
            name=fields.get("name"), credential=fields.get("api_key"), context_length=fields.get("context_length"),
            then=answer))
        self._changed("models")
        return view

    def remove_service(self, name: str) -> None:
        self._run(lambda s: services.remove_service(s, name, self.actor))
        self._changed("models")

    def refresh_service(self, name: str) -> View:
        view = self._with_backends(lambda admin: sync.refresh(
            self.database.in_session, self.settings, admin, lambda s: services.get_service(s, name), self.actor,
            then=lambda _s, service: services.service_view(service)))
        self._changed("models")
        return view

    def list_service_models(self, name: str) -> list[View]:
        def work(s: Session) -> list[View]:
            service = services.get_service(s, name)
            return [services.model_view(m, service) for m in services.service_models(s, service)]
        return self._run(work)

    def list_models(self) -> list[View]:
        return self._run(lambda s: [services.model_view(m, x) for m, x in services.all_models(s)])

    def get_model(self, model_id: int) -> View:
        return self._run(lambda s: services.model_view(*services.get_model(s, model_id)))

    def update_model(self, model_id: int, changes: dict[str, Any], confirm: bool) -> View:
        view = self._run(lambda s: services.model_view(*services.update_model(s, model_id, self.actor, changes)))
        self._changed("models")
        return view

    def list_aliases(self) -> list[View]:
        def work(s: Session) -> list[View]:
            installed = aliases.model_names(s)
            return [aliases.alias_view(a, installed.__contains__) for a in aliases.list_aliases(s)]
        return self._run(work)

    def create_alias(self, alias: str, model: str) -> View:
        def work(s: Session) -> View:
            created = aliases.create_alias(s, self.actor, alias, model)
            return aliases.alias_view(created, aliases.model_names(s).__contains__)
        view = self._run(work)
        self._changed("models")
        return view

    def remove_alias(self, alias: str) -> None:
        self._run(lambda s: aliases.remove_alias(s, self.actor, alias))
        self._changed("models")

    # -- plumbing -----------------------------------------------------------------------------

    def _run(self, work: Callable[[Session], T]) -> T:
        with self.database.session() as session:
            return work(session)

    def _with_backends(self, work: Callable[[AdminClient], Awaitable[T]]) -> T:
        """``work`` with an admin client for the backends it calls, on one event loop: this
        command's (a command is one call of the CLI; the client lives as long as it)."""
        async def run() -> T:
            async with AdminClient(timeout=self.settings.backend_admin_timeout,
                                   connect_timeout=self.settings.backend_connect_timeout) as admin:
                return await work(admin)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run())
        # Called from a thread that runs a loop already (a program embedding the CLI, a test
        # driving a browser): asyncio.run refuses to start there, so the command's loop gets a thread.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, run()).result()

    def _changed(self, kind: str) -> None:
        """Tell running servers at once, through the change bus's channel, when there is Redis."""
        if self.settings.redis_url is None:
            return
        client = redis.Redis.from_url(self.settings.redis_url.get_secret_value(), socket_timeout=2.0,
                                      socket_connect_timeout=2.0)
        try:
            channel = f"{CHANNEL}:{client.connection_pool.connection_kwargs.get('db', 0)}"
            client.publish(channel, f"{kind}:{uuid.uuid4().hex}")
        except (RedisError, OSError) as exc:  # the change is made; servers catch up by TTL and refresh
            print(f"arbiter: warning: could not tell running servers through Redis ({type(exc).__name__}); "
                  "they pick the change up at their key cache's expiry or registry refresh", file=sys.stderr)
        finally:
            client.close()
