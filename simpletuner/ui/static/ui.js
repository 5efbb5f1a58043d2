// The pages' only script: the runs list kept live, a run page's charts, validation images and
// checkpoints growing from its event stream, the new-run form (problems at their fields,
// import, plan), the datasets page's captions and roots; every state-changing request carries
// the workspace secret from the page. Text is set as text, never as HTML.
"use strict";

const secret = document.querySelector('meta[name="simpletuner-secret"]')?.content;

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST", credentials: "same-origin", body: JSON.stringify(body ?? {}),
    headers: {"Content-Type": "application/json", "X-SimpleTuner-Secret": secret},
  });
  return {status: response.status, body: await response.json()};
}

function setFields(root, run) {
  for (const cell of root.querySelectorAll("[data-field]")) {
    const value = run[cell.dataset.field];
    cell.textContent = value === null || value === undefined ? "" : String(value);
  }
}

async function pollRuns(table) {
  const response = await fetch("/api/runs", {credentials: "same-origin"});
  const {runs} = await response.json();
  const rows = table.tBodies[0];
  if (runs.length !== rows.rows.length) { location.reload(); return; }
  for (const run of runs) {
    const row = rows.querySelector(`tr[data-run="${run.id}"]`);
    if (row) setFields(row, run);
  }
}

// A chart of named series (its polylines' classes) that grows as points arrive; a step at or
// before the last one (a resumed run's cut-back) drops the points from there first.
function chart(svg) {
  const series = {};
  for (const line of svg.querySelectorAll("polyline")) series[line.getAttribute("class")] = [];
  let pending = false;
  const draw = () => {
    pending = false;
    const all = Object.values(series).flat();
    if (!all.length) return;
    // Loops, not Math.min(...all): a long run's points exceed the arguments a call takes.
    let first = Infinity, last = -Infinity, low = Infinity, high = -Infinity;
    for (const [step, value] of all) {
      first = Math.min(first, step); last = Math.max(last, step);
      low = Math.min(low, value); high = Math.max(high, value);
    }
    const stepSpan = last - first || 1, span = high - low;
    const y = (v) => span ? 145 - 140 * (v - low) / span : 75;  // a constant: a middle line
    for (const [name, points] of Object.entries(series)) {
      svg.querySelector(`polyline.${name}`).setAttribute("points", points.map(([s, v]) =>
        `${(5 + 390 * (s - first) / stepSpan).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
    }
    svg.closest("figure").querySelector(".range").textContent =
      low === high ? `${low.toPrecision(3)}` : `${low.toPrecision(3)} to ${high.toPrecision(3)}`;
  };
  return (name, step, value) => {
    const points = series[name];
    while (points.length && points.at(-1)[0] >= step) points.pop();
    points.push([step, value]);
    if (!pending) { pending = true; requestAnimationFrame(draw); }
  };
}

function imageUrl(id, path) {
  return `/api/runs/${id}/file?${new URLSearchParams({path})}`;
}

// validation and checkpoint events add to what the page was rendered with (the stream
// replays the run's whole history, so what is there already is skipped).
function addValidation(id, event) {
  const grid = document.getElementById("validation");
  for (const path of event.files ?? []) {
    const url = imageUrl(id, path);
    if (!/\.(png|jpe?g|webp)$/i.test(path) || grid.querySelector(`img[src="${CSS.escape(url)}"]`)) continue;
    const figure = element("figure"), image = element("img");
    image.src = url;
    image.alt = `step ${event.step}`;
    figure.append(image, element("figcaption", `step ${event.step}: ${path}`));
    grid.append(figure);
  }
}

function addCheckpoint(event) {
  const list = document.getElementById("checkpoints");
  const known = [...list.children].some(item => item.textContent.startsWith(`${event.folder} `));
  if (!known) list.append(element("li", `${event.folder} (step ${event.step})`));
}

function watchRun(root) {
  const id = root.dataset.run;
  const loss = chart(document.getElementById("loss"));
  const lr = chart(document.getElementById("lr"));
  const evalLoss = chart(document.getElementById("eval"));
  let smoothed = null;
  const events = new EventSource(`/api/runs/${id}/events`);
  events.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (typeof event.step === "number") root.querySelector('[data-field="step"]').textContent = event.step;
    if (event.type === "step" && typeof event.loss === "number") {
      smoothed = smoothed === null ? event.loss : 0.9 * smoothed + 0.1 * event.loss;
      loss("raw", event.step, event.loss);
      loss("smooth", event.step, smoothed);
    }
    if (event.type === "step" && typeof event.lr === "number") lr("raw", event.step, event.lr);
    if (event.type === "eval" && typeof event.eval_loss === "number") evalLoss("raw", event.step, event.eval_loss);
    if (event.type === "validation") addValidation(id, event);
    if (event.type === "checkpoint") addCheckpoint(event);
  };
  events.addEventListener("close", () => events.close());
  const refresh = async () => setFields(root, await (await fetch(`/api/runs/${id}`)).json());
  setInterval(refresh, 3000);
  for (const button of root.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", async () => {
      const action = button.dataset.action;
      if (action === "delete" && !confirm(`Delete run "${root.dataset.name}" and its folder ` +
                                          `${root.dataset.folder}?`)) return;
      const result = await post(`/api/runs/${id}/${action}`);
      if (action === "delete" && result.status === 200) { location.href = "/"; return; }
      root.querySelector('[data-field="message"]').textContent = result.body.error ?? "";
      refresh();
    });
  }
}

// The new-run form: config.json from the generated option fields (an empty field is unset)
// and the "other keys" object; multidatabackend.json from one textarea per dataset.
function optionValue(input) {
  const text = input.value.trim();
  if (text === "") return undefined;
  const kind = input.dataset.kind;
  if (kind === "bool") return text === "true";
  if (kind === "int" || kind === "number") return Number.isFinite(Number(text)) ? Number(text) : text;
  if (kind === "json") { try { return JSON.parse(text); } catch { return text; } }
  return text;  // the server names a value of the wrong type at its field
}

function readForm(form) {
  const config = {}, problems = [];
  for (const input of form.querySelectorAll("#options [data-kind]")) {
    const value = optionValue(input);
    if (value !== undefined) config[input.name] = value;
  }
  try { Object.assign(config, JSON.parse(form.elements.namedItem("extra").value || "{}")); }
  catch (error) { problems.push({path: "extra", message: `not a JSON object: ${error.message}`}); }
  const datasets = [...form.querySelectorAll("#dataset-list textarea")].map((area, index) => {
    try { return JSON.parse(area.value); }
    catch (error) { problems.push({path: `datasets[${index}]`, message: `not JSON: ${error.message}`}); }
  });
  return {problems, body: {name: form.elements.namedItem("run-name").value, config, datasets}};
}

// Each problem at the field its JSON path names (a config.json option, a dataset's entry),
// at the top when it names none the form shows.
function problemPlace(form, problem) {
  const path = problem.path || (problem.file === "config.json" ? problem.key : "") || "";
  const entry = /^datasets\[(\d+)\]/.exec(path);
  if (entry) return form.querySelectorAll("#dataset-list .dataset")[Number(entry[1])];
  const option = path.split(/[.[]/)[0];
  return option ? form.querySelector(`.option[data-path="${CSS.escape(option)}"]`) : null;
}

function showProblems(form, problems) {
  document.getElementById("checked").replaceChildren();
  for (const list of document.querySelectorAll(".problems")) list.replaceChildren();
  for (const marked of form.querySelectorAll(".has-problem")) marked.classList.remove("has-problem");
  for (const problem of problems) {
    const place = problemPlace(form, problem);
    const item = document.createElement("li");
    item.textContent = problem.fix ? `${problem.message}; ${problem.fix}` : problem.message;
    if (place) {
      place.classList.add("has-problem");
      place.closest("details")?.setAttribute("open", "");
    }
    (place?.querySelector(".problems") ?? document.getElementById("problems")).append(item);
  }
}

function addDataset(form, dataset) {
  const entry = form.querySelector("#dataset-template").content.firstElementChild.cloneNode(true);
  entry.querySelector("textarea").value = JSON.stringify(dataset, null, 2);
  form.querySelector("#dataset-list").append(entry);
}

// A SimpleTuner config.json: its keys (with or without "--") into their fields, the rest into
// "other keys"; its multidatabackend.json replaces the datasets.
function importFiles(form) {
  const text = (name) => form.querySelector(`textarea[data-import="${name}"]`).value.trim();
  try {
    if (text("config")) {  // it replaces the form's options: what it leaves out is unset
      for (const input of form.querySelectorAll("#options [data-kind]")) input.value = "";
      const extra = {};
      for (const [rawKey, value] of Object.entries(JSON.parse(text("config")))) {
        const key = rawKey.replace(/^--/, "");
        const input = form.querySelector(`#options [name="${CSS.escape(key)}"]`);
        if (!input) { extra[key] = value; continue; }
        input.value = typeof value === "string" ? value : JSON.stringify(value);
      }
      form.elements.namedItem("extra").value = JSON.stringify(extra, null, 2);
    }
    if (text("datasets")) {
      form.querySelector("#dataset-list").replaceChildren();
      for (const dataset of JSON.parse(text("datasets"))) addDataset(form, dataset);
    }
    showProblems(form, []);
  } catch (error) { showProblems(form, [{message: `import: not JSON: ${error.message}`}]); }
}

function element(tag, text) {
  const made = document.createElement(tag);
  if (text !== undefined) made.textContent = String(text);
  return made;
}

function tableOf(headings, rows) {
  const table = element("table");
  const head = table.createTHead().insertRow();
  for (const heading of headings) head.append(element("th", heading));
  const body = table.createTBody();
  for (const cells of rows) {
    const row = body.insertRow();
    for (const cell of cells) row.append(element("td", cell));
  }
  return table;
}

// plan's summary: each dataset's buckets, the steps per epoch at the chosen process count.
function showPlan(plan) {
  const parts = [element("h2", "plan")];
  for (const [id, dataset] of Object.entries(plan.datasets)) {
    parts.push(element("h3", `dataset ${id}: ${dataset.skipped} skipped`));
    parts.push(tableOf(["bucket", "images"], Object.entries(dataset.buckets)));
  }
  const steps = plan.optimizer_steps_per_epoch ?? [];
  parts.push(element("p", `${plan.num_processes} process(es): optimizer steps per epoch ` +
    `${steps.slice(0, 5).join(", ")}${steps.length > 5 ? ", ..." : ""}; micro-batches per ` +
    `process per epoch ${(plan.micro_batches_per_epoch ?? []).slice(0, 5).join(", ")}`));
  if (plan.problem) parts.push(element("pre", plan.problem));
  if (plan.memory) {
    parts.push(element("p", plan.memory.verdict ?? "no fit verdict for this family (see the table)"));
    parts.push(element("pre", plan.memory.text));
  }
  document.getElementById("plan").replaceChildren(...parts);
}

function newRunForm(form) {
  const submit = async (url, more) => {
    const {problems, body} = readForm(form);
    if (problems.length) { showProblems(form, problems); return null; }
    return post(url, {...body, ...more});
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const result = await submit("/api/runs");
    if (!result) return;
    if (result.status === 201) location.href = `/runs/${result.body.id}`;
    else showProblems(form, result.body.problems ?? [{message: result.body.error}]);
  });
  form.querySelector('[data-action="check"]').addEventListener("click", async () => {
    const result = await submit("/api/check");
    if (!result) return;
    showProblems(form, result.body.problems ?? [{message: result.body.error}]);
    document.getElementById("checked").textContent =
      result.body.problems?.length === 0 ? "no problems: it would start" : "";
  });
  form.querySelector('[data-action="plan"]').addEventListener("click", async () => {
    const gpuMemory = Number(form.elements.namedItem("gpu-memory").value);
    const result = await submit("/api/plan", {
      processes: Number(form.elements.namedItem("processes").value),
      ...(gpuMemory > 0 ? {gpu_memory: gpuMemory} : {})});
    if (!result) return;
    showProblems(form, result.body.problems ?? []);
    if (result.body.plan) showPlan(result.body.plan);
  });
  form.querySelector('[data-action="add-dataset"]').addEventListener("click",
    () => addDataset(form, {id: "", type: "local", instance_data_dir: "", caption_strategy: "textfile"}));
  form.addEventListener("click", (event) => {
    if (event.target.dataset.action === "remove-dataset") event.target.closest(".dataset").remove();
  });
  form.querySelector('[data-action="import"]').addEventListener("click", () => importFiles(form));
  for (const input of form.querySelectorAll("input[data-import-file]")) {
    input.addEventListener("change", async () => {
      const area = form.querySelector(`textarea[data-import="${input.dataset.importFile}"]`);
      if (input.files[0]) area.value = await input.files[0].text();
    });
  }
}

// The datasets page: a caption saved beside its image; workspace.json's dataset roots.
function datasetsPage(samples) {
  samples.addEventListener("click", async (event) => {
    if (event.target.dataset.action !== "save-caption") return;
    const figure = event.target.closest("figure");
    const result = await post("/api/caption", {path: figure.dataset.image,
                                               caption: figure.querySelector("textarea").value});
    figure.querySelector(".saved").textContent = result.status === 200 ? "saved" : result.body.error;
  });
  const roots = document.getElementById("roots");
  roots.addEventListener("submit", async (event) => {
    event.preventDefault();
    const lines = roots.elements.namedItem("roots").value.split("\n").map(line => line.trim());
    const result = await post("/api/workspace", {dataset_roots: lines.filter(Boolean)});
    if (result.status === 200) location.reload();
    else roots.querySelector(".saved").textContent = result.body.error;
  });
}

const runsTable = document.querySelector("table[data-live=runs]");
if (runsTable) {
  setInterval(() => pollRuns(runsTable), 2000);
  document.querySelector('[data-action="compare"]').addEventListener("click", () => {
    const ids = [...runsTable.querySelectorAll("input[name=compare]:checked")].map(box => box.value);
    location.href = `/compare?${new URLSearchParams({ids: ids.join(",")})}`;
  });
}
const runView = document.getElementById("run");
if (runView) watchRun(runView);
const form = document.getElementById("new-run");
if (form) newRunForm(form);
const samples = document.getElementById("samples");
if (samples) datasetsPage(samples);
