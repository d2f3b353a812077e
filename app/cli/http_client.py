"""The remote mode's client: every command as a call to the admin API (httpx, one connection,
a timeout on every call, TLS verified unless ``--insecure``). An error the server answers is
shown as its message; a network failure as what happened, in one line, never with the key."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

import httpx

from app.cli.client import View
from app.errors import ArbiterError


class RemoteError(ArbiterError):
    """The server refused (its own message), or could not be reached or understood."""


class HttpClient:
    def __init__(self, url: str, key: str, *, verify: ssl.SSLContext | bool, timeout: float,
                 user_agent: str) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        # Redirects are not followed: a redirect to another address would be where the key goes
        # next; the error names the address to use instead.
        self._http = httpx.Client(base_url=self.url + "/", timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                                  verify=verify, follow_redirects=False,
                                  headers={"Authorization": f"Bearer {key}", "User-Agent": user_agent,
                                           "Accept": "application/json"})

    def close(self) -> None:
        self._http.close()

    # -- organizations ------------------------------------------------------------------------

    def list_organizations(self) -> list[View]:
        return self._data("GET", "admin/organizations")

    def get_organization(self, name: str) -> View:
        return self._object("GET", f"admin/organizations/{_segment(name)}")

    def create_organization(self, name: str) -> View:
        return self._object("POST", "admin/organizations", {"name": name})

    def rename_organization(self, name: str, new_name: str) -> View:
        return self._object("PATCH", f"admin/organizations/{_segment(name)}",
                          {"name": new_name})

    # -- projects and keys --------------------------------------------------------------------

    def list_projects(self) -> list[View]:
        return self._data("GET", "admin/projects")

    def get_project(self, name: str) -> View:
        return self._object("GET", f"admin/projects/{_segment(name)}")

    def create_project(self, name: str, models: str | list[str], organization: str | None) -> View:
        body: dict[str, Any] = {"name": name, "models": models}
        if organization is not None:
            body["organization"] = organization
        return self._object("POST", "admin/projects", body)

    def update_project(self, name: str, changes: dict[str, Any]) -> View:
        return self._object("PATCH", f"admin/projects/{_segment(name)}", changes)

    def list_project_keys(self, project: str) -> list[View]:
        return self._data("GET", f"admin/projects/{_segment(project)}/keys")

    def create_project_key(self, project: str, name: str, expires_at: str | None) -> View:
        return self._object("POST", f"admin/projects/{_segment(project)}/keys",
                          _without_none({"name": name, "expires_at": expires_at}))

    def list_admin_keys(self) -> list[View]:
        return self._data("GET", "admin/admin-keys")

    def create_admin_key(self, name: str, role: str, projects: list[str], expires_at: str | None) -> View:
        body = _without_none({"name": name, "role": role, "expires_at": expires_at})
        if projects:
            body["projects"] = projects
        return self._object("POST", "admin/admin-keys", body)

    def get_key(self, key_id: int) -> View:
        return self._object("GET", f"admin/keys/{key_id}")

    def revoke_key(self, key_id: int) -> View:
        return self._object("POST", f"admin/keys/{key_id}/revoke")

    def rotate_key(self, key_id: int, grace_seconds: int) -> View:
        return self._object("POST", f"admin/keys/{key_id}/rotate",
                          {"grace_seconds": grace_seconds})

    # -- services, models, aliases ------------------------------------------------------------

    def list_services(self) -> list[View]:
        return self._data("GET", "admin/services")

    def get_service(self, name: str) -> View:
        return self._object("GET", f"admin/services/{_segment(name)}")

    def add_service(self, fields: dict[str, Any], confirm: bool) -> View:
        body = _without_none(fields) | ({"confirm": True} if confirm else {})
        return self._object("POST", "admin/services", body)

    def remove_service(self, name: str) -> None:
        self._call("DELETE", f"admin/services/{_segment(name)}")

    def refresh_service(self, name: str) -> View:
        return self._object("POST", f"admin/services/{_segment(name)}/refresh")

    def list_service_models(self, name: str) -> list[View]:
        return self._data("GET", f"admin/services/{_segment(name)}/models")

    def list_models(self) -> list[View]:
        return self._data("GET", "admin/models")

    def get_model(self, model_id: int) -> View:
        return self._object("GET", f"admin/models/{model_id}")

    def update_model(self, model_id: int, changes: dict[str, Any], confirm: bool) -> View:
        body = changes | ({"confirm": True} if confirm else {})
        return self._object("PATCH", f"admin/models/{model_id}", body)

    def list_aliases(self) -> list[View]:
        return self._data("GET", "admin/aliases")

    def create_alias(self, alias: str, model: str) -> View:
        return self._object("POST", "admin/aliases", {"alias": alias, "model": model})

    def remove_alias(self, alias: str) -> None:
        self._call("DELETE", f"admin/aliases/{_segment(alias)}")

    # -- the call -----------------------------------------------------------------------------

    def _data(self, method: str, path: str) -> list[View]:
        answer = self._call(method, path)
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
            raise RemoteError(f"{self.url}/{path} answered JSON without its 'data' list: is ARBITER_URL "
                              "the gateway's address, and the gateway as new as this command?")
        return answer["data"]

    def _object(self, method: str, path: str, body: Any = None) -> View:
        answer = self._call(method, path, body)
        if not isinstance(answer, dict):
            raise RemoteError(f"{self.url}/{path} answered JSON that is not an object: is ARBITER_URL "
                              "the gateway's address?")
        return answer

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.TimeoutException as exc:
            raise RemoteError(f"{self.url} did not answer within {self._timeout:g} s "
                              "(--request-timeout sets the wait)") from exc
        except httpx.HTTPError as exc:  # refused, no such host, TLS, a broken connection
            raise RemoteError(_transport_problem(self.url, exc)) from exc
        if response.status_code == 204:
            return None
        if response.is_redirect:
            raise RemoteError(f"{self.url} answered {response.status_code}, a redirect to "
                              f"{response.headers.get('location', '?')}: give that address as ARBITER_URL")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.is_success and answer is not None:
            return answer
        raise RemoteError(_refusal(self.url, response, answer))


def _segment(value: str) -> str:
    """A name as one URL path segment: every reserved character percent-encoded."""
    return quote(value, safe="")


def _without_none(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _refusal(url: str, response: httpx.Response, answer: Any) -> str:
    """What to print of an error answer: Arbiter's message, with what to do for 401 and 403."""
    message = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(message, str) or not message:
        return (f"{url} answered {response.status_code} {response.reason_phrase} without Arbiter's error JSON: "
                "is ARBITER_URL the gateway's address (not its UI, a proxy's page or another server)?")
    if response.status_code == 401:
        return (f"the server refused the admin key: {message} (check ARBITER_ADMIN_KEY, --admin-key-file "
                "or --admin-key; it must be an admin key, not a project key, and neither revoked nor expired)")
    if response.status_code == 403:
        return f"not allowed: {message}"
    return message


def _transport_problem(url: str, exc: httpx.HTTPError) -> str:
    """One line for a call that got no answer; certificate failures say how to trust the server."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(cause):
            return (f"cannot verify the TLS certificate of {url} ({reason}): give its CA with --ca-file "
                    "(or SSL_CERT_FILE), or --insecure to skip the check")
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot reach {url}: {reason} (is the gateway running there, and ARBITER_URL right?)"
    return f"the connection to {url} failed: {reason}"
