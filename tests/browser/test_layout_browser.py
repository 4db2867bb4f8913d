"""Every page of the built book, as a reader's browser lays it out, at 1280 px (a laptop) and 390 px (a phone).

One test per page and width. It fails on

- at 1280 px: an output or code block (`pre`), a table, a display equation (MathJax's `mjx-container[display]`) or
  an entry of the page's contents (the right sidebar) wider than its column: it scrolls inside itself
  (scrollWidth > clientWidth) or reaches past the article's column;
- at 1280 px: the text of a figure of book/figures/ (an SVG `<img>`) under 8 px as shown: the smallest font size in
  the SVG file times the scale it is drawn at;
- at 390 px: a page that scrolls sideways (the document's scrollWidth above the viewport's width; a code block or
  a table may scroll inside its own box);
- at both: Markdown or MyST shown raw in the rendered prose (a backtick, `**`, `{role}`, `:::`, an unrendered `$`);
  a solution whose code cell lies outside its `<details>` fold.

It prints, per page and width, what it measured (run it with `-s` to see it for passing pages too). One page:
`BOOK_PAGES=13_translator` (names separated by commas) or `-k 13_translator`. Pages that still fail are listed in
KNOWN_DEFECTS: each is an expected failure (strict), so a page that starts to pass must leave the set.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
FIGURES = BOOK / "figures"
WIDTHS = (1280, 390)
MIN_FIGURE_TEXT_PX = 8.0

# (page, width) pairs that still fail; printed by test_known_defects_are_printed. Remove a pair once it passes.
KNOWN_DEFECTS: set[tuple[str, int]] = set()


def book_pages() -> list[str]:
    """The book's pages, by the name of their source in book/ (what BOOK_PAGES selects from)."""
    names = sorted(p.stem for p in BOOK.iterdir() if p.suffix in (".ipynb", ".md"))
    wanted = [w.strip() for w in os.environ.get("BOOK_PAGES", "").split(",") if w.strip()]
    if wanted:
        names = [n for n in names if any(w in n for w in wanted)]
    return names


def cases():
    for name in book_pages():
        for width in WIDTHS:
            marks = [pytest.mark.xfail(strict=True, reason="in KNOWN_DEFECTS")] if (name, width) in KNOWN_DEFECTS else []
            yield pytest.param(name, width, id=f"{name}-{width}", marks=marks)


MEASURE = r"""
async (width) => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const out = {problems: [], notes: []};
  const art = document.querySelector('article.bd-article') || document.querySelector('main');
  const ar = art.getBoundingClientRect();
  const colRight = ar.left + art.clientWidth;
  const label = (el) => {
    const t = Array.from((el.innerText || el.textContent || '').replace(/\s+/g, ' ').trim()).slice(0, 50).join('');
    return el.tagName.toLowerCase() + ' "' + t + '"';
  };
  const px = (x) => Math.round(x);
  out.notes.push('article column ' + px(art.clientWidth) + ' px');
  if (width >= 1000) {
    const check = (kind, el, box) => {
      const r = el.getBoundingClientRect();
      if (r.width === 0) { return 0; }
      const sw = box.scrollWidth, cw = box.clientWidth;
      if (sw > cw + 1) {
        out.problems.push(kind + ' scrolls: ' + px(sw) + ' px in ' + px(cw) + ' px: ' + label(el));
      } else if (r.right > colRight + 1) {
        out.problems.push(kind + ' reaches ' + px(r.right - colRight) + ' px past the column: ' + label(el));
      }
      return sw;
    };
    let widest = {pre: 0, table: 0, equation: 0};
    art.querySelectorAll('pre').forEach((el) => { widest.pre = Math.max(widest.pre, check('block', el, el)); });
    art.querySelectorAll('table').forEach((el) => {
      const box = el.closest('.pst-scrollable-table-container') || el.parentElement;
      const r = el.getBoundingClientRect();
      widest.table = Math.max(widest.table, r.width);
      if (r.width > box.clientWidth + 1) {
        out.problems.push('table ' + px(r.width) + ' px in ' + px(box.clientWidth) + ' px: ' + label(el));
      } else if (r.right > colRight + 1) {
        out.problems.push('table reaches ' + px(r.right - colRight) + ' px past the column: ' + label(el));
      }
    });
    art.querySelectorAll('mjx-container[display]').forEach((el) => {
      const math = el.querySelector('mjx-math') || el;
      const mw = math.getBoundingClientRect().width;
      widest.equation = Math.max(widest.equation, mw);
      if (mw > el.clientWidth + 1 || el.scrollWidth > el.clientWidth + 1) {
        out.problems.push('equation ' + px(mw) + ' px in ' + px(el.clientWidth) + ' px: ' + label(el));
      }
    });
    const toc = document.querySelector('.bd-sidebar-secondary');
    if (toc && toc.getBoundingClientRect().width > 0) {
      const tr = toc.getBoundingClientRect();
      const tocScrolls = toc.scrollWidth > toc.clientWidth + 1;
      toc.querySelectorAll('nav a, .toc-entry a').forEach((a) => {
        const r = a.getBoundingClientRect();
        if (a.scrollWidth > a.clientWidth + 1 || (tocScrolls && r.right > tr.left + toc.clientWidth + 1)) {
          out.problems.push('contents entry ' + px(Math.max(a.scrollWidth, r.width)) + ' px in '
                            + px(toc.clientWidth) + ' px: ' + label(a));
        }
      });
    }
    out.notes.push('widest block ' + px(widest.pre) + ', table ' + px(widest.table) + ', equation '
                   + px(widest.equation) + ' px');
  } else {
    const vw = document.documentElement.clientWidth, dw = document.documentElement.scrollWidth;
    out.notes.push('document ' + dw + ' px in a ' + vw + ' px viewport');
    if (dw > vw + 1) {
      const clipped = (el) => {
        for (let p = el.parentElement; p; p = p.parentElement) {
          const o = getComputedStyle(p).overflowX;
          if (o !== 'visible') { return p !== document.body && p !== document.documentElement; }
        }
        return false;
      };
      const culprits = [];
      document.querySelectorAll('body *').forEach((el) => {
        const r = el.getBoundingClientRect();
        if (r.right > vw + 1 && r.width > 0 && !clipped(el)) { culprits.push([r.right, el]); }
      });
      culprits.sort((a, b) => b[0] - a[0]);
      const shown = culprits.slice(0, 3).map(([r, el]) => label(el) + ' to ' + px(r) + ' px').join('; ');
      out.problems.push('page scrolls sideways: ' + dw + ' px in ' + vw + ' px; widest: ' + shown);
    }
  }
  // Markdown or MyST left raw in the prose.
  const skip = 'pre, code, kbd, samp, tt, script, style, mjx-container, .highlight, .cell_input, .cell_output, '
               + 'textarea, .MathJax, math';
  const walker = document.createTreeWalker(art, NodeFilter.SHOW_TEXT);
  const raw = [[/`/, 'backtick'], [/\*\*/, '**'], [/\{[a-z][a-z0-9-]*\}/, '{role}'], [/:::/, ':::'],
               [/\$\$|\$[^$\n]*[\\^_{}][^$\n]*\$/, 'unrendered $']];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip)) { continue; }
    for (const [re, what] of raw) {
      const m = n.textContent.match(re);
      if (m) {
        const i = Math.max(0, m.index - 30);
        out.problems.push('raw ' + what + ': "' + n.textContent.slice(i, m.index + 30).replace(/\s+/g, ' ') + '"');
      }
    }
  }
  // A solution's code cells belong inside its fold.
  art.querySelectorAll('details').forEach((d) => {
    const s = d.querySelector('summary');
    if (!s || !/^\s*Solution/.test(s.textContent)) { return; }
    for (let e = d.nextElementSibling; e && e.matches('div.cell'); e = e.nextElementSibling) {
      out.problems.push('solution code outside its fold: ' + s.textContent.trim() + ': ' + label(e));
    }
  });
  out.figures = [];
  if (width >= 1000) {
    art.querySelectorAll('img').forEach((img) => {
      const src = img.getAttribute('src') || '';
      if (/\.svg$/i.test(src)) {
        out.figures.push([src.split('/').pop(), img.getBoundingClientRect().width]);
      }
    });
  }
  return out;
}
"""


def svg_text_sizes(path: Path) -> tuple[float, float]:
    """(viewBox width, smallest font size) in the SVG's own units; matplotlib writes text as paths, a glyph group
    scaled by font size / 100 (`scale(0.1 -0.1)` is 10 pt), or as <text> with a font size."""
    text = path.read_text(encoding="utf-8")
    box = re.search(r'viewBox="\s*[-\d.]+[\s,]+[-\d.]+[\s,]+([\d.]+)', text)
    width = float(box.group(1)) if box else float(re.search(r'width="([\d.]+)', text).group(1))
    sizes = [float(s) * 100 for s in re.findall(r"scale\(([\d.]+) -[\d.]+\)", text)]
    sizes += [float(s) for s in re.findall(r"font-size[:=]\s*\"?([\d.]+)", text)]
    sizes += [float(s) for s in re.findall(r"font:\s*(?:\w+\s+)*([\d.]+)px", text)]
    return width, min(sizes) if sizes else float("inf")


def test_known_defects_are_printed():
    print("\nKNOWN_DEFECTS (page, width) still failing:", sorted(KNOWN_DEFECTS) or "none")
    names = {p.stem for p in BOOK.iterdir() if p.suffix in (".ipynb", ".md")}
    assert {n for n, _ in KNOWN_DEFECTS} <= names, "KNOWN_DEFECTS names a page the book does not have"
    assert {w for _, w in KNOWN_DEFECTS} <= set(WIDTHS)


@pytest.mark.parametrize(("name", "width"), list(cases()))
def test_page_fits(site, page_at, name, width):
    html = site / "book" / f"{name}.html"
    assert html.is_file(), f"{html} was not built"
    page = page_at(html.as_uri(), width=width, height=900)
    found = page.evaluate(MEASURE, width)
    problems = list(found["problems"])
    notes = list(found["notes"])
    for file, shown in found["figures"]:
        svg = FIGURES / file
        if not svg.is_file() or shown <= 0:
            continue
        box, smallest = svg_text_sizes(svg)
        px = smallest * shown / box
        notes.append(f"figure {file}: text {smallest:g} at {shown:.0f}/{box:g} = {px:.1f} px")
        if px < MIN_FIGURE_TEXT_PX:
            problems.append(f"figure {file}: smallest text {px:.1f} px as shown (under {MIN_FIGURE_TEXT_PX:g} px)")
    print(f"\n{name} at {width} px: " + "; ".join(notes))
    for p in problems:
        print(f"  FAIL {p}")
    assert not problems, f"{name} at {width} px:\n" + "\n".join(problems)
