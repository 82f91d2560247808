// Drives headless Chromium (WebGPU on SwiftShader) through the JS API and the demo page.
// Run by `cargo xtask browser-test`, which builds the package, serves it, and passes:
//   WGEMMA_URL       the served site                 WGEMMA_CHROMIUM  the browser binary
//   WGEMMA_MODEL     the tiny model's URL path       WGEMMA_REQUEST   the generation request (JSON)
//   WGEMMA_MODEL_FILE  the same model on disk (picked through the file input)
//   WGEMMA_G4_MODEL, WGEMMA_G4_EXPECTED  a tiny Gemma 4 with per-layer embeddings, and the
//                                        native run's tokens for WGEMMA_REQUEST
//   WGEMMA_DG_MODEL, WGEMMA_DG_REQUEST, WGEMMA_DG_EXPECTED  a tiny DiffusionGemma, what it is
//                                        asked, and the native run's {drafts, ids}
//   WGEMMA_DGV_MODEL, WGEMMA_DGV_MMPROJ, WGEMMA_DGV_REQUEST, WGEMMA_DGV_EXPECTED  the tiny
//     DiffusionGemma with a vision tower, its projector, a request about WGEMMA_VISION_IMAGE
//     and the native run (its soft tokens of the picture)
//   WGEMMA_DTYPE_REQUEST, WGEMMA_DTYPE_CASES  tiny models of every weight dtype
//                                        ([{dtype, model, expected}]) and what they are asked
//   WGEMMA_EXPECTED  the native run's token ids      WGEMMA_OUT       where the screenshot goes
//   WGEMMA_DEMO_REQUEST, WGEMMA_DEMO_EXPECTED        what is typed into the demo page, and the
//                                                    native run's tokens for it
//   WGEMMA_VISION_MODEL, WGEMMA_VISION_MMPROJ, WGEMMA_VISION_IMAGE  a tiny Gemma 4 with its
//                                        vision projector, and a PNG (URL paths)
//   WGEMMA_VISION_IMAGE_FILE  the PNG on disk (picked through the demo's file input)
//   WGEMMA_VISION_NATIVE  a JSON file of the native run: the PNG's soft tokens and a chat
//                         about it (turns of {request, ids, encodedImages, cachedTokens})
//   WGEMMA_BENCH     optional: a bigger model's URL path to time (load, prefill, decode)
//   WGEMMA_CHROMIUM_ARGS  optional: more browser flags, space-separated
// Prints one JSON line of results; exits non-zero when a check fails.
import { readFileSync } from "node:fs";
import { launchChromium } from "./chromium.mjs";

const env = process.env;
const request = JSON.parse(env.WGEMMA_REQUEST);
const expected = JSON.parse(env.WGEMMA_EXPECTED);
const demoRequest = JSON.parse(env.WGEMMA_DEMO_REQUEST);
const demoExpected = JSON.parse(env.WGEMMA_DEMO_EXPECTED);
const results = { checks: {} };
const failures = [];
const t0 = Date.now();
const elapsed = () => `${((Date.now() - t0) / 1000).toFixed(1)} s`;

// Each check's outcome, and on stderr when it came (where the run's time goes).
function check(name, ok, detail) {
  results.checks[name] = ok ? "ok" : `FAILED: ${detail}`;
  if (!ok) failures.push(`${name}: ${detail}`);
  console.error(`${elapsed()} ${ok ? "ok" : "FAILED"}: ${name}`);
}

const browser = await launchChromium(env);
const page = await browser.newPage({ viewport: { width: 1000, height: 800 } });
const log = [];
page.on("console", (m) => {
  log.push(`${m.type()}: ${m.text()}`);
  // The benchmark's milestones, as they happen.
  if (m.text().startsWith("[bench]")) console.error(`${elapsed()} ${m.text()}`);
});
page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`));
// SwiftShader is slow, but no step of the tiny model's checks takes minutes: fail, never hang.
page.setDefaultTimeout(180_000);

try {
  await page.goto(`${env.WGEMMA_URL}/index.html`);

  // The JS API: greedy generation equals the native run; a second load comes from the cache.
  const api = await page.evaluate(
    async ({ model, request }) => {
      const { WGemma } = await import("./wgemma.js");
      await caches.delete("wgemma-models-v1");
      const run = async (session) => {
        const ids = [];
        let done = null;
        const { messages, ...options } = request;
        for await (const ev of session.generate(messages, options)) {
          if (ev.type === "token") ids.push(ev.id);
          else done = ev;
        }
        return { ids, done };
      };
      let progressCalls = 0;
      const t0 = performance.now();
      const m = await WGemma.load(model, { onProgress: () => progressCalls++ });
      const loadMs = performance.now() - t0;
      const first = await run(m.session({ context: 256 }));
      const info = m.info();
      m.dispose();
      const again = await WGemma.load(model);
      const cachedInfo = again.info();
      const second = await run(again.session({ context: 256 }));
      again.dispose();
      // What the browser offers, asked directly: the engine's device must use subgroups
      // exactly when the adapter has them (wgpu's WebGPU backend maps the feature).
      const adapter = await navigator.gpu.requestAdapter();
      const adapterSubgroups = adapter.features.has("subgroups");
      return { loadMs, progressCalls, info, cachedLoad: cachedInfo.load, first, second, adapterSubgroups };
    },
    { model: env.WGEMMA_MODEL, request },
  );
  results.adapter = api.info.gpu;
  results.tinyLoadMs = api.loadMs;
  results.tokens = api.first.ids;
  check(
    "greedy tokens equal the native run",
    JSON.stringify(api.first.ids) === JSON.stringify(expected),
    `browser ${JSON.stringify(api.first.ids)} vs native ${JSON.stringify(expected)}`,
  );
  check(
    "the engine uses subgroups exactly when the browser's adapter has them",
    api.info.gpu.subgroups === api.adapterSubgroups,
    `engine ${api.info.gpu.subgroups}, adapter ${api.adapterSubgroups}`,
  );
  check("load reports progress", api.progressCalls > 0, `${api.progressCalls} progress calls`);
  check(
    "a second load reads only the cache",
    api.cachedLoad.fetchedBytes === 0 && api.cachedLoad.cachedBytes === api.info.file_size,
    JSON.stringify(api.cachedLoad),
  );
  check(
    "the cached model generates the same tokens",
    JSON.stringify(api.second.ids) === JSON.stringify(expected),
    JSON.stringify(api.second.ids),
  );

  // Gemma 4: the per-layer embedding rows come by range requests as tokens are fed.
  const g4 = await page.evaluate(
    async ({ model, request, image }) => {
      const { WGemma } = await import("./wgemma.js");
      const { messages, ...options } = request;
      const greedy = async (m) => {
        const ids = [];
        for await (const ev of m.session({ context: 256 }).generate(messages, options))
          if (ev.type === "token") ids.push(ev.id);
        return ids;
      };
      // The per-layer table fetched a row per token, then (the default) uploaded whole.
      const fetching = await WGemma.load(model, { cache: false, perLayerTable: "fetch" });
      const fetchedIds = await greedy(fetching);
      fetching.dispose();
      const m = await WGemma.load(model, { cache: false });
      const ids = await greedy(m);
      // No projector: no vision tower.
      const noVision = await m.encodeImage(image).then(
        () => "no error",
        (e) => `${e.code}: ${e.message}`,
      );
      const noAudio = await m.encodeAudio(new Uint8Array(44)).then(
        () => "no error",
        (e) => `${e.code}: ${e.message}`,
      );
      const { vision, audio } = m.info();
      m.dispose();
      return { ids, fetchedIds, noVision, noAudio, vision, audio };
    },
    { model: env.WGEMMA_G4_MODEL, request, image: env.WGEMMA_VISION_IMAGE },
  );
  const expected4 = JSON.parse(env.WGEMMA_G4_EXPECTED);
  check(
    "Gemma 4 with per-layer rows fetched by range equals the native run",
    JSON.stringify(g4.fetchedIds) === JSON.stringify(expected4),
    `browser ${JSON.stringify(g4.fetchedIds)} vs native ${JSON.stringify(expected4)}`,
  );
  check(
    "Gemma 4 with the per-layer table on the GPU equals the native run",
    JSON.stringify(g4.ids) === JSON.stringify(expected4),
    `browser ${JSON.stringify(g4.ids)} vs native ${JSON.stringify(expected4)}`,
  );
  check(
    "a model without a vision tower says so",
    g4.vision === null && g4.noVision.startsWith("no_vision: "),
    JSON.stringify(g4),
  );
  check(
    "a model without an audio tower says so (the clip is refused first when it cannot be read)",
    g4.audio === null && /^(no_audio|bad_audio): /.test(g4.noAudio),
    JSON.stringify(g4),
  );

  // Text diffusion: the model is told apart by its architecture; one denoising step's draft
  // and the block it gives are the native run's.
  const dg = await page.evaluate(
    async ({ model, request }) => {
      const { WGemma } = await import("./wgemma.js");
      const m = await WGemma.load(model, { cache: false });
      const drafts = [], ids = [];
      let done = null;
      const { prompt, ...options } = request;
      for await (const ev of m.session({ context: 64 }).generate(prompt, { ...options, raw: true })) {
        if (ev.type === "draft") drafts.push(ev.text);
        if (ev.type === "token") ids.push(ev.id);
        if (ev.type === "done") done = ev;
      }
      const info = m.info();
      m.dispose();
      return { drafts, ids, canvas: info.diffusion?.canvas_length, blocks: done?.timings?.blocks };
    },
    { model: env.WGEMMA_DG_MODEL, request: JSON.parse(env.WGEMMA_DG_REQUEST) },
  );
  const dgExpected = JSON.parse(env.WGEMMA_DG_EXPECTED);
  check(
    "DiffusionGemma's denoising step and block equal the native run",
    JSON.stringify({ drafts: dg.drafts, ids: dg.ids }) === JSON.stringify(dgExpected) && dg.canvas === 16 && dg.blocks === 1,
    `browser ${JSON.stringify(dg)} vs native ${JSON.stringify(dgExpected)}`,
  );

  // Text diffusion with a picture: the tower from its projector encodes the picture as a File
  // (decoded in the worker) as natively, and a request about it gives the native drafts and
  // block; a clip is refused (the model has no audio tower).
  const dgv = await page.evaluate(
    async ({ model, mmproj, image, clip, request }) => {
      const { WGemma } = await import("./wgemma.js");
      const m = await WGemma.load(model, { mmproj, cache: false });
      const file = new File([await (await fetch(image)).blob()], "picture.png", { type: "image/png" });
      const { data } = await m.encodeImage(file, { imageTokens: request.imageTokens });
      const softTokens = Array.from(data);
      const { messages, ...options } = request;
      const withPicture = messages.map((msg) => (msg.images ? { ...msg, images: [file] } : msg));
      const drafts = [], ids = [];
      for await (const ev of m.session({ context: 256 }).generate(withPicture, options)) {
        if (ev.type === "draft") drafts.push(ev.text);
        if (ev.type === "token") ids.push(ev.id);
      }
      const sound = await (await fetch(clip)).blob();
      const withClip = messages.map((msg) => (msg.images ? { role: msg.role, content: msg.content, audio: [sound] } : msg));
      const refused = await (async () => {
        for await (const ev of m.session({ context: 256 }).generate(withClip, options)) void ev;
        return "no error";
      })().catch((e) => `${e.code}: ${e.message}`);
      m.dispose();
      return { softTokens, drafts, ids, refused };
    },
    {
      model: env.WGEMMA_DGV_MODEL,
      mmproj: env.WGEMMA_DGV_MMPROJ,
      image: env.WGEMMA_VISION_IMAGE,
      clip: env.WGEMMA_AUDIO_CLIP,
      request: JSON.parse(env.WGEMMA_DGV_REQUEST),
    },
  );
  const dgvExpected = JSON.parse(env.WGEMMA_DGV_EXPECTED);
  const softDiff = dgv.softTokens.length === dgvExpected.softTokens.length
    ? Math.max(...dgv.softTokens.map((x, i) => Math.abs(x - dgvExpected.softTokens[i])))
    : Infinity;
  check(
    "DiffusionGemma's vision tower gives the native soft tokens",
    softDiff < 1e-3,
    `max |diff| ${softDiff} over ${dgv.softTokens.length} values`,
  );
  check(
    "DiffusionGemma's request about a picture gives the native drafts and block",
    JSON.stringify({ drafts: dgv.drafts, ids: dgv.ids }) ===
      JSON.stringify({ drafts: dgvExpected.drafts, ids: dgvExpected.ids }) && dgv.ids.length > 0,
    `browser ${JSON.stringify({ drafts: dgv.drafts, ids: dgv.ids })} vs native ${JSON.stringify({ drafts: dgvExpected.drafts, ids: dgvExpected.ids })}`,
  );
  check(
    "DiffusionGemma refuses a sound clip clearly",
    dgv.refused.startsWith("bad_request: ") && dgv.refused.includes("no audio tower"),
    dgv.refused,
  );

  // Images: the vision tower loads from its projector file and encodes a file as natively; a
  // chat about the picture decoded by the browser (an ImageBitmap) gives the native tokens,
  // its next turn finds the picture in the cache, and a truncated file is an error.
  const visionNative = JSON.parse(readFileSync(env.WGEMMA_VISION_NATIVE, "utf8"));
  const vision = await page.evaluate(
    async ({ model, mmproj, image, native }) => {
      const { WGemma } = await import("./wgemma.js");
      const timed = async (f) => {
        const t0 = performance.now();
        const value = await f();
        return { value, ms: Math.round(performance.now() - t0) };
      };
      const load = await timed(() => WGemma.load(model, { mmproj, cache: false }));
      const m = load.value;
      // The picture as a File: read and decoded in the worker.
      const file = new File([await (await fetch(image)).blob()], "picture.png", { type: "image/png" });
      const encode = await timed(() => m.encodeImage(file, { imageTokens: native.imageTokens }));
      const { data, rows, width } = encode.value;
      let maxDiff = 0;
      let scale = 0;
      data.forEach((x, i) => {
        maxDiff = Math.max(maxDiff, Math.abs(x - native.softTokens[i]));
        scale = Math.max(scale, Math.abs(native.softTokens[i]));
      });
      // The same picture decoded by the browser: it reaches the engine as pixels.
      const bitmap = await createImageBitmap(file, { colorSpaceConversion: "none", premultiplyAlpha: "none" });
      // A request of the native run, its `images` counts filled with the turn's picture.
      const chat = async (s, { messages, ...options }, picture) => {
        messages = messages.map((msg) => (msg.images ? { ...msg, images: Array(msg.images).fill(picture) } : msg));
        const ids = [];
        let done = null;
        for await (const ev of s.generate(messages, options)) {
          if (ev.type === "token") ids.push(ev.id);
          else done = ev;
        }
        return { ids, encodedImages: done.timings.encodedImages, cachedTokens: done.timings.cachedTokens };
      };
      const s = m.session({ context: 256 });
      const turns = [];
      let bad = null;
      for (const turn of native.turns) {
        turns.push(await timed(() => chat(s, turn.request, bitmap)));
        if (bad === null) {
          // A truncated PNG between the turns: an error, and the cache stays as it was.
          const truncated = file.slice(0, file.size / 2);
          bad = await chat(s, turn.request, truncated).then(
            () => "no error",
            (e) => `${e.code}: ${e.message}`,
          );
        }
      }
      // The first turn's prompt profiled: the tower's forward, then prefill and decode.
      const { messages: firstMessages, ...firstOptions } = native.turns[0].request;
      const withPicture = firstMessages.map((msg) =>
        msg.images ? { ...msg, images: Array(msg.images).fill(bitmap) } : msg,
      );
      const steps = await s.profile(withPicture, firstOptions);
      const profile = steps && steps.map((p) => ({ what: p.what, tokens: p.tokens, kernels: p.kernels.length, totalUs: p.totalUs }));
      const vision = m.info().vision;
      m.dispose();
      const encoded = { ms: encode.ms, rows, width, length: data.length, maxDiff, scale };
      return { loadMs: load.ms, vision, encode: encoded, turns, bad, profile };
    },
    {
      model: env.WGEMMA_VISION_MODEL,
      mmproj: env.WGEMMA_VISION_MMPROJ,
      image: env.WGEMMA_VISION_IMAGE,
      native: visionNative,
    },
  );
  results.vision = vision;
  const enc = vision.encode;
  console.error(
    `${elapsed()} vision: load ${vision.loadMs} ms, encode ${enc.ms} ms, turns ${vision.turns.map((t) => t.ms).join(", ")} ms`,
  );
  check(
    "the projector's vision tower loads",
    vision.vision?.imageTokens?.includes(visionNative.imageTokens),
    JSON.stringify(vision.vision),
  );
  // Both sides run f32 kernels on the same pixels. Measured: 4e-5 of the values' scale apart
  // (SwiftShader's exp and tanh are approximate), as much as one pixel one level brighter
  // moves them; the whole picture one level brighter moves them by 1.6e-2. 1e-3 is 25x the
  // noise and 16x below that.
  check(
    "the browser's soft tokens match the native ones",
    enc.rows === visionNative.rows &&
      enc.length === visionNative.softTokens.length &&
      enc.scale > 0 &&
      enc.maxDiff <= 1e-3 * enc.scale,
    `${JSON.stringify(enc)} vs native ${visionNative.rows} rows of ${visionNative.softTokens.length / visionNative.rows}`,
  );
  const turn = (i) => {
    const got = vision.turns[i].value;
    const want = visionNative.turns[i];
    return [
      JSON.stringify(got.ids) === JSON.stringify(want.ids) &&
        got.encodedImages === want.encodedImages &&
        got.cachedTokens === want.cachedTokens,
      `browser ${JSON.stringify(got)} vs native ${JSON.stringify({ ...want, request: undefined })}`,
    ];
  };
  check("an image chat (an ImageBitmap) gives the native tokens", ...turn(0));
  const vp = vision.profile;
  check(
    "profile with an image times the vision tower, then prefill and decode",
    vp === null ||
      (vp.length === 3 &&
        vp.map((p) => p.what).join(",") === "vision,prefill,decode" &&
        vp[0].tokens === visionNative.rows &&
        vp.every((p) => p.kernels > 0 && p.totalUs > 0)),
    JSON.stringify(vp),
  );
  check("a truncated PNG is a bad_image error", vision.bad.startsWith("bad_image: "), vision.bad);
  const [same, detail] = turn(1);
  const next = vision.turns[1].value;
  check(
    "the next turn takes the picture from the cache",
    same && next.encodedImages === 0 && next.cachedTokens > visionNative.rows,
    detail,
  );

  // Audio: the audio tower loads from its projector file and encodes a WAV file as natively;
  // a chat about the clip decoded by the browser (an AudioBuffer: samples) gives the native
  // tokens, its next turn finds the clip in the cache, and a truncated file is an error.
  const audioNative = JSON.parse(readFileSync(env.WGEMMA_AUDIO_NATIVE, "utf8"));
  const audio = await page.evaluate(
    async ({ model, mmproj, clip, native }) => {
      const { WGemma } = await import("./wgemma.js");
      const m = await WGemma.load(model, { mmproj, cache: false });
      const file = new File([await (await fetch(clip)).blob()], "clip.wav", { type: "audio/wav" });
      const t0 = performance.now();
      const { data, rows, width } = await m.encodeAudio(file);
      const encodeMs = Math.round(performance.now() - t0);
      let maxDiff = 0;
      let scale = 0;
      data.forEach((x, i) => {
        maxDiff = Math.max(maxDiff, Math.abs(x - native.softTokens[i]));
        scale = Math.max(scale, Math.abs(native.softTokens[i]));
      });
      const context = new OfflineAudioContext(1, 1, 16000);
      const buffer = await context.decodeAudioData(await file.arrayBuffer());
      const chat = async (s, { messages, ...options }, clip) => {
        messages = messages.map((msg) => (msg.audio ? { ...msg, audio: Array(msg.audio).fill(clip) } : msg));
        const ids = [];
        let done = null;
        for await (const ev of s.generate(messages, options)) {
          if (ev.type === "token") ids.push(ev.id);
          else done = ev;
        }
        return { ids, encodedAudio: done.timings.encodedAudio, cachedTokens: done.timings.cachedTokens };
      };
      const s = m.session({ context: 256 });
      const turns = [];
      let bad = null;
      for (const turn of native.turns) {
        turns.push(await chat(s, turn.request, buffer));
        if (bad === null) {
          const truncated = file.slice(0, 30);
          bad = await chat(s, turn.request, truncated).then(
            () => "no error",
            (e) => `${e.code}: ${e.message}`,
          );
        }
      }
      // The second turn again from an empty cache, with the decoded clip and with the file:
      // where the cached turn differs from native, these say whether the cache is the cause.
      const last = native.turns.at(-1).request;
      const fresh = {
        buffer: await chat(m.session({ context: 256 }), last, buffer),
        file: await chat(m.session({ context: 256 }), last, file),
      };
      const info = m.info().audio;
      m.dispose();
      const encoded = { ms: encodeMs, rows, width, length: data.length, maxDiff, scale };
      return { info, encode: encoded, turns, bad, fresh, rate: buffer.sampleRate, frames: buffer.length };
    },
    {
      model: env.WGEMMA_AUDIO_MODEL,
      mmproj: env.WGEMMA_AUDIO_MMPROJ,
      clip: env.WGEMMA_AUDIO_CLIP,
      native: audioNative,
    },
  );
  results.audio = audio;
  console.error(`${elapsed()} audio: encode ${audio.encode.ms} ms`);
  check("the projector's audio tower loads", audio.info?.maxSeconds > 0, JSON.stringify(audio.info));
  // Both sides run f32 kernels on the same samples; the tolerance of the images' check.
  check(
    "the browser's audio soft tokens match the native ones",
    audio.encode.rows === audioNative.rows &&
      audio.encode.length === audioNative.softTokens.length &&
      audio.encode.scale > 0 &&
      audio.encode.maxDiff <= 1e-3 * audio.encode.scale,
    `${JSON.stringify(audio.encode)} vs native ${audioNative.rows} rows`,
  );
  const audioTurn = (i) => {
    const got = audio.turns[i];
    const want = audioNative.turns[i];
    return [
      JSON.stringify(got.ids) === JSON.stringify(want.ids) &&
        got.encodedAudio === want.encodedAudio &&
        got.cachedTokens === want.cachedTokens,
      `browser ${JSON.stringify(got)} vs native ${JSON.stringify({ ...want, request: undefined })} (decoded at ${audio.rate} Hz, ${audio.frames} frames)`,
    ];
  };
  check("an audio chat (an AudioBuffer) gives the native tokens", ...audioTurn(0));
  check("a truncated WAV is a bad_audio error", audio.bad.startsWith("bad_audio: "), audio.bad);
  // The second turn (77 positions: the prefill attention's keys past its first 64) takes the
  // clip from the cache, equals an uncached run whatever form the clip took, and gives the
  // native tokens.
  const nextAudio = audio.turns[1];
  const wantAudio = audioNative.turns[1];
  check(
    "the next turn takes the clip from the cache and equals an uncached run",
    nextAudio.encodedAudio === 0 &&
      nextAudio.cachedTokens === wantAudio.cachedTokens &&
      nextAudio.cachedTokens > audioNative.rows &&
      JSON.stringify(nextAudio.ids) === JSON.stringify(audio.fresh.buffer.ids) &&
      JSON.stringify(audio.fresh.file.ids) === JSON.stringify(audio.fresh.buffer.ids),
    `cached ${JSON.stringify(nextAudio)}, uncached ${JSON.stringify(audio.fresh)}, native ${JSON.stringify(wantAudio.ids)}`,
  );
  check("the audio chat's next turn gives the native tokens", ...audioTurn(1));

  // Every weight dtype compiles under Chromium's WGSL compiler and matches native.
  const dtypeRequest = JSON.parse(env.WGEMMA_DTYPE_REQUEST);
  for (const c of JSON.parse(env.WGEMMA_DTYPE_CASES)) {
    const got = await page.evaluate(
      async ({ model, request }) => {
        const { WGemma } = await import("./wgemma.js");
        try {
          const m = await WGemma.load(model, { cache: false });
          const ids = [];
          const { prompt, ...options } = request;
          for await (const ev of m.session({ context: 64 }).generate(prompt, { ...options, raw: true }))
            if (ev.type === "token") ids.push(ev.id);
          m.dispose();
          return ids;
        } catch (e) {
          return `${e.code}: ${e.message}`;
        }
      },
      { model: c.model, request: dtypeRequest },
    );
    check(
      `${c.dtype} weights match the native run`,
      JSON.stringify(got) === JSON.stringify(c.expected),
      `browser ${JSON.stringify(got)} vs native ${JSON.stringify(c.expected)}`,
    );
  }

  // Abort within a step, then the same session still answers, identically.
  const abort = await page.evaluate(
    async ({ model, request }) => {
      const { WGemma } = await import("./wgemma.js");
      const m = await WGemma.load(model);
      const s = m.session({ context: 256 });
      const { messages, ...options } = request;
      const ids = [];
      let done = null;
      for await (const ev of s.generate(messages, { ...options, maxTokens: 200 })) {
        if (ev.type === "token") {
          ids.push(ev.id);
          if (ids.length === 3) s.abort();
        } else done = ev;
      }
      const after = [];
      for await (const ev of s.generate(messages, options)) if (ev.type === "token") after.push(ev.id);
      // Leaving the loop early aborts too; the session answers again afterwards.
      for await (const ev of s.generate(messages, { ...options, maxTokens: 200 })) break;
      const third = [];
      for await (const ev of s.generate(messages, options)) if (ev.type === "token") third.push(ev.id);
      const profile = await s.profile(messages);
      m.dispose();
      return { reason: done?.reason, tokensBeforeStop: ids.length, after, third, profile };
    },
    { model: env.WGEMMA_MODEL, request },
  );
  check(
    "abort stops within a step",
    abort.reason === "aborted" && abort.tokensBeforeStop <= 3 + 2,
    JSON.stringify(abort),
  );
  const p = abort.profile;
  check(
    "profile times the kernels of a prefill and a decode step",
    p === null ||
      (p.length === 2 && p[1].what === "decode" && p.every((s) => s.kernels.length > 0 && s.totalUs > 0)),
    JSON.stringify(p)?.slice(0, 400),
  );
  results.profiled = p !== null;
  delete abort.profile;
  check(
    "the session is usable after abort",
    JSON.stringify(abort.after) === JSON.stringify(expected) &&
      JSON.stringify(abort.third) === JSON.stringify(expected),
    JSON.stringify(abort),
  );

  // Bad sources reject with typed errors.
  const errors = await page.evaluate(async () => {
    const { WGemma } = await import("./wgemma.js");
    const codeOf = (p) =>
      p.then(
        () => "no error",
        (e) => `${e.name}/${e.code}: ${e.message}`,
      );
    return {
      missing: await codeOf(WGemma.load("models/missing.gguf")),
      notGguf: await codeOf(WGemma.load("index.html")),
    };
  });
  check("a missing URL is a source error", errors.missing.startsWith("WGemmaError/source"), errors.missing);

  // A download cut off mid-body: retried, then a clear error, and nothing partial cached.
  const broken = await page.evaluate(async (model) => {
    const { WGemma } = await import("./wgemma.js");
    const url = new URL(`broken/${model}`, location.href).href;
    const outcome = await WGemma.load(url).then(
      () => "loaded",
      (e) => `${e.code}: ${e.message}`,
    );
    const cache = await caches.open("wgemma-models-v1");
    const cached = (await cache.keys()).map((k) => k.url).filter((u) => u.startsWith(url));
    return { outcome, cached };
  }, env.WGEMMA_MODEL);
  check(
    "a dropped download fails clearly and caches nothing partial",
    broken.outcome.startsWith("source: ") && broken.cached.length === 0,
    JSON.stringify(broken),
  );
  check("a non-GGUF file is a bad_gguf error", errors.notGguf.startsWith("WGemmaError/bad_gguf"), errors.notGguf);

  // The demo page, driven like a user: load, ask, watch tokens stream, screenshot.
  await page.goto(`${env.WGEMMA_URL}/index.html`);
  // The page fills the URL field from the server's model list once that arrives; typing
  // before then races with it (the two URLs ended up concatenated).
  await page.waitForFunction(() => document.getElementById("served").options.length > 0);
  await page.fill("#url", env.WGEMMA_MODEL);
  await page.click("#load-url");
  await page.waitForSelector("#prompt:not([disabled])");
  await page.fill("#max-tokens", String(demoRequest.maxTokens));
  await page.fill("#prompt", demoRequest.messages.at(-1).content);
  await page.click("#send");
  await page.waitForFunction(() => window.wgemmaDemo.lastDone !== null);
  const demo = await page.evaluate(() => ({
    tokens: window.wgemmaDemo.lastTokens,
    stats: document.getElementById("stats").textContent,
    reply: document.querySelector(".turn.model")?.textContent,
  }));
  check(
    "the demo page streams the native reply",
    JSON.stringify(demo.tokens) === JSON.stringify(demoExpected),
    `${JSON.stringify(demo)} vs native ${JSON.stringify(demoExpected)}`,
  );
  check("the demo page shows tok/s", /tok\/s/.test(demo.stats), demo.stats);
  results.screenshot = `${env.WGEMMA_OUT}/demo.png`;
  await page.screenshot({ path: results.screenshot, fullPage: true });

  // A file the user picks loads through the same worker, read by Blob slices.
  const urlModel = await page.evaluateHandle(() => window.wgemmaDemo.model);
  await page.setInputFiles("#file", env.WGEMMA_MODEL_FILE);
  await page.waitForFunction(
    (old) => {
      const d = window.wgemmaDemo;
      return (d.model && d.model !== old) || /Could not load/.test(document.getElementById("model-status").textContent);
    },
    urlModel,
  );
  await page.fill("#prompt", demoRequest.messages.at(-1).content);
  const before = await page.evaluate(() => window.wgemmaDemo.lastDone);
  await page.click("#send");
  await page.waitForFunction((b) => window.wgemmaDemo.lastDone !== b && !window.wgemmaDemo.busy, before);
  const picked = await page.evaluate(() => ({
    status: document.getElementById("model-status").textContent,
    tokens: window.wgemmaDemo.lastTokens,
  }));
  check(
    "a picked file loads and answers the same",
    picked.status.includes("loaded in") && JSON.stringify(picked.tokens) === JSON.stringify(demoExpected),
    JSON.stringify(picked),
  );

  // The demo page with a projector holding both towers: an image attached by the file picker
  // shows a preview its button removes, a pasted one too, a WAV file picked shows a player,
  // and the next message carries the image and the clip (the reply itself is the API checks'
  // business: the model is dropped once the message is sent).
  const visionModel = await page.evaluateHandle(() => window.wgemmaDemo.model);
  await page.fill("#url", env.WGEMMA_AUDIO_MODEL);
  await page.fill("#mmproj-url", env.WGEMMA_AUDIO_MMPROJ);
  await page.click("#load-url");
  await page.waitForFunction((old) => window.wgemmaDemo.model && window.wgemmaDemo.model !== old, visionModel);
  await page.waitForSelector("#attach:not([disabled])", { state: "attached" });
  await page.setInputFiles("#attach", env.WGEMMA_VISION_IMAGE_FILE);
  const thumbs = () => page.locator("#attachments img").count();
  const picked1 = await thumbs();
  // Dispatched, not clicked: a click waits for a rendered frame, which SwiftShader's GPU
  // process, busy compiling the new model's kernels, takes seconds to draw.
  await page.dispatchEvent("#attachments button", "click");
  const removed = await thumbs();
  await page.evaluate(async (image) => {
    const blob = await (await fetch(image)).blob();
    const data = new DataTransfer();
    data.items.add(new File([blob], "pasted.png", { type: "image/png" }));
    const paste = new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true });
    document.getElementById("prompt").dispatchEvent(paste);
  }, env.WGEMMA_VISION_IMAGE);
  const pasted = await thumbs();
  await page.setInputFiles("#attach", env.WGEMMA_AUDIO_CLIP_FILE);
  const players = await page.locator("#attachments audio").count();
  const recordable = await page.evaluate(() => !document.getElementById("record").disabled);
  const sent = await page.evaluate(() => {
    const d = window.wgemmaDemo;
    document.getElementById("prompt").value = "What is in this picture?";
    document.getElementById("image-tokens").value = "70";
    // send() records the message before it awaits anything.
    document.getElementById("send").click();
    const out = {
      status: document.getElementById("model-status").textContent,
      images: d.messages.at(-1)?.images?.map((f) => `${f.name} ${f.type}`),
      audio: d.messages.at(-1)?.audio?.map((f) => `${f.name} ${f.type}`),
      logAudio: document.querySelectorAll(".turn.user audio").length,
      logImages: document.querySelectorAll(".turn.user img").length,
      left: document.querySelectorAll("#attachments img, #attachments audio").length,
    };
    d.model.dispose();
    return out;
  });
  check(
    "the demo page attaches, previews, removes and sends images and sound files",
    /vision/.test(sent.status) &&
      /audio/.test(sent.status) &&
      [picked1, removed, pasted, players].join() === "1,0,1,1" &&
      JSON.stringify(sent.images) === JSON.stringify(["pasted.png image/png"]) &&
      sent.audio?.length === 1 &&
      /^a16k\.wav audio\//.test(sent.audio[0]) &&
      sent.logImages === 1 &&
      sent.logAudio === 1 &&
      sent.left === 0,
    JSON.stringify({ picked1, removed, pasted, players, recordable, ...sent }),
  );

  if (env.WGEMMA_BENCH) {
    page.setDefaultTimeout(0);
    results.bench = await page.evaluate(
      async ({ model }) => {
        const { WGemma } = await import("./wgemma.js");
        await caches.delete("wgemma-models-v1");
        const load = async (what) => {
          const t0 = performance.now();
          let last = 0;
          const m = await WGemma.load(model, {
            onProgress: ({ loaded, total }) => {
              if (loaded / total >= last + 0.25) {
                last = loaded / total;
                console.log(`[bench] ${what} load ${Math.round(last * 100)}%`);
              }
            },
          });
          const ms = performance.now() - t0;
          console.log(`[bench] ${what} load done in ${ms.toFixed(0)} ms`);
          return { m, ms };
        };
        const cold = await load("cold");
        const s = cold.m.session({ context: 512 });
        let done = null;
        const prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle.";
        for await (const ev of s.generate(prompt, { maxTokens: 16, raw: true })) {
          if (ev.type === "done") done = ev;
          else console.log(`[bench] token ${ev.id}`);
        }
        const profile = await s.profile(prompt, { raw: true });
        console.log("[bench] profiled");
        const info = cold.m.info();
        cold.m.dispose();
        const warm = await load("cached");
        warm.m.dispose();
        return { coldLoadMs: cold.ms, cachedLoadMs: warm.ms, gpu: info.gpu, timings: done.timings, reason: done.reason, profile };
      },
      { model: env.WGEMMA_BENCH },
    );
  }
} catch (e) {
  failures.push(`exception: ${e.stack ?? e}`);
} finally {
  await browser.close();
}

results.failures = failures;
if (failures.length) results.log = log.slice(-40);
console.log(JSON.stringify(results));
process.exit(failures.length ? 1 : 0);
