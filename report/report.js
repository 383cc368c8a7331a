// The run report's script (tripod report): hover read-outs on the charts; embedded in the page
// when tripod is built.
(function () {
  var el = document.getElementById('report-data');
  var R = el ? JSON.parse(el.textContent) : {charts: {}};
  function si(v) {
    var a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toPrecision(4) + 'G';
    if (a >= 1e6) return (v / 1e6).toPrecision(4) + 'M';
    if (a >= 1e3) return (v / 1e3).toPrecision(4) + 'k';
    return v.toPrecision(4);
  }
  var fmts = {
    plain: function (v) { return Math.abs(v) >= 1e5 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : String(+v.toPrecision(5)); },
    si: si,
    pct: function (v) { return (100 * v).toPrecision(3) + '%'; },
    sci: function (v) { return v.toExponential(3); }
  };
  function nearest(xs, x) {
    var lo = 0, hi = xs.length - 1;
    if (hi < 0) return -1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] <= x) lo = mid; else hi = mid; }
    return Math.abs(xs[hi] - x) < Math.abs(xs[lo] - x) ? hi : lo;
  }
  var charts = document.querySelectorAll('svg.chart[data-chart]');
  Array.prototype.forEach.call(charts, function (svg) {
    var c = R.charts[svg.getAttribute('data-chart')];
    var cur = svg.querySelector('.cursor');
    var out = document.getElementById('readout-' + svg.getAttribute('data-chart'));
    if (!c || !cur || !out) return;
    var f = fmts[c.fmt] || fmts.plain;
    svg.addEventListener('mousemove', function (ev) {
      var m = svg.getScreenCTM();
      if (!m) return;
      var p = new DOMPoint(ev.clientX, ev.clientY).matrixTransform(m.inverse());
      var t = (p.x - c.px[0]) / (c.px[1] - c.px[0]);
      if (t < -0.03 || t > 1.03) return;
      var x = c.dom[0] + t * (c.dom[1] - c.dom[0]), best = null;
      c.series.forEach(function (s) {
        var i = nearest(s.x, x);
        if (i >= 0 && (best === null || Math.abs(s.x[i] - x) < Math.abs(best - x))) best = s.x[i];
      });
      if (best === null) return;
      var parts = [];
      c.series.forEach(function (s) {
        var i = nearest(s.x, best);
        if (i >= 0 && s.x[i] === best) parts.push(s.n + ' ' + (s.y[i] === null ? 'n/a' : f(s.y[i])));
      });
      var X = c.px[0] + (best - c.dom[0]) / (c.dom[1] - c.dom[0]) * (c.px[1] - c.px[0]);
      cur.setAttribute('x1', X); cur.setAttribute('x2', X); cur.setAttribute('visibility', 'visible');
      out.textContent = 'step ' + best + ':  ' + parts.join('   \u00b7   ');
    });
    svg.addEventListener('mouseleave', function () {
      cur.setAttribute('visibility', 'hidden');
      out.textContent = out.getAttribute('data-hint');
    });
  });
  document.documentElement.setAttribute('data-ready', String(charts.length));
})();
