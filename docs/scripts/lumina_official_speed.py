"""vgen's ar / sjd against Lumina-mGPT's own generation loop on a scaled Chameleon with random weights (AR speed
depends on the shapes, not the weights), on CPU, seconds per image (docs/models/chameleon.md).

The official loop is transformers' ``generate`` with the logits processors of Lumina-mGPT's
``lumina_mgpt/inference_solver.py`` (CFG as a second, unbatched forward with its own cache; the multimodal processor
that forces row ends and image tokens; image top-k 2000), read at run time from a checkout of Alpha-VLLM/Lumina-mGPT
and run as they are with four textual patches: device "cuda" -> "cpu", ``LogitsWarper`` aliased to
``LogitsProcessor`` (gone from transformers 5), and its cache read from the output's ``cache`` field where
transformers 5 puts it (without that its second branch would run uncached on one token), and its per-step prints silenced. transformers' forward masks
image logits; the official fork does not (``mask_image_logits=False``), so the mask is switched off for that loop.
Its processors handle batch 1 only: at batch 8 vgen's time per image is compared with the official batch-1 time.
sjd's tokens per pass on random weights say nothing about a trained model.

    python docs/scripts/lumina_official_speed.py <Lumina-mGPT checkout> [hidden layers grid] [--json out.json]

e.g. ``... 512 8 16 --json docs/bench/lumina-official-cpu.json`` (the JSON docs/models/chameleon.md renders).
"""
import sys
import time
from pathlib import Path

import torch
from transformers import ChameleonConfig, ChameleonForConditionalGeneration, ChameleonVQVAEConfig, GenerationConfig
from transformers.generation.logits_process import LogitsProcessor, LogitsProcessorList

out_json = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
if out_json:
    del sys.argv[sys.argv.index("--json"):sys.argv.index("--json") + 2]
src = (Path(sys.argv[1]) / "lumina_mgpt" / "inference_solver.py").read_text()
src = src[: src.index("class FlexARInferenceSolver")]
src = "\n".join(l for l in src.splitlines() if not l.startswith(("from data", "from model", "from transformers.gen")))
src = src.replace('device="cuda"', 'device="cpu"')
src = src.replace('out.get("past_key_values", None)', '(out.get("past_key_values", None) or out.get("cache", None))')
src = src.replace("print(", "(lambda *a, **k: None)(")
ns = {"LogitsProcessor": LogitsProcessor, "LogitsProcessorList": LogitsProcessorList, "LogitsWarper": LogitsProcessor}
exec(compile(src, "inference_solver.py", "exec"), ns)

from vgen import sample
from vgen.models import from_transformers

CODES = 8192
img_chr = {str(i): chr(ord("A") + i) for i in range(10)}
names = sorted("IMGIMG" + "".join(img_chr[c] for c in str(k)) + "Z" for k in range(CODES))
vocab = {"<s>": 0, "<pad>": 1, "</s>": 2}
vocab.update({n: 4 + i for i, n in enumerate(names)})
vocab.update({"<eoss>": 8196, "<racm3:break>": 8197, "<image>": 8711})
for r in range(8198, 8900):
    vocab.setdefault(f"<reserved{r - 4:05d}>", r)
hidden, layers, G = (int(a) for a in (sys.argv[2:5] if len(sys.argv) > 4 else (512, 8, 16)))  # G: grid side, even
cfg = ChameleonConfig(vocab_size=65536, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=4096,
                      bos_token_id=0, pad_token_id=1, eos_token_id=2,
                      vq_config=ChameleonVQVAEConfig(embed_dim=4, num_embeddings=CODES, latent_channels=4,
                                                     base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
                                                     attn_resolutions=[]).to_dict(),
                      vocabulary_map=vocab)
torch.manual_seed(0)
m = ChameleonForConditionalGeneration(cfg).eval()
BOI, EOI, EOL = 8197, 8196, 8803
prompt = torch.tensor([[0] + list(range(9000, 9030)) + [BOI, 8804 + G // 2, 8804 + G // 2]])


def official():
    lp = LogitsProcessorList([
        ns["LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor"](
            guidance_scale=3.0, model=m, image_start_token_id=BOI, image_end_token_id=EOI,
            image_next_line_token_id=EOL, patch_size=32),
        ns["MultiModalLogitsProcessor"](image_start_token_id=BOI, image_end_token_id=EOI,
                                        image_next_line_token_id=EOL, patch_size=32, voc_size=65536),
        ns["InterleavedTopKLogitsWarper"](image_top_k=2000, text_top_k=10, image_start_token_id=BOI,
                                          image_end_token_id=EOI)])
    gc = GenerationConfig(max_new_tokens=G * (G + 1) + 1, do_sample=True, temperature=1.0, top_k=None,
                          eos_token_id=[8710], pad_token_id=1)
    with torch.no_grad():
        return m.generate(prompt, gc, logits_processor=lp, attention_mask=torch.ones_like(prompt))


model = from_transformers(m, height=G, width=G, layout="lumina")
m.model.vocabulary_mapping.__dict__["image_tokens"] = []  # the official loop: Lumina's fork, mask_image_logits=False


def ours(name, b, **kw):
    return sample(model, prompt.expand(b, -1), name, seed=0, cfg_scale=3.0, top_k=2000, **kw)


def timed(f, reps=2):
    f()
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
    return best


t_off = timed(official)
print(f"shape hidden {hidden} layers {layers} grid {G}x{G} ({G * (G + 1) + 1} tokens), threads {torch.get_num_threads()}")
print(f"official loop, batch 1: {t_off:.2f} s per image")
rows = [{"sampler": "official loop", "batch_size": 1, "seconds_per_image": t_off, "x_official": 1.0}]
for b in (1, 8):
    t = timed(lambda: ours("ar", b))
    print(f"vgen ar, batch {b}: {t / b:.2f} s per image = {t_off / (t / b):.2f}x")
    rows.append({"sampler": "ar", "batch_size": b, "seconds_per_image": t / b, "x_official": t_off / (t / b)})
    _, st = ours("sjd", b, window=4)
    t = timed(lambda: ours("sjd", b, window=4))
    print(f"vgen sjd w4, batch {b}: {t / b:.2f} s per image = {t_off / (t / b):.2f}x ({st['accepted_per_step']:.2f} tokens/pass)")
    rows.append({"sampler": "sjd window=4", "batch_size": b, "seconds_per_image": t / b, "x_official": t_off / (t / b),
                 "tokens_per_pass": st["accepted_per_step"]})
if out_json:
    from vgen.eval.bench import machine
    from vgen.io import atomic_write_json
    atomic_write_json(out_json, {
        "command": "python docs/scripts/lumina_official_speed.py <Lumina-mGPT checkout> " + " ".join(sys.argv[2:]),
        "machine": machine(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "shape": {"hidden": hidden, "layers": layers, "grid": G, "params_m": sum(p.numel() for p in m.parameters()) / 1e6},
        "dtype": "float32", "rows": rows})
