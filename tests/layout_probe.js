/* Layout probe: injected by tests/book_site.py into a page served with "?probe".
 *
 * After the page has loaded and its own scripts have run, it measures the page as laid out and
 * writes a JSON report into <html data-layout-probe="...">, which `chromium --dump-dom` returns:
 *
 *   column        the text column's content box (left, right, width in CSS px)
 *   sticks_out    blocks whose box reaches past the column's right edge with nothing to scroll
 *                 them (a table or output cut off by the page, or pushing it sideways)
 *   cut_off       boxes that hide part of their content sideways without scrolling
 *   no_hint       boxes that scroll sideways without a visible ".reader-scroll-hint" just above
 *   scrolling     boxes that scroll sideways with their hint (allowed on a phone; at 1,280 px
 *                 tests/textbook_rules.py counts them as wider than the page)
 *   spills        blocks whose content is wider than their own box although nothing scrolls or
 *                 clips it (scrollWidth > clientWidth, overflow visible): a word or a number that
 *                 runs over a table cell's edge into its neighbour, a fixed-width box overrun,
 *                 even where the overrun stays inside the column (MathJax's boxes left aside;
 *                 the innermost such block only: the cell, not also its row and table)
 *   search_boxes  search fields and buttons a reader can see
 *   images        every image in the column: its drawn (natural) and shown width
 *
 * The page's own scripts are not trusted to report on themselves: everything is measured here.
 */
(function () {
  "use strict";
  const SLACK = 2; // px: sub-pixel rounding

  function visible(el) {
    const r = el.getBoundingClientRect();
    const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== "hidden" && s.display !== "none";
  }

  function describe(el) {
    let name = el.tagName.toLowerCase();
    if (el.id) name += "#" + el.id;
    const cls = (typeof el.className === "string" ? el.className : "").trim().split(/\s+/).filter(Boolean);
    if (cls.length) name += "." + cls.slice(0, 3).join(".");
    const text = (el.textContent || "").replace(/\s+/g, " ").trim().slice(0, 80);
    return {element: name, text: text};
  }

  function clipper(el, column) {
    for (let p = el.parentElement; p && p !== column; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") return p;
    }
    return null;
  }

  function outermost(list) {
    return list.filter((el) => !list.some((other) => other !== el && other.contains(el)));
  }

  function run() {
    const report = {column: null, sticks_out: [], cut_off: [], no_hint: [], scrolling: [],
                    spills: [], search_boxes: [], images: []};
    const column = document.querySelector("article.bd-article") || document.querySelector("main");
    if (column) {
      const r = column.getBoundingClientRect();
      const s = getComputedStyle(column);
      const left = r.left + parseFloat(s.paddingLeft);
      const right = r.right - parseFloat(s.paddingRight);
      report.column = {left: left, right: right, width: right - left};
      // MathJax's assistive MathML is clipped on purpose (screen readers read it, eyes do not)
      const all = Array.from(column.querySelectorAll("*"))
        .filter((el) => !el.closest("mjx-assistive-mml")).filter(visible);
      const out = [], spills = [];
      for (const el of all) {
        const box = el.getBoundingClientRect();
        if (box.right > right + SLACK && !clipper(el, column)) out.push(el);
        const style = getComputedStyle(el);
        const o = style.overflowX;
        const hidden = el.scrollWidth - el.clientWidth;
        if (hidden <= SLACK || el.clientWidth === 0) continue;
        if (o === "visible") {
          // an inline box has no width of its own to overrun; MathJax's containers measure
          // their glyphs' overhang and their assistive copy, not content a reader misses
          if (!style.display.startsWith("inline") && !el.closest("mjx-container")) spills.push(el);
        } else if (o === "hidden" || o === "clip") {
          // inline math clips its glyphs' overhang by a few px: not content a reader misses
          if (style.display.startsWith("inline")) continue;
          report.cut_off.push(Object.assign(describe(el), {hidden_px: hidden}));
        } else if (o === "auto" || o === "scroll") {
          const hint = el.previousElementSibling;
          const ok = hint && hint.classList.contains("reader-scroll-hint") && visible(hint);
          (ok ? report.scrolling : report.no_hint).push(Object.assign(describe(el), {hidden_px: hidden}));
        }
      }
      // the cell whose word runs over, not also its row, body and table
      for (const el of spills.filter((el) => !spills.some((o) => o !== el && el.contains(o)))) {
        report.spills.push(Object.assign(describe(el), {hidden_px: el.scrollWidth - el.clientWidth}));
      }
      for (const el of outermost(out)) {
        report.sticks_out.push(Object.assign(describe(el), {past_px: Math.round(el.getBoundingClientRect().right - right)}));
      }
      for (const img of column.querySelectorAll("img")) {
        if (!visible(img)) continue;
        report.images.push({src: img.getAttribute("src"), natural: img.naturalWidth,
                            shown: Math.round(img.getBoundingClientRect().width)});
      }
    }
    const fields = ".search-button-field, button.search-button, input[type=search], input[name=q]";
    for (const el of document.querySelectorAll(fields)) {
      if (visible(el) && !el.closest("dialog")) report.search_boxes.push(describe(el));
    }
    document.documentElement.setAttribute("data-layout-probe", JSON.stringify(report));
  }

  function later() { setTimeout(run, 1200); }
  if (document.readyState === "complete") later();
  else window.addEventListener("load", later);
})();
