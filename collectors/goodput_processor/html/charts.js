/* goodput HTML report: goodput and each bucket's share over time, computed here from the
 * job's painted segments (data.over_time in Python is the reference: same instants, same
 * windows), and their Plotly figures. Used by report.js through window.GPCharts. */
(function () {
  'use strict';
  var POINTS = 600;

  // time (s) of each bucket in [0, t] for each instant of ts (ascending): Float64Array(ts x nb)
  function cumulative(job, ts, nb) {
    var B = job.B, K = job.K, n = job.n, out = new Float64Array(ts.length * nb);
    var acc = new Float64Array(nb), i = 0;
    for (var j = 0; j < ts.length; j++) {
      var t = ts[j];
      while (i < n && B[i + 1] <= t) { acc[K[i]] += B[i + 1] - B[i]; i++; }
      for (var k = 0; k < nb; k++) out[j * nb + k] = acc[k];
      if (i < n && B[i] < t) out[j * nb + K[i]] += t - B[i];
    }
    return out;
  }

  // {t, modes: [{label, share: {name: [%]}}]}: cumulative, then each rolling window
  function overTime(job) {
    var meta = job.meta, names = meta.names, nb = names.length, total = meta.total_s;
    var ts = [], out = {t: [], modes: []};
    if (!(total > 0)) return out;
    for (var j = 1; j <= POINTS; j++) ts.push(total * j / POINTS);
    out.t = ts.map(function (t) { return +t.toFixed(6); });
    var cum = cumulative(job, ts, nb), idx = meta.present.map(function (n) {
      return names.indexOf(n);
    });
    function mode(label, lo, cumLo) {
      var share = {};
      idx.forEach(function (k) {
        share[names[k]] = ts.map(function (t, j) {
          var d = t - lo[j];
          return d > 0 ? 100 * (cum[j * nb + k] - (cumLo ? cumLo[j * nb + k] : 0)) / d : 0;
        });
      });
      return {label: label, share: share};
    }
    out.modes.push(mode('cumulative', ts.map(function () { return 0; }), null));
    meta.windows.forEach(function (w) {
      var lo = ts.map(function (t) { return Math.max(0, t - w.s); });
      out.modes.push(mode(w.label, lo, cumulative(job, lo, nb)));
    });
    return out;
  }

  var MARGIN = {l: 60, r: 20, t: 40, b: 50};

  function goodputFigure(ot) {
    if (!ot.t.length) return null;
    var data = ot.modes.map(function (m, i) {
      return {type: 'scatter', mode: 'lines', x: ot.t, y: m.share.productive || ot.t.map(
        function () { return 0; }), name: m.label, line: {width: i === 0 ? 2 : 1.2},
        hovertemplate: '%{x:.3f} s: %{y:.2f} %<extra>' + m.label + '</extra>'};
    });
    return {data: data, layout: {
      title: {text: 'Goodput over time', font: {size: 14}}, height: 330, margin: MARGIN,
      xaxis: {title: {text: 'seconds since job start'}},
      yaxis: {title: {text: 'goodput (%)'}}, legend: {orientation: 'h', y: -0.25}}};
  }

  function bucketsFigure(ot, meta) {
    if (!ot.t.length) return null;
    var data = [], buttons = [], present = meta.present;
    ot.modes.forEach(function (m, i) {
      present.forEach(function (n) {
        var c = meta.colors[n];
        data.push({type: 'scatter', mode: 'lines', x: ot.t, y: m.share[n], name: n,
                   stackgroup: 's' + i, visible: i === 0, legendgroup: n, showlegend: true,
                   fillcolor: c, line: {width: 0.5, color: c},
                   hovertemplate: '%{y:.2f} %<extra>' + n + '</extra>'});
      });
      var vis = [];
      ot.modes.forEach(function (_, j) { present.forEach(function () { vis.push(j === i); }); });
      buttons.push({label: m.label, method: 'restyle', args: [{visible: vis}]});
    });
    return {data: data, layout: {
      title: {text: 'Share of each bucket over time', font: {size: 14}}, height: 330,
      margin: MARGIN, hovermode: 'x unified', legend: {font: {size: 10}},
      xaxis: {title: {text: 'seconds since job start'}},
      yaxis: {title: {text: '% of time'}, range: [0, 100]},
      updatemenus: [{type: 'buttons', direction: 'right', x: 1, xanchor: 'right', y: 1.18,
                     buttons: buttons, showactive: true}]}};
  }

  window.GPCharts = {overTime: overTime, goodputFigure: goodputFigure,
                     bucketsFigure: bucketsFigure};
})();
