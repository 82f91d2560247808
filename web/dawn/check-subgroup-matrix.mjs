// The browser build's tiled products on Dawn's subgroup matrices against the same build's f32
// tiles, end to end: bench.mjs runs `--model` twice on this machine's adapter through Dawn,
// both routed as on a GPU (`WGEMMA_GPU_ROUTING=1`, so a prompt takes the tiled products),
// both with Dawn's `allow_unsafe_apis` (which offers `chromium-experimental-subgroup-matrix`):
// once as the engine chooses, which must take the subgroup matrices, once without them and
// with f32 inputs (`WGEMMA_NO_COOP=1`, `WGEMMA_INT8_TILES=0`). Each generated token's top
// log-probabilities must agree: the same ids in the same order where they stand apart, and
// values within the f16 rounding of the products' operands.
//
//   node check-subgroup-matrix.mjs --model M.gguf [--prompt 96] [--decode 6]
//
// Exits 1 with what differs. scripts/dawn-lavapipe.sh runs it on lavapipe (8 x 8 x 8).
import { execFileSync } from "node:child_process";
import { resolve } from "node:path";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  options: {
    model: { type: "string" },
    prompt: { type: "string", default: "96" },
    decode: { type: "string", default: "6" },
  },
});
if (!a.model) {
  console.error("usage: check-subgroup-matrix.mjs --model M.gguf [--prompt N] [--decode N]");
  process.exit(2);
}

function run(knobs) {
  const args = ["bench.mjs", "--model", resolve(a.model), "--prompt", a.prompt, "--decode", a.decode];
  args.push("--reps", "1", "--logprobs", "5", "--dawn", "enable-dawn-features=allow_unsafe_apis");
  for (const k of ["WGEMMA_GPU_ROUTING=1", ...knobs]) args.push("--knob", k);
  const out = execFileSync(process.execPath, args, {
    cwd: new URL(".", import.meta.url),
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  return JSON.parse(out.trim().split("\n").at(-1));
}

const matrices = run([]);
const f32 = run(["WGEMMA_NO_COOP=1", "WGEMMA_INT8_TILES=0"]);
const problems = [];
if (!(matrices.subgroup_matrix > 0)) {
  problems.push(`the engine took no subgroup matrices on ${matrices.adapter} (${matrices.subgroup_matrix})`);
}
if (f32.subgroup_matrix !== 0) problems.push(`WGEMMA_NO_COOP=1 still took subgroup matrices`);
// f16 operands carry a relative error of 2^-11 each; over a tiny model's few layers the
// log-probabilities move by a few thousandths of their scale.
const tolerance = (x) => 0.02 + 2e-3 * Math.abs(x);
let worst = 0;
matrices.top_logprobs.forEach((top, step) => {
  const ref = f32.top_logprobs[step];
  top.forEach(([id, lp], rank) => {
    const [refId, refLp] = ref[rank];
    // Neighbours closer than the tolerance may swap places.
    const swapped = id !== refId && Math.abs(lp - refLp) <= tolerance(refLp);
    const match = ref.find(([i]) => i === id);
    if (id !== refId && !swapped) {
      problems.push(`token ${step}, rank ${rank}: id ${id} (${lp}) against ${refId} (${refLp})`);
    } else if (match) {
      const d = Math.abs(lp - match[1]);
      worst = Math.max(worst, d / tolerance(match[1]));
      if (d > tolerance(match[1])) problems.push(`token ${step}, id ${id}: ${lp} against ${match[1]}`);
    }
  });
});
console.log(
  JSON.stringify({
    adapter: matrices.adapter,
    subgroup_matrix: matrices.subgroup_matrix,
    steps: matrices.top_logprobs.length,
    worst_of_tolerance: worst,
    ids: matrices.ids,
    f32_ids: f32.ids,
  }),
);
if (problems.length) {
  console.error(`subgroup-matrix check failed:\n  ${problems.join("\n  ")}`);
  process.exit(1);
}
