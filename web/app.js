// The demo page: pick a model (and its vision projector), watch it load, chat with streamed
// tokens and attached or pasted images, stop, see tok/s.
import { WGemma } from "./wgemma.js";

const $ = (id) => document.getElementById(id);
// `pending`: the images attached to the next message, `{file, url}` (url: the preview's).
const demo = { model: null, session: null, messages: [], pending: [], lastTokens: [], lastDone: null, busy: false };
// The browser test reads the state through this.
window.wgemmaDemo = demo;

function setStatus(text, isError = false) {
  $("model-status").textContent = text;
  $("model-status").className = isError ? "error" : "";
}

function enableChat(on) {
  $("prompt").disabled = !on;
  $("send").disabled = !on;
  $("new").disabled = !on;
  const vision = on && Boolean(demo.model?.info().vision);
  $("attach").disabled = !vision;
  $("attach-label").setAttribute("aria-disabled", String(!vision));
  $("attach-label").title = vision ? "attach an image (or paste or drop one on the prompt)" : "the model needs a vision tower (mmproj)";
  if (!vision) clearPending();
}

function thumb(url, onRemove) {
  const div = document.createElement("div");
  div.className = "thumb";
  const img = document.createElement("img");
  img.src = url;
  img.alt = "attached image";
  div.append(img);
  if (onRemove) {
    const x = document.createElement("button");
    x.textContent = "×";
    x.title = "remove";
    x.onclick = onRemove;
    div.append(x);
  }
  return div;
}

function showPending() {
  $("attachments").replaceChildren(
    ...demo.pending.map((p) =>
      thumb(p.url, () => {
        URL.revokeObjectURL(p.url);
        demo.pending = demo.pending.filter((q) => q !== p);
        showPending();
      }),
    ),
  );
}

function attach(files) {
  if ($("attach").disabled) return;
  for (const file of files) {
    if (file.type.startsWith("image/")) demo.pending.push({ file, url: URL.createObjectURL(file) });
  }
  showPending();
}

function clearPending() {
  for (const p of demo.pending) URL.revokeObjectURL(p.url);
  demo.pending = [];
  showPending();
}

// The projector picked for the model: a file, else the URL typed, else none.
function mmproj() {
  return $("mmproj-file").files[0] ?? ($("mmproj-url").value.trim() || undefined);
}

async function loadModel(source, label) {
  demo.model?.dispose();
  demo.model = null;
  enableChat(false);
  $("progress").hidden = false;
  $("progress").value = 0;
  setStatus(`Loading ${label}…`);
  try {
    const model = await WGemma.load(source, {
      mmproj: mmproj(),
      onProgress: ({ loaded, total }) => ($("progress").value = total ? loaded / total : 0),
    });
    const info = model.info();
    demo.model = model;
    demo.session = model.session({ context: 2048 });
    demo.messages = [];
    const mb = (b) => (b / 2 ** 20).toFixed(1);
    setStatus(
      `${info.name ?? info.architecture} · ${mb(info.file_size)} MiB · loaded in ${(info.load.ms / 1000).toFixed(1)} s ` +
        `(${mb(info.load.fetchedBytes)} MiB downloaded, ${mb(info.load.cachedBytes)} MiB from cache) · ` +
        `${info.gpu.adapter || info.gpu.backend}${info.gpu.shaderF16 ? " · f16" : ""}` +
        (info.vision ? " · vision" : ""),
    );
    enableChat(true);
    $("prompt").focus();
  } catch (e) {
    setStatus(`Could not load ${label}: ${e.message} (${e.code})`, true);
  } finally {
    $("progress").hidden = true;
  }
}

function addTurn(role, text, images = []) {
  const div = document.createElement("div");
  div.className = `turn ${role}`;
  div.textContent = text;
  if (images.length) {
    const row = document.createElement("div");
    row.className = "thumbs";
    row.append(...images.map((p) => thumb(p.url)));
    div.append(row);
  }
  $("log").append(div);
  return div;
}

async function send() {
  const text = $("prompt").value.trim();
  if ((!text && !demo.pending.length) || demo.busy) return;
  $("prompt").value = "";
  demo.busy = true;
  $("send").disabled = true;
  $("stop").disabled = false;
  const images = demo.pending;
  demo.pending = [];
  showPending();
  addTurn("user", `You: ${text}`, images);
  // The whole conversation goes each turn, earlier images too: the session finds them in
  // its cache and encodes only the new ones.
  demo.messages.push({ role: "user", content: text, images: images.map((p) => p.file) });
  const out = addTurn("model", "Gemma: ");
  let reply = "";
  demo.lastTokens = [];
  try {
    const options = {
      temperature: Number($("temperature").value) || 0,
      maxTokens: Math.max(1, Number($("max-tokens").value) || 256),
      imageTokens: Number($("image-tokens").value),
      seed: Math.floor(Math.random() * 2 ** 32),
    };
    for await (const ev of demo.session.generate(demo.messages, options)) {
      if (ev.type === "token") {
        demo.lastTokens.push(ev.id);
        reply += ev.text;
        out.textContent = `Gemma: ${reply}`;
        $("log").scrollTop = $("log").scrollHeight;
      } else {
        demo.lastDone = ev;
        const t = ev.timings;
        $("stats").textContent =
          (t.encodedImages ? `${t.encodedImages} image${t.encodedImages > 1 ? "s" : ""} in ${t.encodeMs.toFixed(0)} ms · ` : "") +
          `prompt ${t.promptTokens} tok, ${t.promptTokPerS.toFixed(1)} tok/s · ` +
          `${t.generatedTokens} tok at ${t.decodeTokPerS.toFixed(1)} tok/s · ${ev.reason}`;
      }
    }
    demo.messages.push({ role: "assistant", content: reply });
  } catch (e) {
    addTurn("error", `Error: ${e.message} (${e.code})`);
    demo.messages.pop();
  } finally {
    demo.busy = false;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("load-url").onclick = () => {
  const url = $("url").value.trim();
  if (url) loadModel(url, url);
};
$("file").onchange = () => {
  const f = $("file").files[0];
  if (f) loadModel(f, f.name);
};
$("send").onclick = send;
$("prompt").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    send();
  }
};
$("stop").onclick = () => demo.session?.abort();
$("new").onclick = async () => {
  demo.messages = [];
  for (const img of $("log").querySelectorAll("img")) URL.revokeObjectURL(img.src);
  $("log").textContent = "";
  clearPending();
  await demo.session?.reset();
};
$("attach").onchange = () => {
  attach($("attach").files);
  $("attach").value = "";
};
$("prompt").onpaste = (e) => {
  const files = [...(e.clipboardData?.files ?? [])].filter((f) => f.type.startsWith("image/"));
  if (files.length && !$("attach").disabled) {
    e.preventDefault();
    attach(files);
  }
};
$("prompt").ondragover = (e) => e.preventDefault();
$("prompt").ondrop = (e) => {
  if (!e.dataTransfer?.files.length) return;
  e.preventDefault();
  attach(e.dataTransfer.files);
};

// `cargo xtask serve` lists the models it serves; elsewhere the list is simply empty.
fetch("models/index.json")
  .then((r) => (r.ok ? r.json() : []))
  .then((names) => {
    const ggufs = names.filter((n) => n.endsWith(".gguf"));
    for (const n of ggufs) {
      const o = document.createElement("option");
      o.value = `models/${n}`;
      $("served").append(o);
    }
    // A projector is offered in its own field, never as the model.
    const models = ggufs.filter((n) => !/mmproj/i.test(n));
    if (models.length && !$("url").value) $("url").value = `models/${models[0]}`;
  })
  .catch(() => {});
