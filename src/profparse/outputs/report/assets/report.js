// profparse report: renders the embedded JSON payload with plain DOM, SVG and one canvas (no libraries).
"use strict";
(function () {
  var errors = document.getElementById("errors");
  function fail(text) {  // every page error lands in #errors (tests read it; people see it)
    errors.hidden = false;
    errors.textContent += text + "\n";
    errors.dataset.count = String(Number(errors.dataset.count) + 1);
  }
  window.onerror = function (msg, src, line, col) { fail("error: " + msg + " (line " + line + ":" + col + ")"); };
  window.addEventListener("unhandledrejection", function (e) { fail("error: " + e.reason); });
  var consoleError = console.error;
  console.error = function () { fail("console.error: " + Array.prototype.join.call(arguments, " ")); consoleError.apply(console, arguments); };

  var t0 = performance.now();
  var P = JSON.parse(document.getElementById("payload").textContent);
  var STAGES = P.meta.stages, COLORS = P.meta.colors;
  var STEP_ROWS = 20;  // per-step rows shown before "show all"
  var STEPS_SHOWN = 40;  // characters of a finding's step list shown whole (summary: findings.STEPS_SHOWN)
  var params = new URLSearchParams(location.search);

  // -- small helpers ------------------------------------------------------------------------------------------
  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "class") e.className = attrs[k];
      else if (k.slice(0, 5) === "data-") e.setAttribute(k, attrs[k]);
      else e[k] = attrs[k];
    }
    (kids || []).forEach(function (c) { if (c != null) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return e;
  }
  function svgEl(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function unit(ns) { return ns >= 5e9 ? [1e9, "s"] : ns >= 1e6 ? [1e6, "ms"] : [1e3, "µs"]; }
  function fmt(ns, u) {
    if (ns == null) return "-";
    if (ns === 0) return "0";
    u = u || unit(Math.abs(ns));
    var v = ns / u[0];
    return v.toLocaleString("en-US", {maximumFractionDigits: Math.abs(v) < 100 ? 2 : 0}) + " " + u[1];
  }
  function pct(x) { return x == null || !isFinite(x) ? "-" : (100 * x).toFixed(1) + "%"; }
  // an MFU or HFU: pct, but two significant digits under 0.1% (as summarize writes it: base.formats.utilisation_text)
  function util(x) {
    if (x == null || !isFinite(x) || !(x > 0 && x < 0.001)) return pct(x);
    return x < 1e-6 ? "<0.0001%" : Number((100 * x).toPrecision(2)) + "%";
  }
  function bytes(n) {
    var units = [["GiB", 1 << 30], ["MiB", 1 << 20], ["KiB", 1 << 10]];
    for (var i = 0; i < units.length; i++) if (Math.abs(n) >= units[i][1]) return (n / units[i][1]).toFixed(1) + " " + units[i][0];
    return n + " B";
  }
  function rows(frame) {  // a columnar frame {index, columns, cols} -> [{col: value}]
    var out = [];
    for (var i = 0; i < frame.index.length; i++) {
      var r = {_index: frame.index[i]};
      frame.columns.forEach(function (c) { r[c] = frame.cols[c][i]; });
      out.push(r);
    }
    return out;
  }
  function counted(names) {  // ["A", "A", "B"] -> "2 × A, B"
    var n = {}, order = [];
    names.forEach(function (x) { if (!(x in n)) { n[x] = 0; order.push(x); } n[x] += 1; });
    return order.map(function (x) { return n[x] > 1 ? n[x] + " × " + x : x; }).join(", ");
  }
  function chip(stage) { return el("span", {class: "chip", style: "background:" + (COLORS[stage] || "#777")}); }
  function legend(stages) { return el("div", {class: "legend"}, stages.map(function (s) { return el("span", {}, [chip(s), s]); })); }
  function section(app, id, title, toc) {
    var s = el("section", {id: id}, [el("h2", {text: title})]);
    app.appendChild(s);
    toc.appendChild(el("a", {href: "#" + id, text: title}));
    return s;
  }
  function skipped(parent, why) { parent.appendChild(el("p", {class: "skipped", text: "Not shown: " + why})); }
  function table(head, body, cls, left) {  // the first ``left`` columns (default 1) are left-aligned
    left = left || 1;
    return el("table", {class: cls || ""}, [
      el("thead", {}, [el("tr", {}, head.map(function (h, i) { return el("th", {class: i < left ? "l" : "", text: h}); }))]),
      el("tbody", {}, body)
    ]);
  }
  function hbars(items, color) {  // [{label, value, text}] -> a grid of labelled horizontal bars
    var top = Math.max.apply(null, items.map(function (i) { return i.value; }).concat([1e-12]));
    var g = el("div", {class: "hb"});
    items.forEach(function (it) {
      g.appendChild(el("div", {class: "lab", title: it.title || it.label, text: it.label}));
      var b = el("div", {class: "bar", style: "width:" + (75 * it.value / top).toFixed(2) + "%;background:" + (it.color || color)});
      g.appendChild(el("div", {class: "val"}, [b, el("span", {class: "num", text: it.text})]));
    });
    return g;
  }

  // -- sections of one trace ----------------------------------------------------------------------------------
  function overview(s, summary) {
    var totals = summary.totals, all = 0;
    totals.forEach(function (t) { all += t.host_wall_ns || 0; });
    var fields = [["host_wall_ns", "host wall"], ["host_op_ns", "host ops"], ["gpu_busy_ns", "GPU busy"],
      ["gpu_overlap_ns", "GPU overlap"], ["gpu_idle_ns", "GPU idle"], ["kernel_count", "kernels"], ["launch_count", "launches"]];
    var gpu = summary.gpu_activity_ns > 0;
    if (!gpu) fields = fields.filter(function (f) { return f[0].slice(0, 4) !== "gpu_" && f[0] !== "kernel_count" && f[0] !== "launch_count"; });
    var body = totals.map(function (t) {
      var zero = !fields.some(function (f) { return t[f[0]]; });  // a stage with no time at all: dimmed
      var tr = el("tr", {"data-stage": t.stage, class: zero ? "zero" : ""}, [el("td", {class: "l"}, [chip(t.stage), t.stage])]);
      fields.forEach(function (f) {
        var v = t[f[0]];
        var td = el("td", {"data-stage": t.stage, "data-field": f[0], "data-value": v == null ? "" : String(v)});
        td.textContent = f[0].slice(-6) === "_count" ? (v == null ? "-" : v.toLocaleString("en-US")) : fmt(v);
        if (f[0] === "host_wall_ns") td.appendChild(el("span", {class: "share", text: pct(all ? v / all : null)}));
        tr.appendChild(td);
      });
      return tr;
    });
    s.appendChild(el("h3", {text: "All steps"}));
    s.appendChild(table(["stage"].concat(fields.map(function (f) { return f[1]; })), body, "totals"));
    s.appendChild(el("p", {class: "note", text: "host wall: time any host thread spent in the stage (its share of all stages in grey). " +
      (gpu ? "GPU busy + overlap + idle: the stage's additive share of the steps' GPU spans." : "No GPU activity in this trace.")}));
    // per step: host wall per stage, share of the step, step total
    var steps = {}, order = [];
    summary.per_step.forEach(function (r) {
      if (!(r.step in steps)) { steps[r.step] = {}; order.push(r.step); }
      steps[r.step][r.stage] = r;
    });
    if (!order.length) { s.appendChild(el("p", {class: "note", text: "No steps found (no ProfilerStep# or step marks)."})); return; }
    var present = STAGES.filter(function (st) { return totals.some(function (t) { return t.stage === st && t.host_wall_ns; }); });
    var windows = {};  // the step's span; none for a step whose host part is not in the trace
    (summary.step_totals || []).forEach(function (t) { windows[t.step] = t.window_ns; });
    var hostless = order.filter(function (n) { return !(n in windows); });
    var body2 = order.map(function (n) {
      var total = 0, gtotal = 0, gidle = 0;
      present.forEach(function (st) {
        var r = steps[n][st];
        if (!r) return;
        total += r.host_wall_ns || 0; gtotal += (r.gpu_busy_ns || 0) + (r.gpu_overlap_ns || 0); gidle += r.gpu_idle_ns || 0;
      });
      var tr = el("tr", {"data-step": String(n)}, [el("td", {class: "l", text: "step " + n})]);
      present.forEach(function (st) {
        var r = steps[n][st], v = r ? r.host_wall_ns : 0;
        var td = el("td", {"data-step": String(n), "data-stage": st, "data-value": String(v || 0), text: fmt(v || 0)});
        td.appendChild(el("span", {class: "share", text: pct(total ? v / total : null)}));
        tr.appendChild(td);
      });
      tr.appendChild(el("td", {"data-step-total": String(total), text: fmt(total)}));
      tr.appendChild(n in windows ? el("td", {"data-window": String(windows[n]), text: fmt(windows[n])}) : el("td", {text: "-"}));
      if (gpu) { tr.appendChild(el("td", {text: fmt(gtotal)})); tr.appendChild(el("td", {text: fmt(gidle)})); }
      return tr;
    });
    s.appendChild(el("h3", {id: "per-step", text: "Per step: host wall per stage (share of the step)"}));
    s.appendChild(table(["step"].concat(present, ["step total", "window"], gpu ? ["GPU busy", "GPU idle"] : []), body2, "per-step"));
    folded(s, s.lastChild, body2.map(function (tr) { return [tr]; }), "per-step-more");
    s.appendChild(el("p", {class: "note", text: "step total: its stages added up (stages that ran at once on two threads count twice); window: the step's span (its time when no stage ran, e.g. between ops, counts in no stage)." +
      (hostless.length ? " " + (hostless.length === 1 ? "Step " : "Steps ") + hostless.join(", ") + ": only GPU work in the trace (no window: its host part ran outside it, e.g. a step's kernels still running when the trace began)." : "")}));
  }

  function stagesView(s, v) {
    var panels = v.data.panels, top = 0;
    panels.forEach(function (p) { rows(p[0]).forEach(function (r) { var t = 0; p[0].columns.forEach(function (c) { t += r[c]; }); top = Math.max(top, t); }); });
    var u = unit(top);
    panels.forEach(function (p) {
      var frame = p[0], levels = frame.columns;
      s.appendChild(el("h3", {text: p[1] + " (bars stack the levels, lighter = later in the list)"}));
      var g = el("div", {class: "hb"});
      rows(frame).forEach(function (r) {
        var stage = r._index, total = 0;
        levels.forEach(function (c) { total += r[c]; });
        var bar = el("div", {class: "bar", style: "width:" + (75 * total / (top || 1)).toFixed(2) + "%"});
        levels.forEach(function (c, j) {
          if (!r[c]) return;
          var a = 0.6 * j / Math.max(levels.length - 1, 1);
          bar.appendChild(el("span", {title: c + ": " + fmt(r[c], u), style: "width:" + (100 * r[c] / total) + "%;background:" + COLORS[stage] + ";opacity:" + (1 - a).toFixed(2)}));
        });
        g.appendChild(el("div", {class: "lab"}, [chip(stage), stage]));
        g.appendChild(el("div", {class: "val"}, [bar, el("span", {class: "num", text: fmt(total, u)})]));
      });
      s.appendChild(g);
      var head = ["stage"].concat(levels, ["total"]);
      s.appendChild(table(head, rows(frame).map(function (r) {
        var total = 0;
        levels.forEach(function (c) { total += r[c]; });
        return el("tr", {}, [el("td", {class: "l", text: r._index})].concat(levels.map(function (c) { return el("td", {text: fmt(r[c], u)}); }), [el("td", {text: fmt(total, u)})]));
      })));
    });
  }

  function boundLegend(title, cp) {
    return el("div", {class: "legend"}, [el("span", {text: title})].concat(cp.bounds.map(function (b) {
      return el("span", {}, [el("span", {class: "chip", style: "background:" + cp.colors[b]}), b]);
    })));
  }
  // the critical path's spans as one more timeline row, below the tracks, coloured by bound (views/critical_path.py)
  function withPath(d, tracks) {
    var base = d.spans.cols, cp = P.views.critical_path && P.views.critical_path.data;
    var sp = {row: base.row.slice(), start_ns: base.start_ns.slice(), end_ns: base.end_ns.slice(), stage: base.stage.slice(),
      rule: base.rule.slice(), events: base.events.slice(), color: [], bound: [], name: [], step: []};
    if (!cp) return [sp, null];
    var c = cp.spans.cols, row = tracks.length, shift = cp.origin_ns - d.origin_ns;
    tracks.push({label: "critical path", kind: "path"});
    for (var i = 0; i < c.start_ns.length; i++) {
      var j = sp.row.length;
      var bound = cp.bounds[c.bound[i]];  // bound, stage and name are codes (views/critical_path.py)
      sp.row.push(row); sp.start_ns.push(c.start_ns[i] + shift); sp.end_ns.push(c.end_ns[i] + shift); sp.stage.push(cp.stages[c.stage[i]]);
      sp.rule.push(""); sp.events.push(c.segments[i]); sp.color[j] = cp.colors[bound]; sp.bound[j] = bound;
      sp.name[j] = cp.names[c.name[i]]; sp.step[j] = c.step[i];
    }
    return [sp, cp];
  }

  function timelineView(s, v) {
    var d = v.data, tracks = rows(d.tracks), both = withPath(d, tracks), sp = both[0], cp = both[1], n = sp.start_ns.length, span = d.span_ns || 1;
    var present = STAGES.filter(function (st) { return sp.stage.indexOf(st) >= 0; });
    s.appendChild(legend(present));
    if (cp) s.appendChild(boundLegend("last row, the critical path, by bound:", cp));
    var tools = el("div", {class: "tools"}, [el("span", {text: "wheel: zoom · drag: pan · double-click: reset"}), el("button", {text: "reset", id: "tl-reset"})]);
    s.appendChild(tools);
    var wrap = el("div", {id: "timeline-wrap"}), canvas = el("canvas", {id: "timeline"}), tip = el("div", {id: "tip"});
    wrap.appendChild(canvas); s.appendChild(wrap); document.body.appendChild(tip);
    s.appendChild(el("p", {class: "note", text: d.spans.cols.start_ns.length.toLocaleString("en-US") + " aggregated spans on " + d.tracks.index.length +
      " tracks: same-stage spans of a track closer than " + fmt(d.gap_ns) + " are drawn as one (hover shows how many events it merges and the rule that decided most of its time)" +
      (d.hidden_tracks ? "; " + d.hidden_tracks + " quieter tracks not shown" : "") +
      (cp ? "; the last row is each step's critical path (" + cp.segments.toLocaleString("en-US") + " segments as " + cp.spans.cols.start_ns.length.toLocaleString("en-US") +
        " spans; segments shorter than " + fmt(cp.gap_ns) + " drawn by their main bound; see \u201cWhat bounds each step\u201d below)" : "") + "."}));
    canvas.dataset.pathRow = cp ? String(tracks.length - 1) : "";
    var byRow = tracks.map(function () { return []; });
    for (var i = 0; i < n; i++) byRow[sp.row[i]].push(i);
    byRow.forEach(function (list) { list.sort(function (a, b) { return sp.start_ns[a] - sp.start_ns[b]; }); });
    var probe = canvas.getContext("2d"), LABEL = 120;
    probe.font = "11px system-ui,sans-serif";
    tracks.forEach(function (t) { LABEL = Math.max(LABEL, Math.min(probe.measureText(t.label).width + 14, 320)); });
    var ROW = 22, TOP = 22, view = {a: 0, b: span}, dpr = window.devicePixelRatio || 1;
    canvas.dataset.spans = String(n);
    function width() { return Math.max(canvas.clientWidth || wrap.clientWidth || 1000, 400); }
    function x(t, w) { return LABEL + (t - view.a) / (view.b - view.a) * (w - LABEL - 8); }
    function draw() {
      var w = width(), h = TOP + ROW * tracks.length + 24;
      canvas.width = w * dpr; canvas.height = h * dpr; canvas.style.height = h + "px";
      var c = canvas.getContext("2d");
      c.setTransform(dpr, 0, 0, dpr, 0, 0); c.clearRect(0, 0, w, h); c.font = "11px system-ui,sans-serif";
      c.fillStyle = "#fff"; c.fillRect(0, 0, w, h);
      tracks.forEach(function (t, r) {
        c.fillStyle = r % 2 ? "#fafbfc" : "#f1f3f5"; c.fillRect(LABEL, TOP + r * ROW, w - LABEL, ROW);
        c.fillStyle = "#333"; c.textBaseline = "middle"; c.textAlign = "right";
        c.fillText(t.label, LABEL - 6, TOP + r * ROW + ROW / 2, LABEL - 10);
      });
      c.save(); c.beginPath(); c.rect(LABEL, 0, w - LABEL, h); c.clip();
      byRow.forEach(function (list, r) {
        for (var k = 0; k < list.length; k++) {
          var j = list[k];
          if (sp.end_ns[j] < view.a || sp.start_ns[j] > view.b) continue;
          var x0 = x(sp.start_ns[j], w), x1 = x(sp.end_ns[j], w);
          c.fillStyle = sp.color[j] || COLORS[sp.stage[j]] || "#777";
          c.fillRect(x0, TOP + r * ROW + 3, Math.max(x1 - x0, 1), ROW - 6);
        }
      });
      var steps = rows(d.steps);
      c.strokeStyle = "rgba(40,40,40,.55)"; c.setLineDash([4, 3]); c.fillStyle = "#333"; c.textAlign = "center"; c.textBaseline = "top";
      var lastLabel = -1e9;
      steps.forEach(function (st) {
        var xs = x(st.start_ns, w);
        c.beginPath(); c.moveTo(xs, TOP - 4); c.lineTo(xs, TOP + ROW * tracks.length); c.stroke();
        var xm = x((st.start_ns + st.end_ns) / 2, w);
        xm = Math.max(xm, LABEL + 22);
        if (xm - lastLabel > 60 && xm < w - 20) { c.fillText("step " + st.step, xm, 4); lastLabel = xm; }
      });
      c.restore(); c.setLineDash([]);
      var u = unit(view.b - view.a); c.fillStyle = "#555"; c.textBaseline = "top";
      for (var q = 0; q <= 5; q++) {
        var t = view.a + q * (view.b - view.a) / 5, xx = x(t, w);
        c.textAlign = q === 0 ? "left" : q === 5 ? "right" : "center";
        c.fillText((t / u[0]).toFixed(t / u[0] < 10 ? 2 : 1) + " " + u[1], xx, TOP + ROW * tracks.length + 6);
      }
    }
    function spanAt(r, t, slack) {  // the span of row r under time t (within slack ns), or -1: a binary search
      var list = byRow[r], lo = 0, hi = list.length - 1, best = -1;
      while (lo <= hi) { var m = (lo + hi) >> 1; if (sp.start_ns[list[m]] <= t + slack) { best = m; lo = m + 1; } else hi = m - 1; }
      for (var k = best; k >= 0 && k > best - 50; k--) { var j = list[k]; if (sp.end_ns[j] + slack >= t) return j; }
      return -1;
    }
    function hit(ev) {
      var rect = canvas.getBoundingClientRect(), w = width(), px = ev.clientX - rect.left, py = ev.clientY - rect.top;
      var r = Math.floor((py - TOP) / ROW);
      if (px < LABEL || r < 0 || r >= tracks.length) return -1;
      var t = view.a + (px - LABEL) / (w - LABEL - 8) * (view.b - view.a);
      return spanAt(r, t, 2 * (view.b - view.a) / (w - LABEL));
    }
    function tipText(j) {
      if (sp.bound[j]) {  // a span of the critical path
        return "critical path, step " + sp.step[j] + "\nbound: " + sp.bound[j] + "\nstage: " + sp.stage[j] + "\nevent: " + sp.name[j] + "\n" +
          sp.events[j].toLocaleString("en-US") + " segment" + (sp.events[j] === 1 ? "" : "s") + " merged\n" +
          fmt(sp.start_ns[j]) + " → " + fmt(sp.end_ns[j]) + " (" + fmt(sp.end_ns[j] - sp.start_ns[j]) + ")";
      }
      return tracks[sp.row[j]].label + "\nstage: " + sp.stage[j] + "\nrule: " + sp.rule[j] + "\n" +
        sp.events[j].toLocaleString("en-US") + " event" + (sp.events[j] === 1 ? "" : "s") + " merged\n" +
        fmt(sp.start_ns[j]) + " → " + fmt(sp.end_ns[j]) + " (" + fmt(sp.end_ns[j] - sp.start_ns[j]) + ")";
    }
    var probe = (params.get("probe") || "").split(",");  // ?probe=ROW,NS: what hovering there shows (for tests)
    if (probe.length === 2) {
      var pj = spanAt(Number(probe[0]), Number(probe[1]), 0);
      canvas.dataset.probe = pj < 0 ? "none" : tipText(pj);
    }
    canvas.addEventListener("mousemove", function (ev) {
      if (drag) { var w = width(), dt = (ev.clientX - drag.x) / (w - LABEL) * (drag.b - drag.a); view.a = drag.a - dt; view.b = drag.b - dt; draw(); return; }
      var j = hit(ev);
      if (j < 0) { tip.style.display = "none"; return; }
      tip.textContent = tipText(j);
      tip.style.display = "block"; tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 12) + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; drag = null; });
    var drag = null;
    canvas.addEventListener("mousedown", function (ev) { drag = {x: ev.clientX, a: view.a, b: view.b}; });
    window.addEventListener("mouseup", function () { drag = null; });
    canvas.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var rect = canvas.getBoundingClientRect(), w = width(), f = (ev.clientX - rect.left - LABEL) / (w - LABEL - 8);
      f = Math.min(Math.max(f, 0), 1);
      var t = view.a + f * (view.b - view.a), k = ev.deltaY < 0 ? 0.8 : 1.25, len = Math.max((view.b - view.a) * k, 1000);
      view.a = t - f * len; view.b = view.a + len; draw();
    }, {passive: false});
    function reset() { view.a = 0; view.b = span; draw(); }
    canvas.addEventListener("dblclick", reset);
    document.getElementById("tl-reset").addEventListener("click", reset);
    window.addEventListener("resize", draw);
    draw();
  }

  function topView(s, v, kind) {
    var d = v.data, input = el("input", {type: "search", placeholder: "filter names (substring, case-insensitive)", id: "filter-" + kind, className: "filter"});
    var counter = el("span", {});
    s.appendChild(el("div", {class: "tools"}, [input, counter]));
    var body = [];
    d.stages.forEach(function (st) {
      rows(st.top).forEach(function (r) {
        body.push(el("tr", {class: "toprow", "data-name": r.name.toLowerCase()}, [
          el("td", {class: "l"}, [chip(st.stage), st.stage]),
          el("td", {class: "l name", title: r.name, text: r.label}),
          el("td", {text: fmt(r.total_ns)}), el("td", {text: pct(r.share)}), el("td", {text: r.count.toLocaleString("en-US")})]));
      });
    });
    s.appendChild(el("div", {class: "scroll"}, [table(["stage", "name", d.what, "share of stage", "count"], body, "top", 2)]));
    s.appendChild(el("p", {class: "note", text: "Per stage, the " + d.stages.map(function (st) { return st.stage + " total " + fmt(st.total_ns); }).join(", ") + "."}));
    function apply() {
      var q = input.value.trim().toLowerCase(), shown = 0;
      body.forEach(function (tr) { var on = !q || tr.dataset.name.indexOf(q) >= 0; tr.hidden = !on; shown += on ? 1 : 0; });
      counter.textContent = shown + " of " + body.length + " rows";
      s.dataset.visible = String(shown);
    }
    input.addEventListener("input", apply);
    if (params.get("filter")) input.value = params.get("filter");
    apply();
  }

  function layersView(s, v) {
    var d = v.data, wide = d.wide, series = wide.columns, items = [];
    var top = 0; rows(wide).forEach(function (r) { series.forEach(function (c) { top = Math.max(top, r[c]); }); });
    var u = unit(top);
    rows(wide).forEach(function (r) {
      series.forEach(function (c, j) {
        items.push({label: j === 0 ? r._index : "", title: r._index + " " + c, value: r[c], text: c + " " + fmt(r[c], u),
          color: c === "forward" ? COLORS.forward : c === "backward" ? COLORS.backward : "#f0c270"});
      });
    });
    s.appendChild(el("p", {class: "sub", text: d.what + " per module at depth " + d.depth + ", all steps" + (d.hidden ? " (" + d.hidden + " smaller modules not shown)" : "")}));
    s.appendChild(legend(series.filter(function (c) { return COLORS[c]; })));
    s.appendChild(hbars(items));
  }

  function loadView(s, v) {
    var r = rows(v.data.substeps), total = 0;
    r.forEach(function (x) { total += x.total_ns; });
    s.appendChild(el("p", {class: "sub", text: fmt(total) + " of loading in all, by sub-step in order of first start"}));
    s.appendChild(hbars(r.map(function (x) { return {label: x.label, title: x.name, value: x.total_ns, text: fmt(x.total_ns) + "  " + pct(x.total_ns / total)}; }), COLORS.load));
  }

  function memoryView(s, v) {
    var d = v.data, W = 1100, H = 170, L = 70, span = d.span_ns || 1, u = unit(span), bands = rows(d.bands);
    s.appendChild(legend(STAGES.filter(function (st) { return bands.some(function (b) { return b.stage === st; }); })));
    d.devices.forEach(function (dev) {
      var ts = dev.ts_ns, ys = dev.bytes, top = Math.max.apply(null, ys.concat([1])), low = Math.min.apply(null, ys.concat([0]));
      var svg = svgEl("svg", {viewBox: "0 0 " + W + " " + (H + 24), width: "100%", role: "img"});
      function X(t) { return L + t / span * (W - L - 10); }
      function Y(b) { return 8 + (top - b) / ((top - low) || 1) * (H - 16); }
      bands.forEach(function (b) { svg.appendChild(svgEl("rect", {x: X(b.start_ns), y: 0, width: Math.max(X(b.end_ns) - X(b.start_ns), 0.5), height: H, fill: COLORS[b.stage], "fill-opacity": 0.2})); });
      var pts = [];
      for (var i = 0; i < ts.length; i++) { if (i) pts.push(X(ts[i]).toFixed(1) + "," + Y(ys[i - 1]).toFixed(1)); pts.push(X(ts[i]).toFixed(1) + "," + Y(ys[i]).toFixed(1)); }
      stackCategories(svg, ts, dev.categories || {}, X, Y);
      svg.appendChild(svgEl("polyline", {points: pts.join(" "), fill: "none", stroke: "#222", "stroke-width": 1.3}));
      var t1 = svgEl("text", {x: 4, y: 14}); t1.textContent = bytes(top); svg.appendChild(t1);
      var t2 = svgEl("text", {x: 4, y: H - 4}); t2.textContent = bytes(low); svg.appendChild(t2);
      for (var q = 0; q <= 4; q++) { var tx = svgEl("text", {x: X(q * span / 4), y: H + 16, "text-anchor": q ? (q === 4 ? "end" : "middle") : "start"}); tx.textContent = (q * span / 4 / u[0]).toFixed(2) + " " + u[1]; svg.appendChild(tx); }
      s.appendChild(el("h3", {text: dev.label + ": allocated, peak " + bytes(top)}));
      if (dev.categories) s.appendChild(categoryLegend(Object.keys(dev.categories)));
      s.appendChild(svg);
    });
    memoryPeakTables(s, (P.summary.memory_categories || {}).step_peaks || []);
  }
  var CATEGORY_LABELS = {optimizer_state: "optim state", activation: "activations", temporary: "temporaries"};
  function categoryLegend(names) {
    return el("div", {class: "legend"}, names.map(function (c) {
      return el("span", {}, [el("span", {class: "chip", style: "background:" + (P.meta.category_colors[c] || "#777")}), c]);
    }));
  }
  function stackCategories(svg, ts, categories, X, Y) {  // one step-shaped band per category, stacked in order
    var base = ts.map(function () { return 0; });
    Object.keys(categories).forEach(function (c) {
      var ys = categories[c], upper = [], lower = [];
      for (var i = 0; i < ts.length; i++) {
        var top = base[i] + ys[i], x0 = X(ts[i]).toFixed(1), x1 = X(i + 1 < ts.length ? ts[i + 1] : ts[i]).toFixed(1);
        upper.push(x0 + "," + Y(top).toFixed(1), x1 + "," + Y(top).toFixed(1));
        lower.push(x1 + "," + Y(base[i]).toFixed(1), x0 + "," + Y(base[i]).toFixed(1));
        base[i] = top;
      }
      svg.appendChild(svgEl("polygon", {points: upper.concat(lower.reverse()).join(" "), fill: P.meta.category_colors[c] || "#777",
        "fill-opacity": 0.9, stroke: "none", "data-category": c}));
    });
  }
  function memoryPeakTables(s, steps) {  // the summary's "Memory at the peak, by category", one table per device
    if (!steps.some(function (r) { return r.peak_allocated_bytes; })) return;
    var devices = [];
    steps.forEach(function (r) { if (devices.indexOf(r.device) < 0) devices.push(r.device); });
    devices.forEach(function (d) {
      var mine = steps.filter(function (r) { return r.device === d; });
      var shown = P.meta.categories.filter(function (c) { return mine.some(function (r) { return r[c]; }); });
      s.appendChild(el("h3", {text: "Memory at the peak, by category (" + d + ")"}));
      var peakRows = mine.map(function (r) {
        return el("tr", {"data-device": d}, [el("td", {class: "l", text: r.step == null ? "outside" : String(r.step)}), stageCell(r.stage),
          el("td", {text: bytes(r.peak_allocated_bytes)})].concat(shown.map(function (c) { return el("td", {"data-category": c, text: r[c] ? bytes(r[c]) : "-"}); })));
      });
      s.appendChild(table(["step", "at", "peak"].concat(shown.map(function (c) { return CATEGORY_LABELS[c] || c; })), peakRows, "memory-peaks", 2));
      folded(s, s.lastChild, peakRows.map(function (tr) { return [tr]; }), "");
    });
    s.appendChild(el("p", {class: "note", text: "bytes live in each category at each step's highest Total Allocated (at: its stage); see docs/memory_categories.md"}));
  }

  function genericCell(column, x) {  // times in ms/µs/s, shares as %, stages with their colour, numbers grouped
    if (column === "stage" && typeof x === "string") return stageCell(x);
    if (typeof x !== "number") return el("td", {class: "l", text: x == null ? "-" : String(x)});
    if (/_ns$/.test(column)) return el("td", {text: fmt(x)});
    if (/_bytes$|^bytes$/.test(column)) return el("td", {text: bytes(x)});
    if (/_pct$/.test(column)) return el("td", {text: pct(x / 100)});
    if (/(^|_)share$/.test(column)) return el("td", {text: pct(x)});
    return el("td", {text: num(x, 3)});
  }
  function viewImage(v) {  // a view's PNG at 90 px per inch of its figure (drawn at v.png_dpi: sharp when zoomed)
    var img = el("img", {class: "view", alt: v.title, src: "data:image/png;base64," + v.png});
    img.addEventListener("load", function () { img.style.width = Math.round(img.naturalWidth * 90 / (v.png_dpi || 90)) + "px"; });
    return img;
  }
  function genericView(s, v) {  // a registered view this page has no renderer for: its figure and its tables
    if (v.png) s.appendChild(viewImage(v));
    (function walk(obj, name) {
      if (obj && obj.cols && obj.columns && obj.index) {
        var numbered = obj.index.every(function (x, i) { return x === i; });  // a plain 0..n-1 index is not shown
        s.appendChild(el("h3", {text: words(name)}));
        s.appendChild(table((numbered ? [] : [""]).concat(obj.columns.map(words)), rows(obj).slice(0, 200).map(function (r) {
          return el("tr", {}, (numbered ? [] : [el("td", {class: "l", text: String(r._index)})]).concat(obj.columns.map(function (c) { return genericCell(c, r[c]); })));
        }), "", numbered ? 1 : 2));
      } else if (obj && typeof obj === "object") {
        for (var k in obj) walk(obj[k], k);
      }
    })(v.data, v.title);
  }

  function checks(s, warnings) {
    if (!warnings.length) { s.appendChild(el("p", {text: "No checks fired."})); return; }
    s.appendChild(table(["severity", "check", "message"], warnings.map(function (w) {
      return el("tr", {class: "warn-" + w.severity}, [el("td", {class: "l", text: w.severity}), el("td", {class: "l", text: w.check}), el("td", {class: "l wrap", text: w.message})]);
    }), "", 3));
  }


  // -- Findings: what to change first (the summary's ``findings``, profparse advise), the biggest saving first --------
  function evidenceItems(ev) {  // the top events (time, name) and Python frames of a finding, as list items
    var out = [], TIME = ["ns", "total_ns", "path_ns", "saving_ns", "extra_ns", "delta_ns", "delay_ns", "dur_ns"];
    (Array.isArray(ev.top_events) ? ev.top_events : []).slice(0, 5).forEach(function (e) {
      var name = e, ns = null, perStep = "";
      if (Array.isArray(e)) { name = e[0]; ns = typeof e[1] === "number" ? e[1] : null; }
      else if (e && typeof e === "object") {
        name = e.name || e.label || e.event || e.op || e.kernel || "";
        var key = TIME.concat(Object.keys(e).filter(function (k) { return /_ns$/.test(k); })).filter(function (k) { return typeof e[k] === "number"; })[0];
        ns = key ? e[key] : typeof e.ms_per_step === "number" ? e.ms_per_step * 1e6 : null;
        if (!key && ns != null) perStep = " per step";
      }
      out.push(el("li", {class: "ev-event"}, [ns == null ? "" : fmt(ns) + perStep + "  ", el("code", {text: String(name)})]));
    });
    Object.keys(ev).forEach(function (k) {  // the numbers behind the estimate
      var v = ev[k];
      if (typeof v === "number" || typeof v === "string") out.push(el("li", {class: "ev-number", text: words(k) + ": " + (typeof v === "number" ? num(v) : v)}));
    });
    (Array.isArray(ev.frames) ? ev.frames : []).slice(0, 5).forEach(function (f) {
      var text = f && typeof f === "object" ? (f.file || f.filename || "") + "(" + (f.line || f.lineno || "") + "): " + (f.name || f.function || "") : String(f);
      out.push(el("li", {class: "ev-frame"}, [el("code", {text: text})]));
    });
    return out;
  }
  function stepRanges(steps) {  // [1, 2, 3, 5] -> "1-3,5" (profparse.analysis.advice.finding.steps_text)
    var parts = [];
    steps.forEach(function (n, i) {
      if (i && n === steps[i - 1] + 1) parts[parts.length - 1][1] = n; else parts.push([n, n]);
    });
    return parts.map(function (p) { return p[0] === p[1] ? String(p[0]) : p[0] + "-" + p[1]; }).join(",");
  }
  function folded(s, box, items, id) {  // a long capture: the first STEP_ROWS steps shown, the rest a click away
    if (items.length <= STEP_ROWS) return;
    items.slice(STEP_ROWS).forEach(function (parts) { parts.forEach(function (e) { e.classList.add("more"); }); });
    box.classList.add("folded");
    var more = el("button", id ? {text: "show all " + items.length + " steps", id: id} : {text: "show all " + items.length + " steps"});
    more.onclick = function () {
      var hidden = box.classList.toggle("folded");
      more.textContent = hidden ? "show all " + items.length + " steps" : "show the first " + STEP_ROWS;
    };
    s.appendChild(el("p", {class: "note"}, [(items.length - STEP_ROWS) + " more steps not shown ", more]));
  }
  function stepsLabel(steps) {  // as the summary's heading (outputs/summary/findings.py steps_label): a long list short
    if (!steps.length) return "all steps";
    var text = stepRanges(steps), runs = text.split(","), word = steps.length > 1 ? "steps " : "step ";
    if (text.length <= STEPS_SHOWN || runs.length <= 3) return word + text;
    return word + runs[0] + "," + runs[1] + ",...," + runs[runs.length - 1] + " (" + steps.length + " steps)";
  }
  function findingsSection(s, findings) {
    if (!findings || !findings.length) { s.appendChild(el("p", {class: "note", text: "No finding saves 1% of a step or more."})); return; }
    s.appendChild(el("p", {class: "note", text: findings.length + (findings.length === 1 ? " finding;" : " findings, the biggest saving first;") + " saving: the time on the step's critical path the fix removes, per step (docs/advice.md; profparse advise lists them with their evidence)."}));
    if (findings.some(function (f) { return f.evidence && "measured_in" in f.evidence; })) {
      s.appendChild(el("p", {class: "note warm", text: "Measured in steps that may be warm-up, so all at low confidence: see the check warm_up_only under Checks."}));
    }
    s.appendChild(el("ol", {class: "findings"}, findings.map(function (f) {
      var steps = stepsLabel(f.steps);
      var ev = evidenceItems(f.evidence || {});
      return el("li", {class: "finding", "data-kind": f.kind, "data-saving": String(f.saving_ns_per_step)}, [
        el("div", {class: "f-head"}, [f.rank != null ? el("b", {text: "rank " + f.rank + " · "}) : null, el("b", {text: f.kind}), " · ", chip(f.stage.split(",")[0]), f.stage, el("span", {title: f.steps.length ? "steps " + stepRanges(f.steps) : "", text: " · " + steps}),
          el("span", {class: "f-save", text: "saves " + fmt(f.saving_ns_per_step) + " per step (" + pct(f.saving_share) + " of a step)"}), el("span", {class: "f-conf", text: "confidence " + f.confidence})]),
        el("div", {class: "f-msg", text: f.message}),
        el("div", {class: "f-fix"}, [el("b", {text: "fix: "}), f.fix]),
        ev.length ? el("details", {open: params.get("evidence") === "open"}, [el("summary", {text: "evidence"}), el("ul", {}, ev)]) : null]);
    })));
  }

  // -- the first screen: the headline (profparse.outputs.report.headline), each item a link to its section ------------
  function breakable(text) {  // a snake_case name (a finding's kind) may wrap after each "_", not inside a word
    var out = [];
    String(text).split("_").forEach(function (part, i) { if (i) out.push("_", el("wbr")); out.push(part); });
    return out;
  }
  function headline(app, items) {
    var nav = el("nav", {id: "headline", class: "headline"});
    items.forEach(function (it) {
      var value = el("span", {class: "hl-value"}, [it.stage ? chip(it.stage) : null].concat(breakable(it.text)));
      nav.appendChild(el("a", {class: "hl-item hl-" + it.key, href: it.href, "data-headline": it.key, title: it.detail}, [
        el("span", {class: "hl-label", text: it.label}), value, el("span", {class: "hl-detail", text: it.detail})]));
    });
    app.appendChild(nav);
  }

  function words(column) {  // a column name as words: "exposed_ns" -> "exposed", "gpu_busy" -> "GPU busy"
    return column.replace(/_ns$/, "").replace(/_pct$/, " %").replace(/_/g, " ").replace(/\bgpu\b/g, "GPU").replace(/\bcpu\b/g, "CPU")
      .replace(/\btflops\b/g, "TFLOP/s").replace(/\bflops\b/g, "FLOPs");
  }
  function num(x, digits) { return x == null ? "-" : x.toLocaleString("en-US", {maximumFractionDigits: digits == null ? 2 : digits}); }
  function gflops(x) { return x == null ? "-" : (x / 1e9).toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}); }
  function tflops(x) {  // three significant digits, whole numbers from 100 on
    return x == null ? "-" : x >= 100 ? Math.round(x).toLocaleString("en-US") : Number(x.toPrecision(3)).toLocaleString("en-US", {maximumFractionDigits: 6});
  }
  function stageCell(stage) { return el("td", {class: "l"}, [chip(stage), stage]); }

  // -- Efficiency / MFU: the summary's section of that name (outputs/summary/efficiency.py), as tables -----------
  function efficiency(s, e) {
    if (!e || !e.stages) { skipped(s, "no FLOPs counted in this trace (capture with record_shapes=True)"); return; }
    // basis: GPU or host time; the peak's basis and each stage's math mode and peak where the summary has them
    var basis = e.basis || "GPU", modes = e.stages.some(function (r) { return r.math_mode !== undefined; });
    var peakBasis = e.peak.basis && e.peak.basis !== "--peak-tflops" ? "; " + e.peak.basis : "";
    s.appendChild(el("p", {class: "sub", id: "mfu-basis", text: e.peak.note + peakBasis + "."}));
    var head = ["stage", "GFLOPs", "TFLOP/s", "MFU", "HFU"].concat(modes ? ["mode", "peak TFLOP/s"] : [], ["counted " + basis, "not counted"]);
    s.appendChild(table(head, e.stages.map(function (r) {
      var cells = [stageCell(r.stage), el("td", {text: gflops(r.flops)}), el("td", {text: tflops(r.achieved_tflops)}),
        el("td", {"data-eff-stage": r.stage, "data-eff-mfu": r.mfu == null ? "" : String(r.mfu), text: util(r.mfu)}), el("td", {text: util(r.hfu)})];
      if (modes) cells.push(el("td", {text: r.math_mode || "-"}), el("td", {text: tflops(r.peak_tflops)}));
      return el("tr", {}, cells.concat([el("td", {text: fmt(r.counted_ns)}), el("td", {text: fmt(r.not_counted_ns)})]));
    }), "eff"));
    s.appendChild(el("p", {class: "note", text: "MFU: model FLOPs / (the stage's " + basis + " time x peak); HFU counts recomputed FLOPs too; not counted: " +
      basis + " time of ops with no FLOP formula or no shapes."}));
    if (e.steps.some(function (r) { return r.mfu != null; })) {
      s.appendChild(el("h3", {id: "mfu-per-step", text: "MFU per step"}));
      var mfuRows = e.steps.map(function (r) {
        return el("tr", {}, [el("td", {class: "l", text: "step " + r.step}), el("td", {text: gflops(r.flops)}),
          el("td", {"data-eff-step": String(r.step), text: util(r.mfu)})]);
      });
      s.appendChild(table(["step", "GFLOPs", "MFU"], mfuRows));
      folded(s, s.lastChild, mfuRows.map(function (tr) { return [tr]; }), "mfu-step-more");
      s.appendChild(el("p", {class: "note", text: "model FLOPs / (step window x peak)"}));
    }
    if (e.not_counted && e.not_counted.length) {
      s.appendChild(el("h3", {text: "Not counted (no FLOP formula or no shapes)"}));
      var t = table([basis + " time", "calls", "op"], e.not_counted.map(function (r) {
        return el("tr", {}, [el("td", {text: fmt(r.time_ns)}), el("td", {text: num(r.count)}), el("td", {class: "l name", title: r.name, text: r.name})]);
      }));
      t.querySelector("th:last-child").className = "l";
      s.appendChild(t);
    }
  }

  // -- communication: exposed vs overlapped per stage, and the summary's collectives per stage and kind --------------
  function communicationView(s, v) {
    var r = rows(v.data.stages), top = 0, comm = (P.summary.communication || {}).by_stage || [];
    r.forEach(function (x) { top = Math.max(top, x.comm_ns); });
    var g = el("div", {class: "hb"});
    r.forEach(function (x) {
      var c = COLORS[x.stage] || "#777", bar = el("div", {class: "bar", style: "width:" + (75 * x.comm_ns / (top || 1)).toFixed(2) + "%"});
      bar.appendChild(el("span", {title: "overlapped: " + fmt(x.overlapped_ns), style: "width:" + (100 * x.overlapped_ns / x.comm_ns) + "%;background:" + c}));
      bar.appendChild(el("span", {class: "hatch", title: "exposed: " + fmt(x.exposed_ns), style: "width:" + (100 * x.exposed_ns / x.comm_ns) + "%;color:" + c}));
      g.appendChild(el("div", {class: "lab"}, [chip(x.stage), x.stage]));
      g.appendChild(el("div", {class: "val"}, [bar, el("span", {class: "num", text: fmt(x.exposed_ns) + " exposed of " + fmt(x.comm_ns)})]));
    });
    s.appendChild(el("div", {class: "legend"}, [el("span", {}, [el("span", {class: "chip", style: "background:#777"}), "overlapped by other GPU work"]),
      el("span", {}, [el("span", {class: "chip hatch", style: "color:#777"}), "exposed (nothing else runs on the GPU)"])]));
    s.appendChild(g);
    s.appendChild(el("h3", {text: "Exposed per stage"}));
    s.appendChild(table(["stage", "collectives", "time", "overlapped", "exposed", "overlap"], r.map(function (x) {
      return el("tr", {"data-comm-stage": x.stage}, [stageCell(x.stage), el("td", {text: num(x.comm_count)}), el("td", {text: fmt(x.comm_ns)}),
        el("td", {text: fmt(x.overlapped_ns)}), el("td", {"data-comm-exposed": String(x.exposed_ns), text: fmt(x.exposed_ns)}), el("td", {text: pct(x.overlap_pct / 100)})]);
    })));
    if (!comm.length) return;
    s.appendChild(el("h3", {text: "Collectives per stage, kind and process group"}));
    s.appendChild(table(["stage", "collective", "group", "count", "bytes", "time", "algbw GB/s", "busbw GB/s", "exposed"], comm.map(function (x) {
      var size = x.bytes == null ? "unknown" : (x.bytes ? bytes(x.bytes) : "0") + (x.unknown_bytes_count ? "+?" : "");
      return el("tr", {}, [stageCell(x.stage), el("td", {class: "l", text: x.kind}), el("td", {class: "l", text: x.pg}), el("td", {text: num(x.count)}),
        el("td", {text: size}), el("td", {text: fmt(x.time_ns)}), el("td", {text: num(x.algbw_gbps)}), el("td", {text: num(x.busbw_gbps)}), el("td", {text: fmt(x.exposed_ns)})]);
    }), "", 3));
    s.appendChild(el("p", {class: "note", text: "collective kernels; exposed = not overlapped by other GPU work; algbw = bytes / time, busbw scales it by the collective's traffic factor"}));
  }

  // -- roofline: the plot's figure, and its points as a table (ops with the most time first) ---------------------
  function rooflineView(s, v) {
    var d = v.data, pts = rows(d.points), modes = pts.some(function (x) { return x.math_mode; });
    s.appendChild(el("p", {class: "sub", text: d.peak_note + (d.memory_gbps ? "; memory " + num(d.memory_gbps, 0) + " GB/s" : "") + "."}));
    if (v.png) s.appendChild(viewImage(v));
    var body = pts.slice(0, 30).map(function (x) {
      var over = x.of_roof != null && x.of_roof > 1;
      return el("tr", {class: over ? "over-roof" : ""}, [stageCell(x.stage), el("td", {class: "l name", title: x.name, text: x.label || x.name})].concat(
        modes ? [el("td", {class: "l", text: x.math_mode || "-"})] : [], [el("td", {text: num(x.count)}), el("td", {text: fmt(x.time_ns)}), el("td", {text: gflops(x.flops)}), el("td", {text: bytes(x.bytes)}),
        el("td", {text: num(x.intensity, x.intensity < 10 ? 2 : 0)}), el("td", {text: tflops(x.tflops)}), el("td", {text: tflops(x.roof_tflops)}),
        el("td", {"data-roof-share": x.of_roof == null ? "" : String(x.of_roof), text: pct(x.of_roof)})]));
    });
    s.appendChild(el("h3", {text: "Ops by " + d.basis + " time"}));
    s.appendChild(el("div", {class: "scroll"}, [table(["stage", "op"].concat(modes ? ["mode"] : [], ["calls", d.basis + " time", "GFLOPs", "moved", "FLOPs/byte", "TFLOP/s", "roof TFLOP/s", "of roof"]), body, "roof", modes ? 3 : 2)]));
    s.appendChild(el("p", {class: "note", text: "roof: the lower of the peak of the op's math mode and FLOPs/byte x memory bandwidth at its intensity; rows above their roof are red" +
      (pts.length > 30 ? "; the " + pts.length + " (op, stage) pairs with the most time are in the figure, 30 in the table" : "") + "."}));
  }

  // -- the late ranks of a folder of ranks (profparse.ranks.late.late_data, worded as summarize words it) --------
  function signed(ns) { return ns == null ? "-" : (ns > 0 ? "+" : "") + fmt(ns); }
  function lateCell(stage, field, value, text) {  // data-late-* (not data-value: the heatmap test reads those)
    return el("td", {"data-late-stage": stage, "data-late-field": field, "data-late-value": value == null ? "" : String(value), text: text});
  }
  function rankLink(rank) { return el("a", {href: "#rank-" + rank, text: "rank " + rank}); }

  function lateRanks(s, L, metric) {
    if (!L.available) {
      s.dataset.late = "unavailable";
      s.appendChild(el("p", {class: "skipped", text: "Not in this dataset: it was written by an older profparse, before collectives were matched across ranks; parse the traces again to see which rank the others wait for."}));
      return;
    }
    if (!L.collectives) {
      s.dataset.late = "none";
      s.appendChild(el("p", {class: "skipped", text: "No collective was matched across ranks: no NCCL/RCCL collective kernels ran on two or more ranks."}));
      return;
    }
    s.dataset.late = "shown";
    s.appendChild(el("p", {class: "sub", text: L.collectives + " collectives matched across " + L.ranks + " ranks, each counted in the stage its last rank was in. " +
      "A collective's transfer begins when the last rank starts its kernel: until then the others wait."}));
    L.warnings.forEach(function (w) { s.appendChild(el("p", {class: "late-warning", text: "warning: " + w})); });
    s.appendChild(table(["stage", "collectives", "with a late rank", "late rank", "arrived last", "mean delay", "max delay", "waiting (all ranks)", "transfer", "waiting %"],
      L.stages.map(function (st) {
        var known = st.late_rank != null;
        return el("tr", {"data-late-stage": st.stage}, [
          el("td", {class: "l"}, [chip(st.stage), st.stage]),
          lateCell(st.stage, "collectives", st.collectives, String(st.collectives)),
          lateCell(st.stage, "late", st.late, String(st.late)),
          el("td", {"data-late-stage": st.stage, "data-late-field": "late_rank", "data-late-value": known ? String(st.late_rank) : ""}, [known ? rankLink(st.late_rank) : "none"]),
          lateCell(st.stage, "times_last", st.times_last, known ? st.times_last + " of " + st.collectives : "-"),
          lateCell(st.stage, "mean_delay_ns", st.mean_delay_ns, fmt(st.mean_delay_ns)),
          lateCell(st.stage, "max_delay_ns", st.max_delay_ns, fmt(st.max_delay_ns)),
          lateCell(st.stage, "waiting_ns", st.waiting_ns, fmt(st.waiting_ns)),
          lateCell(st.stage, "transfer_ns", st.transfer_ns, fmt(st.transfer_ns)),
          el("td", {text: pct(st.waiting_share)})]);
      }), "late"));
    s.appendChild(el("p", {class: "note", text: "late rank: the rank that arrived last most often in the stage's collectives; delay: how much later it started its kernel than the median of the others; " +
      "waiting: the part of each rank's collective kernels before the last rank started (the rest is transfer). Clock skew between hosts biases all of these (docs/ranks.md)."}));
    L.stages.forEach(function (st) {
      if (st.late_rank == null) return;
      var r = st.late_rank, mine = L.per_rank.filter(function (x) { return x.stage === st.stage; }), others = 0;
      mine.forEach(function (x) { if (x.rank !== r) others += x.waiting_ns; });
      var line = st.stage + ": rank " + r + " arrived last in " + st.times_last + " of " + st.collectives + " collectives";
      var times = st.stage_ns;
      if (times && times.rank_ns != null) line += "; its " + st.stage + " took " + fmt(times.rank_ns) + ", the median rank " + fmt(times.median_ns) + " (" + metric + ")";
      var box = el("div", {class: "late-stage", "data-late-stage": st.stage}, [el("h3", {}, [chip(st.stage), line])]);
      box.appendChild(el("p", {class: "note", text: "The other ranks waited " + fmt(others) + " in all in the " + st.stage + " collectives; rank " + r +
        " started " + fmt(st.mean_delay_ns) + " after the median of the others on average, " + fmt(st.max_delay_ns) + " at most."}));
      var waits = el("div", {}, [el("h4", {text: "Per rank, in the " + st.stage + " collectives"}), table(["rank", "arrived last", "waiting", "transfer", "waiting %"], mine.map(function (x) {
        var all = x.waiting_ns + x.transfer_ns, f = function (field, v, text) { var td = lateCell(st.stage, field, v, text); td.setAttribute("data-late-rank", String(x.rank)); return td; };
        return el("tr", {class: x.rank === r ? "is-late" : ""}, [el("td", {class: "l"}, [rankLink(x.rank)]), f("rank_times_last", x.times_last, String(x.times_last)),
          f("rank_waiting_ns", x.waiting_ns, fmt(x.waiting_ns)), f("rank_transfer_ns", x.transfer_ns, fmt(x.transfer_ns)), el("td", {text: pct(all ? x.waiting_ns / all : null)})]);
      }))]);
      var diffs = st.differences || {}, body = [];
      ["kernels", "ops"].forEach(function (kind) {
        (diffs[kind] || []).forEach(function (x) {
          body.push(el("tr", {"data-late-stage": st.stage, "data-late-kind": kind.slice(0, -1), "data-late-name": x.name}, [el("td", {class: "l", text: kind.slice(0, -1)}),
            el("td", {class: x.delta_ns > 0 ? "more" : "less", text: signed(x.delta_ns)}), el("td", {text: fmt(x.rank_ns)}), el("td", {text: fmt(x.median_ns)}),
            el("td", {class: "l name", title: x.name, text: x.label || x.name})]));
        });
      });
      var what = el("div", {}, [el("h4", {text: "What rank " + r + " did differently in " + st.stage + " (against the median rank)"})]);
      var diffTable = table(["", "more", "rank " + r, "median", "name"], body);
      diffTable.querySelector("th:last-child").className = "l";  // the names are left-aligned
      what.appendChild(body.length ? diffTable : el("p", {class: "note", text: "No kernel or op time differs."}));
      box.appendChild(el("div", {class: "pair"}, [waits, what]));
      s.appendChild(box);
    });
    pathWaits(s, L.path_waits || []);
  }

  // the part of each rank's own critical path spent waiting for a later rank (profparse.ranks.critical_path)
  function pathWaits(s, waits) {
    if (!waits.length) return;
    s.appendChild(el("h3", {text: "On each rank's critical path: waiting for a later rank"}));
    s.appendChild(table(["rank", "stage", "waited for", "on path", "steps", "per step"], waits.map(function (w) {
      var cell = function (field, value, text) {
        return el("td", {"data-wait-rank": String(w.rank), "data-wait-stage": w.stage, "data-wait-field": field, "data-wait-value": String(value), text: text});
      };
      return el("tr", {}, [el("td", {class: "l"}, [rankLink(w.rank)]), el("td", {class: "l"}, [chip(w.stage), w.stage]),
        cell("waited_rank", w.waited_rank, "rank " + w.waited_rank), cell("wait_ns", w.wait_ns, fmt(w.wait_ns)),
        cell("steps", w.steps, String(w.steps)), cell("per_step_ns", w.per_step_ns, fmt(w.per_step_ns))]);
    }), "path-waits", 2));
    s.appendChild(el("p", {class: "note", text: "The time on a rank's critical path inside its waits at collectives for the rank that arrived last: " +
      "shortening the late rank's work shortens this rank's step by up to that much. Per step: over the steps it waited in (docs/critical_path.md)."}));
  }

  // -- the critical path: ms on the path per stage and bound (the summary's section), per step, longest events --------
  function criticalPathView(s, v) {
    var d = v.data, cp = P.summary.critical_path || {}, per = cp.per_stage || [], stages = per.map(function (r) { return r.stage; });
    var whole = 0, byStage = {};
    per.forEach(function (r) { whole += r.total_ns; byStage[r.stage] = r.bounds; });
    s.appendChild(el("p", {class: "sub", text: "The chain of dependent work (host code, launches, kernels, copies, waits) that bounds each step, " +
      cp.steps + " steps summed. The timeline above draws it as its last row, coloured by bound; hover names the event."}));
    s.appendChild(boundLegend("bound:", d));
    function cell(stage, bound, ns, total) {
      var td = el("td", {"data-cp-stage": stage, "data-cp-bound": bound, "data-cp-value": String(ns), text: fmt(ns)});
      if (total) td.appendChild(el("span", {class: "share", text: pct(ns / total)}));
      return td;
    }
    // the steady steps' path replayed without the profiler's cost (docs/without_profiler.md), where there is one
    var wp = cp.without_profiler || {}, free = wp.bounds || {}, freeWhole = wp.total_ns || 0;
    function freeCell(b) { return freeWhole ? [cell("without_profiler", b, b === "all" ? freeWhole : (free[b] || 0), freeWhole)] : []; }
    var body = d.bounds.map(function (b) {
      var total = 0;
      stages.forEach(function (st) { total += byStage[st][b] || 0; });
      return el("tr", {"data-cp-row": b}, [el("td", {class: "l"}, [el("span", {class: "chip", style: "background:" + d.colors[b]}), b])].concat(
        stages.map(function (st) { return cell(st, b, byStage[st][b] || 0); }), [cell("total", b, total, whole)], freeCell(b)));
    });
    body.push(el("tr", {class: "total"}, [el("td", {class: "l", text: "all"})].concat(per.map(function (r) { return cell(r.stage, "all", r.total_ns); }), [cell("total", "all", whole)], freeCell("all"))));
    s.appendChild(el("h3", {id: "cp-per-stage", text: "ms on the critical path by stage and bound"}));
    var freeHead = freeWhole ? ["without the profiler (share)"] : [];
    s.appendChild(table(["bound"].concat(stages, ["total (share)"], freeHead), body, "cp"));
    if (freeWhole) s.appendChild(el("p", {class: "sub", text: "Without the profiler: the " + wp.steps + " steady steps' critical path replayed with the profiler's own cost taken out (" +
      wp.basis + " costs per event), in ms summed over those steps."}));
    // per step: one bar stacked by bound
    var steps = {}, order = [];
    rows(d.per_step).forEach(function (r) {
      steps[r._index] = {total: 0}; order.push(r._index);
      d.bounds.forEach(function (b) { steps[r._index][b] = r[b]; steps[r._index].total += r[b]; });
    });
    var top = Math.max.apply(null, order.map(function (n) { return steps[n].total; }).concat([1])), g = el("div", {class: "hb"}), items = [];
    order.forEach(function (n) {
      var st = steps[n], bar = el("div", {class: "bar", "data-cp-step": String(n), style: "width:" + (75 * st.total / top).toFixed(2) + "%"});
      d.bounds.forEach(function (b) {
        if (st[b]) bar.appendChild(el("span", {title: b + ": " + fmt(st[b]) + " (" + pct(st[b] / st.total) + ")", style: "width:" + (100 * st[b] / st.total) + "%;background:" + d.colors[b]}));
      });
      var lab = el("div", {class: "lab", text: "step " + n}), val = el("div", {class: "val"}, [bar, el("span", {class: "num", text: fmt(st.total)})]);
      g.appendChild(lab); g.appendChild(val); items.push([lab, val]);
    });
    s.appendChild(el("h3", {text: "Per step, by bound"}));
    s.appendChild(g);
    folded(s, g, items, "cp-step-more");
    var longest = cp.longest || [];
    if (!longest.length) return;
    s.appendChild(el("h3", {text: "Longest events on the critical path"}));
    var labels = P.critical_path_labels || [];
    var t = table(["step", "stage", "bound", "ms on path", "event"], longest.map(function (r, i) {
      return el("tr", {}, [el("td", {class: "l", text: "step " + r.step}), stageCell(r.stage), el("td", {class: "l", text: r.bound}), el("td", {text: fmt(r.ns)}),
        el("td", {class: "l name", title: r.name, text: labels[i] || r.name})]);
    }), "", 3);
    t.querySelector("th:last-child").className = "l";
    s.appendChild(t);
    s.appendChild(el("p", {class: "note", text: "an op cut by its children counts all its pieces; see docs/critical_path.md for how the path is found"}));
  }

  var RENDER = {critical_path: criticalPathView, stages: stagesView, timeline: timelineView, top_kernels: topView, top_ops: topView, top_runtime: topView,
    communication: communicationView, roofline: rooflineView, memory: memoryView, layers: layersView, load: loadView};

  function traceReport(app, toc) {
    var sm = P.summary;
    app.appendChild(el("h1", {text: P.title}));
    app.appendChild(el("p", {class: "sub", text: sm.events.toLocaleString("en-US") + " events · " + sm.steps.count + " steps" +
      (sm.steps.source ? " (" + sm.steps.source + ")" : "") + (sm.devices && sm.devices.length ? " · " + counted(sm.devices) : " · no GPU") +
      (sm.rank != null ? " · rank " + sm.rank : "") + " · profparse " + P.meta.version}));
    if (P.headline) headline(app, P.headline);
    app.appendChild(toc);
    findingsSection(section(app, "findings", "Findings", toc), sm.findings);
    overview(section(app, "overview", "Overview per stage and step", toc), sm);
    efficiency(section(app, "efficiency", "Efficiency / MFU", toc), sm.efficiency);
    var absent = [];
    for (var kind in P.views) {
      var v = P.views[kind];
      if (v.skipped) { absent.push([kind, v]); continue; }
      var s = section(app, "view-" + kind, v.title, toc);
      s.dataset.kind = kind;
      (RENDER[kind] && v.native ? RENDER[kind] : genericView)(s, v, kind);
    }
    checks(section(app, "checks", "Checks", toc), sm.warnings);
    if (absent.length) {  // views whose data is not in the trace: one line each, at the end, each with why
      var n = section(app, "not-shown", "Not in this trace", toc);
      n.appendChild(el("ul", {class: "absent"}, absent.map(function (a) {
        return el("li", {id: "view-" + a[0], class: "skipped-view", "data-kind": a[0]}, [el("b", {text: a[1].title}), ": " + a[1].skipped]);
      })));
    }
  }

  function ranksReport(app, toc) {
    var d = P.ranks, col = d.metric_column;
    app.appendChild(el("h1", {text: P.title + " (" + d.ranks.length + " ranks)"}));
    app.appendChild(el("p", {class: "sub", text: "Metric: " + words(col) + "; ranks from " + d.rank_sources + " · profparse " + P.meta.version}));
    if (P.headline) headline(app, P.headline);
    app.appendChild(toc);
    if (d.findings) findingsSection(section(app, "findings", "Findings", toc), d.findings);
    var s = section(app, "heatmap", "Rank x stage", toc);
    var stages = STAGES.filter(function (st) { return d.per_rank.some(function (r) { return r.stage === st; }); });
    var cell = {}, maxOf = {}, minOf = {};
    d.per_rank.forEach(function (r) {
      var v = r[col] || 0;
      cell[r.rank + "/" + r.stage] = r[col];
      maxOf[r.stage] = Math.max(v, r.stage in maxOf ? maxOf[r.stage] : v);
      minOf[r.stage] = Math.min(v, r.stage in minOf ? minOf[r.stage] : v);
    });
    var ok = d.ranks.filter(function (r) { return r.status === "ok"; });
    s.appendChild(table(["rank"].concat(stages), ok.map(function (r) {
      return el("tr", {}, [el("td", {class: "l"}, [el("a", {href: "#rank-" + r.rank, text: "rank " + r.rank})])].concat(stages.map(function (st) {
        var v = cell[r.rank + "/" + st], spread = maxOf[st] - minOf[st], a = spread > 0 ? ((v || 0) - minOf[st]) / spread : 0;
        return el("td", {class: "cell", "data-rank": String(r.rank), "data-stage": st, "data-value": v == null ? "" : String(v), text: fmt(v),
          style: "background:rgba(204,68,0," + (0.08 + 0.6 * a).toFixed(2) + ")"});
      })));
    }), "heat"));
    s.appendChild(el("p", {class: "note", text: "Colour per stage column: white = the fastest rank, dark = the slowest (all alike when the ranks take the same time)."}));
    var g = section(app, "stragglers", "Stragglers", toc);
    g.appendChild(table(["stage", "median", "min", "max", "slowest rank", "lead over median"], d.stragglers.map(function (r) {
      return el("tr", {}, [stageCell(r.stage), el("td", {text: fmt(r.median_ns)}), el("td", {text: fmt(r.min_ns)}), el("td", {text: fmt(r.max_ns)}),
        el("td", {}, r.slowest_rank == null ? ["-"] : !r.lead_ns ? ["none (all equal)"] : [el("a", {href: "#rank-" + r.slowest_rank, text: "rank " + r.slowest_rank})]), el("td", {text: fmt(r.lead_ns)})]);
    })));
    if (d.late_ranks) lateRanks(section(app, "late-ranks", "Late ranks", toc), d.late_ranks, words(d.metric_column));
    if (d.failed_ranks.length) {
      var f = section(app, "failed", "Failed ranks", toc);
      f.appendChild(table(["rank", "file", "error"], d.failed_ranks.map(function (r) { return el("tr", {}, [el("td", {class: "l", text: String(r.rank)}), el("td", {class: "l", text: r.file}), el("td", {class: "l", text: r.error})]); })));
    }
    var per = section(app, "per-rank", "Per rank", toc);
    d.ranks.forEach(function (r) {
      var box = el("section", {id: "rank-" + r.rank}, [el("h3", {text: "rank " + r.rank + " · " + r.file + " · " + r.status + " · " + r.events.toLocaleString("en-US") + " events" + (r.devices.length ? " · " + counted(r.devices) : "")})]);
      var mine = d.per_rank.filter(function (x) { return x.rank === r.rank; });
      if (mine.length) {
        var cols = Object.keys(mine[0]).filter(function (k) { return k.slice(-3) === "_ns"; });
        box.appendChild(table(["stage"].concat(cols.map(words)), mine.map(function (x) {
          return el("tr", {}, [stageCell(x.stage)].concat(cols.map(function (c) { return el("td", {text: fmt(x[c])}); })));
        })));
      }
      box.appendChild(el("p", {class: "note"}, [el("a", {href: "#heatmap", text: "back to the heatmap"})]));
      per.appendChild(box);
    });
  }

  var app = document.getElementById("app");
  app.textContent = "";
  var toc = el("nav", {class: "toc"});
  try {
    if (P.kind === "ranks") ranksReport(app, toc); else traceReport(app, toc);
  } catch (e) {
    fail("error: " + (e && e.stack || e));
  }
  var only = params.get("only");  // ?only=<section id>: that section alone (tests screenshot the timeline so)
  if (only) Array.prototype.forEach.call(app.children, function (c) { if (c.id !== only) c.hidden = true; });
  document.body.dataset.renderMs = (performance.now() - t0).toFixed(0);  // parse + render, shown in docs/report.md
  if (params.has("widths")) {  // ?widths: the rightmost edge drawn against the window's width (tests: nothing runs off)
    var right = 0;
    Array.prototype.forEach.call(app.querySelectorAll("*"), function (e) { right = Math.max(right, e.getBoundingClientRect().right); });
    document.body.dataset.rightEdge = Math.ceil(right);
    document.body.dataset.clientWidth = document.documentElement.clientWidth;
  }
  document.body.dataset.ready = "1";
})();
