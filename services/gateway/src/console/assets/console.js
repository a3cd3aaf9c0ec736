// The agentmesh console: every page reads the mesh's public APIs through
// the gateway (with the caller's own token when authentication is on) and
// renders with text nodes only, so nothing an agent or a model returns is
// ever interpreted as HTML.

const main = document.getElementById("page");
const page = main.dataset.page;
const arg = main.dataset.arg || "";
const traceUrl = main.dataset.traceUrl || "";
const SVG = "http://www.w3.org/2000/svg";

// ---- elements ------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const json = (value) => el("pre", {}, JSON.stringify(value, null, 2));
const state = (name) => el("span", { class: "state", "data-state": name }, name);
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
function age(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}
function duration(from, to) {
  if (!from || !to) return "";
  const ms = new Date(to).getTime() - new Date(from).getTime();
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}
function traceLink(traceId) {
  if (!traceId) return "";
  if (!traceUrl) return el("code", {}, traceId);
  return el("a", { href: traceUrl.replace("{trace_id}", traceId), rel: "noreferrer" }, traceId);
}

// ---- the API -------------------------------------------------------------

const TOKEN = "agentmesh-console-token";

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const token = sessionStorage.getItem(TOKEN);
  if (token) headers.set("authorization", `Bearer ${token}`);
  if (options.body && !headers.has("content-type")) headers.set("content-type", "application/json");
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    showSignIn("This mesh needs a token.");
    throw new Error("a token is needed");
  }
  if (!response.ok && !(headers.get("accept") || "").includes("text/event-stream")) {
    let message = `${response.status}`;
    try {
      const body = await response.json();
      message = body.message || body.error || message;
    } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

async function getJson(path) {
  return (await api(path)).json();
}

// Server-sent events from a fetch response (EventSource cannot send a token).
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

function showSignIn(why) {
  const auth = document.getElementById("auth");
  auth.replaceChildren(
    el("input", { id: "token", type: "password", placeholder: "token", autocomplete: "off", "aria-label": why }),
    el("button", {
      onclick: () => {
        sessionStorage.setItem(TOKEN, document.getElementById("token").value.trim());
        location.reload();
      },
    }, "Sign in"),
  );
}

function showSignedIn() {
  if (!sessionStorage.getItem(TOKEN)) return;
  document.getElementById("auth").replaceChildren(
    el("button", { class: "plain", onclick: () => { sessionStorage.removeItem(TOKEN); location.reload(); } }, "Sign out"),
  );
}

function fail(where, error) {
  where.append(el("p", { class: "error", role: "alert" }, String(error.message || error)));
}

// ---- the DAG ---------------------------------------------------------------

const STEP_STATES = {
  step_started: "running",
  step_retrying: "retrying",
  step_succeeded: "succeeded",
  step_failed: "failed",
  step_skipped: "skipped",
  step_cancelled: "cancelled",
};

// A step's progress report: `2/3 indexing`.
function progressText(p) {
  return `${p.progress}${p.total ? `/${p.total}` : ""}${p.message ? ` ${p.message}` : ""}`;
}

// Steps an event adds (a collaboration's replan, a review's recovery
// round), those not drawn yet.
function added(e, steps) {
  if (!["plan_extended", "execution_extended"].includes(e.kind) || !e.added_steps) return [];
  const known = new Set(steps.map((s) => s.step_id));
  return e.added_steps.filter((s) => !known.has(s.step_id));
}

async function layoutOf(steps) {
  const response = await api("/console/api/layout", {
    method: "POST",
    body: JSON.stringify({ steps: steps.map((s) => ({ step_id: s.step_id, depends_on: s.depends_on || [] })) }),
  });
  return response.json();
}

// Draws `steps` laid out as `layout`; returns the drawing and a way to set a step's state.
function drawDag(steps, layout, states = {}) {
  const byId = new Map(steps.map((s) => [s.step_id, s]));
  const w = layout.node_width;
  const h = layout.node_height;
  const svg = el("svg:svg", {
    width: layout.width, height: layout.height, viewBox: `0 0 ${layout.width} ${layout.height}`, role: "img",
    "aria-label": `plan of ${steps.length} steps`,
  });
  for (const [from, to] of layout.edges) {
    const a = layout.nodes[from];
    const b = layout.nodes[to];
    const x1 = a.x + w, y1 = a.y + h / 2, x2 = b.x, y2 = b.y + h / 2, mid = (x1 + x2) / 2;
    svg.append(el("svg:path", { class: "edge", d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}` }));
  }
  const nodes = new Map();
  for (const placed of layout.nodes) {
    const step = byId.get(placed.id) || {};
    const label = `${step.agent || ""}/${step.capability || ""}`;
    const cut = (text) => (text.length > 27 ? `${text.slice(0, 26)}…` : text);
    const node = el("svg:g", {
      class: "node", "data-step": placed.id, "data-state": states[placed.id] || "pending",
      transform: `translate(${placed.x},${placed.y})`,
    },
      el("svg:title", {}, `${placed.id}: ${label}`),
      el("svg:rect", { width: w, height: h, rx: 6 }),
      el("svg:text", { x: 10, y: 19 }, cut(`${placed.id} · ${step.capability || ""}`)),
      el("svg:text", { x: 10, y: 38, class: "sub" }, cut(step.agent || "")),
    );
    nodes.set(placed.id, node);
    svg.append(node);
  }
  return {
    svg,
    set(stepId, name) {
      const node = nodes.get(stepId);
      if (node) node.setAttribute("data-state", name);
    },
  };
}

// ---- Ask -----------------------------------------------------------------------

function askPage() {
  const query = el("textarea", { id: "query", placeholder: "What is the weather in Chicago?", required: true });
  const meta = el("div", { class: "meta", id: "ids" });
  const dagBox = el("div", { class: "panel dag", id: "dag", hidden: true });
  const answer = el("div", { class: "panel answer", id: "answer", "aria-live": "polite", hidden: true });
  const review = el("div", { class: "panel", id: "review", hidden: true });
  const log = el("ul", { class: "timeline", id: "events" });
  const status = el("p", { class: "meta", id: "status" });
  const form = el("form", { id: "ask" },
    el("label", { for: "query" }, "Ask the mesh"),
    query,
    el("div", { class: "row" }, el("button", { type: "submit", id: "send" }, "Ask"), status),
  );
  main.replaceChildren(el("h1", {}, "Ask"), form, meta, dagBox, answer, review,
    el("details", {}, el("summary", {}, "Events"), log));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = query.value.trim();
    if (!text) return;
    for (const box of [dagBox, answer, review]) { box.hidden = true; box.replaceChildren(); }
    log.replaceChildren();
    meta.replaceChildren();
    status.replaceChildren("planning…");
    delete answer.dataset.round;
    delete answer.dataset.done;
    let steps = [];
    let drawing = null;
    const states = {};
    const redraw = async () => {
      const layout = await layoutOf(steps);
      drawing = drawDag(steps, layout, states);
      dagBox.replaceChildren(drawing.svg);
      dagBox.hidden = false;
    };
    try {
      const response = await api("/api/v1/orchestrate", {
        method: "POST",
        headers: { accept: "text/event-stream" },
        body: JSON.stringify({ query: text }),
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        throw new Error(body.message || `${response.status}`);
      }
      const traceId = response.headers.get("x-trace-id");
      for await (const { event, data } of events(response)) {
        if (!meta.childElementCount) {
          meta.append(el("span", {}, "request ", el("a", { href: `/requests/${encodeURIComponent(data.request_id)}` }, data.request_id)));
          if (traceId) meta.append(el("span", {}, "trace ", traceLink(traceId)));
        }
        log.append(el("li", {}, `${event}${data.execution_event ? ` ${data.execution_event.kind} ${data.execution_event.step_id || ""}` : ""}`));
        if (event === "plan_created") {
          const plan = data.plan_created.plan || { steps: [] };
          if (data.round > 0) steps = steps.concat(plan.steps); else steps = plan.steps.slice();
          if (!plan.steps.length && data.plan_created.zero_step_reason) {
            status.replaceChildren(`no step: ${data.plan_created.zero_step_reason}`);
          } else {
            status.replaceChildren("running…");
          }
          if (steps.length) await redraw();
        } else if (event === "execution_event") {
          const e = data.execution_event;
          if (e.kind === "execution_started" && !document.getElementById("execution-link")) {
            meta.append(el("span", {}, "execution ", el("a", { id: "execution-link", href: `/executions/${encodeURIComponent(e.execution_id)}` }, e.execution_id)));
          }
          if (STEP_STATES[e.kind]) {
            states[e.step_id] = STEP_STATES[e.kind];
            if (drawing) drawing.set(e.step_id, states[e.step_id]);
          }
          const more = added(e, steps);
          if (more.length) {
            steps = steps.concat(more);
            await redraw();
          }
          if (e.kind === "execution_extended") {
            status.replaceChildren(`recovery round ${data.round}: ${more.length} step(s) added after the review…`);
          }
        } else if (event === "synthesis_chunk") {
          answer.hidden = false;
          // A recovery round writes the answer again: start it afresh.
          if (answer.dataset.round !== String(data.round)) {
            answer.replaceChildren();
            answer.dataset.round = String(data.round);
          }
          answer.append(data.synthesis_chunk.text);
          status.replaceChildren("answering…");
        } else if (event === "review") {
          const r = data.review;
          review.hidden = false;
          // Every review stays: the one that asked for a recovery round, then the next.
          review.append(
            el("h2", {}, data.round > 0 ? `Review after recovery round ${data.round}` : "Review"),
            el("p", {}, r.goal_achieved ? state("succeeded") : state("failed"), ` ${r.summary || ""}`),
            r.missing_data && r.missing_data.length ? el("p", {}, `missing: ${r.missing_data.join(", ")}`) : "",
            r.recovery_actions && r.recovery_actions.length
              ? el("ul", {}, r.recovery_actions.map((a) => el("li", {}, `${a.kind}: ${a.reason}`)))
              : "",
          );
        } else if (event === "final_answer") {
          const f = data.final_answer;
          answer.hidden = false;
          answer.replaceChildren(f.text);
          status.replaceChildren(state(f.goal_achieved ? "completed" : "failed"));
          answer.dataset.done = "true";
        } else if (event === "error") {
          status.replaceChildren(el("span", { class: "error", role: "alert" }, `${data.error.service}: ${data.error.message}`));
        }
      }
    } catch (error) {
      status.replaceChildren(el("span", { class: "error", role: "alert" }, String(error.message || error)));
    }
  });
}

// ---- Executions ----------------------------------------------------------------

function executionsPage() {
  const params = new URLSearchParams(location.search);
  const status = el("select", { name: "status", id: "status" },
    ["", "pending", "running", "completed", "failed", "cancelled"].map((s) =>
      el("option", { value: s, selected: params.get("status") === s }, s || "any status")));
  const requestId = el("input", { name: "request_id", id: "request-id", placeholder: "request id", value: params.get("request_id") || "" });
  const body = el("tbody", { id: "executions" });
  const more = el("button", { class: "plain", hidden: true }, "More");
  main.replaceChildren(
    el("h1", {}, "Executions"),
    el("form", { class: "row", method: "get" }, status, requestId, el("button", { type: "submit" }, "Filter")),
    el("div", { class: "panel" }, el("table", {},
      el("thead", {}, el("tr", {}, ["execution", "status", "request", "steps", "age", "duration"].map((h) => el("th", {}, h)))),
      body)),
    more,
  );
  let token = "";
  const load = async () => {
    const query = new URLSearchParams();
    if (params.get("status")) query.set("status", params.get("status"));
    if (params.get("request_id")) query.set("request_id", params.get("request_id"));
    if (token) query.set("page_token", token);
    try {
      const page = await getJson(`/console/api/executions?${query}`);
      for (const e of page.executions) {
        body.append(el("tr", { "data-execution": e.id },
          el("td", {}, el("a", { href: `/executions/${encodeURIComponent(e.id)}` }, e.id)),
          el("td", {}, state(e.status)),
          el("td", {}, el("a", { href: `/requests/${encodeURIComponent(e.request_id)}` }, e.request_id)),
          el("td", {}, e.steps),
          el("td", { title: when(e.created_at) }, age(e.created_at)),
          el("td", {}, duration(e.created_at, e.finished_at)),
        ));
      }
      token = page.next_page_token || "";
      more.hidden = !token;
      if (!body.childElementCount) body.append(el("tr", {}, el("td", { colspan: 6 }, "No execution matches.")));
    } catch (error) {
      fail(main, error);
    }
  };
  more.addEventListener("click", load);
  load();
}

async function executionPage() {
  const id = arg;
  main.replaceChildren(el("h1", {}, "Execution ", el("code", {}, id)));
  let data;
  try {
    data = await getJson(`/console/api/executions/${encodeURIComponent(id)}`);
  } catch (error) {
    fail(main, error);
    return;
  }
  const x = data.execution;
  const steps = (x.plan && x.plan.steps) || [];
  const states = {};
  const results = new Map();
  const statusBox = el("span", { id: "execution-status" }, state(x.status));
  const meta = el("div", { class: "meta" },
    el("span", {}, "status ", statusBox),
    el("span", {}, "request ", el("a", { href: `/requests/${encodeURIComponent(x.request_id)}` }, x.request_id)),
    x.trace_id ? el("span", {}, "trace ", traceLink(x.trace_id)) : "",
    el("span", {}, `started ${when(x.created_at)}`),
    x.finished_at ? el("span", {}, `took ${duration(x.created_at, x.finished_at)}`) : "",
  );
  const dagBox = el("div", { class: "panel dag", id: "dag" });
  const timeline = el("ul", { class: "timeline", id: "timeline" });
  const stepRows = el("tbody", { id: "steps" });
  const actions = el("div", { class: "row" });
  main.append(meta, x.query ? el("p", {}, x.query) : "", x.error ? el("p", { class: "error" }, x.error) : "", actions,
    dagBox, el("h2", {}, "Steps"), el("div", { class: "panel" }, el("table", {},
      el("thead", {}, el("tr", {}, ["step", "agent / capability", "state", "attempts", "parameters", "output or error"].map((h) => el("th", {}, h)))),
      stepRows)),
    el("h2", {}, "Timeline"), el("div", { class: "panel" }, timeline),
    el("details", {}, el("summary", {}, "Plan"), json(x.plan || {})));
  let drawing = drawDag(steps, data.layout, states);
  dagBox.replaceChildren(drawing.svg);

  const renderSteps = () => {
    stepRows.replaceChildren(...steps.map((s) => {
      const r = results.get(s.step_id) || {};
      return el("tr", { "data-step": s.step_id },
        el("td", {}, s.step_id),
        el("td", {}, `${s.agent}/${s.capability}`),
        el("td", {}, state(states[s.step_id] || "pending")),
        el("td", {}, r.attempt || ""),
        el("td", {}, json(s.parameters || {})),
        el("td", {}, r.error ? el("pre", { class: "error" }, r.error) : r.output !== undefined ? json(r.output) : ""),
      );
    }));
  };
  let last = 0;
  const apply = async (e) => {
    last = Math.max(last, e.sequence);
    timeline.append(el("li", {}, `${e.sequence}. ${e.kind}${e.step_id ? ` ${e.step_id}` : ""}${e.attempt ? ` (attempt ${e.attempt})` : ""}${e.duration_ms ? ` ${e.duration_ms} ms` : ""}${e.progress ? ` ${progressText(e.progress)}` : ""}${e.error ? `: ${e.error}` : ""}`));
    if (STEP_STATES[e.kind]) {
      states[e.step_id] = STEP_STATES[e.kind];
      drawing.set(e.step_id, states[e.step_id]);
      const r = results.get(e.step_id) || {};
      if (e.attempt) r.attempt = e.attempt;
      if (e.output !== undefined) r.output = e.output;
      // A retry's error stays only until the step succeeds.
      if (e.kind === "step_succeeded") delete r.error;
      else if (e.error) r.error = e.error;
      results.set(e.step_id, r);
    }
    const more = added(e, steps);
    if (more.length) {
      steps.push(...more);
      drawing = drawDag(steps, await layoutOf(steps), states);
      dagBox.replaceChildren(drawing.svg);
    }
    if (e.kind === "execution_extended") statusBox.replaceChildren(state("running"));
    const finished = { execution_completed: "completed", execution_failed: "failed", execution_cancelled: "cancelled" }[e.kind];
    if (finished) {
      statusBox.replaceChildren(state(finished));
      actions.replaceChildren();
    }
  };
  for (const e of data.events) await apply(e);
  renderSteps();
  if (x.status === "pending" || x.status === "running") {
    actions.append(el("button", {
      class: "danger", id: "cancel",
      onclick: async () => {
        if (!confirm(`Cancel execution ${id}?`)) return;
        try { await api(`/console/api/executions/${encodeURIComponent(id)}/cancel`, { method: "POST" }); } catch (error) { fail(actions, error); }
      },
    }, "Cancel"));
    try {
      const response = await api(`/console/api/executions/${encodeURIComponent(id)}/follow?after=${last}`, { headers: { accept: "text/event-stream" } });
      for await (const { data: e } of events(response)) {
        await apply(e);
        renderSteps();
      }
    } catch (error) {
      fail(main, error);
    }
  }
}

// ---- Agents --------------------------------------------------------------------

function agentsPage() {
  const params = new URLSearchParams(location.search);
  const filters = ["skill", "reasoner", "tags", "health_status"];
  const inputs = filters.map((f) => el("input", { name: f, placeholder: f.replace("_", " "), value: params.get(f) || "" }));
  const list = el("div", { id: "agents" });
  main.replaceChildren(el("h1", {}, "Agents"),
    el("form", { class: "row", method: "get" }, inputs, el("button", { type: "submit" }, "Filter")), list);
  const load = async () => {
    const query = new URLSearchParams();
    for (const f of filters) if (params.get(f)) query.set(f, params.get(f));
    try {
      const catalog = await getJson(`/console/api/agents?${query}`);
      list.replaceChildren(...catalog.agents.map((a) => el("section", { class: "panel", "data-agent": a.agent_id },
        el("h2", {}, a.agent_id, " ", el("span", { class: "agent-health" }, state(a.health_status))),
        el("div", { class: "meta" }, el("span", {}, `version ${a.version || "—"}`), el("span", {}, `last heartbeat ${when(a.last_heartbeat)}`)),
        el("table", {}, el("tbody", {}, [...(a.reasoners || []).map((c) => ["reasoner", c]), ...(a.skills || []).map((c) => ["skill", c])].map(([kind, c]) =>
          el("tr", {},
            el("td", {}, el("code", {}, c.invocation_target)),
            el("td", {}, kind),
            el("td", {}, c.description || "", (c.tags || []).length ? el("div", { class: "meta" }, c.tags.join(", ")) : ""),
            el("td", {}, c.input_schema ? el("details", {}, el("summary", {}, "input"), json(c.input_schema)) : "",
              c.output_schema ? el("details", {}, el("summary", {}, "output"), json(c.output_schema)) : ""),
          )))),
      )));
      if (!catalog.agents.length) list.replaceChildren(el("p", {}, "No agent matches."));
    } catch (error) {
      list.replaceChildren();
      fail(list, error);
    }
  };
  load();
  follow(load);
}

// Follows discovery's catalog changes: health in place, the rest by
// reloading; polls every 5 s when the stream cannot be had.
async function follow(load) {
  let timer = null;
  const reload = () => { clearTimeout(timer); timer = setTimeout(load, 300); };
  try {
    const response = await api("/console/api/agents/events", { headers: { accept: "text/event-stream" } });
    if (!response.ok) throw new Error(`${response.status}`);
    for await (const { data } of events(response)) {
      const badge = document.querySelector(`[data-agent="${CSS.escape(data.agent_id)}"] .agent-health`);
      if (data.kind === "health_changed" && badge) badge.replaceChildren(state(data.health_status));
      else reload();
    }
  } catch (_) { /* below */ }
  setInterval(load, 5000);
}

// ---- Planner interactions ------------------------------------------------------

// What each kind of LLM call was for, in the words of the planner's docs.
const KIND_NOTES = {
  preselection: "Picking the relevant tools from a large catalog before planning.",
  plan: "The first plan, over the capabilities offered.",
  plan_retry: "Asked again: the last answer could not be read as a valid plan (the error says why).",
  hallucination_retry: "Asked again: the last plan named an agent or capability that was not offered (the error before names it); the allowed list is given once more.",
  replan: "A collaboration request from an agent (or a review's recovery round), planned over what it may use.",
  synthesis: "Writing the answer from the step results.",
  review: "Judging whether the answer achieves the request, and what could recover it.",
};

async function requestPage() {
  const id = arg;
  main.replaceChildren(el("h1", {}, "Request ", el("code", {}, id)),
    el("p", {}, el("a", { href: `/executions?request_id=${encodeURIComponent(id)}` }, "its executions")));
  try {
    const data = await getJson(`/console/api/requests/${encodeURIComponent(id)}/interactions`);
    if (!data.interactions.length) {
      main.append(el("p", {}, "No LLM call is recorded for this request (the log keeps them for a while, and only where the planner and synthesis keep one)."));
    }
    for (const i of data.interactions) {
      main.append(el("section", { class: "panel", "data-kind": i.kind },
        el("h2", {}, i.kind, " ", i.error ? state("error") : ""),
        KIND_NOTES[i.kind] ? el("p", { class: "meta" }, KIND_NOTES[i.kind]) : "",
        el("div", { class: "meta" }, el("span", {}, `${i.provider} ${i.model}`), el("span", {}, `${i.latency_ms} ms`),
          el("span", {}, `${i.prompt_tokens} + ${i.completion_tokens} tokens`), el("span", {}, when(i.created_at))),
        i.error ? el("p", { class: "error" }, i.error) : "",
        el("details", {}, el("summary", {}, "prompt"), el("pre", {}, i.prompt)),
        el("details", { open: true }, el("summary", {}, "answer"), el("pre", {}, i.response)),
      ));
    }
  } catch (error) {
    fail(main, error);
  }
}

showSignedIn();
({ ask: askPage, executions: executionsPage, execution: executionPage, agents: agentsPage, request: requestPage }[page] || askPage)();
