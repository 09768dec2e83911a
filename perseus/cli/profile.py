"""`perseus profile synth`: write a synthetic instruction profile from the emulator's model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perseus.cli._common import cli_errors, console
from perseus.errors import ConfigurationError

__all__ = ["app", "synth"]

app = typer.Typer(
    help="Make instruction profiles (stage, instruction, frequency, time, energy).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """Make instruction profiles (stage, instruction, frequency, time, energy)."""


def _parse_work(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigurationError(
            f"--work {text!r} is not a comma-separated list of numbers, e.g. 1,1,1.2,0.8"
        ) from None


@app.command(short_help="Synthesize a profile from the emulator's DVFS model.")
@cli_errors
def synth(
    out: Annotated[Path, typer.Option("--out", "-o", help="CSV file to write.")],
    gpu: Annotated[
        str, typer.Option(help="Emulated GPU type: A100-SXM | A40 | H100-SXM.")
    ] = "A100-SXM",
    stages: Annotated[
        int | None, typer.Option(help="Pipeline stages (default: the number of --work values).")
    ] = None,
    work: Annotated[
        str | None,
        typer.Option(help="Relative work per stage, comma-separated (default: 1 for every stage)."),
    ] = None,
    model: Annotated[
        str,
        typer.Option(help="Model preset for the base work: generic | gpt3 | gpt3-xl | bloom | t5."),
    ] = "generic",
    base_forward_ms: Annotated[
        float | None,
        typer.Option(help="Forward time of a work-1 stage at the max clock (default: preset's)."),
    ] = None,
    memory_fraction: Annotated[
        float | None,
        typer.Option(help="Share of time not scaling with the SM clock (default: preset's)."),
    ] = None,
    activity: Annotated[
        float | None, typer.Option(help="Dynamic-power activity (default: preset's).")
    ] = None,
    backward_ratio: Annotated[
        float | None, typer.Option(help="Backward over forward work (default: preset's, 2.0).")
    ] = None,
    min_freq: Annotated[
        int | None, typer.Option(help="Leave out SM clocks below this many MHz.")
    ] = None,
    noise: Annotated[
        float, typer.Option(help="Relative std of log-normal noise on time and power.")
    ] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed of the noise.")] = None,
    split_backward: Annotated[
        float | None,
        typer.Option(
            help="Also write backward_input / backward_weight rows (zero-bubble schedules): "
            "I takes this share of B's time and energy at every clock, W the rest "
            "(0.5: T_F ≈ T_I ≈ T_W, the ZB paper's assumption)."
        ),
    ] = None,
) -> None:
    """Synthesize a profile, e.g. `perseus profile synth --gpu A40 --work 1,1,1,0.6 --out p.csv`."""
    from perseus.io.profile_csv import EMULATED_COLUMN, write_profile_frame
    from perseus.synth import check_stage_count, get_preset, stage_workloads, synthesize_profile

    if out.suffix != ".csv":  # the rule of InstructionProfilingResult.to_csv
        raise ConfigurationError(f"--out {str(out)!r} must end with '.csv'")
    if out.is_dir():
        raise ConfigurationError(f"--out {str(out)!r} is a directory; give a CSV file path")
    factors = _parse_work(work) if work is not None else None
    if factors is None:
        if stages is None:
            raise ConfigurationError("Give --stages, --work, or both (e.g. --stages 4)")
        check_stage_count(stages)
        factors = [1.0] * stages
    if stages is not None and stages != len(factors):
        raise ConfigurationError(
            f"--stages {stages} but --work has {len(factors)} value(s); give one value per stage"
        )
    preset = get_preset(model)
    workloads = stage_workloads(
        gpu,
        factors,
        base_forward_ms=preset.base_forward_ms if base_forward_ms is None else base_forward_ms,
        memory_fraction=preset.memory_fraction if memory_fraction is None else memory_fraction,
        activity=preset.activity if activity is None else activity,
        backward_ratio=preset.backward_ratio if backward_ratio is None else backward_ratio,
    )
    frame = synthesize_profile(
        gpu,
        workloads,
        seed=seed,
        noise=noise,
        min_freq_mhz=min_freq,
        backward_split=split_backward,
    )
    # Every row is the emulator's model, not a measurement: the file says so.
    frame[EMULATED_COLUMN] = "true"
    write_profile_frame(frame, out, float_format="%.8g")
    freqs = frame["frequency"]
    console.print(
        f"Wrote {len(frame)} rows ({len(factors)} stages, {freqs.max()}→{freqs.min()} MHz) to "
        f"{out}, marked emulated (the emulator's model for the {gpu}, not measurements)",
        highlight=False,
    )


if __name__ == "__main__":  # pragma: no cover - `python -m perseus.cli.profile`
    app()
