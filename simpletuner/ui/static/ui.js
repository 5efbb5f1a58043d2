// The pages' only script: live values from the JSON API and the run's event stream, and the
// requests the buttons and the new-run form make (with the workspace secret from the page).
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

function lossCurve(svg) {
  const points = [];
  const line = svg.querySelector("polyline");
  return (step, loss) => {
    points.push([step, loss]);
    const maxStep = Math.max(...points.map(p => p[0]), 1);
    const losses = points.map(p => p[1]);
    const low = Math.min(...losses), span = Math.max(...losses) - low || 1;
    line.setAttribute("points", points.map(([s, l]) =>
      `${(400 * s / maxStep).toFixed(1)},${(145 - 140 * (l - low) / span).toFixed(1)}`).join(" "));
  };
}

function watchRun(root) {
  const id = root.dataset.run;
  const addPoint = lossCurve(document.getElementById("loss"));
  const events = new EventSource(`/api/runs/${id}/events`);
  events.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (typeof event.step === "number") root.querySelector('[data-field="step"]').textContent = event.step;
    if (event.type === "step" && typeof event.loss === "number") addPoint(event.step, event.loss);
  };
  events.addEventListener("close", () => events.close());
  const refresh = async () => setFields(root, await (await fetch(`/api/runs/${id}`)).json());
  setInterval(refresh, 3000);
  for (const button of root.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", async () => {
      const result = await post(`/api/runs/${id}/${button.dataset.action}`);
      root.querySelector('[data-field="message"]').textContent = result.body.error ?? "";
      refresh();
    });
  }
}

function showProblems(problems) {
  const list = document.getElementById("problems");
  list.replaceChildren(...problems.map(problem => {
    const item = document.createElement("li");
    item.textContent = problem.message;
    return item;
  }));
}

function newRunForm(form) {
  const request = () => {
    try {
      const field = (name) => form.elements.namedItem(name).value;
      return {name: field("name"), config: JSON.parse(field("config")),
              datasets: JSON.parse(field("datasets"))};
    } catch (error) { showProblems([{message: `not JSON: ${error.message}`}]); return null; }
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = request();
    if (!body) return;
    const result = await post("/api/runs", body);
    if (result.status === 201) location.href = `/runs/${result.body.id}`;
    else showProblems(result.body.problems ?? [{message: result.body.error}]);
  });
  form.querySelector('[data-action="check"]').addEventListener("click", async () => {
    const body = request();
    if (!body) return;
    const problems = (await post("/api/check", body)).body.problems ?? [];
    showProblems(problems.length ? problems : [{message: "no problems"}]);
  });
}

const runsTable = document.querySelector("table[data-live=runs]");
if (runsTable) setInterval(() => pollRuns(runsTable), 2000);
const runView = document.getElementById("run");
if (runView) watchRun(runView);
const form = document.getElementById("new-run");
if (form) newRunForm(form);
