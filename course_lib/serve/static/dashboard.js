// The live dashboard: one EventSource of engine snapshots, four canvases, a few buttons.
// No framework and no build step: this file is served as it is (after colours.js and
// turnstile_window.js). Everything from the server is drawn as text or pixels, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const EMPTY = "#2a3038", CACHED = "#5b6673", CANVAS_TEXT = "#e6ebf0";
const CONTROL_IDS = ["pause", "single-step", "admission", "burst-n", "burst"];
const ERROR_SHOWN_MS = 8000;
const QUEUE_CHIPS = 5;  // the queue's one line holds this many at 1280 px; the count says the rest
const colours = new RequestColours();
const turnstile = new TurnstileWindow();
const spark = [];  // [time, tokens/s] for the last 60 s
let last = null, frames = 0, errorTimer = null;

// The control token (needed when the server listens beyond loopback): given once as
// /dashboard?token=..., then kept for this tab and taken out of the address bar, which the
// projector shows to the room.
const TOKEN_KEY = "course_lib.control_token";
function takeToken() {
  const url = new URL(window.location.href);
  if (url.searchParams.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, url.searchParams.get("token"));
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}
let token = takeToken();

function fit(canvas) {
  const r = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * r) || canvas.height !== Math.round(h * r)) {
    canvas.width = Math.round(w * r); canvas.height = Math.round(h * r);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(r, 0, 0, r, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return [ctx, w, h];
}

function hatch(ctx, x, y, w, h) {  // dark stripes: visible on every palette colour, light or dark
  ctx.save(); ctx.beginPath(); ctx.rect(x, y, w, h); ctx.clip();
  ctx.strokeStyle = "rgba(0,0,0,0.6)"; ctx.lineWidth = 2;
  for (let d = -h; d < w; d += 6) { ctx.beginPath(); ctx.moveTo(x + d, y + h); ctx.lineTo(x + d + h, y); ctx.stroke(); }
  ctx.restore();
}

const colourOf = (id) => colours.colour(id) || colours.assign(id);

function drawTurnstile(s) {
  const newest = turnstile.columns.length ? turnstile.columns[turnstile.columns.length - 1].seats : [];
  if (turnstile.push(s.turnstile)) colours.assignSeats(turnstile.columns[turnstile.columns.length - 1].seats, newest);
  const canvas = $("turnstile"), [ctx, w, h] = fit(canvas);
  const seats = s.num_seats, cols = turnstile.width;
  const cw = w / cols, ch = h / seats, gapX = cw > 4 ? 1 : 0, gapY = ch > 4 ? 1 : 0;
  ctx.fillStyle = EMPTY;
  for (let c = 0; c < cols; c++) for (let r = 0; r < seats; r++) ctx.fillRect(c * cw, r * ch, cw - gapX, ch - gapY);
  const offset = cols - turnstile.columns.length;
  turnstile.columns.forEach((column, i) => column.seats.forEach((cell, seat) => {
    if (!cell) return;
    const x = (offset + i) * cw, y = seat * ch;
    ctx.fillStyle = colourOf(cell[0]);
    ctx.fillRect(x, y, cw - gapX, ch - gapY);
    if (cell[1] === "prefill") hatch(ctx, x, y, cw - gapX, ch - gapY);
  }));
  Object.assign(canvas.dataset, {columns: turnstile.columns.length, firstStep: turnstile.firstStep ?? "",
                                 lastStep: turnstile.lastStep ?? "", frames});
  $("seat-count").textContent = `(${s.stats.num_running} of ${seats} seats)`;
  const stride = turnstile.stride();
  $("turnstile-span").textContent = stride <= 1 ? "one column per step, newest on the right"
    : `one column per refresh, ~${Math.round(stride)} steps apart (steps ${turnstile.firstStep}-${turnstile.lastStep})`;
}

function drawPool(s) {
  const [ctx, w, h] = fit($("pool"));
  const p = s.pages, n = p.num_pages;
  const colsN = Math.max(1, Math.ceil(Math.sqrt(n * w / h)));
  const rowsN = Math.ceil(n / colsN);
  const cw = w / colsN, ch = h / rowsN, gap = Math.min(cw, ch) > 5 ? 1 : 0;
  const shared = new Set(p.shared), cached = new Set(p.cached_free);
  for (let i = 0; i < n; i++) {
    const x = (i % colsN) * cw, y = Math.floor(i / colsN) * ch, owner = p.owners[i];
    ctx.fillStyle = owner ? colourOf(owner) : (cached.has(i) ? CACHED : EMPTY);
    ctx.fillRect(x, y, cw - gap, ch - gap);
    if (shared.has(i)) {
      ctx.strokeStyle = "#fff"; ctx.lineWidth = Math.max(1.5, Math.min(cw, ch) / 5);
      ctx.strokeRect(x + ctx.lineWidth / 2, y + ctx.lineWidth / 2, cw - gap - ctx.lineWidth, ch - gap - ctx.lineWidth);
    }
  }
  $("pool-count").textContent = `(${p.page_size} tokens a page, ${p.shared.length} shared)`;
}

function drawQueue(s) {
  $("waiting").textContent = s.stats.num_waiting;
  const q = $("queue");
  q.replaceChildren(...s.waiting.slice(0, QUEUE_CHIPS).map((id) => {
    const chip = document.createElement("span");
    chip.className = "chip"; chip.textContent = id.slice(-6);
    const c = colours.colour(id);  // a preempted request keeps its colour; a new one has none yet
    if (c) chip.style.borderLeftColor = c;
    return chip;
  }));
  const shown = Math.min(s.waiting.length, QUEUE_CHIPS);
  if (s.stats.num_waiting > shown) {
    const more = document.createElement("span");
    more.className = "label"; more.textContent = `+${s.stats.num_waiting - shown} more`;
    q.appendChild(more);
  }
}

const fmt = (v, digits = 0) => (v === null || v === undefined) ? "-" : Number(v).toFixed(digits);

function drawNumbers(s) {
  const r = s.rolling;
  $("window").textContent = r.window_s;
  $("throughput").textContent = fmt(r.throughput_tok_s);
  $("ttft").textContent = fmt(r.ttft_p50_ms, 1);
  $("tpot").textContent = fmt(r.tpot_p50_ms, 2);
  $("running").textContent = `${s.stats.num_running} / ${s.num_seats}`;
  $("pages").textContent = `${s.stats.pages_used} / ${s.stats.num_pages}`;
  $("preemptions").textContent = s.stats.num_preemptions;
  if (!spark.length || spark[spark.length - 1][0] !== s.time) spark.push([s.time, r.throughput_tok_s]);
  while (spark.length && spark[0][0] < s.time - 60) spark.shift();
  const [ctx, w, h] = fit($("spark"));
  const top = Math.max(1, ...spark.map((p) => p[1]));
  ctx.strokeStyle = "#ffd166"; ctx.lineWidth = 2; ctx.beginPath();
  spark.forEach(([t, v], i) => {
    const x = w - (s.time - t) / 60 * w, y = h - 4 - v / top * (h - 8);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = CANVAS_TEXT; ctx.font = "15px system-ui, sans-serif";
  ctx.fillText(`tokens/s, last 60 s (max ${top.toFixed(0)})`, 6, 17);
}

function drawState(s) {
  const status = $("status");
  status.textContent = s.paused ? "PAUSED" : "RUNNING";
  status.className = s.paused ? "pill paused" : "pill";
  document.body.classList.toggle("paused", s.paused);
  document.body.dataset.paused = s.paused;
  $("pause").textContent = s.paused ? "Resume" : "Pause";
  const note = $("paused-note");
  note.hidden = !s.paused;
  note.textContent = s.paused ? `PAUSED at step ${s.step}: new requests are accepted and wait in the queue `
    + `(${s.stats.num_waiting} now) until Resume, or one Step at a time` : "";
  const locked = Boolean(s.controls_locked) && !token;
  $("view-only").hidden = !locked;
  for (const id of CONTROL_IDS) $(id).disabled = locked;
}

function render(s) {
  last = s;
  document.body.dataset.step = s.step;
  $("step").textContent = s.step;
  $("model").textContent = s.model ? `· ${s.model}` : "";
  if (document.activeElement !== $("admission")) $("admission").value = s.admission;
  drawState(s); drawTurnstile(s); drawPool(s); drawQueue(s); drawNumbers(s);
}

function showError(message) {
  const note = $("error-note");
  note.textContent = message; note.hidden = false;
  clearTimeout(errorTimer);
  errorTimer = setTimeout(() => { note.hidden = true; }, ERROR_SHOWN_MS);
}

async function control(body) {
  const headers = {"Content-Type": "application/json"};
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch("/dashboard/control", {method: "POST", headers, body: JSON.stringify(body)});
  const answer = await r.json().catch(() => ({}));
  if (r.status === 403) { sessionStorage.removeItem(TOKEN_KEY); token = null; }
  if (!r.ok) showError(answer.error ? answer.error.message : `${r.status} ${r.statusText}`);
  // Show the new state now, not at the next snapshot: a second click must see Resume, not Pause again.
  if (r.ok && last && typeof answer.paused === "boolean") { last.paused = answer.paused; drawState(last); }
  return answer;
}

$("pause").onclick = () => control({action: last && last.paused ? "resume" : "pause"});
$("single-step").onclick = () => control({action: "step"});
$("admission").onchange = (e) => control({action: "admission", policy: e.target.value});
$("burst").onclick = () => control({action: "burst", n: parseInt($("burst-n").value, 10)});

function connect() {
  const events = new EventSource("/dashboard/events");
  events.onmessage = (e) => { frames += 1; render(JSON.parse(e.data)); };
  events.onerror = () => { const st = $("status"); st.textContent = "RECONNECTING"; st.className = "pill down"; };
}
window.addEventListener("resize", () => last && render(last));
connect();
