"""The JSON API under /api/ (docs/API.md): runs listed, made (checked first), read, stopped,
resumed, cancelled and moved in the queue; configurations checked; dataset folders listed.
The security middleware has already checked Host, Origin, token and secret."""

from __future__ import annotations

import json
import shutil

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route

from simpletuner.common.atomic import atomic_write_json
from simpletuner.training.run.requests import CHECKPOINT, VALIDATE
from simpletuner.training.run.requests import request as ask_run
from simpletuner.ui import processes, run_files
from simpletuner.ui.browse import list_folder
from simpletuner.ui.checking import CONFIG_NAME, problems_of
from simpletuner.ui.context import UiContext
from simpletuner.ui.events import event_stream
from simpletuner.ui.planning import (PlanFailed, gpu_memory_of, processes_of,
                                     run_memory_plan, run_plan)
from simpletuner.ui.queue_db import ACTIVE, RUNNING
from simpletuner.ui.run_details import run_file
from simpletuner.ui.run_request import BadRequest, read_request
from simpletuner.ui.workspace import PathRefused

MAX_BODY = 1024 * 1024


def _ui(request: Request) -> UiContext:
    return request.app.state.ui


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def json_body(request: Request):
    """The parsed body; BadRequest when it is too large or not JSON."""
    body = await request.body()
    if len(body) > MAX_BODY:
        raise BadRequest([{"message": f"the body is over {MAX_BODY} bytes"}])
    try:
        return json.loads(body or b"{}")
    except ValueError as exc:
        raise BadRequest([{"message": f"the body is not JSON: {exc}"}]) from exc


async def list_runs(request: Request) -> JSONResponse:
    return JSONResponse({"runs": await run_in_threadpool(_ui(request).run_views)})


async def create_run(request: Request) -> JSONResponse:
    ui = _ui(request)
    try:
        run = read_request(await json_body(request), ui.workspace, named=True)
    except BadRequest as exc:
        return JSONResponse({"problems": exc.problems}, status_code=422)
    run_id = ui.workspace.new_run_id()
    folder = ui.workspace.run_folder(run_id)
    problems = await run_in_threadpool(problems_of, run.config, run.datasets, folder)
    if problems:
        shutil.rmtree(folder, ignore_errors=True)
        return JSONResponse({"problems": problems}, status_code=422)
    ui.queue.add(run_id, run.name)
    return JSONResponse({"id": run_id}, status_code=201)


async def check_config(request: Request) -> JSONResponse:
    ui = _ui(request)
    try:
        run = read_request(await json_body(request), ui.workspace, named=False)
    except BadRequest as exc:
        return JSONResponse({"problems": exc.problems})
    folder = ui.workspace.root / ".check" / ui.workspace.new_run_id()
    try:
        problems = await run_in_threadpool(problems_of, run.config, run.datasets, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return JSONResponse({"problems": problems})


async def plan_config(request: Request) -> JSONResponse:
    """The check's problems when there are any, otherwise plan's summary."""
    ui = _ui(request)
    try:
        body = await json_body(request)
        run = read_request(body, ui.workspace, named=False)
    except BadRequest as exc:
        return JSONResponse({"problems": exc.problems})
    folder = ui.workspace.root / ".check" / ui.workspace.new_run_id()
    try:
        problems = await run_in_threadpool(problems_of, run.config, run.datasets, folder)
        if problems:
            return JSONResponse({"problems": problems})
        processes, gpu_memory = processes_of(body), gpu_memory_of(body)
        plan = await run_in_threadpool(run_plan, ui.settings.repo, folder, processes)
        if gpu_memory is not None:
            plan["memory"] = await run_in_threadpool(run_memory_plan, ui.settings.repo, folder,
                                                     processes, gpu_memory)
    except PlanFailed as exc:
        return JSONResponse({"problems": [{"message": str(exc)}]})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return JSONResponse({"problems": [], "plan": plan})


def _record_or_404(request: Request):
    try:
        _ui(request).workspace.run_folder(request.path_params["run_id"])
    except PathRefused:
        return None
    return _ui(request).queue.get(request.path_params["run_id"])


async def get_run(request: Request) -> JSONResponse:
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    return JSONResponse(await run_in_threadpool(_ui(request).run_view, record))


async def stop_run(request: Request) -> JSONResponse:
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    if record.state != RUNNING or record.pid is None or not processes.stop(record.pid):
        return _error(409, f"run {record.id} is {record.state}, not running")
    return JSONResponse({"id": record.id, "status": "stopping"}, status_code=202)


async def resume_run(request: Request) -> JSONResponse:
    """Queued again with resume_from_checkpoint 'latest' (set in its config.json when unset),
    so train.sh continues from its newest verified checkpoint."""
    ui, record = _ui(request), _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    config_path = ui.workspace.run_folder(record.id) / CONFIG_NAME
    config = run_files.read_json(config_path)
    if config is None:
        return _error(409, f"{config_path} is missing or not a JSON object")
    # Written before the run is queued, so the scheduler cannot launch it without; a running
    # run read its config when it started.
    if not config.get("resume_from_checkpoint"):
        atomic_write_json(config_path, {**config, "resume_from_checkpoint": "latest"}, indent=2)
    if not ui.queue.requeue(record.id):
        return _error(409, f"run {record.id} is {record.state}: only an ended run resumes")
    return JSONResponse({"id": record.id, "status": "queued"}, status_code=202)


async def cancel_run(request: Request) -> JSONResponse:
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    if not _ui(request).queue.cancel(record.id):
        return _error(409, f"run {record.id} is {record.state}: only a queued run is cancelled "
                      "(stop a running one)")
    return JSONResponse({"id": record.id, "status": "cancelled"})


async def move_run(request: Request) -> JSONResponse:
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    try:
        body = await json_body(request)
    except BadRequest as exc:
        return JSONResponse({"problems": exc.problems}, status_code=422)
    index = body.get("index") if isinstance(body, dict) else None
    if type(index) is not int:
        return JSONResponse({"problems": [{"message": "'index': an integer"}]}, status_code=422)
    if not _ui(request).queue.move(record.id, index):
        return _error(409, f"run {record.id} is {record.state}, not queued")
    return JSONResponse({"id": record.id, "queue_index": index})


async def delete_run(request: Request) -> JSONResponse:
    """The run's folder removed, then its record; refused while it is queued or running."""
    ui, record = _ui(request), _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    if record.state in ACTIVE:
        return _error(409, f"run {record.id} is {record.state}: stop or cancel it first")
    folder = ui.workspace.run_folder(record.id)
    await run_in_threadpool(shutil.rmtree, folder, ignore_errors=True)
    if folder.exists():
        return _error(500, f"could not remove {folder}")
    ui.queue.delete(record.id)
    return JSONResponse({"id": record.id, "deleted": str(folder)})


async def run_image(request: Request):
    """An image of the run's output_dir (validation images), nothing outside it."""
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    output = run_files.output_of(_ui(request).workspace.run_folder(record.id))
    try:
        path = run_file(output, request.query_params.get("path", ""))
    except PathRefused as exc:
        return _error(403, str(exc))
    if not path.is_file():
        return _error(404, "no such file")
    return FileResponse(path)


async def checkpoint_run(request: Request) -> JSONResponse:
    return await _ask_run(request, CHECKPOINT)


async def validate_run(request: Request) -> JSONResponse:
    return await _ask_run(request, VALIDATE)


async def _ask_run(request: Request, name: str) -> JSONResponse:
    """A request file the running trainer acts on after its next step (requests.py)."""
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    if record.state != RUNNING:
        return _error(409, f"run {record.id} is {record.state}, not running")
    output = run_files.output_of(_ui(request).workspace.run_folder(record.id))
    await run_in_threadpool(ask_run, output, name)
    return JSONResponse({"id": record.id, "requested": name}, status_code=202)


async def run_events(request: Request):
    record = _record_or_404(request)
    if record is None:
        return _error(404, "no such run")
    return event_stream(request, _ui(request), record.id)


async def files(request: Request) -> JSONResponse:
    try:
        listing = await run_in_threadpool(list_folder, _ui(request).workspace,
                                          request.query_params.get("path", "."))
    except PathRefused as exc:
        return _error(403, str(exc))
    except NotADirectoryError as exc:
        return _error(404, str(exc))
    return JSONResponse(listing)


ROUTES = [
    Route("/api/runs", list_runs, methods=["GET"]),
    Route("/api/runs", create_run, methods=["POST"]),
    Route("/api/check", check_config, methods=["POST"]),
    Route("/api/plan", plan_config, methods=["POST"]),
    Route("/api/files", files, methods=["GET"]),
    Route("/api/runs/{run_id}", get_run, methods=["GET"]),
    Route("/api/runs/{run_id}/stop", stop_run, methods=["POST"]),
    Route("/api/runs/{run_id}/resume", resume_run, methods=["POST"]),
    Route("/api/runs/{run_id}/cancel", cancel_run, methods=["POST"]),
    Route("/api/runs/{run_id}/move", move_run, methods=["POST"]),
    Route("/api/runs/{run_id}/checkpoint", checkpoint_run, methods=["POST"]),
    Route("/api/runs/{run_id}/validate", validate_run, methods=["POST"]),
    Route("/api/runs/{run_id}/delete", delete_run, methods=["POST"]),
    Route("/api/runs/{run_id}/file", run_image, methods=["GET"]),
    Route("/api/runs/{run_id}/events", run_events, methods=["GET"]),
]
