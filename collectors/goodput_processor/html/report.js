/* goodput HTML report: draws each job's charts from the inlined data (docs/html-report.md).
 * The timeline and step-time charts are recomputed for the visible range on every zoom
 * (plotly_relayout): what is narrower than MIN_PX pixels is aggregated. */
(function () {
  'use strict';
  var MIN_PX = 2;            // timeline: segments narrower than this are aggregated
  var MAX_POINTS = 4000;     // step-time chart: raw points shown up to this many
  var STEP_NONE = -2147483648;
  var TYPES = {uint8: Uint8Array, int32: Int32Array, uint32: Uint32Array,
               float32: Float32Array, float64: Float64Array};
  var CONFIG = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ['select2d', 'lasso2d', 'autoScale2d']};
  var META = JSON.parse(document.getElementById('gp-meta').textContent);

  function fail(e) {
    var el = document.getElementById('gp-status');
    el.textContent = 'report error: ' + (e && e.message || e);
    document.body.setAttribute('data-gp-error', String(e && e.message || e));
    throw e;
  }

  function unb64(text) {
    var bin = atob(text), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  async function blob(i) {
    var text = document.getElementById('gp-blob-' + i).textContent.trim();
    var bytes;
    try {
      bytes = await (await fetch('data:application/octet-stream;base64,' + text)).arrayBuffer();
    } catch (e) { bytes = unb64(text); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return await new Response(stream).arrayBuffer();
  }

  function view(buf, meta, name) {
    var a = meta.arrays[name];
    return new TYPES[a[0]](buf, a[1], a[2]);
  }

  function upper(arr, x, lo, hi) {  // first index in [lo, hi) with arr[i] > x
    while (lo < hi) { var m = (lo + hi) >> 1; if (arr[m] > x) hi = m; else lo = m + 1; }
    return lo;
  }

  function fmt(s) {
    var a = Math.abs(s);
    if (a >= 60) {
      var h = Math.floor(a / 3600), m = Math.floor(a % 3600 / 60), sec = Math.round(a % 60);
      return (s < 0 ? '-' : '') + (h ? h + 'h ' : '') + m + 'm ' + sec + 's';
    }
    if (a >= 1 || a === 0) return s.toFixed(3) + ' s';
    if (a >= 1e-3) return (s * 1e3).toFixed(2) + ' ms';
    return (s * 1e6).toFixed(1) + ' µs';
  }

  var tDigits = 3;
  function at(t) { return t.toFixed(tDigits) + ' s'; }

  function decodeRows(buf, meta) {
    return meta.rows.map(function (r, i) {
      var d = view(buf, meta, 'd' + i), k = view(buf, meta, 'k' + i);
      var sd = view(buf, meta, 's' + i), n = r.n;
      var B = new Float64Array(n + 1), S = new Int32Array(n), us = r.t0_us, prev = 0;
      B[0] = us / 1e6;
      for (var j = 0; j < n; j++) {
        us += d[j]; B[j + 1] = us / 1e6;
        if (sd[j] === STEP_NONE) S[j] = -1; else { prev += sd[j]; S[j] = prev; }
      }
      return {label: r.label, primary: r.primary, host: r.host, B: B, K: k, S: S, n: n};
    });
  }

  function decodeSteps(buf, meta) {
    var xd = view(buf, meta, 'sx'), n = xd.length, X = new Float64Array(n), x = 0;
    for (var i = 0; i < n; i++) { x += xd[i]; X[i] = x; }
    return {X: X, T: view(buf, meta, 'st'), A: view(buf, meta, 'sa'),
            K: view(buf, meta, 'sk'), n: n};
  }

  // ---- timeline ---------------------------------------------------------------------
  function timelineTraces(job, x0, x1, px) {
    var names = job.meta.names, nb = names.length, w = (x1 - x0) / px * MIN_PX;
    tDigits = Math.min(6, Math.max(3, Math.ceil(-Math.log10(w)) + 1));
    var bars = names.map(function () {
      return {base: [], x: [], y: [], width: [], offset: [], text: []};
    });
    job.rows.forEach(function (row) {
      var B = row.B, K = row.K, S = row.S, n = row.n;
      var width = row.primary ? 0.8 : 0.35, last = null;
      var comp = new Float64Array(nb), runStart = -1, runEnd = 0, slo = -1, shi = -1, cnt = 0;
      function push(start, len, k, text, agg, s, frac, below) {
        var b = bars[k];
        if (frac === undefined) { frac = 1; below = 0; }
        if (last && last.k === k && agg && frac === 1 && last.agg &&
            Math.abs(last.end - start) < 1e-9) {
          b.x[last.i] += len; last.end = start + len;
          if (s[0] >= 0) { last.slo = last.slo < 0 ? s[0] : last.slo; last.shi = s[1]; }
          b.text[last.i] = names[k] + ' · ' + fmt(b.x[last.i]) + stepsText(last.slo, last.shi) +
            '<br>' + at(b.base[last.i]) + ' – ' + at(last.end);
          return;
        }
        // a stretch mixing several buckets is drawn as a column split by each one's share
        b.base.push(start); b.x.push(len); b.y.push(row.label); b.width.push(width * frac);
        b.offset.push(-width / 2 + width * below); b.text.push(text);
        last = {k: k, agg: agg, end: start + len, i: b.x.length - 1, slo: s[0], shi: s[1]};
      }
      function flush() {
        if (runStart < 0) return;
        var parts = [], tot = runEnd - runStart, lines = [];
        for (var k = 0; k < nb; k++) if (comp[k] > 0) parts.push(k);
        parts.slice().sort(function (a, b) { return comp[b] - comp[a]; }).forEach(function (k) {
          lines.push(names[k] + ' ' + (100 * comp[k] / tot).toFixed(1) + ' %');
        });
        var text = at(runStart) + ' – ' + at(runEnd) + ' (' + cnt + ' segments' +
          stepsText(slo, shi) + ')<br>' + lines.join('<br>');
        if (parts.length === 1) {
          push(runStart, tot, parts[0], names[parts[0]] + ' · ' + fmt(tot) + stepsText(slo, shi) +
               '<br>' + at(runStart) + ' – ' + at(runEnd), true, [slo, shi]);
        } else {
          var below = 0, sum = 0;
          parts.forEach(function (k) { sum += comp[k]; });
          parts.forEach(function (k) {
            push(runStart, tot, k, text, false, [-1, -1], comp[k] / sum, below);
            below += comp[k] / sum;
          });
          last = null;
        }
        comp.fill(0); runStart = -1; slo = shi = -1; cnt = 0;
      }
      var i = Math.max(0, upper(B, x0, 0, n + 1) - 1);
      for (; i < n && B[i] < x1; i++) {
        var len = B[i + 1] - B[i];
        if (len <= 0) continue;
        if (len >= w) {
          flush();
          push(B[i], len, K[i], segText(job, row, i, len), false, [S[i], S[i]]);
        } else {
          if (runStart < 0) runStart = B[i];
          comp[K[i]] += len; runEnd = B[i + 1]; cnt++;
          if (S[i] >= 0) { if (slo < 0 || S[i] < slo) slo = S[i]; if (S[i] > shi) shi = S[i]; }
          if (runEnd - runStart >= w) flush();
        }
      }
      flush();
    });
    var present = job.meta.present;
    return names.map(function (name, k) {
      var b = bars[k];
      return {type: 'bar', orientation: 'h', name: name, base: b.base, x: b.x, y: b.y,
              width: b.width, offset: b.offset, hovertext: b.text, hoverinfo: 'text',
              marker: {color: job.meta.colors[name], line: {width: 0}},
              visible: present.indexOf(name) >= 0 ? true : false, showlegend: true};
    }).filter(function (t) { return t.visible; });
  }

  function stepsText(lo, hi) {
    if (lo < 0) return '';
    return lo === hi ? ' · step ' + lo : ' · steps ' + lo + '–' + hi;
  }

  function segText(job, row, i, len) {
    var k = row.K[i], s = row.S[i], name = job.meta.names[k];
    var t = name + ' · ' + fmt(len) + '<br>' + at(row.B[i]) + ' – ' + at(row.B[i + 1]);
    if (s >= 0) {
      t += '<br>step ' + s;
      var st = job.steps, j = st ? lowerX(st.X, s) : -1;
      if (j >= 0 && j < st.n && st.X[j] === s && (name === 'productive' ||
          name === 'training_slowdown')) {
        t += ' · step time ' + fmt(st.T[j] / 1e3) + (st.K[j] ? ' (anomalous)' : '');
      }
    }
    return t + '<br>' + row.label + (row.host ? ' · ' + row.host : '');
  }

  function lowerX(X, x) {
    var lo = 0, hi = X.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (X[m] < x) lo = m + 1; else hi = m; }
    return lo;
  }

  function timelineLayout(job, range) {
    var rows = job.rows, shapes = [], ann = [];
    rows.forEach(function (r, i) {
      if (r.primary && i > 0) {
        shapes.push({type: 'line', xref: 'x', yref: 'paper', x0: r.B[0], x1: r.B[0], y0: 0, y1: 1,
                     line: {color: '#555', dash: 'dot', width: 1}});
        ann.push({x: r.B[0], y: 1, xref: 'x', yref: 'paper', yanchor: 'top', xanchor: 'left',
                  text: 'restart: ' + r.label, showarrow: false, font: {size: 10},
                  bgcolor: 'rgba(255,255,255,0.7)'});
      }
    });
    var labels = rows.map(function (r) { return r.label; });
    return {title: {text: 'Timeline (a row per attempt; thin rows: other processes)', y: 0.98,
                    yanchor: 'top'},
            barmode: 'overlay', bargap: 0, hovermode: 'closest', shapes: shapes,
            annotations: ann, height: 170 + 40 * rows.length, uirevision: 'tl',
            margin: {l: 150, r: 20, t: 100, b: 50},
            legend: {orientation: 'h', y: 1.02, yanchor: 'bottom', x: 0},
            xaxis: {title: {text: 'seconds since job start'}, range: range, autorange: false,
                    zeroline: false},
            yaxis: {type: 'category', categoryarray: labels, categoryorder: 'array',
                    autorange: 'reversed', fixedrange: true}};
  }

  function plotWidth(gd) {
    var fl = gd._fullLayout;
    return fl && fl._size ? Math.max(100, fl._size.w) : 1000;
  }

  function rangeOf(ev, full) {
    if (ev['xaxis.autorange'] || ev['autosize']) return full.slice();
    if (ev['xaxis.range[0]'] !== undefined) return [+ev['xaxis.range[0]'], +ev['xaxis.range[1]']];
    if (ev['xaxis.range']) return [+ev['xaxis.range'][0], +ev['xaxis.range'][1]];
    return null;
  }

  async function drawTimeline(job, others) {
    var gd = document.getElementById('gp-timeline-' + job.index);
    var full = [0, job.meta.total_s || 1], range = full.slice();
    function draw() {
      return Plotly.react(gd, timelineTraces(job, range[0], range[1], plotWidth(gd)),
                          timelineLayout(job, range.slice()), CONFIG);
    }
    await Plotly.newPlot(gd, [], timelineLayout(job, range.slice()), CONFIG);
    await draw();
    gd.on('plotly_relayout', function (ev) {
      var r = rangeOf(ev, full);
      if (!r) return;
      range = r;
      draw();
      others.forEach(function (o) {
        if (o && o.data) Plotly.relayout(o, {'xaxis.range': range.slice()});
      });
    });
  }

  // ---- step time ----------------------------------------------------------------------
  function stepTraces(job, x0, x1, px) {
    var st = job.steps, X = st.X, T = st.T, A = st.A, K = st.K;
    var i0 = lowerX(X, x0), i1 = upper(X, x1, i0, st.n), n = i1 - i0;
    var main = {type: 'scatter', name: 'step time', x: [], y: [], text: [], hoverinfo: 'text',
                marker: {color: '#1f77b4', size: 4}, line: {color: '#1f77b4', width: 1}};
    var anom = {type: 'scatter', mode: 'markers', name: 'anomalous', x: [], y: [], text: [],
                hoverinfo: 'text', marker: {color: '#d62728', size: 6, symbol: 'x'}};
    var label = job.meta.step_x_label;
    function txt(i) {
      return label + ' ' + X[i] + ' · ' + T[i].toFixed(3) + ' ms · attempt ' + A[i] +
        (K[i] ? ' · anomalous' : '');
    }
    if (n <= MAX_POINTS) {
      main.mode = n <= 400 ? 'lines+markers' : 'markers';
      for (var i = i0; i < i1; i++) {
        main.x.push(X[i]); main.y.push(T[i]); main.text.push(txt(i));
        if (K[i]) { anom.x.push(X[i]); anom.y.push(T[i]); anom.text.push(txt(i)); }
      }
    } else {  // min/max per pixel column (a vertical line each), anomalies kept
      main.mode = 'lines'; main.name = 'step time (min–max per pixel)';
      var bins = Math.max(50, Math.floor(px)), span = (x1 - x0) / bins, b = -1;
      var lo = Infinity, hi = -Infinity, xa = 0, xb = 0, amax = -1, nanom = 0;
      var flush = function () {
        if (b < 0) return;
        main.x.push(xa, xa, null); main.y.push(lo, hi, null);
        main.text.push(label + 's ' + xa + '–' + xb + ': ' + lo.toFixed(3) + '–' + hi.toFixed(3) +
                       ' ms', '', '');
        if (amax >= 0) { anom.x.push(X[amax]); anom.y.push(T[amax]); anom.text.push(txt(amax)); }
      };
      for (var j = i0; j < i1; j++) {
        var bj = Math.floor((X[j] - x0) / span);
        if (bj !== b) { flush(); b = bj; lo = Infinity; hi = -Infinity; xa = X[j]; amax = -1; }
        xb = X[j];
        if (T[j] < lo) lo = T[j];
        if (T[j] > hi) hi = T[j];
        if (K[j]) { nanom++; if (amax < 0 || T[j] > T[amax]) amax = j; }
      }
      flush();
      anom.name = 'anomalous (' + nanom + ' here; the slowest per pixel shown)';
    }
    return [main, anom];
  }

  function stepLayout(job, range) {
    var shapes = [], m = job.meta;
    if (m.ideal_ms !== null) {
      shapes.push({type: 'line', xref: 'paper', yref: 'y', x0: 0, x1: 1, y0: m.ideal_ms,
                   y1: m.ideal_ms, line: {color: '#2ca02c', width: 1.5}});
      var thr = m.ideal_ms + (m.tol_ms || 0);
      shapes.push({type: 'line', xref: 'paper', yref: 'y', x0: 0, x1: 1, y0: thr, y1: thr,
                   line: {color: '#d62728', width: 1, dash: 'dash'}});
    }
    return {title: {text: 'Step time per kept step (green: ideal ' +
                    (m.ideal_ms === null ? '-' : m.ideal_ms.toFixed(3) + ' ms') +
                    '; dashed red: anomalous above)'},
            height: 340, uirevision: 'st', hovermode: 'closest', shapes: shapes,
            margin: {l: 60, r: 20, t: 40, b: 50}, legend: {orientation: 'h', y: -0.25},
            xaxis: {title: {text: m.step_x_label}, range: range, autorange: false},
            yaxis: {title: {text: 'step time (ms)'}}};
  }

  async function drawSteps(job) {
    var gd = document.getElementById('gp-steptime-' + job.index), st = job.steps;
    if (!st.n) { gd.innerHTML = '<div class="gp-empty">No kept steps.</div>'; return; }
    var pad = Math.max(0.5, (st.X[st.n - 1] - st.X[0]) * 0.01);
    var full = [st.X[0] - pad, st.X[st.n - 1] + pad], range = full.slice();
    function draw() {
      return Plotly.react(gd, stepTraces(job, range[0], range[1], plotWidth(gd)),
                          stepLayout(job, range.slice()), CONFIG);
    }
    await Plotly.newPlot(gd, [], stepLayout(job, range.slice()), CONFIG);
    await draw();
    gd.on('plotly_relayout', function (ev) {
      var r = rangeOf(ev, full);
      if (!r) return;
      range = r;
      draw();
    });
  }

  async function drawStatic(job, kind) {
    var gd = document.getElementById('gp-' + kind + '-' + job.index);
    var fig = job.meta.figures[kind];
    if (!fig) { gd.innerHTML = '<div class="gp-empty">No data.</div>'; return null; }
    await Plotly.newPlot(gd, fig.data, fig.layout, CONFIG);
    return gd;
  }

  async function main() {
    for (var i = 0; i < META.length; i++) {
      var meta = META[i], buf = await blob(i);
      var job = {index: i, meta: meta, rows: decodeRows(buf, meta),
                 steps: decodeSteps(buf, meta)};
      var g = await drawStatic(job, 'goodput'), b = await drawStatic(job, 'buckets');
      await drawStatic(job, 'histogram');
      await drawTimeline(job, [g, b]);
      await drawSteps(job);
    }
    performance.mark('gp-charts-drawn');
    document.body.setAttribute('data-gp-ready', '1');
  }

  main().catch(fail);
})();
