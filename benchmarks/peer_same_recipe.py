"""The fair peer: torch.nn.Transformer's layers trained by this book's trainer, recipe and decoding.

Chapter 13's first peer (peer_nn_transformer.py) changes two things at once: PyTorch's layers and a tutorial's
recipe. This one changes only the layers. `TorchLayers` is our `Transformer` (the same tied embedding scaled by
sqrt(D), the same sinusoidal encoding and dropout, the same generator) whose encoder and decoder stacks are
`nn.TransformerEncoder` and `nn.TransformerDecoder` of the same shape: post-norm or pre-norm as the preset says,
ReLU, no final norms unless the preset has them, PyTorch's own initialisation (Xavier on every matrix, its packed
query/key/value matrix taken as one). Everything else is `train()` as it is: the same token batches in the same
order, the Noam schedule with its cooldown, label smoothing, gradient clipping, the inner dropout that starts
halfway, the clock, the averaging of the last snapshots, float32 or bf16 as the preset's `amp` decides.

`train(..., model_factory=TorchLayers)` hands the trainer the peer to build; its inner-dropout switch finds
PyTorch's layers as it finds ours (their attention weights' dropout and the feed-forward network's hidden dropout).

At the end the trained weights are copied into our own `Transformer` with `Transformer.from_torch` (chapter 10
shows the two compute the same function) and model.pt is rewritten in our layout, so the run is decoded and
scored by the same code as ours: `tools/record_run.py RUN_DIR results/NAME.json`. The original weights stay
in model_torch_layers.pt.

Usage (the two runs of chapter 13, started together so that they share the machine alike):
  python benchmarks/peer_same_recipe.py --layers torch --out runs/peer_torch --minutes 30 --threads 1
  python benchmarks/peer_same_recipe.py --layers ours  --out runs/peer_ours  --minutes 30 --threads 1
(`--layers ours` draws each attention projection alone, `attention_init=xavier`, whatever the preset draws.)
And the diagnostic of chapters 10 and 13: our layers with PyTorch's initialisation of attention (`attention_init=packed`), for the
steps our run took (a budget in steps, which the machine's load cannot change):
  python benchmarks/peer_same_recipe.py --layers ours-torch-init --out runs/peer_ours_torch_init --steps 774 --threads 1
Add --quick for a smoke run (a few steps on 2,000 pairs, in a temporary folder).
"""
import argparse
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from transformer_lib.checkpoints import load_checkpoint, save_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.training_run import train
from transformer_lib.model import Transformer, TransformerConfig

warnings.filterwarnings("ignore", message="enable_nested_tensor is True")


class TorchLayers(Transformer):
    """Our Transformer with nn.TransformerEncoder / nn.TransformerDecoder in place of its encoder and decoder."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        c = config
        del self.encoder, self.decoder  # ours go; the embeddings, positions and generator stay

        def layer(kind: type[nn.Module]) -> nn.Module:
            return kind(c.d_model, c.n_heads, c.d_ff, c.dropout, batch_first=True, norm_first=c.norm_first)

        encoder = nn.TransformerEncoder(layer(nn.TransformerEncoderLayer), c.n_encoder_layers,
                                        norm=nn.LayerNorm(c.d_model) if c.final_norm else None,
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(layer(nn.TransformerDecoderLayer), c.n_decoder_layers,
                                        norm=nn.LayerNorm(c.d_model) if c.final_norm else None)
        # nn.Transformer initialises its layers itself (Xavier uniform on every matrix)
        self.core = nn.Transformer(c.d_model, c.n_heads, custom_encoder=encoder, custom_decoder=decoder,
                                   batch_first=True)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Source ids (B, S) to the memory (B, S, D) and our padding mask (B, 1, 1, S), True at real tokens."""
        src_real = src != self.config.pad_id  # (B, S)
        x = self.positional(self.src_embed(src))  # (B, S, D)
        return self.core.encoder(x, src_key_padding_mask=~src_real), src_real[:, None, None, :]

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor, cache: None = None,
               offset: int = 0) -> torch.Tensor:
        """Right-padded target ids (B, T) to decoder vectors (B, T, D); no cache (decoding uses ours)."""
        if cache is not None or offset:
            raise ValueError("TorchLayers has no key/value cache: decode with Transformer.from_torch's copy")
        T = tgt.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt.device, dtype=torch.bool)  # (T, T)
        y = self.positional(self.tgt_embed(tgt))  # (B, T, D)
        return self.core.decoder(y, memory, tgt_mask=causal, tgt_is_causal=True,
                                 memory_key_padding_mask=~src_mask[:, 0, 0, :])  # (B, T, D)

    def new_cache(self) -> None:
        raise ValueError("TorchLayers has no key/value cache: decode with Transformer.from_torch's copy")

    def to_ours(self) -> Transformer:
        """Our Transformer holding these weights (Transformer.from_torch), in evaluation mode."""
        c, emb = self.config, self.src_embed.embedding
        tgt_emb = self.tgt_embed.embedding
        return Transformer.from_torch(self.core, emb, tgt_emb, self.generator, max_len=c.max_len, pad_id=c.pad_id,
                                      bos_id=c.bos_id, eos_id=c.eos_id).eval()


def rewrite_in_our_layout(out: Path) -> None:
    """model.pt of a TorchLayers run -> model_torch_layers.pt, and model.pt holding the same weights in our layout."""
    ckpt = load_checkpoint(out / "model.pt")
    peer = TorchLayers(TransformerConfig.from_dict(ckpt["model_config"]))
    peer.load_state_dict(ckpt["model"])
    save_checkpoint(ckpt, out / "model_torch_layers.pt")
    save_checkpoint({**ckpt, "model": peer.to_ours().state_dict(), "layers": "torch.nn.Transformer"},
                    out / "model.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", choices=["torch", "ours", "ours-torch-init"], default="torch")
    parser.add_argument("--out", type=Path, help="the run folder (a new one; with --quick, a temporary one)")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="a budget in steps instead of minutes")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 6 steps on 2,000 pairs")
    args = parser.parse_args()
    overrides = {"max_minutes": args.minutes, "threads": args.threads}
    if args.steps:
        overrides.update(max_minutes=None, max_steps=args.steps)
    if args.quick:
        overrides.update(max_minutes=None, max_steps=6, train_subset=2000, log_every=2)
    config = TrainConfig.from_preset(args.preset, **overrides)
    if args.out is None:
        if not args.quick:
            parser.error("give --out, the run folder")
        args.out = Path(tempfile.mkdtemp()) / "run"
    if args.layers == "torch":
        result = train(config, args.out, model_factory=TorchLayers)
        rewrite_in_our_layout(args.out)
    elif args.layers == "ours-torch-init":
        result = train(replace(config, attention_init="packed"), args.out)
    else:  # our layers with each projection drawn alone, as the records of chapter 13's pairs were trained
        result = train(replace(config, attention_init="xavier"), args.out)
    params = sum(p.numel() for p in result.model.parameters())
    print(f"layers={args.layers} steps={result.history[-1].get('step')} parameters={params}")


if __name__ == "__main__":
    main()
