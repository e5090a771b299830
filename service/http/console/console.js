// The service console: plain JavaScript over the service's JSON API (no build step, no external assets).
// Every value from the API is written with textContent, never parsed as HTML.
"use strict";

// the API root: the console is served at <root>/console/
const BASE = location.pathname.replace(/console\/?(index\.html)?$/, "");
const KEY_STORE = "redundancy-embed.api-key";
const REFRESH_MS = 5000;
const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Call the JSON API; resolves to {data, headers}, rejects with an ApiError carrying the OpenAI-shaped message. */
async function api(method, path, body, key) {
  const headers = {};
  const k = key !== undefined ? key : $("api-key").value.trim();
  if (k) headers.Authorization = `Bearer ${k}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(BASE + path.replace(/^\//, ""), {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!r.ok) {
    const e = data && data.error;
    throw new ApiError(r.status, e ? e.message : (text || r.statusText), e ? e.code : null);
  }
  return { data, headers: r.headers };
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.append(c instanceof Node ? c : el("td", c));
  return tr;
}

function say(text, kind) {
  const m = $("message");
  m.textContent = text || "";
  m.className = kind || "";
  m.hidden = !text;
}

function explain(err, hint = true) {
  if (err instanceof ApiError) {
    if (err.status === 401 && hint) return `401: ${err.message}: enter an API key at the top right`;
    return `${err.status}${err.code ? " " + err.code : ""}: ${err.message}`;
  }
  return String(err && err.message ? err.message : err);
}

// --- models ------------------------------------------------------------------------------------------------------
async function loadModels() {
  const [{ data: info }, { data: models }] = await Promise.all([api("GET", "/info"), api("GET", "/v1/models")]);
  $("active-model").textContent = `${info.model_id}:${info.model_version}`;
  $("active-detail").textContent =
    `${info.dimension} dims · max ${info.max_seq_length} tokens · ${info.providers.join(", ")} · sha256 ${info.model_sha256.slice(0, 12)}`;
  const rows = models.available || models.data.map((m) => ({ name: m.id, version: m.version, loaded: true, active: m.active }));
  const body = $("models").tBodies[0];
  body.replaceChildren(...rows.map((m) => {
    const btn = el("button", m.active ? "active" : "Activate");
    btn.type = "button";
    btn.disabled = m.active;
    btn.dataset.model = m.name;
    btn.dataset.version = m.version;
    btn.addEventListener("click", () => askActivate(m.name, m.version));
    const td = el("td");
    td.append(btn);
    const state = m.active ? "active" : (m.load_error ? `load failed: ${m.load_error}` : "");
    return row([m.name, m.version, m.loaded ? "yes" : "no", el("td", state, m.load_error ? "error" : ""), td]);
  }));
}

function askActivate(name, version) {
  $("activate-target").textContent = `${name}:${version}`;
  $("activate-form").dataset.model = name;
  $("activate-form").dataset.version = version;
  $("activate-error").hidden = true;
  $("activate-dialog").showModal();
  $("admin-key").focus();
}

async function activate(event) {
  event.preventDefault();
  const form = $("activate-form");
  if (!event.submitter || event.submitter.value !== "activate") {
    $("activate-dialog").close();
    return;
  }
  const key = $("admin-key").value.trim();
  if (!key) {
    $("activate-error").textContent = "an admin key is needed";
    $("activate-error").hidden = false;
    return;
  }
  $("activate-confirm").disabled = true;
  try {
    const { name, version } = { name: form.dataset.model, version: form.dataset.version };
    await api("POST", `/admin/models/${encodeURIComponent(name)}/activate`, { version }, key);
    $("activate-dialog").close();
    say(`${name}:${version} is active; collections are re-embedded in the background`, "info");
    await refresh();
  } catch (err) {
    $("activate-error").textContent = explain(err, false);
    $("activate-error").hidden = false;
  } finally {
    $("activate-confirm").disabled = false;
  }
}

// --- collections -------------------------------------------------------------------------------------------------
function reembedCell(re) {
  const td = el("td");
  if (!re) {
    td.append(el("span", "—", "muted"));
    return td;
  }
  const p = el("progress");
  p.max = Math.max(re.total || 0, 1);
  p.value = re.done || 0;
  const target = re.target_model ? ` → ${re.target_model.name}:${re.target_model.version}` : "";
  td.append(el("span", `${re.state} `, `state-${re.state}`), p, el("span", ` ${re.done || 0}/${re.total || 0}${target}`, "muted"));
  return td;
}

async function loadCollections() {
  const { data } = await api("GET", "/collections");
  const list = data.collections;
  $("collections").tBodies[0].replaceChildren(...list.map((c) => row([
    el("td", c.name), c.index.type, c.metric, el("td", c.count.toLocaleString("en"), "num"), el("td", c.dimension, "num"),
    `${c.model.name}:${c.model.version}`, reembedCell(c.reembedding),
  ])));
  $("no-collections").hidden = list.length > 0;
  const sel = $("search-collection");
  const keep = sel.value;
  sel.replaceChildren(...list.map((c) => {
    const o = el("option", `${c.name} (${c.count})`);
    o.value = c.name;
    return o;
  }));
  if (list.some((c) => c.name === keep)) sel.value = keep;
}

async function search(event) {
  event.preventDefault();
  const name = $("search-collection").value;
  if (!name) { say("no collection to search", ""); return; }
  const body = { query: $("search-query").value, top_k: Number($("search-k").value) || 5, with_payload: true, with_text: true };
  try {
    const { data: hits } = await api("POST", `/collections/${encodeURIComponent(name)}/search`, body);
    const table = $("hits");
    table.tBodies[0].replaceChildren(...hits.map((h, i) => {
      const pre = el("pre", JSON.stringify(h.payload), "payload");
      const td = el("td");
      td.append(pre);
      return row([el("td", i + 1, "num"), String(h.id), el("td", h.score.toFixed(4), "num score"), el("td", h.text, "text"), td]);
    }));
    if (!hits.length) table.tBodies[0].append(row([el("td", "no hits", "muted")]));
    table.hidden = false;
    say("");
  } catch (err) {
    say(explain(err));
  }
}

// --- similarity --------------------------------------------------------------------------------------------------
async function similarity(event) {
  event.preventDefault();
  try {
    const { data } = await api("POST", "/similarity", { pairs: [[$("sim-a").value, $("sim-b").value]] });
    const s = data.scores[0];
    $("sim-score").textContent = s.toFixed(4);
    $("sim-meter").value = s;
    $("sim-model").textContent = `(${data.model})`;
    $("sim-result").hidden = false;
    say("");
  } catch (err) {
    say(explain(err));
  }
}

// --- page ----------------------------------------------------------------------------------------------------------
let refreshing = null;

async function refresh() {
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      const { data } = await api("GET", "/ready");
      $("ready").textContent = data.status;
      $("ready").className = "badge ok";
    } catch (err) {
      $("ready").textContent = err instanceof ApiError ? (err.code || `HTTP ${err.status}`) : "unreachable";
      $("ready").className = "badge bad";
    }
    try {
      await Promise.all([loadModels(), loadCollections()]);
      if ($("message").className !== "info") say("");
    } catch (err) {
      say(explain(err));
    }
  })();
  try { await refreshing; } finally { refreshing = null; }
}

document.addEventListener("DOMContentLoaded", () => {
  const key = $("api-key");
  key.value = sessionStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => { sessionStorage.setItem(KEY_STORE, key.value.trim()); refresh(); });
  $("refresh").addEventListener("click", () => refresh());
  $("search-form").addEventListener("submit", search);
  $("similarity-form").addEventListener("submit", similarity);
  $("activate-form").addEventListener("submit", activate);
  refresh();
  setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
});
