"""The datasets page (`/datasets`): a folder of the workspace or a dataset root as thumbnails
by bucket, each with its caption, editable; the bucket histogram; the dataset roots of
workspace.json, editable. Its API: thumbnails, caption writes, the roots."""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.routing import Route

from simpletuner.ui.api import json_body
from simpletuner.ui.dataset_browser import (FolderImage, folder_images, histogram,
                                            set_dataset_roots, thumbnail, write_caption)
from simpletuner.ui.pages import page
from simpletuner.ui.run_request import BadRequest
from simpletuner.ui.workspace import PathRefused

BAR_WIDTH = 300


def _number(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name, "")
    return int(value) if value.isdigit() and 0 < int(value) <= 8192 else default


def _histogram_svg(counts: list[tuple[str, int]]) -> str:
    """Bars as SVG attributes (the pages' policy allows no inline style)."""
    most = max((count for _, count in counts), default=1)
    rows = "".join(
        f'<text x=0 y={18 * i + 13}>{escape(bucket)}</text><rect x=90 y={18 * i + 3} '
        f'height=12 width={max(1, round(BAR_WIDTH * count / most))} fill=steelblue></rect>'
        f'<text x={95 + round(BAR_WIDTH * count / most)} y={18 * i + 13}>{count}</text>'
        for i, (bucket, count) in enumerate(counts))
    return (f'<svg id=histogram width={BAR_WIDTH + 140} height={18 * len(counts) + 6}>'
            f'{rows}</svg>')


def _figure(image: FolderImage) -> str:
    path = escape(str(image.path))
    query = escape(urlencode({"path": str(image.path)}))
    return (f'<figure class=sample data-image="{path}"><img src="/api/thumbnail?{query}" '
            f'alt="{escape(image.path.name)}"><figcaption>{escape(image.path.name)} '
            f'{image.width}x{image.height}</figcaption><textarea rows=3 class=caption>'
            f'{escape(image.caption or "")}</textarea><button type=button '
            'data-action=save-caption>save</button> <span class=saved></span></figure>')


def _by_bucket(images: list[FolderImage], counts: list[tuple[str, int]]) -> str:
    return "".join(
        f'<section data-bucket="{escape(bucket)}"><h3>{escape(bucket)}: {count}</h3>'
        + "".join(_figure(image) for image in images if image.bucket == bucket) + "</section>"
        for bucket, count in counts)


async def datasets_page(request: Request) -> HTMLResponse:
    ui, path = request.app.state.ui, request.query_params.get("path", ".")
    resolution, alignment = _number(request, "resolution", 1024), _number(request, "alignment", 64)
    try:
        folder, images, folders = await run_in_threadpool(folder_images, ui.workspace, path,
                                                          resolution, alignment)
    except PathRefused as exc:
        return page(ui, "Refused", f"<p>{escape(str(exc))}</p>", status_code=403)
    except NotADirectoryError as exc:
        return page(ui, "Not a folder", f"<p>{escape(str(exc))}</p>", status_code=404)
    roots = [str(root) for root in ui.workspace.dataset_roots()]
    links = "".join(f'<li><a href="/datasets?{escape(urlencode({"path": str(place)}))}">'
                    f'{escape(str(place))}</a></li>'
                    for place in [*ui.workspace.allowed_roots(), *folders])
    counts = histogram(images)
    body = (f'<form id=roots><label>dataset roots (workspace.json), one per line<textarea '
            f'name=roots rows=3>{escape(chr(10).join(roots))}</textarea></label><button>save '
            'the roots</button> <span class=saved></span></form>'
            f'<ul>{links}</ul><form method=get><input type=hidden name=path '
            f'value="{escape(str(folder))}"><label>buckets at resolution <input name=resolution '
            f'value={resolution}> alignment <input name=alignment value={alignment}></label>'
            f'<button>show</button></form><h2>{len(images)} images by bucket</h2>'
            f'{_histogram_svg(counts)}<div id=samples>{_by_bucket(images, counts)}</div>')
    return page(ui, str(folder), body)


async def thumbnail_file(request: Request):
    ui = request.app.state.ui
    try:
        made = await run_in_threadpool(thumbnail, ui.workspace,
                                       request.query_params.get("path", ""))
    except PathRefused as exc:
        return JSONResponse({"error": str(exc)}, status_code=403)
    except OSError as exc:  # missing, or not an image Pillow reads
        return JSONResponse({"error": f"no thumbnail: {exc}"}, status_code=404)
    return FileResponse(made, media_type="image/png")


async def save_caption(request: Request) -> JSONResponse:
    ui = request.app.state.ui
    try:
        body = await json_body(request)
        image, caption = (body.get("path"), body.get("caption")) if isinstance(
            body, dict) else (None, None)
        if not (isinstance(image, str) and isinstance(caption, str)):
            raise BadRequest([{"message": "'path' and 'caption': strings"}])
        written = await run_in_threadpool(write_caption, ui.workspace, image, caption)
    except BadRequest as exc:
        return JSONResponse({"error": str(exc)}, status_code=422)
    except PathRefused as exc:
        return JSONResponse({"error": str(exc)}, status_code=403)
    except (OSError, ValueError) as exc:
        return JSONResponse({"error": str(exc)}, status_code=404 if isinstance(
            exc, FileNotFoundError) else 422)
    return JSONResponse({"path": str(written)})


async def save_roots(request: Request) -> JSONResponse:
    ui = request.app.state.ui
    try:
        body = await json_body(request)
        roots = body.get("dataset_roots") if isinstance(body, dict) else None
        saved = await run_in_threadpool(set_dataset_roots, ui.workspace, roots)
    except (BadRequest, ValueError) as exc:
        return JSONResponse({"error": str(exc)}, status_code=422)
    return JSONResponse({"dataset_roots": saved})


ROUTES = [
    Route("/datasets", datasets_page, methods=["GET"]),
    Route("/api/thumbnail", thumbnail_file, methods=["GET"]),
    Route("/api/caption", save_caption, methods=["POST"]),
    Route("/api/workspace", save_roots, methods=["POST"]),
]
