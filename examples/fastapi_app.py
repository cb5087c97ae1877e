"""A FastAPI app that enqueues a job and waits for its result without blocking.

    python examples/fastapi_app.py            # http://127.0.0.1:8000, PORT=... to change
    curl -X POST http://127.0.0.1:8000/reports/2024
    curl http://127.0.0.1:8000/jobs/1

``POST /reports/{year}`` enqueues a job and awaits its result for up to
``wait`` seconds (``job.await_result`` does not block the event loop): the
answer is the result, or 202 with the job's id when it takes longer, to be
fetched later from ``GET /jobs/{id}``. A worker runs in this process for the
example's sake (started and drained by the app's lifespan); in production
workers are processes of their own (``PYTHONPATH=examples conveyor worker
fastapi_app:app``, from the same directory: the same ./conveyor.db) and the
web process only enqueues and reads.

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse

from conveyor import App, JobFailed, JobNotFoundError

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db


@app.task(queue="reports", max_attempts=2)
async def build_report(year: int) -> dict[str, Any]:
    if year < 1970:
        raise ValueError(f"no data before 1970, asked for {year}")
    await asyncio.sleep(0.2 if year < 2100 else 2)  # the work itself (longer far ahead)
    return {"year": year, "pages": year % 100 + 1}


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    with app.worker(queues=["reports"], concurrency=4):  # stops claiming and drains on exit
        yield
    app.close()


api = FastAPI(title="reports", lifespan=lifespan)


@api.post("/reports/{year}")
async def create_report(year: int, wait: float = 10.0) -> Any:
    job = await build_report.aenqueue(year)
    try:
        result = await job.await_result(timeout=wait)
    except TimeoutError:
        return JSONResponse({"job": job.id, "state": "running"}, status_code=202)
    except JobFailed as failure:
        error = (failure.error or "").strip().splitlines()[-1]
        return JSONResponse({"job": job.id, "state": "failed", "error": error}, status_code=500)
    return {"job": job.id, "state": "succeeded", "result": result}


@api.get("/jobs/{job_id}")
async def job_status(job_id: int) -> dict[str, Any]:
    try:
        job = await app.aget(job_id)
    except JobNotFoundError as missing:
        raise HTTPException(status_code=404, detail=str(missing)) from None
    return {"job": job.id, "state": job.detailed_state(), "result": job.result, "error": job.error}


if __name__ == "__main__":
    uvicorn.run(api, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
