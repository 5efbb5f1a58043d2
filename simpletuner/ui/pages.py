"""The pages: server-rendered HTML, every text from runs, configs, captions and file names
escaped; the only script and style are the server's own (static/), which read the API. The
workspace secret is in a meta tag, for the pages' own state-changing requests."""

from __future__ import annotations

import json
from html import escape
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse
from starlette.routing import Route

from simpletuner.ui.browse import list_folder
from simpletuner.ui.context import UiContext
from simpletuner.ui.security import TOKEN_COOKIE, same
from simpletuner.ui.workspace import PathRefused

# What /new starts from: the demo's settings, on the demo dataset generated in the workspace
# (`python -m simpletuner.demo_data WORKSPACE/data/demo-shapes`).
NEW_RUN_CONFIG = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                  "model_type": "full", "resolution": 64, "aspect_bucket_alignment": 16,
                  "train_batch_size": 8, "max_train_steps": 200, "learning_rate": 0.003,
                  "checkpointing_steps": 100, "resume_from_checkpoint": "latest"}
NEW_RUN_DATASETS = [{"id": "demo-shapes", "type": "local", "instance_data_dir":
                     "data/demo-shapes", "caption_strategy": "textfile"}]


def _page(ui: UiContext, title: str, body: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} · simpletuner</title>"
        f'<meta name="simpletuner-secret" content="{escape(ui.secret)}">'
        '<link rel=stylesheet href="/static/ui.css"><script src="/static/ui.js" defer></script>'
        '</head><body><nav><a href="/">runs</a> <a href="/new">new run</a> '
        f'<a href="/files">datasets</a></nav><h1>{escape(title)}</h1>{body}</body></html>',
        status_code=status_code)


def _ui(request: Request) -> UiContext:
    return request.app.state.ui


def _run_row(run: dict) -> str:
    cells = "".join(f'<td data-field="{field}">{escape(str(run[field] or ""))}</td>'
                    for field in ("status", "step", "max_steps", "elapsed"))
    return (f'<tr data-run="{escape(run["id"])}"><td><a href="/runs/{escape(run["id"])}">'
            f'{escape(run["name"])}</a></td>{cells}</tr>')


async def runs_page(request: Request) -> HTMLResponse:
    runs = await run_in_threadpool(_ui(request).run_views)
    rows = "".join(_run_row(run) for run in runs)
    return _page(_ui(request), "Runs",
                 '<table id=runs data-live=runs><thead><tr><th>name<th>status<th>step'
                 f'<th>of<th>seconds</thead><tbody>{rows}</tbody></table>')


async def run_page(request: Request) -> HTMLResponse:
    ui, run_id = _ui(request), request.path_params["run_id"]
    record = ui.queue.get(run_id)
    if record is None:
        return _page(ui, "No such run", "", status_code=404)
    run = await run_in_threadpool(ui.run_view, record)
    body = (f'<div id=run data-run="{escape(run_id)}">'
            f'<p>status <b data-field=status>{escape(run["status"])}</b>, step '
            f'<b data-field=step>{escape(str(run["step"] or 0))}</b> of '
            f'<span data-field=max_steps>{escape(str(run["max_steps"] or "?"))}</span></p>'
            f'<pre data-field=message>{escape(run["message"] or "")}</pre>'
            '<button data-action=stop>stop</button> <button data-action=resume>resume</button> '
            '<button data-action=cancel>cancel</button>'
            '<svg id=loss viewBox="0 0 400 150" width=400 height=150><polyline fill=none '
            'stroke=currentColor points=""/></svg></div>')
    return _page(ui, run["name"], body)


async def new_page(request: Request) -> HTMLResponse:
    body = ('<form id=new-run><label>name <input name=name required maxlength=200></label>'
            '<label>config.json<textarea name=config rows=14>'
            f'{escape(json.dumps(NEW_RUN_CONFIG, indent=2))}</textarea></label>'
            '<label>multidatabackend.json<textarea name=datasets rows=8>'
            f'{escape(json.dumps(NEW_RUN_DATASETS, indent=2))}</textarea></label>'
            '<button>queue</button> <button type=button data-action=check>check</button>'
            '</form><ul id=problems></ul>')
    return _page(_ui(request), "New run", body)


async def files_page(request: Request) -> HTMLResponse:
    ui, path = _ui(request), request.query_params.get("path", ".")
    try:
        listing = await run_in_threadpool(list_folder, ui.workspace, path)
    except PathRefused as exc:
        return _page(ui, "Refused", f"<p>{escape(str(exc))}</p>", status_code=403)
    except NotADirectoryError as exc:
        return _page(ui, "Not a folder", f"<p>{escape(str(exc))}</p>", status_code=404)
    rows = "".join(f'<tr><td>{escape(entry["name"])}</td><td>{escape(entry["kind"])}</td>'
                   f'<td>{escape(entry["caption"] or "")}</td></tr>'
                   for entry in listing["entries"])
    roots = "".join(f"<li>{escape(str(root))}</li>" for root in ui.workspace.allowed_roots())
    return _page(ui, listing["path"], f"<p>roots:</p><ul>{roots}</ul>"
                 f"<table><thead><tr><th>name<th>kind<th>caption</thead>{rows}</table>")


async def login_page(request: Request) -> HTMLResponse:
    ui = _ui(request)
    if request.method == "POST":
        form = parse_qs((await request.body())[:4096].decode(errors="replace"))
        token = (form.get("token") or [""])[0]
        if ui.settings.token is not None and same(token, ui.settings.token):
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response
    return HTMLResponse(
        '<!doctype html><html lang=en><head><meta charset=utf-8><title>log in</title>'
        '<link rel=stylesheet href="/static/ui.css"></head><body><form method=post>'
        '<label>access token <input name=token type=password></label><button>log in</button>'
        '</form></body></html>', status_code=401 if request.method == "POST" else 200)


ROUTES = [
    Route("/", runs_page, methods=["GET"]),
    Route("/runs/{run_id}", run_page, methods=["GET"]),
    Route("/new", new_page, methods=["GET"]),
    Route("/files", files_page, methods=["GET"]),
    Route("/login", login_page, methods=["GET", "POST"]),
]
