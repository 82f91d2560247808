// The demo page: pick a model (and its projector), watch it load, chat with streamed tokens
// and attached or pasted images, attached sound files and microphone recordings; stop, see
// tok/s.
import { WGemma } from "./wgemma.js";

const $ = (id) => document.getElementById(id);
// `pending`: what is attached to the next message, `{kind, file, url}` (kind "image" or
// "audio"; file: a File, or a recording's AudioBuffer; url: the preview's).
const demo = {
  model: null,
  session: null,
  messages: [],
  pending: [],
  lastTokens: [],
  lastDone: null,
  busy: false,
  recorder: null,
};
// The browser test reads the state through this.
window.wgemmaDemo = demo;

// " of 32" or " of 8-64" lanes, as the adapter reports them ("" where it does not).
function subgroupLanes({ subgroupMinSize: lo, subgroupMaxSize: hi }) {
  if (!lo) return "";
  return lo === hi ? ` of ${lo}` : ` of ${lo}-${hi}`;
}

function setStatus(text, isError = false) {
  $("model-status").textContent = text;
  $("model-status").className = isError ? "error" : "";
}

// Which kinds of attachment the loaded model takes.
function takes() {
  const info = demo.model?.info();
  return { image: Boolean(info?.vision), audio: Boolean(info?.audio) };
}

function enableChat(on) {
  $("prompt").disabled = !on;
  $("send").disabled = !on;
  $("new").disabled = !on;
  const can = on ? takes() : { image: false, audio: false };
  const any = can.image || can.audio;
  $("attach").disabled = !any;
  $("attach").accept = [can.image && "image/*", can.audio && "audio/*"].filter(Boolean).join(",");
  $("attach-label").setAttribute("aria-disabled", String(!any));
  $("attach-label").title = any
    ? `attach ${[can.image && "an image", can.audio && "a sound file"].filter(Boolean).join(" or ")} (or paste or drop one on the prompt)`
    : "the model needs a vision or audio tower (mmproj)";
  $("record").disabled = !can.audio || !navigator.mediaDevices?.getUserMedia;
  $("record").title = can.audio ? "record from the microphone" : "the model needs an audio tower (mmproj)";
  if (!any) clearPending();
}

// A preview: the image, or an audio player.
function thumb(p, onRemove) {
  const div = document.createElement("div");
  div.className = "thumb";
  const media = document.createElement(p.kind === "audio" ? "audio" : "img");
  media.src = p.url;
  if (p.kind === "audio") media.controls = true;
  else media.alt = "attached image";
  div.append(media);
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
      thumb(p, () => {
        URL.revokeObjectURL(p.url);
        demo.pending = demo.pending.filter((q) => q !== p);
        showPending();
      }),
    ),
  );
}

// The kind of attachment a file is, if the model takes it.
function kindOf(file) {
  const can = takes();
  if (can.image && file.type.startsWith("image/")) return "image";
  if (can.audio && file.type.startsWith("audio/")) return "audio";
  return null;
}

function attach(files) {
  if ($("attach").disabled) return;
  for (const file of files) {
    const kind = kindOf(file);
    if (kind) demo.pending.push({ kind, file, url: URL.createObjectURL(file) });
  }
  showPending();
}

// Starts or stops a microphone recording; a finished one is decoded by the browser (whatever
// container MediaRecorder chose) into an AudioBuffer and attached.
async function toggleRecording() {
  if (demo.recorder) {
    demo.recorder.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (e) {
    addTurn("error", `Microphone: ${e.message}`);
    return;
  }
  const recorder = new MediaRecorder(stream);
  const parts = [];
  recorder.ondataavailable = (e) => parts.push(e.data);
  recorder.onstop = async () => {
    for (const track of stream.getTracks()) track.stop();
    demo.recorder = null;
    $("record").textContent = "Record";
    $("record").classList.remove("recording");
    const blob = new Blob(parts, { type: recorder.mimeType });
    try {
      const context = new AudioContext();
      const buffer = await context.decodeAudioData(await blob.arrayBuffer());
      context.close();
      demo.pending.push({ kind: "audio", file: buffer, url: URL.createObjectURL(blob) });
      showPending();
    } catch (e) {
      addTurn("error", `Recording: ${e.message}`);
    }
  };
  recorder.start();
  demo.recorder = recorder;
  $("record").textContent = "Stop recording";
  $("record").classList.add("recording");
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
        (info.gpu.subgroups ? ` · subgroups${subgroupLanes(info.gpu)}` : "") +
        (info.gpu.subgroupMatrix ? ` · ${info.gpu.subgroupMatrix}x${info.gpu.subgroupMatrix} subgroup matrices` : "") +
        (info.vision ? " · vision" : "") +
        (info.audio ? " · audio" : ""),
    );
    enableChat(true);
    $("prompt").focus();
  } catch (e) {
    setStatus(`Could not load ${label}: ${e.message} (${e.code})`, true);
  } finally {
    $("progress").hidden = true;
  }
}

function addTurn(role, text, attached = []) {
  const div = document.createElement("div");
  div.className = `turn ${role}`;
  div.textContent = text;
  if (attached.length) {
    const row = document.createElement("div");
    row.className = "thumbs";
    row.append(...attached.map((p) => thumb(p)));
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
  const attached = demo.pending;
  demo.pending = [];
  showPending();
  addTurn("user", `You: ${text}`, attached);
  // The whole conversation goes each turn, earlier images and clips too: the session finds
  // them in its cache and encodes only the new ones.
  const of = (kind) => attached.filter((p) => p.kind === kind).map((p) => p.file);
  demo.messages.push({ role: "user", content: text, images: of("image"), audio: of("audio") });
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
      } else if (ev.type === "draft") {
        // Text diffusion: the block condensing, step by step, after the text confirmed so far.
        out.textContent = `Gemma: ${reply}`;
        const draft = document.createElement("span");
        draft.className = "draft";
        draft.textContent = ev.text;
        out.append(draft);
        $("log").scrollTop = $("log").scrollHeight;
      } else if (ev.type === "done") {
        demo.lastDone = ev;
        const t = ev.timings;
        const encoded = [
          t.encodedImages && `${t.encodedImages} image${t.encodedImages > 1 ? "s" : ""}`,
          t.encodedAudio && `${t.encodedAudio} clip${t.encodedAudio > 1 ? "s" : ""}`,
        ].filter(Boolean);
        const blocks = t.blocks
          ? ` · ${t.blocks} block${t.blocks > 1 ? "s" : ""}, ${t.denoisingSteps} steps of ` +
            `${(t.decodeMs / Math.max(1, t.denoisingSteps)).toFixed(0)} ms`
          : "";
        $("stats").textContent =
          (encoded.length ? `${encoded.join(" and ")} in ${t.encodeMs.toFixed(0)} ms · ` : "") +
          `prompt ${t.promptTokens} tok, ${t.promptTokPerS.toFixed(1)} tok/s · ` +
          `${t.generatedTokens} tok at ${t.decodeTokPerS.toFixed(1)} tok/s${blocks} · ${ev.reason}`;
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
  for (const media of $("log").querySelectorAll("img, audio")) URL.revokeObjectURL(media.src);
  $("log").textContent = "";
  clearPending();
  await demo.session?.reset();
};
$("attach").onchange = () => {
  attach($("attach").files);
  $("attach").value = "";
};
$("record").onclick = toggleRecording;
$("prompt").onpaste = (e) => {
  const files = [...(e.clipboardData?.files ?? [])].filter((f) => kindOf(f));
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
