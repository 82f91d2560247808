// The page's worker (web/worker.js) in a Node worker thread, given what a browser gives a
// worker: `self` and its messages, `location`, `navigator.gpu` (Dawn, through the `webgpu`
// package) and `fetch` of the package's own files (the wasm module). bench.mjs starts it.
import { parentPort, workerData } from "node:worker_threads";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { create, globals } from "webgpu";

Object.assign(globalThis, globals);
globalThis.self = globalThis;
// wgpu's WebGPU backend looks for `navigator.gpu` once it sees a browser global.
globalThis.Window = class Window {};
Object.defineProperty(globalThis, "navigator", {
  value: { gpu: create(workerData.dawn) },
  configurable: true,
});
self.location = { href: workerData.base };

const webFetch = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const url = new URL(input instanceof Request ? input.url : String(input));
  if (url.protocol !== "file:") return webFetch(input, init);
  const type = url.pathname.endsWith(".wasm") ? "application/wasm" : "application/octet-stream";
  return new Response(await readFile(fileURLToPath(url)), { headers: { "Content-Type": type } });
};

// Messages that come while the worker's module loads wait for its handler.
const early = [];
parentPort.on("message", (data) => (self.onmessage ? self.onmessage({ data }) : early.push(data)));
self.postMessage = (message, transfer) => parentPort.postMessage(message, transfer);
await import(workerData.worker);
for (const data of early.splice(0)) self.onmessage({ data });
