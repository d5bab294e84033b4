"""The ``release`` command line: each command validates its options and calls one stage function."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from release import ReleaseError, __version__

DEBUG_ENV = "RELEASE_DEBUG"


class _Group(click.Group):
    """Turns every error into one line on stderr; tracebacks only with ``RELEASE_DEBUG=1``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReleaseError as exc:
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted; outputs were left untouched, rerun to resume", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug, not bad input: say so, keep the traceback for RELEASE_DEBUG=1
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            click.echo(f"internal error: {type(exc).__name__}: {exc} (rerun with {DEBUG_ENV}=1 for a traceback)",
                       err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="release")
def main() -> None:
    """Build, verify, document and publish FP8 builds of Cosmos3-Nano-Policy-DROID."""
    _quiet_libraries()


def _quiet_libraries() -> None:
    import logging
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("diffusers", "transformers", "modelopt", "accelerate", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)


@main.command()
@click.argument("size", type=click.Choice(["tiny", "nano"]))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Folder to create.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and observations.")
@click.option("--observations", "n_obs", type=click.IntRange(1, 10_000), default=32, show_default=True,
              help="Observations from the calibration labs.")
@click.option("--heldout", type=click.IntRange(0, 10_000), default=16, show_default=True,
              help="Observations from the held-out labs.")
def fixture(size: str, out: Path, seed: int, n_obs: int, heldout: int) -> None:
    """A Cosmos3OmniTransformer checkpoint (the real architecture) and synthetic DROID observations.

    tiny: 565k parameters, runs on a CPU. nano: the 15.7B model's sizes with random weights (31 GB; for speed and
    scale runs, best on a GPU with 80 GB)."""
    from release.fixture import write_fixture

    paths = write_fixture(out, size=size, seed=seed, n_obs=n_obs, heldout=heldout)
    click.echo(f"source:       {paths['source']} (revision {paths['revision'][:12]})")
    click.echo(f"observations: {paths['observations']}")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--all", "all_builds", is_flag=True, help="Build every YAML file in builds/.")
@click.option("--source", type=click.Path(path_type=Path), default=None,
              help="BF16 checkpoint folder (default: $RELEASE_SOURCE, then the Hugging Face cache).")
@click.option("--observations", type=click.Path(path_type=Path), default=None,
              help="Observation set (default: $RELEASE_OBSERVATIONS, then 'observations' beside the source).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
def build(names: tuple[str, ...], all_builds: bool, source: Path | None, observations: Path | None,
          out: Path) -> None:
    """Quantize, export and record provenance for the named builds."""
    from release.build import BuildRequest, run_builds

    if not run_builds(BuildRequest.create(names, all_builds, source, observations, out)):
        sys.exit(1)


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
@click.option("--reference", type=click.Path(path_type=Path), default=None,
              help="Reference checkpoint (NVIDIA's Cosmos3-Nano@fp8); default: the RTN build in --dist.")
@click.option("--source", type=click.Path(path_type=Path), default=None,
              help="BF16 source the values are recomputed from (default: as for build).")
@click.option("--observations", type=click.Path(path_type=Path), default=None,
              help="Observations for the loadability rollout (default: beside the source).")
def verify(names: tuple[str, ...], dist: Path, reference: Path | None, source: Path | None,
           observations: Path | None) -> None:
    """Check built repos against a reference and their source; exit 1 if any check fails."""
    from release.verify import VerifyRequest, verify_builds

    requests = [VerifyRequest.create(n, dist, reference, source, observations) for n in names]
    if not verify_builds(requests):
        sys.exit(1)


@main.command("eval")
@click.argument("names", nargs=-1)
@click.option("--all", "all_builds", is_flag=True, help="Evaluate the sweep of builds/release.yaml (as build --all).")
@click.option("--path", "path_", type=click.Choice(["fakequant", "deployed"]), default="fakequant", show_default=True)
@click.option("--split", type=click.Choice(["calibration", "validation", "all"]), default="calibration",
              show_default=True)
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
@click.option("--source", type=click.Path(path_type=Path), default=None)
@click.option("--observations", type=click.Path(path_type=Path), default=None)
@click.option("--yardsticks", is_flag=True, help="Also BF16 eager vs torch.compile and seed vs seed.")
def eval_(names: tuple[str, ...], all_builds: bool, path_: str, split: str, dist: Path, source: Path | None,
          observations: Path | None, yardsticks: bool) -> None:
    """Replay the policy for BF16 and each build on the same seeds; store the action chunks."""
    from release.evaluate import EvalRequest, describe, run_eval

    request = EvalRequest.create(names, path_, split, dist, source, observations, yardsticks, all_builds)
    for out in run_eval(request):
        click.echo(f"results: {out} ({describe(out)})")


@main.command("import-served")
@click.argument("name")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
@click.option("--source", type=click.Path(path_type=Path), default=None)
@click.option("--observations", type=click.Path(path_type=Path), default=None)
def import_served_(name: str, file: Path, dist: Path, source: Path | None, observations: Path | None) -> None:
    """Take a policy server's results (npz) as the build's 'served' path."""
    from release.evaluate import describe, import_served

    out = import_served(name, file, dist, observations, source)
    click.echo(f"results: {out} ({describe(out)})")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Default: DIST/tables.")
@click.option("--baseline", default="rtn", show_default=True)
@click.option("--resamples", type=click.IntRange(100, 1_000_000), default=10_000, show_default=True)
def tables(names: tuple[str, ...], dist: Path, out: Path | None, baseline: str, resamples: int) -> None:
    """Fidelity, served, ranking and attribution tables (CSV and JSON) across every evaluated build."""
    from release.tables import TablesRequest, run_tables

    result = run_tables(TablesRequest.create(names, dist, out, baseline, resamples))
    click.echo(result["fidelity"].to_string(index=False))


@main.command("select")
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
def select_(dist: Path) -> None:
    """Apply the selection rule of builds/release.yaml to DIST/tables/tables.json; write DIST/selection.json."""
    from rich.console import Console

    from release.select import SelectRequest, ranking_table, run_select

    request = SelectRequest.create(dist)
    Console(width=160).print(ranking_table(run_select(request)))
    click.echo(f"selection: {request.out}")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
@click.option("--lang", default="en,ko", show_default=True, help="Comma-separated languages; the first is README.md.")
@click.option("--check", is_flag=True, help="Render without writing; fail on a missing translation or bad data.")
def card(names: tuple[str, ...], dist: Path, lang: str, check: bool) -> None:
    """Render the model cards (README.md, README.<lang>.md, LICENSE, forest plot) of each built repo."""
    from release.card import CardRequest, render_cards

    for path in render_cards(CardRequest.create(names, dist, lang, check)):
        click.echo(f"{'checked' if check else 'card'}: {path}")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--org", default=None, help="Hub organisation (default: builds/release.yaml).")
@click.option("--dist", type=click.Path(path_type=Path), default=Path("dist"), show_default=True)
@click.option("--endpoint", default=None, help="Hub endpoint (default: huggingface_hub's, HF_ENDPOINT).")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--create-pr", is_flag=True, help="Open a Hub pull request instead of committing to main.")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--force", default=None, metavar="REASON", help="Push builds whose verification failed, was skipped "
              "in part, or is missing; REASON goes into the commit message.")
@click.option("--retag", is_flag=True, help="Move the release tag v<version> to the new commit if it points elsewhere "
              "(without it, such a push is refused before anything is committed).")
@click.option("--target", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Publish to this local folder (ORG/REPO inside it) instead of the Hub.")
def push(names: tuple[str, ...], org: str | None, dist: Path, endpoint: str | None, dry_run: bool,
         create_pr: bool, fmt: str, force: str | None, retag: bool, target: Path | None) -> None:
    """Plan and publish the sibling repos (token from HF_TOKEN or the huggingface_hub login; never printed)."""
    from release.push import PushRequest, run_push

    click.echo(run_push(PushRequest.create(names, org, dist, dry_run, endpoint, create_pr, fmt, force, target,
                                           retag)))
