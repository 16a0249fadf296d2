// DOM helpers for the dashboard's pages: element building and the small formatters the tables use.

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

/** A duration in words: "42 s", "5 min", "1.5 h", "2.0 d"; "–" when unknown. */
export function ago(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 60) return `${Math.max(0, Math.round(seconds))} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

/** Tags as strings: a list as is, a mapping as "key=value". */
export function tagList(tags) {
  if (!tags) return [];
  if (Array.isArray(tags)) return tags.map(String);
  return Object.entries(tags).map(([k, v]) => `${k}=${v}`);
}

export const badge = (state) => h("span", { class: `state state-${state}` }, state);
