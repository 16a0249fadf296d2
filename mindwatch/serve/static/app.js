// mindwatch dashboard: the router. #/ the runs page, #/run/<id>?<view> one run (live charts), #/compare?runs=… compare.
// Each page is a class in its own module that builds its DOM in the constructor and undoes it in dispose().

import { $, showStateColours } from "./dom.js";
import { ComparePage } from "./compare_page.js";
import { RunPage } from "./run_page.js";
import { RunsPage } from "./runs_page.js";
import { loadVocabulary } from "./vocabulary.js";

const main = $("#main");
let page = null;

function route() {
  if (page) {
    try {
      page.dispose();
    } catch (e) {
      /* already gone */
    }
  }
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  if (path.startsWith("/run/")) page = new RunPage(main, decodeURIComponent(path.slice(5)), new URLSearchParams(query || ""));
  else if (path === "/compare") page = new ComparePage(main, new URLSearchParams(query || ""));
  else page = new RunsPage(main, new URLSearchParams(query || ""));
}

window.addEventListener("hashchange", route);
route();
// every page's badges and banners take the states' colours once the vocabulary came; without it they stay grey
loadVocabulary().then(
  (v) => showStateColours(v.state_css),
  (e) => console.warn(e.message),
);
