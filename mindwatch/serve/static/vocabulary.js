// The metric vocabulary (mindwatch/metrics.py, from /api/vocabulary): names, families and chart groups, and the states'
// colours. The page holds no metric name of its own. It is asked for once, when a page first needs it: a page that
// draws metrics awaits loadVocabulary() before it reads the rest of this module; a page that does not never waits on
// it, and cannot fail with it.

import { getJSON } from "./api.js";

let asked = null; // the request, once made (again after a failure)
let loaded = null; // its answer

/** The vocabulary, asked for once; a failure says what did not load (and the next call asks again). */
export function loadVocabulary() {
  asked =
    asked ||
    getJSON("/api/vocabulary").then(
      (v) => (loaded = v),
      (e) => {
        asked = null;
        throw new Error(`the metric vocabulary (/api/vocabulary) did not load: ${e.message}`);
      },
    );
  return asked;
}

/** {metrics, families, groups, layer_stats, attention, stragglers, not_charted, evaluation, state_css}: see
 * mindwatch.serve.api.page_vocabulary. Only after loadVocabulary() resolved. */
export function vocab() {
  if (!loaded) throw new Error("the metric vocabulary is read before it loaded: await loadVocabulary() first");
  return loaded;
}

/** The per-layer statistics' families (grad_norm/<layer>, ...), in layer-row order. */
export const layerFamilies = () => vocab().families.filter((f) => f.per === "layer");
/** The families recorded in the metrics file, each member a metric of its own, drawn as a heat map (members x steps):
 * the attention families (attention_entropy/<layer>, attention_max_logit/<layer>) and stable_rank/<weight>. */
export const heatFamilies = () => vocab().families.filter((f) => f.per === "attention layer" || f.per === "weight");
/** Whether ``m`` is a member of a built-in family ("<family>/<layer>"): drawn by a view, not a chart each. */
export const isFamilyMetric = (m) => vocab().families.some((f) => m.startsWith(f.prefix));
/** Whether ``m`` is a per-layer statistic (the layers view draws it). */
export const isLayerMetric = (m) => layerFamilies().some((f) => m.startsWith(f.prefix));
/** Whether ``m`` is an evaluation's result ("eval/<name>"): one point per evaluation, drawn as points joined by a line. */
export const isEvalMetric = (m) => m.startsWith(vocab().evaluation.prefix);
