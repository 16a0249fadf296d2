// The metric vocabulary (mindwatch/metrics.py, from /api/vocabulary): names, families and chart groups. The
// page holds no metric name of its own; it asks the server once, when the first module loads.

import { getJSON } from "./api.js";

/** {metrics, families, groups, layer_stats, attention, stragglers, not_charted}: see mindwatch.metrics.vocabulary. */
export const vocab = await getJSON("/api/vocabulary");

/** The per-layer statistics' families (grad_norm/<layer>, ...), in layer-row order. */
export const layerFamilies = vocab.families.filter((f) => f.per === "layer");
/** The attention families (attention_entropy/<layer>, attention_max_logit/<layer>). */
export const attentionFamilies = vocab.families.filter((f) => f.per === "attention layer");
/** Whether ``m`` is a member of a built-in family ("<family>/<layer>"): drawn by a view, not a chart each. */
export const isFamilyMetric = (m) => vocab.families.some((f) => m.startsWith(f.prefix));
/** Whether ``m`` is a per-layer statistic (the layers view draws it). */
export const isLayerMetric = (m) => layerFamilies.some((f) => m.startsWith(f.prefix));
