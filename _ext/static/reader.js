/* Wide blocks say that they scroll (added by _ext/reader_pages.py).
 *
 * A table, code cell or output wider than the text column scrolls inside its own box. A reader
 * on a touchpad or a phone sees no scroll bar, so each such box gets a visible hint just above
 * it and a shadow on its right edge. Tables of notebook outputs that the theme does not wrap
 * are wrapped in a scrolling box first. Re-checked when the window is resized.
 */
(function () {
  "use strict";
  const HINT = "reader-scroll-hint";
  const ARTICLE = "article.bd-article, main, div.body";

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
    root.querySelectorAll("pre, .reader-scroll-box, .pst-scrollable-table-container, div.output, div.cell_output, mjx-container").forEach((el) => {
      const wide = scrolls(el);
      el.classList.toggle("reader-scrolls", wide);
      const prev = el.previousElementSibling;
      if (wide) hintFor(el).hidden = false;
      else if (prev && prev.classList.contains(HINT)) prev.hidden = true;
    });
  }

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
