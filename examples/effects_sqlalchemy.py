"""Exactly-once effects with SQLAlchemy: complete the job in the session's transaction.

    python examples/effects_sqlalchemy.py
    CONVEYOR_DSN=postgresql://localhost/app python examples/effects_sqlalchemy.py

The handler adds a row with the ORM and hands ``ctx.complete`` the session's
own database connection (the driver's: a sqlite3 or a psycopg connection);
the session's commit then makes the row and the job's success durable
together. The queue and the tables share one database (SQLite or PostgreSQL).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from conveyor import App, Context

DSN = os.environ.get("CONVEYOR_DSN", "sqlite:///conveyor.db")
app = App(DSN)
# The same database for SQLAlchemy (psycopg 3 as its PostgreSQL driver).
engine = create_engine(DSN.replace("postgresql://", "postgresql+psycopg://", 1))


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "invoices"
    order_id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))


def driver_connection(session: Session) -> Any:
    """The database connection under the session's transaction, as its driver made it."""
    return session.connection().connection.driver_connection


@app.task(queue="billing")
def invoice(ctx: Context, order: int, customer: str) -> None:
    with Session(engine) as session, session.begin():  # commits at the end of the block
        session.add(Invoice(order_id=order, customer=customer))
        session.flush()  # the INSERT runs now, in the session's transaction
        ctx.complete(driver_connection(session), result=f"invoice for order {order}")


def main() -> None:
    app.migrate()
    Base.metadata.create_all(engine)
    jobs = [invoice.enqueue(order, name) for order, name in ((1, "Ada"), (2, "Grace"))]
    with app.worker(queues=["billing"]):
        for job in jobs:
            print("result:", job.wait(timeout=10))
    print("history:", ", ".join(event.kind for event in app.events(jobs[0].id)))
    with Session(engine) as session:
        rows = session.query(Invoice).order_by(Invoice.order_id).all()
        print("invoices:", [(row.order_id, row.customer) for row in rows])


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        main()
    finally:
        engine.dispose()
        app.close()
