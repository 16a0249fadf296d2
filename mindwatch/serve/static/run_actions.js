// A person's requests to a live run from its page: stop, checkpoint, lr x factor, rewind, batch size, profile the next
// steps (mindwatch serve --allow-control).
// The server files the same request as `mindwatch stop RUN`; without --allow-control it shows no button.

import { getJSON, postJSON } from "./api.js";
import { h } from "./dom.js";

const LIVE = new Set(["running", "stalled"]);

/** The action bar of one run; `show(state)` after each status. */
export class RunActions {
  constructor(runId) {
    this.runId = runId;
    this.allowed = [];
    this.state = null;
    this.reason = h("input", { type: "text", class: "run-actions-reason", placeholder: "reason", maxlength: "500" });
    this.factor = h("input", { type: "number", class: "run-actions-factor", value: "0.5", min: "0.01", step: "0.05" });
    this.size = h("input", { type: "number", class: "run-actions-size", min: "1", step: "1", placeholder: "batch size" });
    this.steps = h("input", {
      type: "number",
      class: "run-actions-steps",
      min: "1",
      max: "1000",
      step: "1",
      placeholder: "steps",
      title: "steps to profile (empty: the run's profile.steps)",
      "aria-label": "steps to profile",
    });
    this.note = h("span", { class: "run-actions-note", role: "status" });
    this.el = h("div", { class: "run-actions", hidden: true });
    getJSON("/api/control")
      .then((c) => {
        this.allowed = c.actions || [];
        this.render();
      })
      .catch(() => {});
  }

  render() {
    // each button, then the field it takes (the factor after LR ×, the size after Batch size, the steps after Profile)
    const items = this.allowed.flatMap((b) => {
      const button = h("button", { type: "button", "data-action": b.action, onclick: () => this.ask(b) }, b.label);
      if (b.factor !== undefined) this.factor.value = String(b.factor);
      const field = this.fieldOf(b);
      return field ? [button, field] : [button];
    });
    this.el.replaceChildren(this.reason, ...items, this.note);
    this.show(this.state);
  }

  show(state) {
    this.state = state;
    this.el.hidden = !this.allowed.length || !LIVE.has(state);
  }

  /** The field a button takes: the factor (LR ×), the batch size, the steps to profile; null: none. */
  fieldOf(button) {
    if (button.factor !== undefined) return this.factor;
    if (button.size) return this.size;
    return button.steps ? this.steps : null;
  }

  async ask(button) {
    const action = button.action;
    const field = this.fieldOf(button);
    const value = field === this.steps && !field.value ? "(the run's profile.steps)" : field && field.value;
    const what = field ? `${button.confirm || action} ${value}` : action;
    if (!window.confirm(`${what} on ${this.runId}?`)) return;
    const body = { action, reason: this.reason.value || null };
    if (field === this.factor) body.factor = Number(this.factor.value);
    if (field === this.size) body.size = this.size.value;
    if (field === this.steps && this.steps.value) body.steps = Number(this.steps.value);
    let filed;
    try {
      filed = await postJSON(`/api/request?run=${encodeURIComponent(this.runId)}`, body);
    } catch (e) {
      this.note.textContent = `refused: ${e.message}`;
      return;
    }
    this.note.textContent = `${action}: filed, waiting for the training…`;
    this.follow(action, filed.id, Date.now() + 60_000);
  }

  async follow(action, id, until) {
    const { answer } = await getJSON(`/api/request?run=${encodeURIComponent(this.runId)}&id=${encodeURIComponent(id)}`);
    if (answer && answer.state === "taken") {
      // the batch size's answer says the step it lands at
      this.note.textContent =
        `${action}: taken at step ${answer.step}` + (action === "batch" && answer.message ? `: ${answer.message}` : "");
      return;
    }
    if (answer && answer.state === "failed") {
      this.note.textContent = `${action} failed: ${answer.error || answer.message}`;
      return;
    }
    if (Date.now() < until) setTimeout(() => this.follow(action, id, until), 500);
  }
}
