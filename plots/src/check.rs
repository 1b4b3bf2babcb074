//! The figure check a browser runs: every text of every SVG on a page as the browser lays it
//! out (its box from `getBBox`, through its transform), every drawn data line (an element with
//! a `data-own` attribute: roofs, ridge and label leaders, drop lines, trajectories, curves),
//! and what a reader would call unfit for a report: two texts overlapping, a text crossed by a
//! line that is not its own (a label's `data-own` names what it belongs to), a text smaller
//! than [`MIN_FONT_PX`]. The result goes into attributes of `<body>` (`data-texts`,
//! `data-overlaps`, `data-crossed`, `data-small`, `data-detail`) for headless tests
//! (`chromium --dump-dom`); the interactive page runs it under `#selftest`.

/// The smallest font, in pixels of the figure at its own size, a text may have.
pub const MIN_FONT_PX: f64 = 12.0;

/// The script (plain JavaScript, no library): `figureCheck()` writes the attributes.
pub const SCRIPT: &str = r#"
function figureCheck() {
  const quadOf = (t) => {
    const b = t.getBBox(), m = t.getCTM();
    const fs = parseFloat(getComputedStyle(t).fontSize) || 10;
    // The glyphs' band, not the font's whole line box: cap height above the baseline,
    // descenders below (the box getBBox gives runs 0.93 em up and 0.24 em down).
    const y0 = b.y + 0.18 * fs, y1 = b.y + b.height - 0.06 * fs;
    const pt = (x, y) => ({x: m.a * x + m.c * y + m.e, y: m.b * x + m.d * y + m.f});
    return [pt(b.x, y0), pt(b.x + b.width, y0), pt(b.x + b.width, y1), pt(b.x, y1)];
  };
  const proj = (ps, ax) => {
    let lo = Infinity, hi = -Infinity;
    for (const p of ps) { const d = p.x * ax.x + p.y * ax.y; lo = Math.min(lo, d); hi = Math.max(hi, d); }
    return [lo, hi];
  };
  const axesOf = (ps) => {
    const out = [];
    for (let i = 0; i + 1 < ps.length && i < 2; i++) {
      const ex = ps[i + 1].x - ps[i].x, ey = ps[i + 1].y - ps[i].y, n = Math.hypot(ex, ey);
      if (n > 1e-9) out.push({x: -ey / n, y: ex / n});
    }
    return out;
  };
  // Separating axes: two convex shapes (a quad, or a segment as two points) meet when no axis
  // separates them by more than `margin` pixels.
  const meet = (a, b, margin) => {
    let axes = axesOf(a).concat(axesOf(b));
    if (b.length === 2) {
      const ex = b[1].x - b[0].x, ey = b[1].y - b[0].y, n = Math.hypot(ex, ey);
      if (n < 1e-9) return false;
      axes.push({x: ex / n, y: ey / n});
    }
    return axes.every(ax => {
      const [a0, a1] = proj(a, ax), [b0, b1] = proj(b, ax);
      return a1 > b0 + margin && b1 > a0 + margin;
    });
  };
  const visible = (e) => {
    for (let p = e; p && p.nodeType === 1; p = p.parentNode)
      if (getComputedStyle(p).display === 'none') return false;
    return true;
  };
  const texts = [...document.querySelectorAll('svg text')]
    .map(t => ({t, name: [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.data).join('').trim()}))
    .filter(x => x.name && visible(x.t))
    .map(({t, name}) => ({t, name, own: t.getAttribute('data-own'), q: quadOf(t),
                fs: parseFloat(getComputedStyle(t).fontSize)}));
  const lines = [];
  document.querySelectorAll('svg [data-own]').forEach(e => {
    if (!visible(e)) return;
    const m = e.getCTM(), own = e.getAttribute('data-own');
    const pt = (x, y) => ({x: m.a * x + m.c * y + m.e, y: m.b * x + m.d * y + m.f});
    let ps = [];
    if (e.tagName === 'line') {
      const g = (k) => parseFloat(e.getAttribute(k));
      ps = [pt(g('x1'), g('y1')), pt(g('x2'), g('y2'))];
    } else if (e.tagName === 'polyline') {
      const v = e.getAttribute('points').trim().split(/[\s,]+/).map(parseFloat);
      for (let i = 0; i + 1 < v.length; i += 2) ps.push(pt(v[i], v[i + 1]));
    } else return;
    for (let i = 0; i + 1 < ps.length; i++) lines.push({own, seg: [ps[i], ps[i + 1]]});
  });
  const detail = [];
  let overlaps = 0, crossed = 0, small = 0;
  for (let i = 0; i < texts.length; i++) {
    for (let j = i + 1; j < texts.length; j++) {
      const a = texts[i], b = texts[j];
      if (a.name === b.name && Math.abs(a.q[0].x - b.q[0].x) < 0.5 && Math.abs(a.q[0].y - b.q[0].y) < 0.5) continue;
      if (meet(a.q, b.q, 0.5)) { overlaps++; detail.push('overlap: "' + a.name + '" / "' + b.name + '"'); }
    }
    const a = texts[i];
    const by = new Set();
    for (const l of lines)
      if (l.own !== a.own && !by.has(l.own) && meet(a.q, l.seg, 0.5)) { by.add(l.own); crossed++; detail.push('crossed: "' + a.name + '" by ' + l.own); }
    if (a.fs < MIN_FONT - 0.01) { small++; detail.push('small: "' + a.name + '" ' + a.fs + 'px'); }
  }
  const d = document.body.dataset;
  d.texts = String(texts.length);
  d.overlaps = String(overlaps);
  d.crossed = String(crossed);
  d.small = String(small);
  d.detail = detail.join(' | ');
}
"#;

/// The script with the minimum font size filled in.
pub fn script() -> String {
    format!("const MIN_FONT = {MIN_FONT_PX};\n{SCRIPT}")
}

/// A page that runs the check on `doc` (an SVG figure, or an HTML page holding figures) when
/// it loads.
pub fn page(doc: &str) -> String {
    // An interactive page carries the script already (its `#selftest`): only the call.
    let run = if doc.contains(&script()) {
        "<script>figureCheck();</script>".to_string()
    } else {
        format!("<script>{}\nfigureCheck();</script>", script())
    };
    if let Some(i) = doc.rfind("</body>") {
        let mut s = doc.to_string();
        s.insert_str(i, &run);
        s
    } else {
        let svg = doc.find("<svg").map_or(doc, |i| &doc[i..]);
        format!("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head><body style=\"margin:0\">{svg}{run}</body></html>\n")
    }
}

/// What the check found, read back from a dumped DOM's `<body>` tag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub texts: usize,
    pub overlaps: usize,
    pub crossed: usize,
    pub small: usize,
    pub detail: String,
}

impl Found {
    /// Reads the attributes `figureCheck` wrote; None when the body has none (the script did
    /// not run).
    pub fn from_dom(dom: &str) -> Option<Found> {
        let i = dom.find("<body")?;
        let body = &dom[i..i + dom[i..].find('>')?];
        let attr = |k: &str| -> Option<String> {
            let key = format!(" data-{k}=\"");
            let j = body.find(&key)? + key.len();
            Some(body[j..].split('"').next()?.to_string())
        };
        let n = |k: &str| attr(k).and_then(|v| v.parse().ok());
        Some(Found {
            texts: n("texts")?,
            overlaps: n("overlaps")?,
            crossed: n("crossed")?,
            small: n("small")?,
            detail: attr("detail")
                .unwrap_or_default()
                .replace("&quot;", "\"")
                .replace("&amp;", "&"),
        })
    }

    /// Nothing unfit.
    pub fn clean(&self) -> bool {
        self.overlaps == 0 && self.crossed == 0 && self.small == 0
    }
}
