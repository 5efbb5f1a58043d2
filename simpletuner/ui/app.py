"""The Starlette app of `python -m simpletuner serve`, built from its settings: the security
middleware around the API, the pages and the static files, and the scheduler's loop running
for the app's lifetime."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from simpletuner.ui import api, compare, dataset_routes, pages
from simpletuner.ui.context import UiContext
from simpletuner.ui.queue_db import RunQueue
from simpletuner.ui.scheduler import Scheduler
from simpletuner.ui.security import Guard
from simpletuner.ui.settings import ServerSettings
from simpletuner.ui.workspace import Workspace

STATIC = Path(__file__).resolve().parent / "static"


def build_app(settings: ServerSettings) -> Starlette:
    workspace = Workspace(settings.workspace)
    secret = workspace.prepare()
    queue = RunQueue(workspace.queue_path)
    scheduler = Scheduler(workspace, queue, settings.slots, settings.repo, settings.devices)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(scheduler.run_forever())
        try:
            yield
        finally:  # the runs go on: they are process groups of their own
            task.cancel()

    app = Starlette(
        routes=[*api.ROUTES, *dataset_routes.ROUTES, *compare.ROUTES, *pages.ROUTES,
                Mount("/static", StaticFiles(directory=STATIC))],
        middleware=[Middleware(Guard, settings=settings, secret=secret)], lifespan=lifespan)
    app.state.ui = UiContext(settings, workspace, queue, secret)
    return app
