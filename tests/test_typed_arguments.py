"""Typed arguments: a handler's annotated parameters validated at enqueue, stored as JSON,
and handed back as their types in the worker, on every store; with pydantic and without."""

from __future__ import annotations

import datetime as dt
import enum
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypedDict

import pydantic
import pytest
from click.testing import CliRunner

from conveyor import App, Context, InvalidJobError, JobState
from conveyor import arguments as typed_arguments
from conveyor.cli import cli
from conveyor.testing import drain


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Line:
    sku: str
    quantity: int
    price: Decimal


@dataclass
class Order:
    id: uuid.UUID
    lines: list[Line]
    placed: dt.datetime
    colour: Colour = Colour.RED


class Address(TypedDict):
    street: str
    city: str


class Customer(pydantic.BaseModel):
    name: str
    email: str
    age: int = pydantic.Field(ge=0)


PLACED = dt.datetime(2026, 11, 27, 12, 30, tzinfo=dt.UTC)
ORDER = Order(
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    [Line("apple", 3, Decimal("0.10")), Line("pear", 1, Decimal("2.50"))],
    PLACED,
    Colour.BLUE,
)


@pytest.fixture
def seen() -> list[Any]:
    return []


@pytest.fixture
def shop(app: App, seen: list[Any]) -> Iterator[App]:
    @app.task(queue="shop")
    def place(ctx: Context, order: Order, address: Address, on: dt.date, colour: Colour) -> str:
        seen.append((order, address, on, colour))
        return str(sum(line.price * line.quantity for line in order.lines))

    @app.task(queue="shop")
    def welcome(customer: Customer, *, sent: dt.datetime | None = None) -> None:
        seen.append((customer, sent))

    yield app


def test_a_handler_gets_its_types_back_on_every_store(shop: App, seen: list[Any]) -> None:
    address: Address = {"street": "1 Main St", "city": "Lyon"}
    job = shop.get_task("place").enqueue(ORDER, address, dt.date(2026, 12, 1), Colour.RED)
    # Stored as JSON: what another language's client or the dashboard reads.
    stored = shop.get(job.id)
    assert stored.args[0]["id"] == "12345678-1234-5678-1234-567812345678"
    assert stored.args[0]["lines"][0]["price"] in ("0.10", 0.1)
    assert stored.args[2] == "2026-12-01" and stored.args[3] == "red"
    assert drain(shop, ["shop"]) == {"succeeded": 1}
    order, got_address, on, colour = seen[0]
    assert order == ORDER and isinstance(order.lines[0].price, Decimal)
    assert got_address == address and on == dt.date(2026, 12, 1) and colour is Colour.RED
    assert shop.get(job.id).result == "2.80"


def test_a_pydantic_model_is_validated_at_enqueue_and_nothing_is_written(
    shop: App, seen: list[Any]
) -> None:
    welcome = shop.get_task("welcome")
    with pytest.raises(InvalidJobError, match="argument 'customer' does not fit Customer") as info:
        welcome.enqueue({"name": "Ann", "email": "ann@example.com", "age": -1})
    assert "greater than or equal to 0" in str(info.value)
    with pytest.raises(InvalidJobError, match="customer"):
        welcome.enqueue(Customer.model_construct(name="Bo"))  # built without validation
    assert shop.count_jobs(queue="shop") == {}
    welcome.enqueue({"name": "Ann", "email": "ann@example.com", "age": 30}, sent=PLACED)
    assert drain(shop, ["shop"]) == {"succeeded": 1}
    customer, sent = seen[0]
    assert isinstance(customer, Customer) and customer.age == 30 and sent == PLACED


def test_arguments_that_no_longer_fit_fail_the_job_without_a_retry(
    shop: App, seen: list[Any]
) -> None:
    # Enqueued by name with raw JSON (another service), not checked here: the worker refuses.
    job = shop.enqueue_many([])  # nothing
    assert job == []
    other = App(store=shop.store)
    raw = other.enqueue("welcome", [{"name": "Ann"}], queue="shop")
    assert drain(shop, ["shop"]) == {"failed": 1}
    failed = shop.get(raw.id)
    assert failed.state == JobState.FAILED and failed.attempts == 1
    assert "does not fit Customer" in (failed.error or "") and "not retried" in (failed.error or "")
    assert seen == []


def test_a_task_without_rich_annotations_pays_nothing(app: App) -> None:
    @app.task
    def add(a: int, b: float = 1.0, *rest: str, **more: dict[str, Any]) -> float:
        return a + b

    assert add.arguments is None
    schema = app.task_schema("add")
    assert schema["properties"]["a"] == {"type": "integer"}
    assert schema["required"] == ["a"]


def test_the_schema_names_each_parameter_with_its_format(shop: App) -> None:
    schema = shop.task_schema("place")
    assert schema["title"] == "place" and "ctx" not in schema["properties"]
    assert schema["required"] == ["order", "address", "on", "colour"]
    assert schema["properties"]["on"] == {"format": "date", "type": "string"}
    assert schema["properties"]["colour"]["enum"] == ["red", "blue"]
    welcome = shop.task_schema("welcome")
    assert welcome["properties"]["customer"]["properties"]["age"]["minimum"] == 0
    json.dumps(schema)  # a JSON document


@pytest.fixture
def without_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(typed_arguments, "_pydantic", lambda: None)


@pytest.mark.usefixtures("without_pydantic")
def test_dataclasses_and_standard_types_work_without_pydantic(
    tmp_path: Any, seen: list[Any]
) -> None:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as app:
        app.migrate()

        @app.task
        def place(order: Order, when: dt.time, tags: dict[str, Colour] | None = None) -> None:
            seen.append((order, when, tags))

        place.enqueue(ORDER, dt.time(9, 30), {"a": Colour.BLUE})
        assert drain(app) == {"succeeded": 1}
        assert seen == [(ORDER, dt.time(9, 30), {"a": Colour.BLUE})]
        with pytest.raises(InvalidJobError, match="argument 'order' does not fit Order"):
            place.enqueue({"id": "not-a-uuid", "lines": [], "placed": "2026-01-01T00:00:00"},
                          dt.time(1))  # fmt: skip
        with pytest.raises(InvalidJobError, match="Line has no field colour"):
            place.enqueue({"id": str(ORDER.id), "placed": PLACED.isoformat(),
                           "lines": [{"sku": "a", "quantity": 1, "price": 1, "colour": "red"}]},
                          dt.time(1))  # fmt: skip
        schema = app.task_schema("place")
        assert schema["properties"]["when"] == {"type": "string", "format": "time"}
        assert schema["properties"]["order"]["properties"]["id"]["format"] == "uuid"
        with pytest.raises(InvalidJobError, match=r"install conveyor\[typed\]"):

            @app.task
            def greet(customer: Customer) -> None: ...


def test_conveyor_tasks_lists_and_shows_the_schema(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    monkeypatch.setenv("CONVEYOR_DSN", f"sqlite:///{tmp_path / 'jobs.db'}")
    listed = CliRunner().invoke(cli, ["tasks", "list", "typed_app:app", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.output)}
    assert rows["ship"]["typed"] is True and rows["plain"]["typed"] is False
    assert rows["ship"]["queue"] == "orders"
    shown = CliRunner().invoke(cli, ["tasks", "show", "typed_app:app", "ship"])
    assert shown.exit_code == 0, shown.output
    schema = json.loads(shown.output)
    assert schema["required"] == ["order"]
    assert schema["properties"]["order"]["properties"]["placed"]["format"] == "date-time"
    missing = CliRunner().invoke(cli, ["tasks", "show", "typed_app:app", "nope"])
    assert missing.exit_code != 0 and "no task named 'nope'" in missing.output
