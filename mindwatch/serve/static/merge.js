// Live points into chart series: what arrives on the stream is appended to the series it belongs to.

/**
 * Append the points of one "points" message ({rank, metrics: {name: [[step, t, value], ...]}}) to the
 * series defs ({metric, rank, points, overview?, nonfinite}) of that rank; x is "step" or "time".
 * Points at or before a series' last x are already drawn (the page loaded after they were written).
 * Returns how many points were added.
 */
export function mergePoints(defs, message, x) {
  let added = 0;
  for (const def of defs) {
    if (def.rank !== message.rank) continue;
    const pts = message.metrics[def.metric];
    if (!pts) continue;
    const last = def.points.length ? def.points[def.points.length - 1][0] : -Infinity;
    for (const [step, t, v] of pts) {
      const px = x === "step" ? step : t;
      if (px <= last) continue;
      const y = typeof v === "number" ? v : null;  // "nan", "inf": a gap, and a mark
      def.points.push([px, y]);
      if (def.overview) def.overview.push([px, y]);
      if (y === null) def.nonfinite.push([px, v]);
      added++;
    }
  }
  return added;
}
