"""Each record of the tuning log (book/eng_tuning_log.ipynb) carries the command that trains it with
today's library, in the page's `COMMANDS`. Parsed by the command line's own parser
(`transformer_lib.cli.build_parser`, `parse_overrides`, `TrainConfig.from_preset`), each command must
build, field by field, the configuration its record stores, so a command that drifts from its run, or
a preset that changes under its records, fails here. The records are read by the page's own
`settings`, so the page and the test read them alike; it also supplies what no record stores (the
draw of attention, the epochs and the validation points by epochs), which are compared too. A field
that changes nothing is left out on both sides (inner_dropout_from where no inner dropout is on), so
that a command carries no setting its run does not need. A peer's command runs its script's own
main() up to the call of train(); the two records of torch.nn.Transformer's tutorial script keep no
configuration, and their commands are compared word for word (less --out)."""
from __future__ import annotations

import ast
import importlib.util
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from transformer_lib.cli import build_parser
from transformer_lib.config import TrainConfig, parse_overrides, renamed_fields

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "eng_tuning_log.ipynb"
RESULTS = ROOT / "results"


def page_commands() -> dict[str, str]:
    """The page's COMMANDS, a literal dict in one of its code cells."""
    for cell in json.loads(PAGE.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code" or "COMMANDS = {" not in "".join(cell["source"]):
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMANDS"
                                                    for t in node.targets):
                return ast.literal_eval(node.value)
    raise AssertionError(f"{PAGE.name} has no COMMANDS")


def page_records() -> dict[str, dict]:
    """The records the page reads: every run record of results/ but chapter 15c's."""
    found = {p.relative_to(RESULTS).with_suffix("").as_posix(): json.loads(p.read_text())
             for p in sorted(RESULTS.rglob("*.json")) if p.parent.name != "decoder_only"}
    return {name: r for name, r in found.items() if "bleu" in r}


def page_settings() -> Callable[[dict], dict[str, Any]]:
    """The page's `settings`, which reads a record's settings by today's field names, taken from its
    code cell with the rules it reads (the upper-case literals of the page's code cells up to its
    own) and run here: the test reads the records as the page does, from one definition."""
    body: list[ast.stmt] = []
    for cell in json.loads(PAGE.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        function = None
        for node in ast.parse("".join(cell["source"])).body:
            if isinstance(node, ast.FunctionDef) and node.name == "settings":
                function = node
            elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper()
                                                      for t in node.targets):
                try:
                    ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError):
                    continue
                body.append(node)
        if function is not None:
            scope: dict[str, Any] = {"TrainConfig": TrainConfig, "renamed_fields": renamed_fields}
            module = ast.Module(body=[*body, function], type_ignores=[])
            exec(compile(module, str(PAGE), "exec"), scope)
            return scope["settings"]
    raise AssertionError(f"{PAGE.name} has no settings")


recorded = page_settings()  # the settings a record trained with, by today's field names


class _Handed(Exception):
    """Raised by the stand-in for train(): the script got as far as training."""


def peer_config(argv: list[str]) -> tuple[dict[str, Any], str]:
    """The TrainConfig (as plain values) that benchmarks/peer_same_recipe.py hands train() for
    these options, and its --layers: the script's own main() runs, with its own parser (an option
    missing or unknown fails here as it fails the command) and its own mapping of the options onto
    the preset, up to the call of train(), which a stand-in catches."""
    spec = importlib.util.spec_from_file_location("peer_same_recipe_under_test",
                                                  ROOT / "benchmarks" / "peer_same_recipe.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    handed: dict[str, Any] = {}

    def train(config: TrainConfig, out: Path, **kwargs: Any) -> None:
        handed.update(config=config, out=out)
        raise _Handed

    script.train = train
    with mock.patch.object(sys, "argv", ["peer_same_recipe.py", *argv]):
        try:
            script.main()
        except SystemExit as refused:  # argparse's error: the command fails as printed
            raise AssertionError(f"peer_same_recipe.py refuses {shlex.join(argv)}") from refused
        except _Handed:
            pass
    layers = argv[argv.index("--layers") + 1] if "--layers" in argv else "torch"
    return handed["config"].to_dict(), layers


def built(command: str) -> dict[str, Any] | None:
    """The TrainConfig a command builds (as plain values); None for a peer outside TrainConfig."""
    words = shlex.split(command)
    if words[:2] == ["transformer-lib", "train"]:
        args = build_parser().parse_args(words[1:])
        return TrainConfig.from_preset(args.preset, **parse_overrides(args.overrides)).to_dict()
    if words[:2] == ["python", "benchmarks/peer_same_recipe.py"]:
        config, layers = peer_config(words[2:])
        if layers == "torch":  # PyTorch's layers draw their own weights: the record's draw is moot
            config["attention_init"] = "xavier"
        return config
    if words[:2] == ["python", "benchmarks/peer_nn_transformer.py"]:
        return None
    raise AssertionError(f"not a command the test can read: {command}")


def without_moot(config: dict[str, Any]) -> dict[str, Any]:
    """The settings less a field that changes nothing: inner_dropout_from where attention_dropout and
    ffn_dropout are both 0 (no inner dropout to start late), as the page's changed() and moved()
    read them."""
    if config.get("attention_dropout") == config.get("ffn_dropout") == 0:
        return {k: v for k, v in config.items() if k != "inner_dropout_from"}
    return config


def disagreements(run: dict, command: str) -> list[str]:
    """Each field where the command's configuration differs from the record's (moot fields aside)."""
    config = built(command)
    if config is None:  # torch.nn.Transformer's tutorial: its record is its own command
        def less_out(text: str) -> list[str]:
            words = shlex.split(text)
            if "--out" in words:
                del words[words.index("--out"):words.index("--out") + 2]
            return words
        same = less_out(run["command"]) == less_out(command)
        return [] if same else [f"command: {run['command']!r}"]
    config = without_moot(json.loads(json.dumps(config)))  # tuples as the record's lists
    want = without_moot(json.loads(json.dumps(recorded(run))))
    return [f"{k}: the record {want[k]!r}, the command {config.get(k, '(no such field)')!r}"
            for k in sorted(want) if config.get(k, object()) != want[k]]


COMMANDS = page_commands()
RECORDS = page_records()


def test_every_record_the_page_reads_has_a_command():
    assert sorted(COMMANDS) == sorted(RECORDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_command_builds_the_record_s_configuration(name):
    assert not disagreements(RECORDS[name], COMMANDS[name]), disagreements(RECORDS[name],
                                                                             COMMANDS[name])


def unneeded(name: str, command: str) -> list[str]:
    """The --set settings of a command without which it still builds its record's configuration."""
    words = shlex.split(command)
    return [words[i + 1] for i, w in enumerate(words) if w == "--set"
            and not disagreements(RECORDS[name], shlex.join(words[:i] + words[i + 2:]))]


@pytest.mark.parametrize("name", [n for n in sorted(COMMANDS) if "--set" in COMMANDS[n]])
def test_each_setting_of_a_command_is_needed(name):
    """A command less any one of its --set builds another run: the check can fail."""
    assert not unneeded(name, COMMANDS[name])


def test_a_moot_setting_is_unneeded_and_a_needed_one_left_out_is_caught():
    """With no inner dropout, when it starts changes nothing: a command that sets it carries a
    setting its run does not need. Leaving out a setting the run needs still fails."""
    name = "ablations/cpu_residual_dropout_only"
    moot = COMMANDS[name] + " --set inner_dropout_from=0"
    assert not disagreements(RECORDS[name], moot)
    assert unneeded(name, moot) == ["inner_dropout_from=0"]
    wrong = COMMANDS[name].replace(" --set ffn_dropout=0", "")
    assert disagreements(RECORDS[name], wrong) == ["ffn_dropout: the record 0.0, the command None"]


@pytest.mark.parametrize("name", [n for n in sorted(COMMANDS) if "peer_same_recipe.py" in COMMANDS[n]])
def test_a_peer_command_without_its_run_folder_fails(name):
    """The peer's script needs --out (a run folder) unless --quick: a command without it fails."""
    words = shlex.split(COMMANDS[name])
    assert "--out" in words, COMMANDS[name]
    at = words.index("--out")
    with pytest.raises(AssertionError, match="refuses"):
        built(shlex.join(words[:at] + words[at + 2:]))


def test_the_gpu_runs_before_the_budget_in_data_are_read_at_1000_epochs():
    """No record stores epochs: the page's settings() supplies them, so the H200 runs, made before
    the gpu preset took 30 epochs, are checked at the 1,000 (no limit) they ran, the H100's at 30."""
    assert recorded(RECORDS["earlier/gpu_post_norm_6min"])["epochs"] == 1000
    assert recorded(RECORDS["gpu/h100_2026-11-27/gpu"])["epochs"] == 30
    wrong = COMMANDS["earlier/gpu_post_norm_6min"].replace(" --set epochs=1000", "")
    assert "epochs: the record 1000, the command 30" in disagreements(
        RECORDS["earlier/gpu_post_norm_6min"], wrong)


def test_a_wrong_command_is_caught():
    run = RECORDS["earlier/cpu_v0.2.0"]
    assert recorded(run)["max_tokens"] == 3000  # release 0.2.0's batches
    wrong = COMMANDS["earlier/cpu_v0.2.0"].replace("max_tokens=3000", "max_tokens=2000")
    assert disagreements(run, wrong) == ["max_tokens: the record 3000, the command 2000"]
    assert disagreements(run, "transformer-lib train --preset gpu")


def test_max_steps_is_compared_for_every_record():
    """No record's config stores max_steps: the page's rules supply None for a record whose overrides
    name none and whose minutes were capped, so a budget of steps the run did not have is caught,
    not only in the three records whose overrides name one."""
    name = "earlier/cpu_default_init"
    assert "max_steps" not in RECORDS[name]["config"] and recorded(RECORDS[name])["max_steps"] is None
    wrong = COMMANDS[name] + " --set max_steps=2483"
    assert disagreements(RECORDS[name], wrong) == ["max_steps: the record None, the command 2483"]


def test_what_goes_unchecked_is_only_what_release_0_2_0_predates():
    """Beyond the fields no record stores, only release 0.2.0's two records leave fields to today's
    values (the page prints them): every other record with a configuration has each field checked."""
    fields = set(TrainConfig.from_preset("cpu").to_dict())
    stored = set().union(*(renamed_fields({**r.get("config", {}), **r.get("overrides", {})},
                                          warn=False) for r in RECORDS.values()))
    with_config = {n: r for n, r in RECORDS.items() if "config" in r}
    lacking = {n for n, r in with_config.items() if (fields & stored) - set(recorded(r))}
    assert lacking == {"earlier/cpu_v0.2.0", "earlier/cpu_v0.2.0_shared_machine"}, lacking
