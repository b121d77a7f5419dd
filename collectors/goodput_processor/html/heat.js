/* goodput HTML report: the processes' heat strip and the expanded attempt (heat.py codes).
 * Codes (uint8) become pixels of a canvas, shown as a Plotly layout image stretched over the
 * time axis; a tooltip follows the mouse over it. Used by report.js through window.GPHeat. */
(function () {
  'use strict';
  // code 1 (at the ideal / no lag) .. 255 (2x the ideal / a whole step late); 0: no step.
  // Up to 0.07 (5 % slower than the ideal: the accounting's noise floor) stays pale.
  var STOPS = [[0, [232, 245, 224]], [0.07, [236, 246, 222]], [0.15, [255, 255, 178]],
               [0.35, [254, 204, 92]],
               [0.6, [253, 141, 60]], [0.8, [240, 59, 32]], [1, [189, 0, 38]]];
  var LUT = (function () {
    var lut = new Uint8ClampedArray(256 * 4);
    for (var c = 1; c < 256; c++) {
      var t = (c - 1) / 254, j = 1;
      while (j < STOPS.length - 1 && STOPS[j][0] < t) j++;
      var a = STOPS[j - 1], b = STOPS[j], f = (t - a[0]) / (b[0] - a[0] || 1);
      for (var ch = 0; ch < 3; ch++) lut[c * 4 + ch] = a[1][ch] + f * (b[1][ch] - a[1][ch]);
      lut[c * 4 + 3] = 255;
    }
    return lut;  // code 0 stays transparent
  })();

  function gradient() {
    return 'linear-gradient(to right,' + STOPS.map(function (s) {
      return 'rgb(' + s[1].join(',') + ') ' + (s[0] * 100) + '%';
    }).join(',') + ')';
  }

  // codes[row * stride + col] for cols [c0, c1) -> a PNG data URL (one pixel per cell)
  function image(codes, rows, stride, c0, c1) {
    var w = Math.max(1, c1 - c0), h = Math.max(1, rows);
    var canvas = document.createElement('canvas');
    canvas.width = w; canvas.height = h;
    var ctx = canvas.getContext('2d'), img = ctx.createImageData(w, h), px = img.data;
    for (var r = 0; r < rows; r++) {
      for (var c = c0; c < c1; c++) {
        var k = codes[r * stride + c] * 4, o = (r * w + c - c0) * 4;
        px[o] = LUT[k]; px[o + 1] = LUT[k + 1]; px[o + 2] = LUT[k + 2]; px[o + 3] = LUT[k + 3];
      }
    }
    ctx.putImageData(img, 0, 0);
    return canvas.toDataURL('image/png');
  }

  // what a code means, for the tooltip and the scale
  function describe(heat, mode, code) {
    if (!code) return 'no step';
    var t = (code - 1) / 254;
    if (mode === 'ratio') {
      var r = Math.pow(heat.ratio_max, t);
      return 'step time ' + (code >= 255 ? '\u2265 ' : '') + r.toFixed(2) + '\u00d7 ideal (' +
        (r * heat.ideal_ms / 1e3).toFixed(3) + ' s)';
    }
    var lag = t * heat.lag_max * heat.ideal_ms / 1e3;
    return 'start lag ' + (code >= 255 ? '\u2265 ' : '') + lag.toFixed(3) + ' s behind the median';
  }

  function scaleHtml(heat, mode) {
    var lo = mode === 'ratio' ? '\u2264 1\u00d7 ideal step' : 'no lag';
    var hi = mode === 'ratio' ? '\u2265 ' + heat.ratio_max + '\u00d7' :
      '\u2265 ' + (heat.lag_max * heat.ideal_ms / 1e3).toFixed(3) + ' s late';
    return lo + ' <span class="bar" style="background:' + gradient() + '"></span> ' + hi +
      ' <span class="none"></span> no step';
  }

  var tip = null;
  function showTip(ev, html) {
    if (!tip) {
      tip = document.createElement('div');
      tip.className = 'gp-tip';
      document.body.appendChild(tip);
    }
    if (!html) { tip.style.display = 'none'; return; }
    tip.innerHTML = html;
    tip.style.display = 'block';
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + 'px';
    tip.style.top = (ev.clientY + 14) + 'px';
  }

  // mouse position over a Plotly chart in data units, or null outside its plot area
  function dataAt(gd, ev) {
    var fl = gd._fullLayout;
    if (!fl || !fl.xaxis) return null;
    var xa = fl.xaxis, ya = fl.yaxis, rect = gd.getBoundingClientRect();
    var px = ev.clientX - rect.left - xa._offset, py = ev.clientY - rect.top - ya._offset;
    if (px < 0 || py < 0 || px > xa._length || py > ya._length) return null;
    return {x: xa.p2l(px), y: ya.p2l(py)};
  }

  // ranks of strip row g: those r with floor(r * rows / ranks) == g
  function rowRanks(heat, g) {
    var lo = Math.ceil(g * heat.ranks / heat.rows), hi = Math.ceil((g + 1) * heat.ranks / heat.rows) - 1;
    return lo === hi ? 'p' + lo : 'p' + lo + '\u2013p' + hi;
  }

  window.GPHeat = {image: image, describe: describe, scaleHtml: scaleHtml, showTip: showTip,
                   dataAt: dataAt, rowRanks: rowRanks};
})();
