//! The interactive roofline page (`roofline plot … -o roofline.html`): one self-contained HTML
//! file — no network, no external asset — holding the same SVG figure, with a tooltip for every
//! roof, point and label (its id, value, samples, spread, method), a switch for every roof and
//! every placed workload, and a self-check (`#selftest` in the address: it shows the first
//! tooltip, runs the figure check of `crate::check` as the browser lays the figure out —
//! overlapping texts, texts crossed by a line not their own, small fonts — and switches the
//! first roof off, into `data-` attributes of the body, for headless tests).

use crate::labels::esc;

/// The distinct values of `data-<key>` in `svg`, in order of appearance.
fn distinct(svg: &str, key: &str) -> Vec<String> {
    let k = format!("data-{key}=\"");
    let mut out: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find(&k) {
        rest = &rest[i + k.len()..];
        if let Some(v) = rest.split('"').next() {
            if !out.iter().any(|o| o == v) {
                out.push(v.to_string());
            }
        }
    }
    out
}

const SCRIPT: &str = r#"
const tip = document.getElementById('tip');
function show(e, x, y) {
  tip.textContent = e.getAttribute('data-tip');
  tip.hidden = false;
  tip.style.left = (x + 14) + 'px';
  tip.style.top = (y + 14) + 'px';
}
document.querySelectorAll('[data-tip]').forEach(e => {
  e.addEventListener('mouseover', ev => show(e, ev.pageX, ev.pageY));
  e.addEventListener('mousemove', ev => show(e, ev.pageX, ev.pageY));
  e.addEventListener('mouseout', () => { tip.hidden = true; });
});
function members(c) {
  const [k, v] = [c.dataset.key, c.dataset.value];
  return [...document.querySelectorAll('[data-' + k + ']')]
    .filter(e => e.getAttribute('data-' + k) === v);
}
document.querySelectorAll('input[data-key]').forEach(c => {
  c.addEventListener('change', () => {
    members(c).forEach(e => { e.style.display = c.checked ? '' : 'none'; });
  });
});
if (location.hash === '#selftest') {
  const first = document.querySelector('.roof ~ .hit[data-tip], [data-tip]');
  const r = first.getBoundingClientRect();
  first.dispatchEvent(new MouseEvent('mouseover', {bubbles: true, clientX: r.left, clientY: r.top}));
  document.body.dataset.tip = tip.hidden ? '' : tip.textContent;
  figureCheck();
  const c = document.querySelector('input[data-key="roof"]');
  if (c) {
    c.click();
    document.body.dataset.switched = members(c).every(e => e.style.display === 'none') ? c.dataset.value : '';
  }
}
"#;

/// The page for `svg` (a `classic_svg` figure) titled `title`.
pub fn interactive(svg: &str, title: &str) -> String {
    let roofs = distinct(svg, "roof");
    let groups = distinct(svg, "group");
    let switch = |key: &str, v: &str| {
        format!(
            "<label><input type=\"checkbox\" checked data-key=\"{key}\" data-value=\"{}\"> {}</label>\n",
            v,
            v
        )
    };
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str(&format!("<title>{}</title>", esc(title)));
    h.push_str(
        "<style>body{font-family:sans-serif;margin:16px;color:#222}#controls{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:13px;margin:8px 0}#controls fieldset{border:1px solid #ccc}#controls label{white-space:nowrap;display:inline-block;margin-right:8px}#tip{position:absolute;max-width:480px;background:#fffbe6;border:1px solid #999;padding:4px 6px;font-size:12px;pointer-events:none;white-space:pre-wrap}.hit{cursor:help}.point{cursor:help}svg text[data-tip]{cursor:help}</style></head><body>\n",
    );
    h.push_str(&format!(
        "<h1 style=\"font-size:18px\">{}</h1>\n",
        esc(title)
    ));
    h.push_str("<div id=\"controls\">");
    if !groups.is_empty() {
        h.push_str("<fieldset><legend>placed</legend>\n");
        for g in &groups {
            h.push_str(&switch("group", g));
        }
        h.push_str("</fieldset>");
    }
    // A figure without roofs (the link matrix) gets no empty box of switches.
    if !roofs.is_empty() {
        h.push_str("<fieldset><legend>roofs</legend>\n");
        for r in &roofs {
            h.push_str(&switch("roof", r));
        }
        h.push_str("</fieldset>");
    }
    h.push_str("</div>\n<div id=\"figure\">\n");
    // The SVG inline, without its XML prologue.
    h.push_str(
        svg.trim_start_matches(|c| c != '<')
            .trim_start_matches(|c: char| c != '<'),
    );
    h.push_str("\n</div>\n<div id=\"tip\" hidden></div>\n<script>");
    h.push_str(&crate::check::script());
    h.push_str(SCRIPT);
    h.push_str("</script>\n</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_per_roof_and_workload_and_no_external_asset() {
        let svg = "<svg><line data-roof=\"cpu/fma/f32/all\" data-tip=\"a\"/><line data-roof=\"cpu/fma/f32/all\"/><circle data-group=\"resnet50\"/><line data-roof=\"cpu/mem/L1/triad/all\"/></svg>";
        let h = interactive(svg, "t");
        assert_eq!(h.matches("data-key=\"roof\" data-value=").count(), 2);
        assert_eq!(h.matches("data-key=\"group\" data-value=").count(), 1);
        assert!(!h.contains("http") && !h.contains("src="), "self-contained");
        assert!(h.contains("<svg>") && h.contains("id=\"tip\""));
        // A switch and its name never break apart (a label wraps as one).
        assert!(h.contains("#controls label{white-space:nowrap"));
    }
}

/// A configuration value as a reader reads it in a report's table: text as it is, a setting
/// left unset as "not set" (never `null`), yes/no, numbers, lists joined with commas, a table's
/// entries as `key: value` (never raw JSON).
pub fn config_value(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "not set".into(),
        Value::Bool(b) => if *b { "yes" } else { "no" }.into(),
        // A whole number stored as a float (a parameter limit) reads as the whole number.
        Value::Number(n) => match n.as_f64() {
            Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 9e15 => {
                format!("{}", f as i64)
            }
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "none".into(),
        Value::Array(a) => a.iter().map(config_value).collect::<Vec<_>>().join(", "),
        Value::Object(o) if o.is_empty() => "none".into(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| format!("{}: {}", k.replace('_', " "), config_value(v)))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// A configuration key as a reader reads it: words, not an identifier (`budget_s` is
/// "budget (s)", `lr_per_256` "lr per 256").
pub fn config_key(k: &str) -> String {
    match k.strip_suffix("_s") {
        Some(stem) => format!("{} (s)", stem.replace('_', " ")),
        None => k.replace('_', " "),
    }
}

#[cfg(test)]
mod config_tests {
    use super::{config_key, config_value};

    #[test]
    fn keys_and_whole_numbers_read_as_words() {
        assert_eq!(config_key("budget_s"), "budget (s)");
        assert_eq!(config_key("lr_per_256"), "lr per 256");
        assert_eq!(config_key("model"), "model");
        let v = serde_json::json!({"max_parameters": 534128.0, "lr": 0.1, "n": 3});
        assert_eq!(config_value(&v["max_parameters"]), "534128");
        assert_eq!(config_value(&v["lr"]), "0.1");
        assert_eq!(config_value(&v["n"]), "3");
    }

    #[test]
    fn configuration_values_read_as_words() {
        let v = serde_json::json!({"epochs": null, "resume": false, "seeds": [1, 2],
            "tpe": {"batch_sizes": [32, 64], "lr": 0.1}, "name": "r50"});
        let o = v.as_object().unwrap();
        assert_eq!(config_value(&o["epochs"]), "not set");
        assert_eq!(config_value(&o["resume"]), "no");
        assert_eq!(config_value(&o["seeds"]), "1, 2");
        assert_eq!(config_value(&o["tpe"]), "batch sizes: 32, 64; lr: 0.1");
        assert_eq!(config_value(&o["name"]), "r50");
        assert!(!config_value(&v).contains(['{', '"', '[']));
    }
}
