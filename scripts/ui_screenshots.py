"""Make docs/ui/*.png again: a demo-like Arbiter (SQLite, an emulated Ollama, `arbiter serve`, all
on loopback, nothing from the network) filled with a few organizations, projects, keys, decisions
and admin changes, then photographed in headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright from the `test` extra).

    scripts/screenshots [--out docs/ui] [--chromium /usr/bin/chromium] [--keep]

Every run starts from an empty database in a temporary folder (removed afterwards, unless
--keep), so the pictures show the same things each time; the emulator's answers are
deterministic, the times and ids are today's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
ARBITER = ROOT / ".venv" / "bin" / "arbiter"
WIDE = (1280, 800)
NARROW = (390, 844)  # a phone's screen, as tests/ui/test_browser_narrow.py checks it
TICKETS = ("My card was charged twice for one order.", "The parcel never arrived and tracking is stuck.",
           "I cannot log in since the password reset.", "Please refund the second charge, it is a mistake.",
           "Where is my order? It has been two weeks.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui", help="where the PNGs go (docs/ui)")
    parser.add_argument("--chromium", type=Path, default=Path("/usr/bin/chromium"), help="the browser to drive")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (database, logs)")
    args = parser.parse_args()
    if not args.chromium.exists():
        print(f"scripts/screenshots: no browser at {args.chromium} (apt-get install chromium, or --chromium PATH)",
              file=sys.stderr)
        return 1
    folder = Path(tempfile.mkdtemp(prefix="arbiter-screenshots-"))
    try:
        with demo(folder) as (base, admin_key):
            fill(base, admin_key)
            spread_over_days(folder / "arbiter.db")
            args.out.mkdir(parents=True, exist_ok=True)
            made = photograph(base, admin_key, args.out, args.chromium)
        for path in made:
            print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        return 0
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def demo(folder: Path) -> Iterator[tuple[str, str]]:
    """Arbiter and an emulated Ollama as scripts/demo --backend emulator starts them: its base
    URL and an owner admin key. Both processes are stopped on the way out."""
    env = {**os.environ, "ARBITER_DATABASE_URL": f"sqlite:///{folder}/arbiter.db",
           "ARBITER_USAGE_SPOOL_DIR": str(folder)}
    env.pop("ARBITER_SECRET_KEY", None)

    def arbiter(*args: str) -> str:
        """What ``arbiter ARGS`` prints; an error says why it failed."""
        done = subprocess.run([str(ARBITER), *args], env=env, cwd=folder, capture_output=True, text=True,
                              timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"arbiter {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
        return done.stdout
    arbiter("migrate")
    emulator_port, port = free_port(), free_port()
    children: list[subprocess.Popen[bytes]] = []
    try:
        with open(folder / "emulator.log", "wb") as log:
            children.append(subprocess.Popen([ARBITER, "emulate", "ollama", "--port", str(emulator_port)],
                                             env=env, cwd=folder, stdout=log, stderr=log))
        emulator = f"http://127.0.0.1:{emulator_port}"
        wait_until(lambda: httpx.get(f"{emulator}/api/version", timeout=2).status_code == 200, "the emulator")
        admin_key = arbiter("admin", "create-key", "--name", "docs").strip().splitlines()[-1]
        arbiter("service", "add", "--type", "ollama-external", "--url", emulator, "--name", "gpu-box")
        with open(folder / "arbiter.log", "wb") as log:
            children.append(subprocess.Popen([ARBITER, "serve", "--port", str(port)], env=env, cwd=folder,
                                             stdout=log, stderr=log))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, "Arbiter")
        yield base, admin_key
    finally:
        for child in reversed(children):
            child.terminate()
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()


def fill(base: str, admin_key: str) -> None:
    """What a deployment holds after a few days: a catalog model installed, organizations with
    projects, keys (one rotated), decisions (a few refused), and the changes in the audit log."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30) as admin:
        def ok(response: httpx.Response) -> Any:
            if response.status_code >= 300:
                raise RuntimeError(f"{response.request.method} {response.request.url.path}: "
                                   f"{response.status_code} {response.text[:300]}")
            return response.json() if response.content else None
        wait_until(lambda: any(m["public_name"] == "nimble" for m in ok(admin.get("/admin/models"))["data"]),
                   "the first sync of the emulated Ollama")
        install = ok(admin.post("/admin/services/gpu-box/models", json={"model": "tev1"}))
        wait_until(lambda: ok(admin.get(f"/admin/installs/{install['id']}"))["status"] == "succeeded", "tev1's install")
        ok(admin.post("/admin/aliases", json={"alias": "jev-latest", "model": "nimble"}))
        for org in ("acme-retail", "northwind"):
            ok(admin.post("/admin/organizations", json={"name": org}))
        keys: dict[str, str] = {}
        for name, org, models in (("support", "acme-retail", ["nimble", "tev1"]), ("billing-bot", "acme-retail", "all"),
                                  ("triage", "northwind", ["nimble"])):
            ok(admin.post("/admin/projects", json={"name": name, "organization": org, "models": models}))
            keys[name] = ok(admin.post(f"/admin/projects/{name}/keys", json={"name": "production"}))["key"]
        ok(admin.patch("/admin/projects/support", json={"requests_per_minute": 600, "tokens_per_minute": 200_000}))
        ci = ok(admin.post("/admin/projects/support/keys", json={"name": "ci"}))
        ok(admin.post(f"/admin/keys/{ci['id']}/rotate", json={"grace_seconds": 3600}))
        question = {"team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                             "criteria": {"billing": "payments and refunds", "shipping": "deliveries and parcels",
                                          "security": "account access and passwords"}},
                    "urgent": {"type": "noul", "instructions": "Reply within the hour?"}}
        sent = 0
        for project, model, count in (("support", "nimble", 9), ("support", "tev1", 5), ("billing-bot", "nimble", 6),
                                      ("triage", "nimble", 4), ("triage", "tev1", 2)):
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {keys[project]}"},
                              timeout=30) as tenant:
                for n in range(count):
                    tenant.post("/v1/systemone", json={"model": model, "state": {"ticket": TICKETS[n % len(TICKETS)]},
                                                       "questions": question})
                    sent += 1
        wait_until(lambda: len(ok(admin.get("/admin/usage/recent", params={"limit": 100}))["data"]) >= sent,
                   "the usage ledger's writes")


def spread_over_days(database: Path) -> None:
    """The decisions ``fill`` sent, moved back over the past week (one in seven stays today),
    so the usage charts show days rather than one bar: the records are real, their days are not."""
    import sqlite3

    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT id, at FROM usage_records ORDER BY id").fetchall()
        for n, (record_id, at) in enumerate(rows):
            moved = datetime.datetime.fromisoformat(at) - datetime.timedelta(days=(n * 3) % 7)
            db.execute("UPDATE usage_records SET at = ? WHERE id = ?", (moved.isoformat(sep=" "), record_id))


def photograph(base: str, admin_key: str, out: Path, chromium: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    made: list[Path] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        try:
            wide = browser.new_context(viewport={"width": WIDE[0], "height": WIDE[1]})
            page = wide.new_page()
            page.set_default_timeout(15_000)

            def shot(name: str, target: Any = None) -> None:
                path = out / f"{name}.png"
                (target or page).screenshot(path=str(path))
                made.append(path)

            page.goto(f"{base}/ui/sign-in")
            shot("sign-in")
            page.get_by_label("Admin key").fill(admin_key)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{base}/ui/services")
            shot("services")

            page.goto(f"{base}/ui/models")
            card = page.locator("article.card", has=page.get_by_role("heading", name="nimble", exact=True))
            card.get_by_role("button", name="Test").click()
            card.locator(".test-result .choice").wait_for()
            card.scroll_into_view_if_needed()
            page.locator("#cards").scroll_into_view_if_needed()
            shot("models")
            tev1 = page.locator("article.card", has=page.get_by_role("heading", name="tev1", exact=True))
            tev1.locator("details.playground summary").click()
            tev1.get_by_role("button", name="Run").click()
            tev1.locator(".playground-result .probability").first.wait_for()
            tev1.locator(".playground-result details.raw-answer summary").click()
            shot("playground", tev1)

            for name, path in (("usage", "/ui/usage?days=7"), ("audit", "/ui/audit?action=project"),
                               ("organizations", "/ui/organizations")):
                answer = page.goto(base + path)
                if answer is None or answer.status != 200:
                    raise RuntimeError(f"{path} answered {answer.status if answer else 'nothing'}")
                shot(name)
            wide.close()

            narrow = browser.new_context(viewport={"width": NARROW[0], "height": NARROW[1]})
            page = narrow.new_page()
            page.goto(f"{base}/ui/sign-in")
            page.get_by_label("Admin key").fill(admin_key)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{base}/ui/services")
            page.goto(f"{base}/ui/projects")
            page.get_by_role("link", name="support").click()
            page.locator("#keys-title").scroll_into_view_if_needed()
            shot("narrow-project")
            narrow.close()
        finally:
            browser.close()
    return made


if __name__ == "__main__":
    sys.exit(main())
