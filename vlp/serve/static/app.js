// vlp serve's page: the search form, the grid of hits, a hit's Grad-CAM panel. Everything comes from
// the server that served this file (its JSON API: vlp/serve/server.py); the address bar holds the
// search (?q=...&top=...&rerank=... or ?like=ROW&top=...) so that it can be reloaded or shared.
"use strict";

const $ = (id) => document.getElementById(id);
const form = $("search"), q = $("q"), topSelect = $("top"), rerank = $("rerank"), rerankK = $("rerank-k");
const errorBox = $("error"), statusLine = $("status"), grid = $("grid");
const detail = $("detail"), detailTitle = $("detail-title"), heat = $("heat"), heatMsg = $("heat-msg");
let info = null; // /api/info
let current = null; // the search shown: {q, like, top, rerank}
let asked = 0; // the number of the latest request: an older answer arriving late is dropped
let opened = null; // the hit whose panel is open

function showError(message) {
  errorBox.textContent = message || "";
  errorBox.hidden = !message;
}

// The JSON of `url`; an error answer ({"error": ...}) is thrown as its message.
async function getJSON(url) {
  const r = await fetch(url);
  let body = null;
  try {
    body = await r.json();
  } catch (e) {
    throw new Error(`${url}: HTTP ${r.status} without a JSON answer`);
  }
  if (!r.ok) throw new Error(body.error || `${url}: HTTP ${r.status}`);
  return body;
}

function stateFromURL() {
  const p = new URLSearchParams(location.search);
  return { q: p.get("q"), like: p.get("like"), top: p.get("top") || "10", rerank: p.get("rerank") || "0" };
}

function queryString(s) {
  const p = new URLSearchParams();
  if (s.like !== null) p.set("like", s.like);
  else p.set("q", s.q);
  p.set("top", s.top);
  if (s.like === null && s.rerank !== "0") p.set("rerank", s.rerank);
  return "?" + p.toString();
}

function fillForm(s) {
  q.value = s.q || "";
  if (![...topSelect.options].some((o) => o.value === s.top)) topSelect.add(new Option(s.top));
  topSelect.value = s.top;
  rerank.checked = s.rerank !== "0";
  if (rerank.checked) rerankK.value = s.rerank;
}

function formState() {
  return { q: q.value, like: null, top: topSelect.value, rerank: rerank.checked ? rerankK.value || "0" : "0" };
}

// Search as `s` says, and put it in the address bar (push: a new entry; else: replace).
function go(s, push) {
  const url = queryString(s);
  if (push) history.pushState(null, "", url);
  else history.replaceState(null, "", url);
  run(s);
}

async function run(s) {
  const n = ++asked;
  current = s;
  showError("");
  closeDetail();
  grid.dataset.state = "loading";
  statusLine.textContent = "searching…";
  const enc = encodeURIComponent;
  const api = s.like !== null
    ? `/api/similar?row=${enc(s.like)}&top=${enc(s.top)}`
    : `/api/search?q=${enc(s.q)}&top=${enc(s.top)}&rerank=${enc(s.rerank)}`;
  try {
    const res = await getJSON(api);
    if (n === asked) render(res, s);
  } catch (e) {
    if (n !== asked) return;
    grid.replaceChildren();
    grid.dataset.state = "error";
    statusLine.textContent = "";
    showError(e.message);
  }
}

function render(res, s) {
  const what = s.like !== null
    ? `the ${res.hits.length} images most like ${res.name}`
    : `${res.hits.length} hits for “${res.q}”` + (res.rerank ? `, the ITC top ${res.rerank} re-ranked by ITM` : "");
  statusLine.textContent = `${what}, of ${res.count} images (${res.ms} ms)`;
  grid.replaceChildren(...res.hits.map(tile));
  grid.dataset.state = "done";
}

function tile(hit) {
  const fig = document.createElement("figure");
  fig.className = "hit";
  Object.assign(fig.dataset, { rank: hit.rank, row: hit.row, itc: hit.itc, itm: hit.itm === null ? "" : hit.itm });
  const thumb = document.createElement("button");
  thumb.className = "thumb";
  thumb.type = "button";
  thumb.title = current.like !== null ? "show this image" : "Grad-CAM of the query over this image";
  const img = document.createElement("img");
  img.src = `/image?row=${hit.row}`;
  img.alt = hit.name;
  img.loading = "lazy";
  img.addEventListener("error", () => imageMissing(img));
  thumb.append(img);
  thumb.addEventListener("click", () => openDetail(hit, fig));
  const cap = document.createElement("figcaption");
  const span = (cls, text) => Object.assign(document.createElement("span"), { className: cls, textContent: text });
  cap.append(span("rank", `#${hit.rank}`), span("score itc", `itc ${hit.itc.toFixed(4)}`));
  if (hit.itm !== null) cap.append(span("score itm", `itm ${hit.itm.toFixed(4)}`));
  const name = Object.assign(document.createElement("div"), { className: "name", textContent: hit.name, title: hit.path });
  const like = Object.assign(document.createElement("button"), { className: "like", type: "button", textContent: "more like this" });
  like.addEventListener("click", () => moreLike(hit.row));
  cap.append(name, like);
  fig.append(thumb, cap);
  return fig;
}

// An image the browser could not show: the server's reason (a file gone since indexing) in its place.
async function imageMissing(img) {
  let message = `the browser cannot show ${img.alt}`;
  try {
    const r = await fetch(img.src);
    if (!r.ok) message = (await r.json()).error || message;
  } catch (e) {
    message = `${img.alt}: ${e.message}`;
  }
  const box = Object.assign(document.createElement("div"), { className: "missing", textContent: message });
  img.replaceWith(box);
}

function moreLike(row) {
  q.value = "";
  go({ q: null, like: String(row), top: topSelect.value, rerank: "0" }, true);
}

async function openDetail(hit, fig) {
  if (opened) opened.classList.remove("open");
  opened = fig;
  fig.classList.add("open");
  detail.hidden = false;
  detail.dataset.row = hit.row;
  detailTitle.textContent = `#${hit.rank} ${hit.name}`;
  heat.hidden = true;
  heat.removeAttribute("src");
  const text = current.like === null ? current.q : null;
  if (text === null || !info.heatmap) {
    heat.src = `/image?row=${hit.row}`;
    heat.hidden = false;
    heatMsg.textContent = text === null ? "A heat map shows a text query over the image: search by text to see one." : info.heatmap_note;
    detail.dataset.state = "image";
    return;
  }
  const n = asked;
  detail.dataset.state = "loading";
  heatMsg.textContent = `computing the Grad-CAM map of “${text}” over ${hit.name}…`;
  detail.scrollIntoView({ block: "nearest" });
  try {
    const r = await fetch(`/api/heatmap?row=${hit.row}&q=${encodeURIComponent(text)}`);
    if (!r.ok) throw new Error((await r.json()).error || `HTTP ${r.status}`);
    const blob = await r.blob();
    if (n !== asked || opened !== fig) return;
    heat.src = URL.createObjectURL(blob);
    await heat.decode();
    heat.hidden = false;
    heatMsg.textContent = `Grad-CAM of the ITM score, one panel per word (fusion layer ${info.layer}); contour lines at 0.25, 0.5 and 0.75 of each map scaled to [0, 1].`;
    detail.dataset.state = "done";
  } catch (e) {
    if (n !== asked || opened !== fig) return;
    heatMsg.textContent = e.message;
    detail.dataset.state = "error";
  }
}

function closeDetail() {
  if (opened) opened.classList.remove("open");
  opened = null;
  detail.hidden = true;
  detail.dataset.state = "";
}

form.addEventListener("submit", (e) => {
  e.preventDefault();
  go(formState(), true);
});
$("detail-close").addEventListener("click", closeDetail);
$("detail-like").addEventListener("click", () => moreLike(detail.dataset.row));
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") closeDetail();
});
window.addEventListener("popstate", () => {
  const s = stateFromURL();
  fillForm(s);
  if (s.q !== null || s.like !== null) run(s);
});

async function start() {
  try {
    info = await getJSON("/api/info");
  } catch (e) {
    showError(e.message);
    return;
  }
  $("info").textContent = `${info.index}: ${info.count} images, searched with ${info.checkpoint} (${info.kind})`
    + (info.note ? `; note: ${info.note}` : "");
  rerankK.max = info.max_rerank;
  const s = stateFromURL();
  fillForm(s);
  if (s.q !== null || s.like !== null) go(s, false);
  document.body.dataset.ready = "1";
}

start();
