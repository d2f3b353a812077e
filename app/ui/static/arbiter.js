// Arbiter's admin UI: the few live parts (install progress, the Test button, copy, confirm).
// Everything else is plain forms. Text goes in with textContent only, never as HTML.
"use strict";

(function () {
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : "";

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  async function callJson(method, url) {
    const response = await fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRF-Token": csrf },
    });
    let body = null;
    try { body = await response.json(); } catch (err) { body = null; }
    if (response.status === 401) {
      window.location.assign("/ui/sign-in?ended=1");
      throw new Error("signed out");
    }
    return { status: response.status, body: body };
  }

  // A failed form on a long page: the summary at the top takes the focus (its links lead to the form).
  const summary = document.getElementById("error-summary");
  if (summary) summary.focus();

  // Forms that change something irreversible ask first.
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });

  // Install progress: poll each running install until it ends.
  document.querySelectorAll("[data-install]").forEach(function (item) {
    if (item.dataset.status !== "running") return;
    if (item.dataset.focus) item.scrollIntoView({ block: "center" });
    const id = item.dataset.install;
    const field = function (name) { return item.querySelector('[data-field="' + name + '"]'); };
    const bar = item.querySelector("progress");
    async function poll() {
      let answer;
      try {
        answer = await callJson("GET", "/ui/api/installs/" + encodeURIComponent(id));
      } catch (err) {
        setTimeout(poll, 2000);  // Arbiter away for a moment: try again
        return;
      }
      const view = answer.body || {};
      if (answer.status !== 200) {
        field("error").textContent = (view && view.error) || "Cannot read the install's progress.";
        field("error").hidden = false;
        return;
      }
      const percent = view.status === "succeeded" ? 100 : Number(view.percent || 0);
      bar.value = percent;
      bar.textContent = Math.round(percent) + "%";
      field("percent").textContent = Math.round(percent) + "%";
      field("stage").textContent = view.stage || "";
      field("status").textContent = view.status;
      item.dataset.status = view.status;
      if (view.status === "running") {
        setTimeout(poll, 300);
        return;
      }
      const cancel = field("cancel");
      if (cancel) cancel.hidden = true;
      if (view.error) {
        field("error").textContent = view.error;
        field("error").hidden = false;
      }
      if (view.status === "succeeded") field("done").hidden = false;
    }
    poll();
  });

  // The Test button of a model card: one request, then the answer or the backend's error.
  function showTest(box, answer) {
    box.replaceChildren();
    const view = answer.body || {};
    if (answer.status !== 200) {
      box.append(el("p", "error-text", "Test failed (" + answer.status + "): " + (view.error || "no answer")));
      return;
    }
    if (!view.ok) {
      box.append(el("p", "error-text", "The backend answered with an error" +
        (view.status ? " (" + view.status + ")" : "") + ": " + (view.error || "")));
      return;
    }
    if (view.kind === "decision") {
      box.append(el("p", "muted small", view.question));
      const chosen = el("p", "chosen");
      chosen.append("Chose: ");
      chosen.append(el("span", "choice", view.choice));
      box.append(chosen);
      const probabilities = view.probabilities || {};
      Object.keys(probabilities).forEach(function (option) {
        const p = Number(probabilities[option]);
        const row = el("div", "probability");
        row.dataset.option = option;
        const label = el("span", option === view.choice ? "chosen" : "", option);
        const bar = el("progress");
        bar.max = 1;
        bar.value = isFinite(p) ? p : 0;
        bar.setAttribute("aria-label", "Probability of " + option);
        row.append(label, bar, el("span", "num", (isFinite(p) ? (p * 100).toFixed(1) : "?") + "%"));
        box.append(row);
      });
      if (view.confidence !== undefined && view.confidence !== null) {
        box.append(el("p", "muted small", "Confidence: " + Number(view.confidence).toFixed(3)));
      }
      // A reading that clearly failed: answered, but the answer says so (diagnostics.<question>.warnings).
      (view.warnings || []).forEach(function (warning) {
        const note = el("p", "warning");
        note.dataset.code = warning.code;
        note.append(el("strong", "", "Warning (" + warning.code + "): "), warning.message);
        box.append(note);
      });
    } else if (view.kind === "completion") {
      box.append(el("p", "muted small", view.prompt));
      box.append(el("p", "", "Reply: " + (view.reply || "")));
    } else if (view.kind === "embedding") {
      box.append(el("p", "", "Embedding of " + view.dimensions + " dimensions"));
    }
    box.append(el("p", "muted small", "Answered in " + view.latency_ms + " ms"));
  }

  document.querySelectorAll("button[data-test]").forEach(function (button) {
    button.addEventListener("click", async function () {
      const box = document.getElementById("test-" + button.dataset.test);
      button.disabled = true;
      box.replaceChildren(el("p", "muted", "Testing…"));
      try {
        showTest(box, await callJson("POST", "/ui/api/models/" + encodeURIComponent(button.dataset.test) + "/test"));
      } catch (err) {
        box.replaceChildren(el("p", "error-text", "Could not reach Arbiter: " + err.message));
      } finally {
        button.disabled = false;
      }
    });
  });

  // Copy the new key.
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.addEventListener("click", async function () {
      const input = document.getElementById(button.dataset.copy);
      const status = button.parentElement.querySelector(".copied");
      let copied = false;
      try {
        await navigator.clipboard.writeText(input.value);
        copied = true;
      } catch (err) {
        input.select();
        copied = document.execCommand && document.execCommand("copy");
      }
      if (status) status.textContent = copied ? "Copied." : "Select the key and copy it by hand.";
    });
  });
})();
