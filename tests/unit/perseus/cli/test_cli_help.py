"""The command line read at 80 columns: every ``--help`` fits without cutting an option name
or a command's summary, every hint names an option its command has, and ``perseus serve``'s
scheduler flags are generated from the schedulers' argument models."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
from pydantic import Field
from typer.testing import CliRunner

import perseus
from perseus.cli import app
from perseus.cli.scheduler_flags import scheduler_args, scheduler_flags
from perseus.errors import ConfigurationError
from perseus.schedulers.args import SchedulerArgs
from perseus.schedulers.registry import SCHEDULERS

runner = CliRunner()
PACKAGE = Path(perseus.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def commands() -> dict[tuple[str, ...], Any]:
    """Every command of `perseus`, by its path (groups included)."""
    found: dict[tuple[str, ...], Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        found[path] = cmd
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(None):
                walk(cmd.get_command(None, name), (*path, name))

    walk(typer.main.get_command(app), ())
    return found


def options(cmd: Any) -> set[str]:
    return {
        o
        for p in cmd.params
        for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
        if o.startswith("--")
    }


COMMANDS = commands()


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p) or "perseus")
def test_help_is_readable_at_80_columns(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    text = result.output
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert not too_long, too_long
    assert "…" not in text
    for option in options(COMMANDS[path]):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), option
    if hasattr(COMMANDS[path], "list_commands"):  # a group: no summary cut short
        listed = text.split("Commands:", 1)[1].splitlines()
        assert not [line for line in listed if line.rstrip().endswith("...")], listed


NAMED_COMMAND = re.compile(r"perseus ([a-z]+(?: [a-z]+)?)")


def _flags_in(node: ast.AST) -> tuple[set[str], list[str]]:
    """(flags named without a command, problems of flags after an explicit ``perseus CMD``)."""
    loose: set[str] = set()
    problems: list[str] = []
    for n in ast.walk(node):
        if not (isinstance(n, ast.Constant) and isinstance(n.value, str)):
            continue
        text, start = n.value, 0
        for m in NAMED_COMMAND.finditer(text):
            loose |= set(FLAG.findall(text[start : m.start()]))
            words = tuple(m.group(1).split())
            path = words if words in COMMANDS else words[:1]
            end = text.find("\n", m.end())
            tail = text[m.end() : end if end >= 0 else len(text)]
            if path in COMMANDS:
                problems += [
                    f"perseus {' '.join(path)} {f}"
                    for f in FLAG.findall(tail)
                    if f not in options(COMMANDS[path]) | {"--help"}
                ]
            start = m.end() + len(tail)
        loose |= set(FLAG.findall(text[start:]))
    return loose, problems


PROFILE_READERS = (("solve",), ("evaluate",), ("polish",), ("plot", "timeline"), ("report",))


def test_every_hint_names_an_option_of_its_command() -> None:
    """A flag after ``perseus CMD`` is an option of CMD. Otherwise: messages and help of a
    command function name only its own options; a CLI module's helpers only options of the
    commands it defines; library code only options that every command reaching it has."""
    by_function: dict[tuple[str, str], set[str]] = {}
    for cmd in COMMANDS.values():
        callback = getattr(cmd, "callback", None)
        if callback is None:
            continue  # the root group's callback (``--version``) counts like a command's
        func = inspect.unwrap(getattr(callback, "__wrapped__", callback))
        if func.__module__ == "perseus.cli.scheduler_flags":  # serve, built around:
            from perseus.cli.serve import serve

            func = inspect.unwrap(serve)
        key = (func.__module__, func.__name__)
        by_function[key] = by_function.get(key, set()) | options(cmd) | {"--help"}
    wrong: list[str] = []
    for module_path in sorted((PACKAGE / "cli").glob("*.py")):
        stem = module_path.stem
        module = "perseus.cli" if stem == "__init__" else f"perseus.cli.{stem}"
        if module == "perseus.cli.scheduler_flags":
            continue  # makes the flags
        tree = ast.parse(module_path.read_text())
        mine = {k: v for k, v in by_function.items() if k[0] == module}
        union = set().union(*mine.values()) if mine else set()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            loose, problems = _flags_in(node)
            allowed = mine.get((module, node.name), union)
            wrong += [f"{module}.{node.name}: {f}" for f in sorted(loose - allowed)] + problems
    # Library code: only the options of every command that reaches it.
    reached_by = {"planning/gpu.py": (("solve",),), "domain/profile.py": PROFILE_READERS}
    for module_path in sorted(PACKAGE.rglob("*.py")):
        rel = module_path.relative_to(PACKAGE).as_posix()
        if rel.startswith(
            (
                "cli/",
                "train/",
                "demo/",
                "client/hook.py",
                "server/__init__.py",
                "integrations/torchtitan.py",
            )
        ):
            continue  # the CLI above; perseus.train's own argparse flags; torchrun's; torchtitan's
        readers = reached_by.get(rel, ())
        allowed = set.intersection(*(options(COMMANDS[c]) for c in readers)) if readers else set()
        loose, problems = _flags_in(ast.parse(module_path.read_text()))
        wrong += [f"perseus/{rel}: {f}" for f in sorted(loose - allowed)] + problems
    assert not wrong, wrong


def test_evaluate_does_not_suggest_an_option_it_lacks(tmp_path: Path) -> None:
    profile = tmp_path / "p.csv"
    profile.write_text(
        "stage,instruction,frequency,time,energy\n"
        + "".join(f"{s},{k},1000,1.0,100\n" for s in range(3) for k in ("forward", "backward"))
    )
    plan = tmp_path / "plan.json"
    plan.write_text(
        '{"schedule": "1f1b", "num_stages": 2, "num_microbatches": 1, "p2p_power": 5.0, '
        '"iteration_time": 1.0, "energy": 1.0, "frequencies": [[["forward", 1000], '
        '["backward", 1000]], [["forward", 1000], ["backward", 1000]]]}'
    )
    result = runner.invoke(app, ["evaluate", str(profile), str(plan)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "profile has 3 stage(s)" in text and "--stages" not in text


# ---------------------------------------------------------------- perseus serve's flags
def test_serve_help_lists_every_argument_of_every_scheduler() -> None:
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for name, cls in SCHEDULERS.items():
        for field in cls.Args.model_fields:
            flag = "--" + field.replace("_", "-")
            assert flag in text, (name, flag)
    assert "--max-slowdown <float>" in text and "--num-microbatches <int>" in text
    assert "--sweep [coarse|full]" in text and "--refine / --no-refine" in text
    # Defaults as the models declare them, per scheduler where they differ.
    assert "[default: coarse; full for ZeusGlobal, ZeusPerStage]" in text
    assert "[range: 0 <= x <= 1] [default: 0.03]" in text  # --stop-margin


def test_a_field_added_to_a_model_is_a_flag_at_once() -> None:
    class NewArgs(SchedulerArgs):
        new_knob: int = Field(default=4, ge=1, description="rounds the knob compares")
        max_slowdown: float = Field(default=0.0, ge=0.0, le=1.0)

    flags = {
        f.name: f for f in scheduler_flags({"Old": SCHEDULERS["Perseus"].Args, "New": NewArgs})
    }
    assert flags["new_knob"].option == "--new-knob"
    assert flags["new_knob"].schedulers == ("New",)
    assert flags["max_slowdown"].schedulers == ("Old", "New")
    assert flags["new_knob"].help(("A", "B", "C", "New", "Old")) == (
        "rounds the knob compares (New). [range: >= 1] [default: 4]"
    )


def test_flags_win_over_the_variable_and_are_typed() -> None:
    model = SCHEDULERS["Perseus"].Args
    args = scheduler_args(
        "Perseus",
        model,
        {"max_slowdown": 0.5, "num_microbatches": 4},
        {"max_slowdown": "0.01", "refine": False, "sweep": "full"},
    )
    assert args == {"max_slowdown": 0.01, "num_microbatches": 4, "refine": False, "sweep": "full"}


@pytest.mark.parametrize(
    ("variable", "flags", "message"),
    [
        ({}, {"max_slowdown": "2"}, "--max-slowdown 2: max_slowdown 2 is above 1"),
        ({}, {"max_slowdown": "fast"}, "--max-slowdown fast: Input should be a valid number"),
        (
            {},
            {"stop_margin": "1.5"},
            "--stop-margin 1.5: Input should be less than or equal to 1 (allowed: a number, 0 <= x <= 1)",
        ),
        (
            {},
            {"sweep": "quick"},
            "--sweep quick: Input should be 'coarse' or 'full' (allowed: one of coarse, full)",
        ),
        ({}, {"num_microbatches": "0"}, "(allowed: an integer >= 1)"),
        (
            {"max_slowdown": 3},
            {},
            "PERSEUS_SCHEDULER_ARGS.max_slowdown=3: max_slowdown 3 is above 1",
        ),
        (
            {"freq_stride": 2},
            {},
            "PERSEUS_SCHEDULER_ARGS.freq_stride: not an argument of scheduler Perseus",
        ),
        ({}, {"eta_knob": "0.5"}, "--eta-knob: not an argument of scheduler Perseus"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(variable, flags, message) -> None:
    with pytest.raises(ConfigurationError) as caught:
        scheduler_args("Perseus", SCHEDULERS["Perseus"].Args, variable, flags)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--max-slowdown", "5"], {}, "--max-slowdown 5: max_slowdown 5 is above 1"),
        (
            ["--scheduler", "AllMaxFrequency", "--max-slowdown", "0.01"],
            {},
            "not an argument of scheduler AllMaxFrequency",
        ),
        (["--scheduler", "Nope"], {}, "Unknown scheduler 'Nope'"),
        (
            [],
            {"PERSEUS_SCHEDULER_ARGS": "{not json"},
            "PERSEUS_SCHEDULER_ARGS is not a JSON object",
        ),
        (
            [],
            {"PERSEUS_SCHEDULER_ARGS": '{"num_microbatches": 0}'},
            "PERSEUS_SCHEDULER_ARGS.num_microbatches=0",
        ),
        ([], {"PERSEUS_DUMP_KEEP_ROUNDS": "-1"}, "PERSEUS_DUMP_KEEP_ROUNDS"),
    ],
)
def test_serve_exits_2_with_one_clear_line(args, env, message) -> None:
    result = runner.invoke(app, ["serve", *args], env=env)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_a_short_token_file_is_named_as_such(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("short-secret\n")
    result = runner.invoke(app, ["serve", "--token-file", str(token)])
    assert result.exit_code == 2
    assert f"--token-file {token}: the token must be at least 16" in result.stderr
    assert "PERSEUS_TOKEN" not in result.stderr and "short-secret" not in result.output
