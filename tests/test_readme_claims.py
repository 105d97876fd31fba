"""The README's names against the code: its `roseinfer ...` commands parse, every `--flag` it names is a flag of
some `roseinfer` command (with a valid value where it gives one), every `name=` it shows is a parameter of the
offline API (with the default the README gives it, where it gives one), and every repository file it points
to is there. A rename that leaves the README behind fails here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import shlex
from pathlib import Path

import pytest

from roseinfer import LLM, BeamSearchParams, SamplingParams
from roseinfer.entrypoints.cli import build_parser, main
from roseinfer.entrypoints.llm import make_engine_config

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# Backticked spans, a span broken over two lines joined back into one.
SPANS = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", README, flags=re.S))]
# vLLM's names the README cites for comparison, and pip's torch pin: not roseinfer parameters.
NOT_OURS = {"logprobs_mode", "torch"}
# Placeholders the README's commands use, and a value of the right type for each.
PLACEHOLDERS = {"DIR": "some/model-dir", "K": "2", "PATH.json": "report.json", "TRACE": "trace.json"}


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser under it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _parsers(sub)
    return out


def _options() -> dict[str, list[argparse.Action]]:
    """Each option string of any `roseinfer` command -> its actions (one a command that has it)."""
    options: dict[str, list[argparse.Action]] = {}
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            for flag in action.option_strings:
                options.setdefault(flag, []).append(action)
    return options


def _commands() -> list[list[str]]:
    """The README's `roseinfer ...` command lines: those of its bash blocks and its backticked spans, comments
    dropped, placeholders given values; spans listing alternatives (`a | b`) or trailing off (`...`) left out."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            lines += [part.strip() for part in line.split("&&")]
    lines += [s for s in SPANS if "|" not in s and "..." not in s.replace('"SELECT ..."', "")]
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:1] == ["roseinfer"]:
            commands.append([PLACEHOLDERS.get(w, w) for w in words[1:]])
            # A comment offering other flags (`# or --a b`): the same command with those.
            other = re.search(r"#\s*or\s+(--.*)$", line)
            if other:
                commands.append([words[1], *shlex.split(other.group(1))])
    return commands


COMMANDS = _commands()


def test_the_readme_shows_commands_of_every_kind() -> None:
    assert {c[0] for c in COMMANDS} == {"generate", "serve", "bench", "trace-sql"}
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_each_readme_command_parses(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert callable(args.func)


# The commands a new user can run as shown on a CPU machine: no model directory to give, no GPU.
RUNNABLE = [c for c in COMMANDS if c[0] == "generate" and "some/model-dir" not in c and "--model" not in c]


def test_the_readme_shows_runnable_commands() -> None:
    assert ["generate"] in RUNNABLE and len(RUNNABLE) >= 3


@pytest.mark.parametrize("argv", RUNNABLE, ids=" ".join)
def test_each_readme_generate_command_without_a_model_runs(argv: list[str], capsys) -> None:
    """The first command a new user runs (`roseinfer generate`, on the built-in dummy model) and the others
    that need no model directory: exit 0, the tokens on stdout, the model named on stderr."""
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "# tiny-llama (dummy weights)" in err
    ids = out.splitlines()[0].split(",")
    assert ids and all(t.isdigit() for t in ids)


def test_each_readme_flag_is_a_flag_with_a_valid_value() -> None:
    options = _options()
    named = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", README))
    assert len(named) >= 20
    missing = sorted(f for f in named if f not in options)
    assert not missing, f"README names flags no command has: {missing}"
    # `--flag value` spans: the value is one of the flag's choices, for some command whose flag has choices (`--peer`
    # takes hf for `bench throughput` and vllm for `bench serve`).
    for span in SPANS:
        words = span.split()
        if len(words) == 2 and words[0] in options and not words[1].startswith("-"):
            choices = [a.choices for a in options[words[0]] if a.choices is not None]
            assert not choices or any(words[1] in c for c in choices), f"`{span}`: not among {choices}"


def test_each_readme_keyword_is_a_parameter_of_the_offline_api() -> None:
    params = set(inspect.signature(make_engine_config).parameters) | set(inspect.signature(LLM).parameters)
    params |= {f.name for f in dataclasses.fields(SamplingParams)} | {
        f.name for f in dataclasses.fields(BeamSearchParams)
    }
    named = {m for s in SPANS for m in re.findall(r"\b([a-z_]+)=", s)} - NOT_OURS
    assert len(named) >= 15
    missing = sorted(named - params)
    assert not missing, f"README shows keywords the API lacks: {missing}"


def test_each_file_the_readme_points_to_is_there() -> None:
    """Paths in backticks or in prose, under the repository root or the package; `shared/` is the team's
    folder beside the repository, not in it."""
    paths = set(re.findall(r"(?<![\w/.])((?:[\w-]+/)*[\w-]+\.(?:py|md|sh))\b", README))
    paths = {p for p in paths if not p.startswith("shared/")}
    assert len(paths) >= 8
    missing = sorted(p for p in paths if not (ROOT / p).is_file() and not (ROOT / "roseinfer" / p).is_file())
    assert not missing, f"README points to files that are not there: {missing}"
    dotted = re.findall(r"`(models/\w+)\.(\w+)`", README)
    assert dotted
    for module, name in dotted:
        assert re.search(rf"^def {name}\(", (ROOT / "roseinfer" / f"{module}.py").read_text(), flags=re.M)


def _engine_defaults() -> dict[str, object]:
    """Each keyword of `LLM(...)` -> its default."""
    out: dict[str, object] = {}
    for fn in (make_engine_config, LLM):
        out |= {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
    return out


def test_the_defaults_the_readme_states() -> None:
    """`name=False` turns something on by default off (and `name=True` one off by default on); `LLM(name=v)`
    gives its default; the beam search signature lists BeamSearchParams' defaults."""
    engine = _engine_defaults()
    fields = dataclasses.fields(SamplingParams)
    defaults = engine | {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    switches = [(n, v == "True") for s in SPANS for n, v in re.findall(r"^(\w+)=(True|False)$", s)]
    assert len(switches) >= 8
    for name, value in switches:
        assert defaults[name] is (not value), f"`{name}={value}`: its default is {defaults[name]!r}"
    stated = [m for s in SPANS for m in re.findall(r"^LLM\((\w+)=(-?\d[\d.]*|True|False|None)\)$", s)]
    assert stated
    for name, value in stated:
        assert engine[name] == ast.literal_eval(value), (
            f"`LLM({name}={value})`: its default is {engine[name]!r}"
        )
    (beam,) = [s for s in SPANS if s.startswith("llm.beam_search(")]
    listed = dict(re.findall(r"(\w+)=([\w.]+)", beam))
    beam_defaults = {f.name: f.default for f in dataclasses.fields(BeamSearchParams)}
    assert set(listed) == {n for n, d in beam_defaults.items() if d is not dataclasses.MISSING}
    for name, value in listed.items():
        assert beam_defaults[name] == ast.literal_eval(value), (
            f"BeamSearchParams.{name}: {beam_defaults[name]!r}"
        )
