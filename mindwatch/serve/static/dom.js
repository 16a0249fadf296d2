// DOM helpers for the dashboard's pages: element building, and a run state's badge and colours.

export const $ = (sel, root) => (root || document).querySelector(sel);

/** An element: h("a", {href, class, onclick}, ...children); false, null and undefined attributes are left out. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

/** A run's state as a badge; its colour is the state's (showStateColours). */
export const badge = (state) => h("span", { class: `state state-${state}` }, state);

/** The states' colours (mindwatch/analysis/state_colours.py: the vocabulary's ``state_css``) as the page's own style. */
export function showStateColours(css) {
  const style = $("#state-colours") || document.head.appendChild(h("style", { id: "state-colours" }));
  style.textContent = css;
}
