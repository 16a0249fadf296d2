// A run's display name and note on its page (notes.json in the run directory, mindwatch.store.notes): the title
// shows the name with the run id beside it, the note under the title. Rename / note buttons only where the
// dashboard takes writes (mindwatch serve --allow-control, which needs a token); `mindwatch rename|note` otherwise.

import { getJSON, postJSON } from "./api.js";
import { h } from "./dom.js";

export class RunNotes {
  constructor(runId) {
    this.runId = runId;
    this.notes = {};
    this.title = h("h2", { id: "run-title" }, runId);
    this.text = h("p", { class: "note", id: "run-note", hidden: true });
    this.status = h("span", { class: "muted", role: "status" });
    this.buttons = h(
      "span",
      { class: "run-notes-edit", hidden: true },
      h(
        "button",
        { type: "button", id: "run-rename", onclick: () => this.edit("name", "A name for this run (its id stays):") },
        "rename",
      ),
      h("button", { type: "button", id: "run-annotate", onclick: () => this.edit("note", "A note on this run:") }, "note"),
      this.status,
    );
    this.el = h("div", { class: "run-notes" }, this.text, this.buttons);
    getJSON("/api/control")
      .then((c) => {
        this.buttons.hidden = !c.allowed;
      })
      .catch(() => {});
  }

  /** notes: /api/run's ``notes`` ({name?, note?}). */
  show(notes) {
    this.notes = notes || {};
    const name = this.notes.name;
    this.title.replaceChildren(name || this.runId, name ? h("span", { class: "muted run-id" }, ` ${this.runId}`) : "");
    document.title = `mindwatch: ${name || this.runId}`;
    this.text.hidden = !this.notes.note;
    this.text.textContent = this.notes.note || "";
  }

  async edit(field, question) {
    const value = window.prompt(`${question} ("" removes it)`, this.notes[field] || "");
    if (value === null) return;
    try {
      this.show(await postJSON(`/api/notes?run=${encodeURIComponent(this.runId)}`, { [field]: value }));
      this.status.textContent = "";
    } catch (e) {
      this.status.textContent = `not saved: ${e.message}`;
    }
  }
}
