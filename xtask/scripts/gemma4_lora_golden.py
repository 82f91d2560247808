#!/usr/bin/env python3
"""PEFT LoRA adapters on the tiny Gemma 4 E2B fixture, with transformers' logits as the golden.

Regenerate (from the repository root, where torch, transformers and peft are installed; the
lent GPU machine has them: `bash benches/h100.sh lora` runs this and brings the files back):

    python3 xtask/scripts/gemma4_lora_golden.py

Rebuilds the E2B fixture's Hugging Face model exactly as `gemma4_tiny_fixtures.py` does (same
seed; checked against that golden's transformers rows), then for each variant wraps it with
PEFT (`get_peft_model`, dropout 0), sets every lora_A / lora_B to fixed random values (PEFT's
own init leaves B at zero, which would test nothing), saves the adapter directory and records
transformers + PEFT's float32 logits at every position of the fixture's first two sequences.

Variants (targets: q/o/gate/up/down on every layer, k/v on the layers that compute their own):
  lora    r 4, alpha 8, every target
  rslora  r 3, alpha 6, use_rslora (scale alpha / sqrt(r)), q_proj and down_proj only

Writes
    crates/gemma4-text/tests/fixtures/gemma4_tiny_e2b_{lora,rslora}/adapter_{config.json,model.safetensors}
    crates/gemma4-text/tests/golden/gemma4_tiny_e2b_lora.json
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma4_tiny_fixtures as fx  # noqa: E402

COMMAND = "python3 xtask/scripts/gemma4_lora_golden.py"
VARIANTS = {
    "lora": dict(r=4, alpha=8, rslora=False, modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"]),
    "rslora": dict(r=3, alpha=6, rslora=True, modules=["q_proj", "down_proj"]),
}


def target_regex(model, modules):
    """A PEFT target regex: the modules on every layer, k/v only where the layer owns its KV."""
    cfg = model.config
    own = cfg.num_hidden_layers - (getattr(cfg, "num_kv_shared_layers", 0) or 0)
    parts = []
    for m in modules:
        layers = range(own) if m in ("k_proj", "v_proj") else range(cfg.num_hidden_layers)
        alt = "|".join(str(i) for i in layers)
        parts.append(rf".*\.layers\.({alt})\.(self_attn|mlp)\.{m}")
    return "|".join(parts)


def randomize_lora(model, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if "lora_A" in name:
            v = torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
        elif "lora_B" in name:
            v = 0.5 * torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
        else:
            continue
        with torch.no_grad():
            p.copy_(v.to(torch.float32))


def main():
    import numpy as np
    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    base_golden = json.loads((fx.GOLDEN / "gemma4_tiny_e2b.json").read_text())
    seqs = [c["tokens"] for c in base_golden["cases"][:2]]
    out = {"command": COMMAND,
           "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                        "transformers": transformers.__version__, "peft": peft.__version__},
           "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        fx.build_model("e2b", tmp)
        base = fx.load_model(tmp)
        worst = 0.0
        for c in base_golden["cases"][:2]:
            got = fx.hf_logits(base, c["tokens"])
            for pos, row in c["hf"]["full_rows"].items():
                worst = max(worst, float(np.abs(got[int(pos)] - np.array(row)).max()))
        out["base_model_max_abs_diff_from_fixture_golden"] = worst
        assert worst < 1e-4, f"the rebuilt model is not the fixture's: {worst}"
        for i, (name, v) in enumerate(VARIANTS.items()):
            model = fx.load_model(tmp)
            cfg = LoraConfig(r=v["r"], lora_alpha=v["alpha"], use_rslora=v["rslora"],
                             target_modules=target_regex(model, v["modules"]),
                             lora_dropout=0.0, init_lora_weights=False)
            pm = get_peft_model(model, cfg).eval()
            randomize_lora(pm, 77 + i)
            adapter_dir = fx.FIXTURES / f"gemma4_tiny_e2b_{name}"
            pm.save_pretrained(adapter_dir)
            (adapter_dir / "README.md").unlink(missing_ok=True)
            cases = []
            for tokens in seqs:
                with torch.no_grad():
                    logits = pm(input_ids=torch.tensor([tokens]), use_cache=False).logits[0]
                rows = logits.to(torch.float32).numpy()
                base_rows = fx.hf_logits(base, tokens)
                keep = sorted(set(range(0, len(tokens), 3)) | {len(tokens) - 1})
                cases.append({"tokens": tokens,
                              "rows": {str(p): [float(f"{x:.7g}") for x in rows[p]] for p in keep},
                              "max_abs_change_from_base": float(np.abs(rows - base_rows).max())})
            out["variants"][name] = {"adapter": str(adapter_dir.relative_to(fx.REPO)),
                                     "r": v["r"], "lora_alpha": v["alpha"],
                                     "use_rslora": v["rslora"], "modules": v["modules"],
                                     "cases": cases}
            print(f"{name}: logits moved by up to {max(c['max_abs_change_from_base'] for c in cases):.3g}",
                  file=sys.stderr)
    path = fx.GOLDEN / "gemma4_tiny_e2b_lora.json"
    path.write_text(json.dumps(out) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
