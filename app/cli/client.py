"""What the object commands ask of Arbiter, whichever way they reach it: the admin API over
HTTP (app/cli/http_client.py, the source of truth for every shape) or the database itself
(app/cli/db_client.py, the same answers from the same domain functions). A command is written
once, against this; it prints the same in both modes."""

from __future__ import annotations

from typing import Any, Protocol

View = dict[str, Any]


class Client(Protocol):
    """Each method is one admin API route (named in its docstring); each answer is that route's JSON
    (a list route's ``data``)."""

    def list_organizations(self) -> list[View]:
        """GET /admin/organizations"""

    def get_organization(self, name: str) -> View:
        """GET /admin/organizations/{name}"""

    def create_organization(self, name: str) -> View:
        """POST /admin/organizations"""

    def rename_organization(self, name: str, new_name: str) -> View:
        """PATCH /admin/organizations/{name}"""

    def list_projects(self) -> list[View]:
        """GET /admin/projects"""

    def get_project(self, name: str) -> View:
        """GET /admin/projects/{name}"""

    def create_project(self, name: str, models: str | list[str], organization: str | None) -> View:
        """POST /admin/projects"""

    def update_project(self, name: str, changes: dict[str, Any]) -> View:
        """PATCH /admin/projects/{name}"""

    def list_project_keys(self, project: str) -> list[View]:
        """GET /admin/projects/{name}/keys"""

    def create_project_key(self, project: str, name: str, expires_at: str | None) -> View:
        """POST /admin/projects/{name}/keys (the answer's ``key`` is the new key)"""

    def list_admin_keys(self) -> list[View]:
        """GET /admin/admin-keys"""

    def create_admin_key(self, name: str, role: str, projects: list[str], expires_at: str | None) -> View:
        """POST /admin/admin-keys (the answer's ``key`` is the new key)"""

    def get_key(self, key_id: int) -> View:
        """GET /admin/keys/{key_id}"""

    def revoke_key(self, key_id: int) -> View:
        """POST /admin/keys/{key_id}/revoke"""

    def rotate_key(self, key_id: int, grace_seconds: int) -> View:
        """POST /admin/keys/{key_id}/rotate (the answer's ``key`` is the new key)"""

    def list_services(self) -> list[View]:
        """GET /admin/services"""

    def get_service(self, name: str) -> View:
        """GET /admin/services/{name}"""

    def add_service(self, fields: dict[str, Any], confirm: bool) -> View:
        """POST /admin/services (the answer has the service's ``models``)"""

    def remove_service(self, name: str) -> None:
        """DELETE /admin/services/{name}"""

    def refresh_service(self, name: str) -> View:
        """POST /admin/services/{name}/refresh"""

    def list_service_models(self, name: str) -> list[View]:
        """GET /admin/services/{name}/models"""

    def list_models(self) -> list[View]:
        """GET /admin/models"""

    def get_model(self, model_id: int) -> View:
        """GET /admin/models/{model_id}"""

    def update_model(self, model_id: int, changes: dict[str, Any], confirm: bool) -> View:
        """PATCH /admin/models/{model_id}"""

    def list_aliases(self) -> list[View]:
        """GET /admin/aliases"""

    def create_alias(self, alias: str, model: str) -> View:
        """POST /admin/aliases"""

    def remove_alias(self, alias: str) -> None:
        """DELETE /admin/aliases/{alias}"""
