// The dashboard's debug flag: open it as /?debug=1#/run/... and the page counts, in window.mindwatchDebug,
// the live points it merged (pointsReceived) and the server-binned refreshes it drew (derivedRefreshes).
// Without the flag nothing is counted and nothing is added to window.

const enabled = new URLSearchParams(location.search).has("debug");
if (enabled) window.mindwatchDebug = { pointsReceived: 0, derivedRefreshes: 0 };

/** Add n to the debug counter ``name`` (a no-op without ?debug=1). */
export function count(name, n = 1) {
  if (enabled) window.mindwatchDebug[name] += n;
}
