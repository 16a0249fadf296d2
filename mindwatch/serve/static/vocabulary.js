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

// What a family is recorded per (mindwatch.metrics.Per): those drawn as heat maps, and the words a title says it in.
const HEAT_PER = ["attention layer", "weight", "moe layer"];
const PER_WORDS = { "attention layer": "layer", "moe layer": "MoE layer" };

/** The per-layer statistics' families (grad_norm/<layer>, ...), in layer-row order. */
export const layerFamilies = () => vocab().families.filter((f) => f.per === "layer");
/** The families recorded in the metrics file, each member a metric of its own, drawn as a heat map (members x steps):
 * the attention families (attention_entropy/<layer>, attention_max_logit/<layer>), stable_rank/<weight> and the MoE
 * layers' routing (moe_imbalance/<layer>, router_entropy/<layer>, moe_dropped/<layer>). */
export const heatFamilies = () => vocab().families.filter((f) => HEAT_PER.includes(f.per));
/** The families recorded per expert of a MoE layer (expert_load/<layer>/<expert>): drawn as experts x MoE layers at a
 * step a slider picks (charts.js's expertLoad). */
export const expertFamilies = () => vocab().families.filter((f) => f.per === "expert");
/** What a family is recorded per, as a heat map's title says it: "layer", "weight", "MoE layer". */
export const perWords = (f) => PER_WORDS[f.per] || f.per;
/** Whether ``m`` is a member of a built-in family ("<family>/<layer>"): drawn by a view, not a chart each. */
export const isFamilyMetric = (m) => vocab().families.some((f) => m.startsWith(f.prefix));
/** Whether ``m`` is a per-layer statistic (the layers view draws it). */
export const isLayerMetric = (m) => layerFamilies().some((f) => m.startsWith(f.prefix));
/** Whether ``m`` is an evaluation's result ("eval/<name>"): one point per evaluation, drawn as points joined by a line. */
export const isEvalMetric = (m) => m.startsWith(vocab().evaluation.prefix);
