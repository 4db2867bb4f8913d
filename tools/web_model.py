"""Put the browser translator of appendix E into the built site: its scripts and the shipped model.

`python tools/web_model.py [SITE]` (SITE defaults to _build/html) copies book/translator/*.js (the model's
arithmetic and the page's controls) into SITE/_static/translator/ and writes model.js there:
one script that sets the global `TRANSLATOR_MODEL` to the model's configuration, the tokenizer's merges and
every parameter's float16 values (little-endian, base64). A script tag loads it, so the page works opened as
a file, where `fetch` of a file:// address is refused. `make html` runs it after the book is built; the
weights are committed once, in transformer_lib/pretrained/, and never in the site's sources.
"""
from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "transformer_lib" / "pretrained"
SCRIPTS = ROOT / "book" / "translator"


def model_script() -> str:
    """The text of model.js: `TRANSLATOR_MODEL = {config, merges, tensors, data}`."""
    saved = torch.load(SHIPPED / "model.pt", map_location="cpu", weights_only=True)
    tokenizer = json.loads((SHIPPED / "tokenizer.json").read_text(encoding="utf-8"))
    tensors, chunks, offset = {}, [], 0
    for name, value in saved["model"].items():
        if name in ("tgt_embed.embedding.weight", "generator.weight") and saved["model_config"].get(
                "tie_embeddings"):
            continue  # tied to src_embed.embedding.weight: stored once
        half = value.detach().to(torch.float16).contiguous()
        raw = bytes(half.view(torch.uint8).untyped_storage())  # little-endian float16
        tensors[name] = {"shape": list(half.shape), "offset": offset}
        chunks.append(raw)
        offset += half.numel()
    header = {"config": saved["model_config"], "merges": tokenizer["merges"],
              "pattern": tokenizer["pattern"], "tensors": tensors}
    data = base64.b64encode(b"".join(chunks)).decode("ascii")
    return (f"// The book's shipped model (transformer_lib/pretrained), written by tools/web_model.py.\n"
            f"var TRANSLATOR_MODEL = {json.dumps(header, separators=(',', ':'))};\n"
            f'TRANSLATOR_MODEL.data = "{data}";\n')


def main(argv: list[str]) -> int:
    site = Path(argv[0]) if argv else ROOT / "_build" / "html"
    if not (site / "index.html").is_file():
        print(f"no built site in {site}: run jupyter-book build first", file=sys.stderr)
        return 1
    out = site / "_static" / "translator" / "model.js"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(model_script(), encoding="ascii")
    for script in sorted(SCRIPTS.glob("*.js")):  # not in _static/: Jupyter Book adds those to every page
        shutil.copyfile(script, out.parent / script.name)
    print(f"wrote {out.relative_to(site)} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
