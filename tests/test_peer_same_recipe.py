"""benchmarks/peer_same_recipe.py: torch.nn.Transformer's layers trained by this book's trainer and decoded by ours.

The peer changes the layers and nothing else; these tests check the three places where that could go wrong: the
peer's masks (its loss equals that of our model holding the same weights), the trainer's two names pointed at the
peer (and given back afterwards), and the copy into our layout that the decoders and tools/record_run.py read.
"""
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from transformer_lib.checkpoints import load_checkpoint, load_model
from transformer_lib.config import TrainConfig
from transformer_lib.data import load_multi30k
from transformer_lib.training_run import train
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.recipe import LabelSmoothingLoss, batch_loss, make_batch
from transformer_lib.tokenizer import BPETokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from peer_same_recipe import TorchLayers, rewrite_in_our_layout  # noqa: E402

SMALL = dict(d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=1, d_ff=64, dropout=0.1, train_subset=200,
             max_tokens=400, warmup=10, max_steps=3, log_every=1, average_last=1, seed=5, device="cpu", amp="off",
             inner_dropout_from=0.0)


def _batch():
    return make_batch([[5, 6, 7, 8, 9], [10, 11]], [[12, 13, 14], [15, 16, 17, 18, 19, 20]])


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_peer_computes_our_models_loss_from_the_same_weights(norm_first):
    torch.manual_seed(0)
    peer = TorchLayers(TransformerConfig(vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=2,
                                         n_decoder_layers=3, d_ff=64, norm_first=norm_first)).eval()
    ours = peer.to_ours()
    assert isinstance(peer.core.encoder.layers[0], nn.TransformerEncoderLayer) and type(ours) is Transformer
    assert sum(p.numel() for p in peer.parameters()) == sum(p.numel() for p in ours.parameters())
    criterion = LabelSmoothingLoss(40, 0, 0.1, reduction="sum")
    with torch.no_grad():
        theirs_loss, theirs_nll = batch_loss(peer, _batch(), criterion)
        our_loss, our_nll = batch_loss(ours, _batch(), criterion)
    torch.testing.assert_close(theirs_loss, our_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(theirs_nll, our_nll, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="no key/value cache"):
        peer.new_cache()


def test_the_trainer_trains_the_peer_and_gets_its_own_names_back(tmp_path):
    pairs = load_multi30k("train")[:200]
    tokenizer = BPETokenizer.train([s for pair in pairs for s in pair], vocab_size=350)
    result = train(TrainConfig.from_preset("tiny", **SMALL), tmp_path / "run", progress=False, tokenizer=tokenizer,
                   model_factory=TorchLayers)
    peer = result.model
    assert isinstance(peer, TorchLayers)
    steps = [r for r in result.history if r["kind"] == "train"]
    assert steps and all(r["loss"] == r["loss"] for r in steps)  # trained, and no NaN
    # inner dropout from the start: PyTorch's attention-weight and hidden-unit dropout were switched on
    attention = [m for m in peer.modules() if isinstance(m, nn.MultiheadAttention)]
    assert len(attention) == 2 + 2 and all(m.dropout == 0.1 for m in attention)
    assert all(layer.dropout.p == 0.1 for layer in peer.core.decoder.layers)

    rewrite_in_our_layout(tmp_path / "run")
    ours, loaded_tokenizer, _ = load_model(tmp_path / "run" / "model.pt")
    assert type(ours) is Transformer and loaded_tokenizer.to_dict() == tokenizer.to_dict()
    kept = load_checkpoint(tmp_path / "run" / "model_torch_layers.pt")["model"]
    assert any(k.startswith("core.") for k in kept)
    criterion = LabelSmoothingLoss(tokenizer.vocab_size, 0, 0.1, reduction="sum")
    with torch.no_grad():
        torch.testing.assert_close(batch_loss(ours.eval(), _batch(), criterion),
                                   batch_loss(peer.eval(), _batch(), criterion), rtol=1e-5, atol=1e-4)
