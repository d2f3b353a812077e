"""``python -m app.db.check``: fail when the models and the migrations disagree (alembic check)."""

from __future__ import annotations

from alembic import command

from app.db.migrate import alembic_config
from app.settings import Settings

if __name__ == "__main__":
    command.check(alembic_config(Settings().database_url))
    print("migrations match the models")
