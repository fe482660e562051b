/* petlprof report explorer: plots the configurations in #petlprof-data (its format: page.py), filters them by
   method and budget, recomputes the frontier, and makes every table sortable.  No library, no network;
   without this script the page is the static report. */
(function () {
  "use strict";
  const W = 720, H = 440, L = 72, R = W - 24, T = 16, B = H - 48; // the chart, and its plot area
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"];

  // an element (SVG when svg) with attributes and text, appended to parent
  function el(tag, attrs, parent, text, svg) {
    const e = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const k in attrs) if (attrs[k] != null) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  const svg = (tag, attrs, parent, text) => el(tag, attrs, parent, text, true);
  const finite = (v) => typeof v === "number" && isFinite(v);
  const withUnit = (a) => (a.unit ? `${a.label} (${a.unit})` : a.label);
  const name = (p) => (p.config && p.config !== "-" ? `${p.method} ${p.config}` : p.method);
  const pow10 = (v) => Math.pow(10, v);

  // 3 significant digits with thousands separators; an exponent for very large or small magnitudes
  function fmt(v) {
    const a = Math.abs(v);
    if (!finite(v)) return "n/a";
    if (a && (a >= 1e7 || a < 1e-3)) return v.toExponential(2).replace(/\.?0+e/, "e").replace("e+", "e");
    return v.toLocaleString("en-US", { maximumSignificantDigits: 3 });
  }

  // about n round ticks over [lo, hi]; on a log axis the powers of ten, with 2 and 5 between when few
  function linearTicks(lo, hi, n) {
    const raw = (hi - lo) / n, p = pow10(Math.floor(Math.log10(raw))), e = raw / p, out = [];
    const step = (e >= 7.5 ? 10 : e >= 3.5 ? 5 : e >= 1.5 ? 2 : 1) * p;
    if (!(step > 0) || (hi - lo) / step > 100 || Math.abs(lo / step) > 1e12) return [lo, hi]; // no float steps
    for (let i = Math.ceil(lo / step); i * step <= hi + step * 1e-9; i++) out.push(+(i * step).toPrecision(12));
    return out;
  }
  function logTicks(lo, hi) {
    const pick = (mults) => {
      const out = [];
      for (let d = Math.floor(Math.log10(lo)); d <= Math.log10(hi); d++) {
        mults.forEach((m) => { const v = +(m * pow10(d)).toPrecision(12); if (v >= lo && v <= hi) out.push(v); });
      }
      return out;
    };
    const ticks = pick([1]).length >= 4 ? pick([1]) : pick([1, 2, 5]);
    return ticks.length >= 3 ? ticks : linearTicks(lo, hi, 4).filter((v) => v > 0);
  }

  // values onto [r0, r1] with 5% to spare, log where asked (the values are then above 0); clamp keeps in view
  function scale(values, log, r0, r1) {
    const f = log ? Math.log10 : (v) => v;
    let lo = Math.min(...values.map(f)), hi = Math.max(...values.map(f));
    // equal values (or equal but for float rounding, as two sums of the same seeds can be) get a span of their own
    if (!(hi - lo > 1e-9 * Math.max(Math.abs(lo), Math.abs(hi)))) {
      const d = log ? 0.5 : Math.abs(lo) * 0.1 || 1;
      lo -= d; hi += d;
    }
    const pad = (hi - lo) * 0.05;
    lo -= pad; hi += pad;
    const s = (v) => r0 + ((f(v) - lo) / (hi - lo)) * (r1 - r0);
    s.ticks = log ? logTicks(pow10(lo), pow10(hi)) : linearTicks(lo, hi, 5);
    s.clamp = (v) => (log && v <= 0 ? r0 : Math.min(Math.max(s(v), Math.min(r0, r1)), Math.max(r0, r1)));
    return s;
  }

  // the points no other dominates (as good on both axes, strictly better on one); equal points both stay
  function frontier(points, xa, ya) {
    const gain = (a, b, axis) => (axis.direction === "higher" ? a - b : b - a);
    return points.filter((p) => !points.some((q) => {
      const dx = gain(q.x, p.x, xa), dy = gain(q.y, p.y, ya);
      return dx >= 0 && dy >= 0 && (dx > 0 || dy > 0);
    }));
  }

  function explorer(data) {
    const $ = (id) => document.getElementById(id);
    const root = $("explorer"), controls = $("explorer-controls"), chart = $("explorer-chart");
    const frontText = $("explorer-frontier");
    if (!root || !controls || !chart || !frontText || !data.axes.length || !data.points.length) return;
    const axes = {}, methods = [], references = [];
    data.axes.forEach((a) => { axes[a.key] = a; });
    data.points.forEach((p) => {
      const list = p.zero_shot ? references : methods;
      if (!list.includes(p.method)) list.push(p.method);
    });
    const colour = (m) => PALETTE[methods.indexOf(m) % PALETTE.length];
    const note = el("p", { id: "explorer-note" });
    chart.after(note);
    const tip = el("div", { id: "tooltip", role: "tooltip", hidden: "" }, document.body);

    // the controls; any change redraws
    const box = (legend) => {
      const b = el(legend ? "fieldset" : "div", { class: "control" }, controls);
      if (legend) el("legend", {}, b, legend);
      return b;
    };
    const labelled = (parent, text, input, after) => {
      el("label", {}, parent, after ? undefined : text + " ").append(input, after ? text : "");
      return input;
    };
    function axisSelect(id, chosen) {
      const b = box(), s = labelled(b, id[0] + ":", el("select", { id }));
      data.axes.forEach((a) => { el("option", { value: a.key }, s, withUnit(a)).selected = a.key === chosen; });
      const log = labelled(b, " log", el("input", { type: "checkbox", id: id[0] + "-log" }), true);
      log.checked = !!axes[chosen].log;
      s.addEventListener("change", () => { log.checked = !!axes[s.value].log; }); // each axis' own default
      return [s, log];
    }
    const keys = data.axes.map((a) => a.key), yKey = data.y || keys[0];
    const [xSel, xLog] = axisSelect("x-axis", data.x || keys.find((k) => k !== yKey) || yKey);
    const [ySel, yLog] = axisSelect("y-axis", yKey);
    const groupBox = box(), group = labelled(groupBox, "task / backbone:", el("select", { id: "group" }));
    data.groups.forEach((g, i) => el("option", { value: i }, group, `${g.task} / ${g.backbone}`));
    groupBox.hidden = data.groups.length < 2;
    const methodBox = box("methods");
    [...methods, ...references].forEach((m) => {
      const l = el("label", {}, methodBox), tuned = methods.includes(m);
      el("input", { type: "checkbox", class: "method-toggle", "data-method": m, checked: "" }, l);
      el("span", { class: tuned ? "swatch" : "swatch zero-shot", style: tuned ? `background:${colour(m)}` : null }, l);
      l.append(m.replace("zero_shot", "zero-shot"));
    });
    const budgetBox = box("budgets (at most)");
    const budgets = data.budgets.filter((k) => axes[k]).map((k) => labelled(budgetBox, withUnit(axes[k]),
      el("input", { type: "number", class: "budget", "data-axis": k, min: 0, step: "any", placeholder: "no limit" })));
    budgetBox.hidden = !budgets.length;
    // another task: its own primary metric on the y axis, where the data names one
    group.addEventListener("change", () => {
      const own = (data.groups[+group.value] || {}).y;
      if (own && axes[own] && ySel.value !== own) { ySel.value = own; yLog.checked = !!axes[own].log; }
    });
    controls.addEventListener("change", render);
    controls.addEventListener("input", render);
    root.hidden = false;

    // a point's interval on an axis as [low, high]: its binomial range, or ± the half-width over seeds, kept
    // within the axis' own range (a share cannot pass 1); null without either
    function bounds(p, a) {
      const v = p.values[a.key], half = p.intervals[a.key], range = p.ranges && p.ranges[a.key];
      const b = range || (finite(half) && half > 0 ? [v - half, v + half] : null);
      return b && a.range ? [Math.max(b[0], a.range[0]), Math.min(b[1], a.range[1])] : b;
    }
    function showTip(ev, p, shown) {
      tip.textContent = "";
      el("strong", {}, tip, name(p));
      el("div", {}, tip, "seeds: " + (p.seeds.join(", ") || "n/a"));
      shown.forEach((a) => {
        const half = p.intervals[a.key], range = p.ranges && p.ranges[a.key];
        const unit = a.unit && a.unit !== "count" ? " " + a.unit : "";
        const spread = range ? ` [${fmt(range[0])}, ${fmt(range[1])}]` : finite(half) ? ` ± ${fmt(half)}${unit}` : "";
        el("div", {}, tip, `${a.label}: ${fmt(p.values[a.key])}${unit}${spread}`);
        if (p.flags[a.key]) el("div", { class: "flag" }, tip, `⚑ ${a.label}: ${p.flags[a.key]}`);
      });
      if (p.interval && shown.some((a) => finite(p.intervals[a.key]))) el("div", { class: "interval" }, tip, "± " + p.interval);
      if (p.range_how && shown.some((a) => p.ranges && p.ranges[a.key])) el("div", { class: "interval" }, tip, "[ ] " + p.range_how);
      if (p.no_front) el("div", { class: "flag" }, tip, "⚑ on no frontier: " + p.no_front);
      // beside the pointer, or beside the point when it has the keyboard's focus
      const r = ev.target.getBoundingClientRect();
      tip.style.left = `${scrollX + (ev.clientX || r.right) + 12}px`;
      tip.style.top = `${scrollY + (ev.clientY || r.top) + 12}px`;
      tip.hidden = false;
    }
    const hide = () => { tip.hidden = true; };

    function render() {
      const xa = axes[xSel.value], ya = axes[ySel.value], both = xa === ya ? [xa] : [xa, ya];
      const on = [...controls.querySelectorAll(".method-toggle")].filter((b) => b.checked).map((b) => b.dataset.method);
      const caps = budgets.filter((b) => b.value !== "" && finite(+b.value)).map((b) => [b.dataset.axis, +b.value]);
      const chosen = data.points.filter((p) => p.group === (+group.value || 0) && on.includes(p.method));
      // a cap removes what exceeds it or lacks the figure; the zero-shot reference only what exceeds it
      const kept = chosen.filter((p) => caps.every(([k, cap]) => (finite(p.values[k]) ? p.values[k] <= cap : p.zero_shot)))
        .map((p) => ({ p, x: p.values[xa.key], y: p.values[ya.key] }));
      const tuned = kept.filter((d) => !d.p.zero_shot), pts = tuned.filter((d) => finite(d.x) && finite(d.y));
      // the zero-shot row: a line across a metric axis, else a hollow marker
      const refs = kept.filter((d) => d.p.zero_shot).map((d) => {
        const h = ya.kind === "metric" && finite(d.y), v = xa.kind === "metric" && finite(d.x);
        return { ...d, h, v, o: !h && !v && ya.kind !== "metric" && xa.kind !== "metric" && finite(d.x) && finite(d.y) };
      });
      const atX = [...pts, ...refs.filter((r) => r.v || r.o)].map((d) => d.x);
      const atY = [...pts, ...refs.filter((r) => r.h || r.o)].map((d) => d.y);
      xLog.disabled = atX.some((v) => v <= 0);
      yLog.disabled = atY.some((v) => v <= 0);
      const logX = xLog.checked && !xLog.disabled, logY = yLog.checked && !yLog.disabled;
      const spanX = [...atX], spanY = [...atY]; // the error bars in view too
      pts.forEach((d) => {
        spanX.push(...(bounds(d.p, xa) || []));
        spanY.push(...(bounds(d.p, ya) || []));
      });

      // what is not drawn, said under the chart
      const said = both.map((a) => {
        const n = tuned.filter((d) => !finite(d.p.values[a.key])).length;
        return n && `${n} configuration${n > 1 ? "s lack" : " lacks"} ${a.label}`;
      });
      const capped = chosen.filter((p) => !p.zero_shot).length - tuned.length;
      if (capped) said.push(`${capped} left out by the budgets`);
      note.textContent = said.filter(Boolean).join("; ");

      const front = frontier(pts.filter((d) => !d.p.no_front), xa, ya).sort((a, b) => a.x - b.x);
      frontText.textContent = front.length
        ? `On the frontier (${ya.label} against ${xa.label}): ${front.map((d) => name(d.p)).join(", ")}`
        : `No configuration here has both ${ya.label} and ${xa.label}.`;
      chart.textContent = "";
      hide();
      const s = svg("svg", { id: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${ya.label} against ${xa.label}` }, chart);
      const line = (x1, y1, x2, y2, attrs) => svg("line", { x1, y1, x2, y2, ...attrs }, s);
      const text = (x, y, t, cls, attrs) => svg("text", { x, y, class: cls, ...attrs }, s, t);
      const inX = spanX.filter((v) => !logX || v > 0), inY = spanY.filter((v) => !logY || v > 0);
      if (!inX.length || !inY.length) return text(W / 2, H / 2, "Nothing to plot with these choices.", "mid");
      const sx = scale(inX, logX, L, R), sy = scale(inY, logY, B, T);

      // grid, tick labels, axis titles
      sx.ticks.forEach((t) => { line(sx(t), T, sx(t), B, { class: "grid" }); text(sx(t), B + 16, fmt(t), "mid"); });
      sy.ticks.forEach((t) => { line(L, sy(t), R, sy(t), { class: "grid" }); text(L - 6, sy(t) + 4, fmt(t), "end"); });
      svg("path", { class: "frame", d: `M${L},${T}V${B}H${R}` }, s);
      text((L + R) / 2, H - 10, withUnit(xa) + (logX ? ", log scale" : ""), "mid title");
      text(0, 0, withUnit(ya) + (logY ? ", log scale" : ""), "mid title", { transform: `translate(16,${(T + B) / 2}) rotate(-90)` });

      const hover = (node, p) => {
        const show = (ev) => showTip(ev, p, both);
        ["mouseenter", "focus"].forEach((e) => node.addEventListener(e, show));
        ["mouseleave", "blur"].forEach((e) => node.addEventListener(e, hide));
      };
      refs.forEach((d) => {
        if (d.h) { line(L, sy(d.y), R, sy(d.y), { class: "zero-shot" }); text(R - 4, sy(d.y) - 4, "zero-shot", "end ref"); }
        if (d.v) { line(sx(d.x), T, sx(d.x), B, { class: "zero-shot" }); text(sx(d.x) + 4, T + 10, "zero-shot", "ref"); }
        if (d.o) hover(svg("circle", { class: "zero-shot", cx: sx(d.x), cy: sy(d.y), r: 6, "data-id": d.p.id }, s), d.p);
      });
      if (front.length > 1) svg("path", { id: "frontier-line", d: "M" + front.map((d) => `${sx(d.x)},${sy(d.y)}`).join("L") }, s);
      pts.forEach((d) => {
        const stroke = colour(d.p.method), bx = bounds(d.p, xa), by = bounds(d.p, ya);
        if (bx) line(sx.clamp(bx[0]), sy(d.y), sx.clamp(bx[1]), sy(d.y), { class: "error-bar", stroke });
        if (by) line(sx(d.x), sy.clamp(by[0]), sx(d.x), sy.clamp(by[1]), { class: "error-bar", stroke });
      });
      pts.forEach((d) => hover(svg("circle", { class: front.includes(d) ? "point on-front" : "point", cx: sx(d.x),
        cy: sy(d.y), r: 5, fill: colour(d.p.method), "data-id": d.p.id, tabindex: 0, "aria-label": name(d.p) }, s), d.p));
    }
    render();
  }

  // sortable tables: a leading number sorts as a number (thousands separators, "†", and what follows it, "± …"
  // or a unit, ignored), other text after the numbers either way; a second click reverses
  function sortKey(text) {
    const m = text.replace(/[,\u202f†]/g, "").replace(/\u2212/g, "-").match(/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?/i);
    return m ? parseFloat(m[0]) : null;
  }
  function sortable(table) {
    const head = table.tHead && table.tHead.rows[table.tHead.rows.length - 1], body = table.tBodies[0];
    if (!head || !body) return;
    table.classList.add("sortable");
    [...head.cells].forEach((th, col) => {
      const sort = () => {
        const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        [...head.cells].forEach((h) => h.removeAttribute("aria-sort"));
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        const rows = [...body.rows].map((r) => {
          const t = r.cells[col] ? r.cells[col].textContent.trim() : "";
          return { r, t, n: sortKey(t) };
        });
        rows.sort((a, b) => (a.n === null) - (b.n === null) || dir * (a.n === null ? a.t.localeCompare(b.t) : a.n - b.n));
        rows.forEach((x) => body.appendChild(x.r));
      };
      th.tabIndex = 0;
      th.addEventListener("click", sort);
      th.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sort(); } });
    });
  }

  function start() {
    document.querySelectorAll("table").forEach(sortable);
    const data = document.getElementById("petlprof-data");
    if (data) explorer(JSON.parse(data.textContent));
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
