// The demo page: pick a model, watch it load, chat with streamed tokens, stop, see tok/s.
import { WGemma } from "./wgemma.js";

const $ = (id) => document.getElementById(id);
const demo = { model: null, session: null, messages: [], lastTokens: [], lastDone: null, busy: false };
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
        `${info.gpu.adapter || info.gpu.backend}${info.gpu.shaderF16 ? " · f16" : ""}`,
    );
    enableChat(true);
    $("prompt").focus();
  } catch (e) {
    setStatus(`Could not load ${label}: ${e.message} (${e.code})`, true);
  } finally {
    $("progress").hidden = true;
  }
}

function addTurn(role, text) {
  const div = document.createElement("div");
  div.className = `turn ${role}`;
  div.textContent = text;
  $("log").append(div);
  return div;
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || demo.busy) return;
  $("prompt").value = "";
  demo.busy = true;
  $("send").disabled = true;
  $("stop").disabled = false;
  addTurn("user", `You: ${text}`);
  demo.messages.push({ role: "user", content: text });
  const out = addTurn("model", "Gemma: ");
  let reply = "";
  demo.lastTokens = [];
  try {
    const options = {
      temperature: Number($("temperature").value) || 0,
      maxTokens: Math.max(1, Number($("max-tokens").value) || 256),
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
  $("log").textContent = "";
  await demo.session?.reset();
};

// `cargo xtask serve` lists the models it serves; elsewhere the list is simply empty.
fetch("models/index.json")
  .then((r) => (r.ok ? r.json() : []))
  .then((names) => {
    for (const n of names) {
      const o = document.createElement("option");
      o.value = `models/${n}`;
      $("served").append(o);
    }
    if (names.length && !$("url").value) $("url").value = `models/${names[0]}`;
  })
  .catch(() => {});
