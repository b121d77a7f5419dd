/* goodput HTML report: draws each job's charts from the inlined data (docs/html-report.md).
 * The timeline (the job's lane, a lane per bucket group, the processes' heat strip) and the
 * step-time chart are recomputed for the visible range on every zoom (plotly_relayout):
 * what is narrower than MIN_PX pixels is aggregated. heat.js (window.GPHeat) draws the heat
 * codes, charts.js (window.GPCharts) the curves over time. */
(function () {
  'use strict';
  var MIN_PX = 2;            // timeline: segments narrower than this are aggregated
  var MAX_POINTS = 4000;     // step-time chart: raw points shown up to this many
  var LANE_PX = 26;          // height of one lane
  var HEAT_LANES = 5;        // the heat strip is this many lanes tall
  var MIN_SHARE = 0.15;      // a group lane's column is at least this tall when not empty
  var BAR = 0.8;             // bar height, in lanes
  var STEP_NONE = -2147483648;
  var TYPES = {uint8: Uint8Array, int32: Int32Array, uint32: Uint32Array,
               float32: Float32Array, float64: Float64Array};
  var CONFIG = {displaylogo: false, responsive: true,
                modeBarButtonsToRemove: ['select2d', 'lasso2d', 'autoScale2d']};
  var META = JSON.parse(document.getElementById('gp-meta').textContent);
  var H = window.GPHeat;

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

  function lowerX(X, x) {
    var lo = 0, hi = X.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (X[m] < x) lo = m + 1; else hi = m; }
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

  // the primary rows one after the other (they are contiguous): the job's lane
  function decodeJob(buf, meta) {
    var n = 0;
    meta.rows.forEach(function (r) { n += r.n; });
    var B = new Float64Array(n + 1), K = new Uint8Array(n), S = new Int32Array(n), j = 0;
    meta.rows.forEach(function (r, i) {
      var d = view(buf, meta, 'd' + i), k = view(buf, meta, 'k' + i);
      var sd = view(buf, meta, 's' + i), us = r.t0_us, prev = 0;
      if (j === 0) B[0] = us / 1e6;
      for (var q = 0; q < r.n; q++, j++) {
        us += d[q]; B[j + 1] = us / 1e6; K[j] = k[q];
        if (sd[q] === STEP_NONE) S[j] = -1; else { prev += sd[q]; S[j] = prev; }
      }
    });
    return {B: B, K: K, S: S, n: n};
  }

  function decodeSteps(buf, meta) {
    var xd = view(buf, meta, 'sx'), n = xd.length, X = new Float64Array(n), x = 0;
    for (var i = 0; i < n; i++) { x += xd[i]; X[i] = x; }
    return {X: X, T: view(buf, meta, 'st'), A: view(buf, meta, 'sa'),
            K: view(buf, meta, 'sk'), n: n};
  }

  function decodeHeat(buf, meta) {
    if (!meta.heat) return null;
    var out = {};
    ['hr', 'hrr', 'hrh', 'hl', 'hlr', 'hlh', 'er', 'el', 'ek', 'eh'].forEach(function (k) {
      out[k] = view(buf, meta, k);
    });
    return out;
  }

  function attemptAt(job, x) {  // index of the attempt running (or recovering) at x
    var A = job.meta.attempts, lo = 0, hi = A.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (A[m].t0 <= x) lo = m + 1; else hi = m; }
    return Math.max(0, lo - 1);
  }

  function hostName(heat, h) { return h >= 0 ? ' ' + heat.hosts[h] : ''; }

  // ---- timeline: lanes ----------------------------------------------------------------
  function timelineTraces(job, x0, x1, px) {
    var names = job.meta.names, nb = names.length, w = (x1 - x0) / px * MIN_PX;
    tDigits = Math.min(6, Math.max(3, Math.ceil(-Math.log10(w)) + 1));
    var bars = names.map(function () {
      return {base: [], x: [], y: [], width: [], offset: [], text: []};
    });
    var laneOf = new Int32Array(nb).fill(-1), lanes = [newLane(0, false)];
    job.meta.lanes.forEach(function (l, j) {
      l.buckets.forEach(function (k) { laneOf[k] = j + 1; });
      lanes.push(newLane(-(j + 1), true));
    });
    function newLane(y, group) {
      return {y: y, group: group, comp: new Float64Array(nb), runStart: -1, runEnd: 0,
              slo: -1, shi: -1, cnt: 0, last: null};
    }
    function push(L, start, len, k, text, agg, s, frac, below) {
      var b = bars[k], last = L.last;
      if (frac === undefined) { frac = 1; below = 0; }
      if (last && last.k === k && agg && frac === 1 && last.agg &&
          Math.abs(last.end - start) < 1e-9) {  // touching stretches of one bucket: one bar
        b.x[last.i] += len; last.end = start + len;
        if (s[0] >= 0) { last.slo = last.slo < 0 ? s[0] : last.slo; last.shi = s[1]; }
        b.text[last.i] = names[k] + ' · ' + fmt(b.x[last.i]) + stepsText(last.slo, last.shi) +
          '<br>' + at(b.base[last.i]) + ' – ' + at(last.end);
        return;
      }
      b.base.push(start); b.x.push(len); b.y.push(L.y); b.width.push(BAR * frac);
      b.offset.push(-BAR / 2 + BAR * below); b.text.push(text);
      L.last = {k: k, agg: agg, end: start + len, i: b.x.length - 1, slo: s[0], shi: s[1]};
    }
    // a stretch of narrow segments: a column split by each bucket's share of it
    function flush(L) {
      if (L.runStart < 0) return;
      var parts = [], tot = L.runEnd - L.runStart, filled = 0, lines = [], comp = L.comp;
      for (var k = 0; k < nb; k++) if (comp[k] > 0) { parts.push(k); filled += comp[k]; }
      parts.slice().sort(function (a, b) { return comp[b] - comp[a]; }).forEach(function (k) {
        lines.push(names[k] + ' ' + (100 * comp[k] / tot).toFixed(1) + ' %');
      });
      var steps = stepsText(L.slo, L.shi);
      if (parts.length === 1 && filled >= tot * (1 - 1e-9)) {
        push(L, L.runStart, tot, parts[0], names[parts[0]] + ' · ' + fmt(tot) + steps +
             '<br>' + at(L.runStart) + ' – ' + at(L.runEnd), true, [L.slo, L.shi]);
      } else {
        var text = at(L.runStart) + ' – ' + at(L.runEnd) + ' (' + L.cnt + ' segments' + steps +
          ')<br>' + lines.join('<br>'), scale = 1 / tot, below = 0;
        if (L.group && filled * scale < MIN_SHARE) scale = MIN_SHARE / filled;
        parts.forEach(function (k) {
          push(L, L.runStart, tot, k, text, false, [-1, -1], comp[k] * scale, below);
          below += comp[k] * scale;
        });
        L.last = null;
      }
      comp.fill(0); L.runStart = -1; L.slo = L.shi = -1; L.cnt = 0;
    }
    function feed(L, s, e, k, st, i) {
      var len = e - s;
      if (L.runStart >= 0 && s - L.runEnd >= w) flush(L);  // a gap as wide as a stretch
      if (len >= w) {
        flush(L);
        push(L, s, len, k, segText(job, i, len), false, [st, st]);
        return;
      }
      if (L.runStart < 0) L.runStart = s;
      L.comp[k] += len; L.runEnd = e; L.cnt++;
      if (st >= 0) { if (L.slo < 0 || st < L.slo) L.slo = st; if (st > L.shi) L.shi = st; }
      if (L.runEnd - L.runStart >= w) flush(L);
    }
    var B = job.B, K = job.K, S = job.S, n = job.n;
    for (var i = Math.max(0, upper(B, x0, 0, n + 1) - 1); i < n && B[i] < x1; i++) {
      if (B[i + 1] <= B[i]) continue;
      feed(lanes[0], B[i], B[i + 1], K[i], S[i], i);
      if (laneOf[K[i]] > 0) feed(lanes[laneOf[K[i]]], B[i], B[i + 1], K[i], S[i], i);
    }
    lanes.forEach(flush);
    var present = job.meta.present, traces = [];
    names.forEach(function (name, k) {
      if (present.indexOf(name) < 0) return;
      var b = bars[k];
      traces.push({type: 'bar', orientation: 'h', name: name, base: b.base, x: b.x, y: b.y,
                   width: b.width, offset: b.offset, hovertext: b.text, hoverinfo: 'text',
                   marker: {color: job.meta.colors[name], line: {width: 0}}, showlegend: true});
    });
    traces.push(restartTrace(job));
    return traces;
  }

  function restartTrace(job) {
    var A = job.meta.attempts, t = {type: 'scatter', mode: 'markers', name: 'restart',
      x: [], y: [], hovertext: [], hoverinfo: 'text', showlegend: false, cliponaxis: false,
      marker: {symbol: 'triangle-down', size: 10, color: '#222',
               line: {color: '#fff', width: 1}}};
    for (var i = 1; i < A.length; i++) {
      t.x.push(A[i].t0); t.y.push(BAR / 2 + 0.15); t.hovertext.push(A[i].hover);
    }
    return t;
  }

  function stepsText(lo, hi) {
    if (lo < 0) return '';
    return lo === hi ? ' · step ' + lo : ' · steps ' + lo + '–' + hi;
  }

  function segText(job, i, len) {
    var k = job.K[i], s = job.S[i], name = job.meta.names[k];
    var t = name + ' · ' + fmt(len) + '<br>' + at(job.B[i]) + ' – ' + at(job.B[i + 1]);
    if (s >= 0) {
      t += '<br>step ' + s;
      var st = job.steps, j = st ? lowerX(st.X, s) : -1;
      if (j >= 0 && j < st.n && st.X[j] === s && (name === 'productive' ||
          name === 'training_slowdown')) {
        t += ' · step time ' + fmt(st.T[j] / 1e3) + (st.K[j] ? ' (anomalous)' : '');
      }
    }
    return t + '<br>attempt ' + job.meta.attempts[attemptAt(job, job.B[i])].n;
  }

  function heatImage(job, x0, x1) {
    var heat = job.meta.heat, total = job.meta.total_s;
    if (!heat || !heat.rows || !(total > 0)) return [];
    var C = heat.bins, bw = total / C;
    var c0 = Math.min(C - 1, Math.max(0, Math.floor(x0 / bw)));
    var c1 = Math.min(C, Math.max(c0 + 1, Math.ceil(x1 / bw)));
    var codes = job.heat[job.mode === 'ratio' ? 'hr' : 'hl'];
    return [{source: H.image(codes, heat.rows, C, c0, c1), xref: 'x', yref: 'y', x: c0 * bw,
             y: job.heatTop, sizex: (c1 - c0) * bw, sizey: HEAT_LANES, sizing: 'stretch',
             xanchor: 'left', yanchor: 'top', layer: 'above'}];
  }

  function timelineLayout(job, range) {
    var meta = job.meta, L = 1 + meta.lanes.length, tv = [0], tt = ['job'];
    meta.lanes.forEach(function (l, j) { tv.push(-(j + 1)); tt.push(l.name); });
    var ymin = -(L - 1) - 0.5;
    job.heatTop = null;
    if (meta.heat && meta.heat.rows) {
      job.heatTop = ymin - 0.2;
      ymin = job.heatTop - HEAT_LANES;
      tv.push(job.heatTop - HEAT_LANES / 2);
      tt.push('processes<br>p0' + (meta.heat.ranks > 1 ? '–p' + (meta.heat.ranks - 1) : ''));
    }
    var ymax = BAR / 2 + 0.35;
    return {title: {text: 'Timeline', x: 0, y: 0.99, yanchor: 'top'},
            barmode: 'overlay', bargap: 0, hovermode: 'closest', uirevision: 'tl',
            height: 120 + LANE_PX * (ymax - ymin), images: heatImage(job, range[0], range[1]),
            margin: {l: 110, r: 20, t: 80, b: 45},
            legend: {orientation: 'h', y: 1.0, yanchor: 'bottom', x: 0},
            xaxis: {title: {text: 'seconds since job start'}, range: range, autorange: false,
                    zeroline: false},
            yaxis: {range: [ymin - 0.05, ymax], fixedrange: true, tickvals: tv, ticktext: tt,
                    zeroline: false, showgrid: false}};
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
    var full = [0, job.meta.total_s || 1];
    job.range = full.slice();
    job.redraw = function () {
      var layout = timelineLayout(job, job.range.slice());  // sets job.heatTop first
      return Plotly.react(gd, timelineTraces(job, job.range[0], job.range[1], plotWidth(gd)),
                          layout, CONFIG);
    };
    await Plotly.newPlot(gd, [], timelineLayout(job, job.range.slice()), CONFIG);
    await job.redraw();
    gd.on('plotly_relayout', function (ev) {
      var r = rangeOf(ev, full);
      if (!r) return;
      job.range = r;
      gd.gpDrawn = job.redraw();  // a promise, for whoever waits for the redraw (tests)
      others.forEach(function (o) {
        if (o && o.data) Plotly.relayout(o, {'xaxis.range': r.slice()});
      });
    });
    gd.on('plotly_click', function (ev) {
      if (!job.heat || !ev.points || !ev.points.length) return;
      var pt = ev.points[0], d = pt.data, x;
      if (d.type === 'scatter') x = pt.x;  // a restart marker: the attempt starting there
      else x = d.base[pt.pointIndex] + d.x[pt.pointIndex] / 2;
      expand(job, attemptAt(job, x));
    });
    gd.addEventListener('mousemove', function (ev) { H.showTip(ev, stripTip(job, gd, ev)); });
    gd.addEventListener('mouseleave', function (ev) { H.showTip(ev, null); });
  }

  function stripTip(job, gd, ev) {
    var heat = job.meta.heat, p = H.dataAt(gd, ev);
    if (!heat || job.heatTop === null || !p || p.y > job.heatTop ||
        p.y < job.heatTop - HEAT_LANES) return null;
    var g = Math.min(heat.rows - 1, Math.floor((job.heatTop - p.y) / HEAT_LANES * heat.rows));
    var C = heat.bins, bw = job.meta.total_s / C;
    var c = Math.min(C - 1, Math.max(0, Math.floor(p.x / bw))), idx = g * C + c;
    var m = job.mode === 'ratio' ? 'hr' : 'hl', code = job.heat[m][idx];
    var a = job.meta.attempts[attemptAt(job, (c + 0.5) * bw)];
    var text = 'ranks ' + H.rowRanks(heat, g) + ' · ' + at(c * bw) + ' – ' + at((c + 1) * bw) +
      ' · attempt ' + a.n + '<br>';
    if (!code) return text + 'no step';
    return text + 'worst: p' + job.heat[m + 'r'][idx] + hostName(heat, job.heat[m + 'h'][idx]) +
      ' · ' + H.describe(heat, job.mode, code) + '<br>click the job\'s lane to expand an attempt';
  }

  // ---- one attempt's processes, on demand -------------------------------------------------
  function expand(job, i) {
    var heat = job.meta.heat, e = heat.expand, a = job.meta.attempts[i];
    var off = e.attempts[i][0], nrows = e.attempts[i][1], present = e.attempts[i][2];
    var Ca = e.bins, box = document.getElementById('gp-procbox-' + job.index);
    var gd = document.getElementById('gp-procs-' + job.index);
    job.expanded = i;
    box.hidden = false;
    document.getElementById('gp-expand-sel-' + job.index).value = String(i);
    document.getElementById('gp-collapse-btn-' + job.index).hidden = false;
    document.getElementById('gp-procs-info-' + job.index).textContent =
      'Attempt ' + a.n + ': +' + fmt(a.t0) + ' to +' + fmt(a.t1) + ', ended ' + a.end + '; ' +
      (nrows < present ? 'the ' + nrows + ' of ' + present + ' processes with the highest ' +
       'step time or lag, in rank order' : 'all ' + present + ' processes') +
      ' (' + Ca + ' time bins). Missing: ' + a.missing + '; late: ' + a.late +
      '; gone early: ' + a.early + '.';
    var codes = job.heat[job.mode === 'ratio' ? 'er' : 'el'].subarray(off * Ca,
                                                                     (off + nrows) * Ca);
    var rowPx = Math.max(3, Math.min(16, Math.floor(640 / Math.max(1, nrows))));
    var every = Math.max(1, Math.ceil(nrows / 40)), tv = [], tt = [];
    for (var r = 0; r < nrows; r += every) {
      tv.push(-r - 0.5); tt.push('p' + job.heat.ek[off + r] + hostName(heat, job.heat.eh[off + r]));
    }
    job.expandInfo = {off: off, nrows: nrows, Ca: Ca, t0: a.t0, t1: a.t1, n: a.n};
    var span = Math.max(a.t1 - a.t0, 1e-9);
    return Plotly.react(gd, [], {
      title: {text: 'Processes of attempt ' + a.n + ' (' +
              (job.mode === 'ratio' ? 'step time' : 'start lag') + ')', x: 0},
      height: 90 + Math.max(1, nrows) * rowPx, margin: {l: 130, r: 20, t: 40, b: 45},
      showlegend: false,
      xaxis: {title: {text: 'seconds since job start'}, range: [a.t0, a.t0 + span],
              zeroline: false},
      yaxis: {range: [-Math.max(1, nrows), 0], fixedrange: true, tickvals: tv, ticktext: tt,
              zeroline: false, showgrid: false},
      images: nrows ? [{source: H.image(codes, nrows, Ca, 0, Ca), xref: 'x', yref: 'y',
                        x: a.t0, y: 0, sizex: span, sizey: nrows, sizing: 'stretch',
                        xanchor: 'left', yanchor: 'top', layer: 'above'}] : []}, CONFIG);
  }

  function procsTip(job, gd, ev) {
    var p = H.dataAt(gd, ev), x = job.expandInfo, heat = job.meta.heat;
    if (!p || !x || !x.nrows || p.y > 0 || p.y < -x.nrows) return null;
    var r = Math.min(x.nrows - 1, Math.floor(-p.y));
    var c = Math.min(x.Ca - 1, Math.max(0, Math.floor((p.x - x.t0) / (x.t1 - x.t0) * x.Ca)));
    var code = job.heat[job.mode === 'ratio' ? 'er' : 'el'][(x.off + r) * x.Ca + c];
    var bw = (x.t1 - x.t0) / x.Ca;
    return 'p' + job.heat.ek[x.off + r] + hostName(heat, job.heat.eh[x.off + r]) +
      ' · attempt ' + x.n + ' · ' + at(x.t0 + c * bw) + ' – ' + at(x.t0 + (c + 1) * bw) +
      '<br>' + H.describe(heat, job.mode, code);
  }

  function setupProcs(job) {
    var i = job.index, heat = job.meta.heat;
    if (!heat) return;
    var sel = document.getElementById('gp-expand-sel-' + i);
    var gd = document.getElementById('gp-procs-' + i);
    job.meta.attempts.forEach(function (a, j) {
      var o = document.createElement('option');
      o.value = String(j);
      o.textContent = 'attempt ' + a.n + ' (+' + fmt(a.t0) + ', ' + a.procs + ' processes' +
        (a.nmissing ? ', ' + a.nmissing + ' missing' : '') + ')';
      sel.appendChild(o);
    });
    document.getElementById('gp-expand-btn-' + i).addEventListener('click', function () {
      expand(job, +sel.value);
    });
    document.getElementById('gp-collapse-btn-' + i).addEventListener('click', function () {
      document.getElementById('gp-procbox-' + i).hidden = true;
      this.hidden = true;
      job.expanded = null;
      Plotly.purge(gd);
    });
    var scale = document.getElementById('gp-scale-' + i);
    scale.innerHTML = H.scaleHtml(heat, job.mode);
    document.querySelectorAll('#gp-heatctl-' + i + ' button[data-mode]').forEach(function (b) {
      b.addEventListener('click', function () {
        job.mode = b.dataset.mode;
        document.querySelectorAll('#gp-heatctl-' + i + ' button[data-mode]').forEach(
          function (o) { o.classList.toggle('on', o === b); });
        scale.innerHTML = H.scaleHtml(heat, job.mode);
        job.redraw();
        if (job.expanded !== null) expand(job, job.expanded);
      });
    });
    gd.addEventListener('mousemove', function (ev) { H.showTip(ev, procsTip(job, gd, ev)); });
    gd.addEventListener('mouseleave', function (ev) { H.showTip(ev, null); });
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
                    '; dashed red: anomalous above)', font: {size: 14}},
            height: 320, uirevision: 'st', hovermode: 'closest', shapes: shapes,
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

  async function drawStatic(job, kind, fig) {
    var gd = document.getElementById('gp-' + kind + '-' + job.index);
    if (!fig) { gd.innerHTML = '<div class="gp-empty">No data.</div>'; return null; }
    await Plotly.newPlot(gd, fig.data, fig.layout, CONFIG);
    return gd;
  }

  async function main() {
    for (var i = 0; i < META.length; i++) {
      var meta = META[i], buf = await blob(i), job = decodeJob(buf, meta);
      job.index = i; job.meta = meta; job.mode = 'ratio'; job.expanded = null;
      job.steps = decodeSteps(buf, meta);
      job.heat = decodeHeat(buf, meta);
      var ot = window.GPCharts.overTime(job);
      var g = await drawStatic(job, 'goodput', window.GPCharts.goodputFigure(ot));
      var b = await drawStatic(job, 'buckets', window.GPCharts.bucketsFigure(ot, meta));
      await drawStatic(job, 'histogram', meta.figures.histogram);
      await drawTimeline(job, [g, b]);
      await drawSteps(job);
      setupProcs(job);
    }
    performance.mark('gp-charts-drawn');
    document.body.setAttribute('data-gp-ready', '1');
  }

  main().catch(fail);
})();
