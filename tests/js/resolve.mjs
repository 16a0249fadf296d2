// A module hook for the tests: the pages import "./charts.js" from serve/static, where the dashboard serves
// mindwatch/assets/charts.js (the report's too); here that file is read from where it lives.
const CHARTS = new URL("../../mindwatch/assets/charts.js", import.meta.url).href;

export async function resolve(specifier, context, next) {
  if (specifier === "./charts.js" && context.parentURL && context.parentURL.includes("/serve/static/")) {
    return next(CHARTS, context);
  }
  return next(specifier, context);
}
