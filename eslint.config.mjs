// eslint for the dashboard's and the report's JavaScript (`npm run lint`, run by `make lint`, so by CI).
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["node_modules/**", "dist/**", "build/**", ".venv*/**", "**/*.min.js", "mindwatch/assets/echarts*"] },
  js.configs.recommended,
  {
    files: ["mindwatch/**/*.js"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      // echarts: a classic script the pages load first; DATA: the report's embedded data
      globals: { ...globals.browser, echarts: "readonly" },
    },
    rules: {
      "no-unused-vars": ["error", { args: "after-used", argsIgnorePattern: "^_", caughtErrors: "none" }],
      eqeqeq: ["error", "always", { null: "ignore" }],
      "prefer-const": "error",
      "no-var": "error",
    },
  },
  {
    files: ["tests/js/**/*.mjs", "eslint.config.mjs"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: { ...globals.node } },
  },
];
