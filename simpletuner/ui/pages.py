"""The pages: server-rendered HTML, every text from runs, configs, captions and file names
escaped; the only script and style are the server's own (static/), which read the API. The
workspace secret is in a meta tag, for the pages' own state-changing requests."""

from __future__ import annotations

import json
from functools import partial
from html import escape
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse
from starlette.routing import Route

from simpletuner.ui import run_files
from simpletuner.ui.browse import list_folder
from simpletuner.ui.checking import CONFIG_NAME, DATASETS_NAME
from simpletuner.ui.context import UiContext
from simpletuner.ui.queue_db import ACTIVE
from simpletuner.ui.run_details import details_html
from simpletuner.ui.option_form import SERVER_SET, option_names, options_html
from simpletuner.ui.security import TOKEN_COOKIE, same
from simpletuner.ui.workspace import PathRefused

# What /new starts from: ./train.sh's own demo (config/ in the repository), shorter, on the
# demo dataset generated in the workspace (`python -m simpletuner.demo_data
# WORKSPACE/data/demo-shapes`, the path its dataset file names).
DEMO_CONFIG = Path("config") / CONFIG_NAME
DEMO_DATASETS = Path("config") / DATASETS_NAME
NEW_RUN_OVERRIDES = {"max_train_steps": 200, "checkpointing_steps": 100,
                     "validation_steps": 100}


def _demo_run(repo: Path) -> tuple[str, dict, list]:
    """The demo's two files as a new run's starting point."""
    config = run_files.read_json(repo / DEMO_CONFIG) or {}
    try:
        datasets = json.loads((repo / DEMO_DATASETS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        datasets = []
    for key in SERVER_SET:
        config.pop(key, None)
    return "", {**config, **NEW_RUN_OVERRIDES}, datasets


def page(ui: UiContext, title: str, body: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} · simpletuner</title>"
        f'<meta name="simpletuner-secret" content="{escape(ui.secret)}">'
        '<link rel=stylesheet href="/static/ui.css"><script src="/static/ui.js" defer></script>'
        '</head><body><nav><a href="/">runs</a> <a href="/new">new run</a> '
        '<a href="/datasets">datasets</a> <a href="/files">files</a></nav>'
        f'<h1>{escape(title)}</h1>{body}</body></html>',
        status_code=status_code)


def _ui(request: Request) -> UiContext:
    return request.app.state.ui


def _run_row(run: dict) -> str:
    cells = "".join(f'<td data-field="{field}">{escape(str(run[field] or ""))}</td>'
                    for field in ("status", "step", "max_steps", "elapsed"))
    return (f'<tr data-run="{escape(run["id"])}"><td><input type=checkbox name=compare '
            f'value="{escape(run["id"])}"> <a href="/runs/{escape(run["id"])}">'
            f'{escape(run["name"])}</a></td>{cells}</tr>')


async def runs_page(request: Request) -> HTMLResponse:
    runs = await run_in_threadpool(_ui(request).run_views)
    rows = "".join(_run_row(run) for run in runs)
    return page(_ui(request), "Runs",
                 '<table id=runs data-live=runs><thead><tr><th>name<th>status<th>step'
                 f'<th>of<th>seconds</thead><tbody>{rows}</tbody></table>'
                 '<p><button type=button data-action=compare>compare the checked runs'
                 '</button></p>')


def _chart(chart_id: str, title: str, series: tuple[str, ...]) -> str:
    lines = "".join(f'<polyline class={name} fill=none points=""></polyline>' for name in series)
    return (f'<figure class=chart><figcaption>{escape(title)} <span class=range></span>'
            f'</figcaption><svg id={chart_id} viewBox="0 0 400 150" width=400 height=150>'
            f'{lines}</svg></figure>')


async def run_page(request: Request) -> HTMLResponse:
    ui, run_id = _ui(request), request.path_params["run_id"]
    record = ui.queue.get(run_id)
    if record is None:
        return page(ui, "No such run", "", status_code=404)
    run = await run_in_threadpool(ui.run_view, record)
    folder = ui.workspace.run_folder(run_id)
    details = await run_in_threadpool(partial(details_html, ended=record.state not in ACTIVE),
                                      run_id, run_files.output_of(folder))
    body = (f'<div id=run data-run="{escape(run_id)}" data-name="{escape(run["name"])}" '
            f'data-folder="{escape(str(folder))}">'
            f'<p>status <b data-field=status>{escape(run["status"])}</b>, step '
            f'<b data-field=step>{escape(str(run["step"] or 0))}</b> of '
            f'<span data-field=max_steps>{escape(str(run["max_steps"] or "?"))}</span>, '
            f'exit status <span data-field=exit_status>'
            f'{escape("" if run["exit_status"] is None else str(run["exit_status"]))}'
            '</span></p>'
            f'<pre data-field=message>{escape(run["message"] or "")}</pre>'
            '<button data-action=stop>stop</button> <button data-action=resume>resume</button> '
            '<button data-action=checkpoint>checkpoint now</button> '
            '<button data-action=validate>validate now</button> '
            '<button data-action=cancel>cancel</button> <button data-action=delete>delete'
            f'</button> <a href="/new?{escape(urlencode({"from": run_id}))}">duplicate as a '
            'new run</a><div class=charts>'
            + _chart("loss", "loss (raw, smoothed)", ("raw", "smooth"))
            + _chart("lr", "learning rate", ("raw",))
            + _chart("eval", "eval loss", ("raw",)) + f'</div>{details}</div>')
    return page(ui, run["name"], body)


def _dataset_entry(dataset: dict) -> str:
    return ('<div class=dataset><textarea rows=6 spellcheck=false>'
            f'{escape(json.dumps(dataset, indent=2))}</textarea>'
            '<button type=button data-action=remove-dataset>remove</button>'
            '<ul class=problems></ul></div>')


def _duplicated(ui: UiContext, run_id: str | None) -> tuple[str, dict, list] | None:
    """A run's name, config and datasets for a new run made from it (without the keys the
    server sets and the resume, which names the old run's checkpoints)."""
    record = ui.queue.get(run_id) if run_id else None
    if record is None:
        return None
    folder = ui.workspace.run_folder(run_id)
    config = run_files.read_json(folder / CONFIG_NAME) or {}
    try:
        datasets = json.loads((folder / DATASETS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        datasets = []
    for key in (*SERVER_SET, "resume_from_checkpoint"):
        config.pop(key, None)
    return f"{record.name} (copy)", config, datasets


async def new_page(request: Request) -> HTMLResponse:
    ui = _ui(request)
    name, config, datasets = (await run_in_threadpool(
        _duplicated, ui, request.query_params.get("from"))) or _demo_run(ui.settings.repo)
    offered = set(option_names())
    extra = {key: value for key, value in config.items() if key not in offered}
    entries = "".join(_dataset_entry(dataset) for dataset in datasets
                      if isinstance(dataset, dict))
    body = ('<form id=new-run novalidate><label>name <input name=run-name required maxlength=200 '
            f'value="{escape(name)}"></label>'
            '<details id=import><summary>import a SimpleTuner config.json and '
            'multidatabackend.json</summary>'
            '<label>config.json <input type=file accept=".json" data-import-file=config>'
            '<textarea data-import=config rows=5 spellcheck=false></textarea></label>'
            '<label>multidatabackend.json <input type=file accept=".json" '
            'data-import-file=datasets><textarea data-import=datasets rows=5 spellcheck=false>'
            '</textarea></label><button type=button data-action=import>import</button>'
            '</details><p id=checked></p><ul id=problems class=problems></ul>'
            f'{options_html(config)}'
            '<fieldset class=option data-path=extra><legend>other config.json keys '
            '(a JSON object)</legend><textarea name=extra rows=3 spellcheck=false>'
            f'{escape(json.dumps(extra, indent=2))}</textarea><ul class=problems></ul></fieldset>'
            '<fieldset id=datasets><legend>multidatabackend.json: one JSON object per dataset'
            f'</legend><template id=dataset-template>{_dataset_entry({})}</template>'
            f'<div id=dataset-list>{entries}</div><button type=button '
            'data-action=add-dataset>add a dataset</button></fieldset>'
            '<p><button type=button data-action=check>check</button> <button type=button '
            'data-action=plan>plan</button> for <input name=processes type=number value=1 '
            'min=1 max=64> process(es), memory on a device of <input name=gpu-memory '
            'type=number min=0 step=any placeholder="GiB (slower)"> GiB <button>queue</button>'
            '</p></form>'
            '<div id=plan></div>')
    return page(ui, "New run", body)


async def files_page(request: Request) -> HTMLResponse:
    ui, path = _ui(request), request.query_params.get("path", ".")
    try:
        listing = await run_in_threadpool(list_folder, ui.workspace, path)
    except PathRefused as exc:
        return page(ui, "Refused", f"<p>{escape(str(exc))}</p>", status_code=403)
    except NotADirectoryError as exc:
        return page(ui, "Not a folder", f"<p>{escape(str(exc))}</p>", status_code=404)
    rows = "".join(f'<tr><td>{escape(entry["name"])}</td><td>{escape(entry["kind"])}</td>'
                   f'<td>{escape(entry["caption"] or "")}</td></tr>'
                   for entry in listing["entries"])
    roots = "".join(f"<li>{escape(str(root))}</li>" for root in ui.workspace.allowed_roots())
    return page(ui, listing["path"], f"<p>roots:</p><ul>{roots}</ul>"
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
