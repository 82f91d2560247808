// What Dawn's adapter on this machine offers, as one JSON object: its info, features, limits
// that the kernels size themselves by, and its subgroup-matrix configurations (with Dawn's
// unsafe APIs, `chromium-experimental-subgroup-matrix`).
//
//   node adapter.mjs [DAWN_FLAG]...      e.g. enable-dawn-features=allow_unsafe_apis
import { create, globals } from "webgpu";

Object.assign(globalThis, globals);
const adapter = await create(process.argv.slice(2)).requestAdapter();
if (!adapter) {
  console.log(JSON.stringify({ adapter: null }));
  process.exit(1);
}
const info = adapter.info;
console.log(
  JSON.stringify({
    description: info.description,
    vendor: info.vendor,
    architecture: info.architecture,
    subgroupMinSize: info.subgroupMinSize,
    subgroupMaxSize: info.subgroupMaxSize,
    features: [...adapter.features].sort(),
    maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize,
    subgroupMatrixConfigs: [...(info.subgroupMatrixConfigs ?? [])].map((c) => ({
      componentType: c.componentType,
      resultComponentType: c.resultComponentType,
      M: c.M,
      N: c.N,
      K: c.K,
    })),
  }),
);
process.exit(0);
