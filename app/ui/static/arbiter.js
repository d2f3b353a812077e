// Arbiter's admin UI: the few live parts (install progress, the Test button, the playground,
// copy, confirm).
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

  async function callJson(method, url, payload) {
    const headers = { "Accept": "application/json", "X-CSRF-Token": csrf };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: headers,
      body: payload === undefined ? undefined : JSON.stringify(payload),
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

  // A table wider than its box scrolls inside it (never the page): say so above it, and let the
  // keyboard scroll it (a focusable region). Checked again when the window changes size.
  function markScrolling() {
    document.querySelectorAll(".table-wrap").forEach(function (box) {
      const scrolls = box.scrollWidth > box.clientWidth + 1;
      let hint = box.previousElementSibling;
      if (!hint || !hint.classList.contains("scroll-hint")) hint = null;
      if (scrolls && !hint) {
        hint = el("p", "scroll-hint", "This table is wider than the screen: scroll it sideways for more columns →");
        box.before(hint);
      }
      if (hint) hint.hidden = !scrolls;
      if (scrolls) {
        box.dataset.scrolls = "1";
        box.tabIndex = 0;
        box.setAttribute("role", "region");
        box.setAttribute("aria-label", "Table, scrolls sideways");
      } else if (box.dataset.scrolls) {
        delete box.dataset.scrolls;
        box.removeAttribute("tabindex");
        box.removeAttribute("role");
        box.removeAttribute("aria-label");
      }
    });
  }
  markScrolling();
  window.addEventListener("resize", markScrolling);

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

  // One option of an answer: its name, a bar of its probability, the percentage.
  function probabilityRow(name, label, probability, chosen) {
    const p = probability === null || probability === undefined ? NaN : Number(probability);
    const row = el("div", "probability");
    row.dataset.option = name;
    const bar = el("progress");
    bar.max = 1;
    bar.value = isFinite(p) ? Math.min(1, Math.max(0, p)) : 0;
    bar.setAttribute("aria-label", "Probability of " + label);
    row.append(el("span", chosen ? "chosen" : "", label), bar,
      el("span", "num", (isFinite(p) ? (p * 100).toFixed(1) : "?") + "%"));
    return row;
  }

  // A reading that clearly failed: answered, but the answer says so (diagnostics.<question>.warnings).
  function showWarnings(box, warnings) {
    (warnings || []).forEach(function (warning) {
      const note = el("p", "warning");
      note.dataset.code = warning.code;
      note.append(el("strong", "", "Warning (" + warning.code + "): "), warning.message);
      box.append(note);
    });
  }

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
        box.append(probabilityRow(option, option, probabilities[option], option === view.choice));
      });
      if (view.confidence !== undefined && view.confidence !== null) {
        box.append(el("p", "muted small", "Confidence: " + Number(view.confidence).toFixed(3)));
      }
      showWarnings(box, view.warnings);
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

  // The playground of a decision model's card: the admin's state and questions, then each
  // question's options as bars, the usage and warnings, and the raw JSON answer.
  function figure(value) {
    return typeof value === "number" ? value.toFixed(3) : String(value);
  }

  function showPlayground(box, answer) {
    box.replaceChildren();
    const view = answer.body || {};
    if (answer.status !== 200) {  // the form's input, refused before anything was asked
      box.append(el("p", "error-text", "Not run (" + answer.status + "): " + (view.error || "no answer")));
      return;
    }
    if (!view.ok) {
      const who = view.source === "backend" ? "The backend answered with an error" : "No answer";
      box.append(el("p", "error-text", who + (view.status ? " (" + view.status + ")" : "") + ": " + (view.error || "")));
      box.append(el("p", "muted small", "After " + view.latency_ms + " ms"));
      return;
    }
    (view.questions || []).forEach(function (question) {
      const part = el("section", "playground-question");
      part.dataset.question = question.id;
      part.append(el("h4", "", question.id + " (" + question.type + ")"));
      if (question.instructions) part.append(el("p", "muted small", question.instructions));
      if (question.missing) {
        part.append(el("p", "error-text", "The answer has no answer for this question."));
      } else {
        const value = el("p", "chosen");
        value.append(question.type + ": ", el("span", "value", figure(question.value)));
        part.append(value);
        (question.options || []).forEach(function (option) {
          part.append(probabilityRow(option.name, option.label, option.probability, option.name === question.chosen));
        });
        if (question.confidence !== null && question.confidence !== undefined) {
          part.append(el("p", "muted small", "Confidence: " + Number(question.confidence).toFixed(3)));
        }
      }
      showWarnings(part, question.warnings);
      box.append(part);
    });
    const usage = view.usage || {};
    const tokens = Object.keys(usage).map(function (name) { return name.replace(/_/g, " ") + ": " + usage[name]; });
    box.append(el("p", "muted small usage", "Usage: " + (tokens.length ? tokens.join(", ") : "none reported") +
      ". Answered in " + view.latency_ms + " ms."));
    const raw = el("details", "raw-answer");
    raw.append(el("summary", "", "Raw JSON answer"), el("pre", "json", JSON.stringify(view.answer, null, 2)));
    box.append(raw);
  }

  document.querySelectorAll("form[data-playground]").forEach(function (form) {
    form.addEventListener("submit", async function (event) {
      event.preventDefault();
      const box = document.getElementById("playground-" + form.dataset.playground + "-result");
      const button = form.querySelector('button[type="submit"]');
      button.disabled = true;
      box.replaceChildren(el("p", "muted", "Asking…"));
      try {
        showPlayground(box, await callJson("POST", form.action,
          { state: form.elements.state.value, questions: form.elements.questions.value }));
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
