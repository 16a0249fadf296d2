// What every test of the dashboard's JavaScript shares: the server's real responses (tests/js_fixtures.py captures
// them from a real run; MINDWATCH_JS_FIXTURES names a fresh capture, else the committed ones in ./fixtures), a fetch that
// answers the pages' requests with them, and the page modules, imported once the hook that finds charts.js is in.
import { readFileSync } from "node:fs";
import { register } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const fixtureDir = process.env.MINDWATCH_JS_FIXTURES || path.join(here, "fixtures");

/** One captured response, by its name (the file's, without .json). */
export const fixture = (name) => JSON.parse(readFileSync(path.join(fixtureDir, `${name}.json`), "utf8"));

/** The capture's answer to a page's request: /api/<route>?<query> -> the response captured for it. */
function answerFor(url) {
  const u = new URL(url, "http://dashboard");
  const q = u.searchParams;
  if (u.pathname === "/api/vocabulary") return fixture("vocabulary");
  if (u.pathname === "/api/run") return fixture("run");
  if (u.pathname === "/api/band") return fixture("band_loss");
  if (u.pathname === "/api/compare") return fixture("compare_loss");
  if (u.pathname === "/api/series" && q.get("metric") === fixture("vocabulary").evaluation.loss)
    return fixture("series_eval_loss");
  if (u.pathname === "/api/series" && q.get("metric") === "loss") {
    if (q.has("lo")) return fixture("series_loss_window");
    return fixture(q.get("x") === "step" ? "series_loss" : "series_loss_time");
  }
  return null;
}

/** The requests the pages made, in order. */
export const requested = [];

globalThis.fetch = async (url) => {
  requested.push(String(url));
  const body = answerFor(String(url));
  return new Response(JSON.stringify(body ?? { error: `no captured response for ${url}` }), { status: body ? 200 : 404 });
};

register("./resolve.mjs", import.meta.url);

/** A page module of mindwatch/serve/static (or mindwatch/assets/charts.js: "assets/charts.js"). */
export const page = (name) =>
  import(
    new URL(name.startsWith("assets/") ? `../../mindwatch/${name}` : `../../mindwatch/serve/static/${name}`, import.meta.url).href
  );
