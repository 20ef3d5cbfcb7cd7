// botgw console, knowledge page: upload by drag and drop or the file picker. Each file is its own request
// (XMLHttpRequest, for its upload progress), one after another: the gateway ingests one upload at a time and
// answers a second one meanwhile with 429. Each file gets a line with its progress and its outcome: what was
// added, or the server's reason for refusing it. The page's texts come from #upload's data- attributes.
"use strict";
(function () {
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  let queue = Promise.resolve();

  function line(list, name, text) {
    const item = document.createElement("li");
    item.dataset.name = name;
    item.dataset.state = "waiting";
    const label = document.createElement("span");
    label.className = "name";
    label.textContent = name;
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.value = 0;
    const outcome = document.createElement("span");
    outcome.className = "outcome";
    outcome.textContent = text.waiting;
    item.append(label, bar, outcome);
    list.append(item);
    return { item, bar, outcome };
  }

  function finish(row, state, message) {
    row.item.dataset.state = state;
    row.outcome.textContent = message;
    row.bar.value = state === "done" ? 1 : row.bar.value || 0;
  }

  function send(file, kb, row, text) {
    return new Promise((resolve) => {
      const xhr = new XMLHttpRequest();
      xhr.open("POST", `/console/knowledge/${encodeURIComponent(kb)}/documents`);
      xhr.setRequestHeader("X-CSRF-Token", csrf());
      xhr.setRequestHeader("Accept", "application/json");
      row.item.dataset.state = "sending";
      row.outcome.textContent = text.uploading;
      xhr.upload.onprogress = (event) => {
        if (!event.lengthComputable) return;
        row.bar.value = event.loaded / event.total;
        row.outcome.textContent = `${text.uploading} ${Math.round((100 * event.loaded) / event.total)}%`;
      };
      xhr.upload.onload = () => {
        row.item.dataset.state = "processing";
        row.bar.removeAttribute("value"); // indeterminate while the gateway cuts and embeds
        row.outcome.textContent = text.processing;
      };
      xhr.onload = () => {
        let body = null;
        try { body = JSON.parse(xhr.responseText); } catch (e) { body = null; }
        if (xhr.status === 200 && body && Array.isArray(body.documents)) {
          const done = body.documents.map((d) => `${text[d.status] || d.status} · ${d.chunks} ${text.chunks}`);
          row.item.dataset.chunks = String(body.documents.reduce((sum, d) => sum + d.chunks, 0));
          row.item.dataset.status = body.documents.map((d) => d.status).join(",");
          finish(row, "done", done.join("; "));
        } else {
          const reason = (body && body.error) || `HTTP ${xhr.status}`;
          row.item.dataset.code = String(xhr.status);
          finish(row, "refused", `${text.refused}: ${reason}`);
        }
        resolve(xhr.status === 200);
      };
      xhr.onerror = () => { finish(row, "failed", text.network); resolve(false); };
      const form = new FormData();
      form.append("files", file, file.name);
      xhr.send(form);
    });
  }

  async function refreshLists(kb) {
    const lists = document.getElementById("lists");
    const url = `/console/knowledge/lists?kb=${encodeURIComponent(kb)}`;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { "Accept": "application/x-console-fragment" } });
      if (response.ok) {
        lists.innerHTML = await response.text();
        lists.dataset.kb = kb;
        const search = document.getElementById("search-kb");
        if (search && !search.value) search.value = kb;
        history.replaceState(null, "", `/console/knowledge?kb=${encodeURIComponent(kb)}`);
      }
    } catch (e) { /* the lists stay as they were; a reload shows them */ }
  }

  function enqueue(files, section) {
    const text = section.dataset;
    const list = document.getElementById("uploads");
    const kb = document.getElementById("upload-kb").value.trim();
    const rows = Array.from(files).map((file) => ({ file, row: line(list, file.name, text) }));
    if (!kb) {
      rows.forEach(({ row }) => finish(row, "refused", `${text.refused}: ${text.noKb}`));
      return;
    }
    for (const { file, row } of rows) queue = queue.then(() => send(file, kb, row, text));
    queue = queue.then(() => refreshLists(kb));
  }

  document.addEventListener("DOMContentLoaded", () => {
    const section = document.getElementById("upload");
    if (!section) return; // a viewer: no upload area
    const drop = document.getElementById("drop");
    const picker = document.getElementById("picker");
    picker.addEventListener("change", () => { enqueue(picker.files, section); picker.value = ""; });
    ["dragenter", "dragover"].forEach((name) => drop.addEventListener(name, (event) => {
      event.preventDefault();
      drop.classList.add("over");
    }));
    ["dragleave", "dragend"].forEach((name) => drop.addEventListener(name, () => drop.classList.remove("over")));
    drop.addEventListener("drop", (event) => {
      event.preventDefault();
      drop.classList.remove("over");
      if (event.dataTransfer && event.dataTransfer.files.length) enqueue(event.dataTransfer.files, section);
    });
  });
})();
