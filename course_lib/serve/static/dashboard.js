// The live dashboard: one EventSource of engine snapshots, four canvases, a few buttons.
// No framework and no build step: this file is served as it is.
"use strict";

const $ = (id) => document.getElementById(id);
const spark = [];  // [time, tokens/s] for the last 60 s
let last = null;

// One stable colour per request id: FNV-1a, then a final mix so that ids differing in their last
// digit (cmpl-..746, cmpl-..747) get far-apart hues instead of two alternating ones.
function colour(id, light = 55) {
  let h = 2166136261;
  for (let i = 0; i < id.length; i++) { h ^= id.charCodeAt(i); h = Math.imul(h, 16777619); }
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b); h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35); h ^= h >>> 16;
  return `hsl(${(h >>> 0) % 360}, 70%, ${light}%)`;
}

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

function hatch(ctx, x, y, w, h) {
  ctx.save(); ctx.beginPath(); ctx.rect(x, y, w, h); ctx.clip();
  ctx.strokeStyle = "rgba(255,255,255,0.85)"; ctx.lineWidth = 1.5;
  for (let d = -h; d < w; d += 5) { ctx.beginPath(); ctx.moveTo(x + d, y + h); ctx.lineTo(x + d + h, y); ctx.stroke(); }
  ctx.restore();
}

function drawTurnstile(s) {
  const [ctx, w, h] = fit($("turnstile"));
  const seats = s.num_seats, cols = Math.max(48, s.turnstile.length);
  const cw = w / cols, ch = h / seats, gap = ch > 4 ? 1 : 0;
  ctx.fillStyle = "#22272e";
  for (let c = 0; c < cols; c++) for (let r = 0; r < seats; r++) ctx.fillRect(c * cw, r * ch, cw - 1, ch - gap);
  const offset = cols - s.turnstile.length;
  s.turnstile.forEach((column, i) => {
    column.seats.forEach((cell, seat) => {
      if (!cell) return;
      const x = (offset + i) * cw, y = seat * ch;
      ctx.fillStyle = colour(cell[0]);
      ctx.fillRect(x, y, cw - 1, ch - gap);
      if (cell[1] === "prefill") hatch(ctx, x, y, cw - 1, ch - gap);
    });
  });
  $("seat-count").textContent = `(${s.stats.num_running} of ${seats} seats)`;
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
    ctx.fillStyle = owner ? colour(owner) : (cached.has(i) ? "#3a4350" : "#22272e");
    ctx.fillRect(x, y, cw - gap, ch - gap);
    if (shared.has(i)) {
      ctx.strokeStyle = "#fff"; ctx.lineWidth = Math.max(1.5, Math.min(cw, ch) / 5);
      ctx.strokeRect(x + ctx.lineWidth / 2, y + ctx.lineWidth / 2, cw - gap - ctx.lineWidth, ch - gap - ctx.lineWidth);
    }
  }
  const used = s.stats.pages_used;
  $("pool-count").textContent = `(${used} of ${n} pages of ${p.page_size} tokens used, ${p.shared.length} shared)`;
}

function drawQueue(s) {
  $("waiting").textContent = s.stats.num_waiting;
  const q = $("queue");
  q.replaceChildren(...s.waiting.map((id) => {
    const chip = document.createElement("span");
    chip.className = "chip"; chip.style.background = colour(id, 65); chip.textContent = id.slice(-6);
    return chip;
  }));
  if (s.stats.num_waiting > s.waiting.length) {
    const more = document.createElement("span");
    more.className = "label"; more.textContent = `+${s.stats.num_waiting - s.waiting.length} more`;
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
  spark.push([s.time, r.throughput_tok_s]);
  while (spark.length && spark[0][0] < s.time - 60) spark.shift();
  const [ctx, w, h] = fit($("spark"));
  const top = Math.max(1, ...spark.map((p) => p[1]));
  ctx.strokeStyle = "#ffd166"; ctx.lineWidth = 2; ctx.beginPath();
  spark.forEach(([t, v], i) => {
    const x = w - (s.time - t) / 60 * w, y = h - 4 - v / top * (h - 8);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#93a1b0"; ctx.font = "14px system-ui"; ctx.fillText(`max ${top.toFixed(0)}`, 6, 16);
}

function render(s) {
  last = s;
  document.body.dataset.step = s.step;
  $("step").textContent = s.step;
  $("model").textContent = s.model ? `· ${s.model}` : "";
  const status = $("status");
  status.textContent = s.paused ? "PAUSED" : "RUNNING";
  status.className = s.paused ? "pill paused" : "pill";
  $("pause").textContent = s.paused ? "Resume" : "Pause";
  if (document.activeElement !== $("admission")) $("admission").value = s.admission;
  drawTurnstile(s); drawPool(s); drawQueue(s); drawNumbers(s);
}

async function control(body) {
  const r = await fetch("/dashboard/control", {method: "POST", headers: {"Content-Type": "application/json"},
                                               body: JSON.stringify(body)});
  const answer = await r.json();
  if (!r.ok) alert(answer.error ? answer.error.message : r.statusText);
  return answer;
}

$("pause").onclick = () => control({action: last && last.paused ? "resume" : "pause"});
$("single-step").onclick = () => control({action: "step"});
$("admission").onchange = (e) => control({action: "admission", policy: e.target.value});
$("burst").onclick = () => control({action: "burst", n: parseInt($("burst-n").value, 10)});

function connect() {
  const events = new EventSource("/dashboard/events");
  events.onmessage = (e) => render(JSON.parse(e.data));
  events.onerror = () => { const st = $("status"); st.textContent = "RECONNECTING"; st.className = "pill down"; };
}
window.addEventListener("resize", () => last && render(last));
connect();
