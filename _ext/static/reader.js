/* Pages that fit the reader's window (added by _ext/reader_pages.py).
 *
 * - An output wider than the text column is fitted to it: on a wide window its type shrinks
 *   (down to MIN_FONT_PX) so that aligned columns stay aligned, and if that is not enough its
 *   long lines wrap; on a phone it scrolls sideways under a hint. An output taller than
 *   TRIM_LINES lines shows its first lines and a button that shows the rest (and folds it).
 * - A table wider than the text column gets a smaller font ("reader-wide-table"); a table that
 *   still does not fit, and any other block that scrolls sideways (display maths, code on a
 *   phone), scrolls inside its own box, with a visible hint above it ("scroll sideways") and a
 *   shadow on its right edge. A reader on a touchpad or a phone sees no scroll bar otherwise.
 * - Search knows the field's spellings both ways: a query's "all-reduce", "all reduce" or
 *   "AllReduce" becomes the one word under which every page using any of them is indexed
 *   (window.READER_SYNONYMS, written into the search page by reader_pages.py).
 * - Printing opens the folded "how this was measured" notes.
 * Everything is re-checked when the window is resized.
 */
(function () {
  "use strict";
  const HINT = "reader-scroll-hint";
  const ARTICLE = "article.bd-article, main, div.body";
  const TRIM_LINES = 40;      // an output longer than this is folded ...
  const SHOW_LINES = 24;      // ... to about this many lines
  const MIN_FONT_PX = 10.5;   // an output's type shrinks no further to fit the column ...
  const FIT_WIDTH = 768;      // ... on windows at least this wide (a phone scrolls instead)

  function scrolls(el) {
    const style = getComputedStyle(el);
    return (style.overflowX === "auto" || style.overflowX === "scroll") && el.scrollWidth > el.clientWidth + 1;
  }

  function wrapTables(root) {
    root.querySelectorAll("table").forEach((table) => {
      let p = table.parentElement;
      while (p && p !== root) {
        const o = getComputedStyle(p).overflowX;
        if (o === "auto" || o === "scroll") return;
        p = p.parentElement;
      }
      const box = document.createElement("div");
      box.className = "reader-scroll-box";
      table.parentNode.insertBefore(box, table);
      box.appendChild(table);
    });
  }

  function shrinkWideTables(root) {
    root.querySelectorAll("table").forEach((table) => {
      const box = table.parentElement;
      if (!box) return;
      table.classList.remove("reader-wide-table");
      if (table.scrollWidth > box.clientWidth + 1) table.classList.add("reader-wide-table");
    });
  }

  // Outputs and literal blocks may wrap; a code cell's input only shrinks (Python's lines
  // carry meaning: one longer than 80 columns is the page's to fix, and it scrolls).
  function fitBlocks(root) {
    root.querySelectorAll("pre").forEach((pre) => {
      pre.classList.remove("reader-wrap");
      pre.style.removeProperty("font-size");
      if (window.innerWidth < FIT_WIDTH || pre.scrollWidth <= pre.clientWidth + 1) return;
      const size = parseFloat(getComputedStyle(pre).fontSize);
      const style = getComputedStyle(pre);
      const pad = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
      const fitted = size * (pre.clientWidth - pad) / (pre.scrollWidth - pad);
      if (fitted >= MIN_FONT_PX) {
        pre.style.fontSize = `${Math.floor(fitted * 10) / 10}px`;
        if (pre.scrollWidth <= pre.clientWidth + 1) return;
      }
      pre.style.removeProperty("font-size");
      if (!pre.closest("div.cell_input")) pre.classList.add("reader-wrap");
    });
  }

  function trimLongOutputs(root) {
    root.querySelectorAll("div.cell_output pre").forEach((pre) => {
      if (pre.dataset.readerTrim) return;        // decided once; the button keeps the state
      const line = parseFloat(getComputedStyle(pre).lineHeight) || 16;
      const lines = Math.round(pre.scrollHeight / line);
      if (lines <= TRIM_LINES) return;
      pre.dataset.readerTrim = "1";
      pre.style.setProperty("--reader-trim-height", `${SHOW_LINES * line}px`);
      pre.classList.add("reader-trimmed");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "reader-more";
      const more = `Show the whole output (${lines} lines)`;
      button.textContent = more;
      button.setAttribute("aria-expanded", "false");
      button.addEventListener("click", () => {
        const folded = pre.classList.toggle("reader-trimmed");
        button.textContent = folded ? more : "Fold the output";
        button.setAttribute("aria-expanded", folded ? "false" : "true");
      });
      pre.parentNode.insertBefore(button, pre.nextSibling);
    });
  }

  function hintFor(el) {
    const prev = el.previousElementSibling;
    if (prev && prev.classList.contains(HINT)) return prev;
    const hint = document.createElement("div");
    hint.className = HINT;
    hint.setAttribute("aria-hidden", "true");
    hint.textContent = "\u21c6 wider than the page: scroll sideways to see all of it";
    el.parentNode.insertBefore(hint, el);
    return hint;
  }

  function mark() {
    const root = document.querySelector(ARTICLE);
    if (!root) return;
    wrapTables(root);
    shrinkWideTables(root);
    fitBlocks(root);
    trimLongOutputs(root);
    root.querySelectorAll("pre, .reader-scroll-box, .pst-scrollable-table-container, div.output, div.cell_output, mjx-container").forEach((el) => {
      const wide = scrolls(el);
      el.classList.toggle("reader-scrolls", wide);
      const prev = el.previousElementSibling;
      if (wide) hintFor(el).hidden = false;
      else if (prev && prev.classList.contains(HINT)) prev.hidden = true;
    });
  }

  // --- search: one word for every spelling of a term -------------------------------------
  function escape(text) {
    return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  }

  function canonicalQuery(query) {
    const groups = window.READER_SYNONYMS || [];
    let out = query;
    for (const [word, spellings] of groups) {
      // longest spellings first, so "all reduce scatter" is not read as "all reduce"; a
      // one-word spelling too ("recomputation" would otherwise also find, by its stem, pages
      // that only say "recompute", which "activation checkpointing" does not)
      for (const spelling of [...spellings].sort((a, b) => b.length - a.length)) {
        const parts = spelling.split(/[\s\-._]+/).filter(Boolean).map(escape);
        if (parts.length === 1 && spelling.toLowerCase() === word) continue;
        const rx = new RegExp(`(^|[^\\p{L}\\p{N}_])${parts.join("[\\s\\-._]*")}(?:e?s)?(?![\\p{L}\\p{N}_])`, "giu");
        out = out.replace(rx, (m, before) => `${before}${word}`);
      }
    }
    return out;
  }

  if (typeof window.splitQuery === "function" && window.READER_SYNONYMS) {
    const split = window.splitQuery;
    window.splitQuery = (query) => split(canonicalQuery(query));
  }
  window.readerCanonicalQuery = canonicalQuery;   // for tests and the curious

  // --- printing ---------------------------------------------------------------------------
  window.addEventListener("beforeprint", () => {
    document.querySelectorAll("details.measured-note").forEach((d) => { d.open = true; });
  });

  let pending = null;
  function later() {
    if (pending) clearTimeout(pending);
    pending = setTimeout(mark, 150);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mark);
  else mark();
  window.addEventListener("load", mark);
  window.addEventListener("resize", later);
  // MathJax typesets after load; check its wide equations once it is done
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    window.MathJax.startup.promise.then(mark);
  }
})();
