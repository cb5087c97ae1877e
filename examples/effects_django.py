"""Exactly-once effects with Django: complete the job in ``transaction.atomic()``.

    python examples/effects_django.py
    CONVEYOR_DSN=postgresql://localhost/app python examples/effects_django.py

In a Django project the settings come from the project; this one configures
Django in the script, on the queue's own database (SQLite or PostgreSQL). The
handler writes through Django's connection inside ``transaction.atomic()``
and hands ``ctx.complete`` the connection under it (``connection.connection``:
the driver's sqlite3 or psycopg connection); the atomic block's commit makes
the row and the job's success durable together.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

import django
from django.conf import settings
from django.db import connection, transaction

from conveyor import App, Context

DSN = os.environ.get("CONVEYOR_DSN", "sqlite:///conveyor.db")


def database_settings(dsn: str) -> dict[str, object]:
    """Django's DATABASES entry for the queue's database."""
    if dsn.startswith("sqlite:///"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": dsn.removeprefix("sqlite:///")}
    url = urlsplit(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.path.lstrip("/"),
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.hostname or "",
        "PORT": str(url.port or ""),
    }


settings.configure(DATABASES={"default": database_settings(DSN)}, USE_TZ=True)
django.setup()
app = App(DSN)


@app.task(queue="mail")
def welcome(ctx: Context, user: str) -> None:
    with transaction.atomic():  # commits at the end of the block
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO welcomed (username) VALUES (%s)", [user])
        ctx.complete(connection.connection, result=f"welcomed {user}")


def main() -> None:
    app.migrate()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS welcomed (username varchar(100) PRIMARY KEY)")
    jobs = [welcome.enqueue(user) for user in ("ada", "grace")]
    with app.worker(queues=["mail"]):
        for job in jobs:
            print("result:", job.wait(timeout=10))
    print("history:", ", ".join(event.kind for event in app.events(jobs[0].id)))
    with connection.cursor() as cursor:
        cursor.execute("SELECT username FROM welcomed ORDER BY username")
        print("welcomed:", [row[0] for row in cursor.fetchall()])


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        main()
    finally:
        app.close()
